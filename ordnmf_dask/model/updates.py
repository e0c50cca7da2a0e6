"""Global CAVI updates of one factor chunk (rows of W, or rows of H)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ordnmf_dask.model.gamma import gamma_update
from ordnmf_dask.model.sizes import held_bytes


@dataclass(frozen=True)
class FactorChunk:
    """Variational state of a contiguous range of rows of W (or H).

    mean : (n, K) E[x]; geo : (n, K) exp(E[log x]) (at a random or warm-start initialization:
    the draws themselves, docs/design.md §2); shape : (n, K) Gamma posterior shape and
    prior_rate : (n, 1) the empirical-Bayes rate of this update (both None at init);
    elbo : this chunk's prior/posterior ELBO term. The posterior rate and E[log x] are derived
    (``rate``, ``log_mean``): the passes need only ``mean`` and ``geo``, and not keeping the other
    two saves two (n, K) arrays per chunk on the workers.
    """

    __sizeof__ = held_bytes  # what Dask counts for memory and transfers

    mean: np.ndarray
    geo: np.ndarray
    shape: np.ndarray | None = None
    prior_rate: np.ndarray | None = None
    elbo: float = 0.0

    @classmethod
    def initial(cls, mean: np.ndarray) -> FactorChunk:
        """A chunk before any update: the draws serve as both E[x] and exp(E[log x])."""
        return cls(mean=mean, geo=mean)

    @property
    def log_mean(self) -> np.ndarray:
        """(n, K) E[log x] = log(geo)."""
        return np.log(self.geo)

    @property
    def rate(self) -> np.ndarray | None:
        """(n, K) Gamma posterior rate = shape / mean (None at init)."""
        return None if self.shape is None else self.shape / self.mean

    @property
    def summary(self) -> np.ndarray:
        """(K + 1,) vector [column sums of E[x], elbo]: what travels to the client."""
        return np.append(self.mean.sum(axis=0), self.elbo)


def empirical_bayes_rate(alpha: float, mean: np.ndarray) -> np.ndarray:
    """Exact M-step of the per-row prior rate: ``alpha / mean_k E[x_k]``, shape (n, 1)."""
    return alpha / mean.mean(axis=1, keepdims=True)


def update_chunk(
    old: FactorChunk,
    alpha: float,
    shape_stat: np.ndarray,
    theta0_colsum: np.ndarray,
    correction: np.ndarray | None,
) -> FactorChunk:
    """Gamma update of one chunk (docs/design.md §2 steps 1 and 3/4).

    Parameters
    ----------
    old : the chunk before the update (its mean gives the empirical-Bayes rate).
    shape_stat : (n, K) SW (or SH) from the previous local step.
    theta0_colsum : (K,) theta_0 times the column sums of the other factor's E[.].
    correction : (n, K) sparse rate correction sum_nz G_y E[other], or None (none, dcPF).
    """
    k = old.mean.shape[1]
    f64 = np.ascontiguousarray
    corr = np.empty((0, k)) if correction is None else f64(correction, dtype=np.float64)
    n = old.mean.shape[0]
    mean, geo, shape = (np.empty((n, k)) for _ in range(3))
    beta, elbo = gamma_update(
        float(alpha),
        f64(old.mean, dtype=np.float64),
        f64(shape_stat, dtype=np.float64),
        f64(theta0_colsum, dtype=np.float64),
        corr,
        mean,
        geo,
        shape,
    )
    return FactorChunk(mean, geo, shape, beta, float(elbo))
