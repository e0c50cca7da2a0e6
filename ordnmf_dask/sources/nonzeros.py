"""Interactions in the store's index space, as every ingest step hands them on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Nonzeros:
    """Interactions in final index space: u, i int64 (n,), y uint8 (n,), raw float64 (n,)."""

    u: np.ndarray
    i: np.ndarray
    y: np.ndarray
    raw: np.ndarray

    def take(self, idx: np.ndarray) -> Nonzeros:
        return Nonzeros(self.u[idx], self.i[idx], self.y[idx], self.raw[idx])
