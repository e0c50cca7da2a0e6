"""Posterior predictive simulation (docs/design.md §2, "PPC"): pure numpy, one block at a time."""

from __future__ import annotations

import numpy as np
from scipy.stats import nbinom


def sample_ordinal(lam: np.ndarray, theta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Classes y in 0..V with ``P(y <= v | lam) = exp(-lam theta_v)`` (theta: (V + 1,)).

    With e ~ Exp(1): y = #{v < V : lam theta_v > e}, i.e. x = lam / e quantized by the
    thresholds b_v = 1 / theta_v. Returns int64, shape of ``lam``.
    """
    e = rng.exponential(size=lam.shape)
    return (lam[..., None] * theta[None, :-1] > e[..., None]).sum(axis=-1)


def sample_dcpf(
    lam: np.ndarray, p: float, t: float, rng: np.random.Generator, edges: np.ndarray | None
) -> np.ndarray:
    """dcPF-Log counts NB(t lam / -log(1 - p), 1 - p), as classes when ``edges`` are given.

    With the store's count thresholds ``edges`` (V,), class = #{edges < count} (0 for count 0);
    without, the counts themselves. The limits p = 0 (Poisson) and p = 1 (binary) are handled.
    """
    if p == 0.0:
        counts = rng.poisson(t * lam)
    elif p == 1.0:
        counts = (rng.random(lam.shape) > np.exp(-t * lam)).astype(np.int64)
    else:
        counts = nbinom(t * lam / -np.log1p(-p), 1.0 - p).rvs(random_state=rng)
    if edges is None:
        return np.asarray(counts, dtype=np.int64)
    return np.searchsorted(np.asarray(edges, dtype=np.float64), counts, side="left")


def sample_pairs(
    n_rows: int, n_cols: int, budget: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, float]:
    """(rows, cols, weight): every pair of the block when it has at most ``budget`` pairs
    (weight 1), else ``budget`` pairs drawn uniformly with replacement (weight area / budget)."""
    area = n_rows * n_cols
    if area <= budget:
        rows, cols = np.divmod(np.arange(area, dtype=np.int64), n_cols)
        return rows, cols, 1.0
    return rng.integers(0, n_rows, budget), rng.integers(0, n_cols, budget), area / budget
