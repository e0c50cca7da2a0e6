"""Model families on the one CAVI engine: what differs between OrdNMF, BePoF, PF and dcPF.

A family names the values its blocks hold, its local-step kernel, its O(V) global parameters
(Delta, or p), their update from the summed local statistics, the rate terms of the W / H updates,
and the assembly of the ELBO. Everything here runs on the client and handles O(K + V) numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ordnmf_dask.model import dcpf, kernels
from ordnmf_dask.model.thresholds import gap_from_delta, init_delta, theta_from_delta, update_delta


@dataclass(frozen=True)
class OrdinalFamily:
    """IG-OrdNMF (docs/design.md §2); V = 1 is BePoF, and with ``approx`` PF on binary data.

    ``binarize_at`` S turns the store's classes into {0, 1} (class >= S) when blocks are read,
    so BePoF / PF at any threshold run on a store ingested once with its ordinal classes.
    """

    hist: tuple[int, ...]  # training histogram of the classes the model sees, (V + 1,)
    approx: bool = False
    binarize_at: int | None = None
    fixed_delta: tuple[float, ...] | None = None  # keep Delta here (BePoF with theta_0 = 1)

    name = "ordinal"
    uses_correction = True

    @property
    def values(self) -> str:
        return "class" if self.binarize_at is None else f"ge:{self.binarize_at}"

    @property
    def n_classes(self) -> int:
        return len(self.hist) - 1

    @property
    def kernel(self) -> Callable[..., kernels.RowStats]:
        return kernels.local_step_row

    def init_params(self) -> np.ndarray:
        if self.fixed_delta is not None:
            return np.asarray(self.fixed_delta, dtype=np.float64)
        return init_delta(np.asarray(self.hist))

    def kernel_args(self, delta: np.ndarray) -> tuple[Any, ...]:
        return (delta, self.approx)

    def update_params(self, delta: np.ndarray, small: np.ndarray, total: float) -> np.ndarray:
        """Step 2: Delta from the last local step's per-class sums; ``total`` = sum_all lambda."""
        if self.fixed_delta is not None:
            return delta
        en, lam, _, _ = kernels.split_ordinal_small(small)
        return update_delta(en, lam, total)

    def rate_scale(self, delta: np.ndarray) -> float:
        return float(theta_from_delta(delta)[0])

    def gap(self, delta: np.ndarray) -> np.ndarray:
        return gap_from_delta(delta)

    def elbo(self, delta: np.ndarray, small: np.ndarray, total: float) -> tuple[float, float]:
        """(reported ELBO, ascended bound) minus the gamma terms, from the new local step."""
        _, lam, elbo_loc, bound_loc = kernels.split_ordinal_small(small)
        rest = -self.rate_scale(delta) * total + float(self.gap(delta) @ lam)
        return elbo_loc + rest, bound_loc + rest

    def describe(self, delta: np.ndarray) -> dict[str, Any]:
        return {"delta": delta.tolist(), "theta": theta_from_delta(delta).tolist()}

    def summary(self, delta: np.ndarray) -> str:
        return f"delta[1..V] min {delta[1:].min():.3g} max {delta[1:].max():.3g}"

    @property
    def small_size(self) -> int:
        """The length of the summed local statistics (:func:`kernels.ordinal_small`)."""
        return 2 * len(self.hist) + 2

    def params_problem(self, value: Any) -> str | None:
        """What makes ``value`` (read back as JSON) no Delta of this family, or None: V + 1
        finite decrements >= 0, ``delta[0] = 0``, a positive sum (theta_0 > 0); the fixed Delta
        when the family keeps one."""
        n = len(self.hist)
        ok = isinstance(value, list) and len(value) == n and all(_finite(x) for x in value)
        if not ok or value[0] != 0.0 or min(value) < 0.0 or not sum(value) > 0.0:
            return f"{n} finite decrements >= 0 with delta[0] = 0 and a positive sum"
        if self.fixed_delta is not None and tuple(value) != self.fixed_delta:
            return f"the fixed Delta {list(self.fixed_delta)}"
        return None

    def to_json(self, delta: np.ndarray) -> list[float]:
        return delta.tolist()

    def from_json(self, value: list[float]) -> np.ndarray:
        return np.asarray(value, dtype=np.float64)


@dataclass(frozen=True)
class DcPFFamily:
    """dcPF with the logarithmic element distribution (docs/design.md §5).

    ``values`` is "raw" for count stores (the counts themselves) and "class" otherwise.
    ``p`` is the starting value (0 and 1 are the fixed limits PF-on-counts / PF-on-binary);
    ``update_p`` runs 10 Newton steps per iteration, kept only when they improve.
    """

    values: str = "raw"
    p: float = 0.5
    t: float = 1.0
    update_p: bool = True

    name = "dcpf"
    uses_correction = False

    @property
    def kernel(self) -> Callable[..., kernels.RowStats]:
        return dcpf.local_step_row

    def init_params(self) -> float:
        return float(self.p)

    def kernel_args(self, p: float) -> tuple[Any, ...]:
        return (p, self.t)

    def update_params(self, p: float, small: np.ndarray, total: float) -> float:
        if not self.update_p or p in (0.0, 1.0):
            return p
        return dcpf.update_p(p, float(small[0]), float(small[1]))

    def rate_scale(self, p: float) -> float:
        return self.t

    def gap(self, p: float) -> None:
        return None

    def elbo(self, p: float, small: np.ndarray, total: float) -> tuple[float, float]:
        value = float(small[2]) - self.t * total
        return value, value

    def describe(self, p: float) -> dict[str, Any]:
        return {"p": p, "t": self.t}

    def summary(self, p: float) -> str:
        return f"p {p:.6g}"

    @property
    def small_size(self) -> int:
        """The length of the summed local statistics ``[sum E[n], sum y, local bound]``."""
        return 3

    def params_problem(self, value: Any) -> str | None:
        """What makes ``value`` (read back as JSON) no p of dcPF, or None."""
        return None if _finite(value) and 0.0 <= value <= 1.0 else "a number in [0, 1]"

    def to_json(self, p: float) -> float:
        return float(p)

    def from_json(self, value: float) -> float:
        return float(value)


Family = OrdinalFamily | DcPFFamily


def _finite(value: Any) -> bool:
    """A finite real number (JSON's int or float, not a bool)."""
    return type(value) in (int, float) and math.isfinite(value)
