"""Global CAVI updates of one factor chunk (rows of W, or rows of H)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gamma import gamma_elbo_term, gamma_moments


@dataclass(frozen=True)
class FactorChunk:
    """Variational state of a contiguous range of rows of W (or H).

    mean, log_mean : (n, K) E[x], E[log x]; shape, rate : (n, K) Gamma posterior parameters
    (None right after a random or warm-start initialization); prior_rate : (n, 1) empirical-Bayes
    rate used for this update (None at init); elbo : this chunk's prior/posterior ELBO term.
    """

    mean: np.ndarray
    log_mean: np.ndarray | None
    shape: np.ndarray | None = None
    rate: np.ndarray | None = None
    prior_rate: np.ndarray | None = None
    elbo: float = 0.0

    @property
    def summary(self) -> np.ndarray:
        """(K + 1,) vector [column sums of E[x], elbo]: what travels to the client."""
        return np.append(self.mean.sum(axis=0), self.elbo)

    @property
    def geo_mean(self) -> np.ndarray:
        """exp(E[log x]); at initialization the draws themselves (DESIGN.md section 2)."""
        return self.mean if self.log_mean is None else np.exp(self.log_mean)


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
    """Gamma update of one chunk (DESIGN.md section 2, steps 1 and 3/4).

    Parameters
    ----------
    old : the chunk before the update (its mean gives the empirical-Bayes rate).
    shape_stat : (n, K) SW (or SH) from the previous local step.
    theta0_colsum : (K,) theta_0 times the column sums of the other factor's E[.].
    correction : (n, K) sparse rate correction sum_nz G_y E[other], or None (none, dcPF).
    """
    beta = empirical_bayes_rate(alpha, old.mean)
    shape = alpha + shape_stat
    rate = beta + (theta0_colsum if correction is None else theta0_colsum - correction)
    mean, log_mean = gamma_moments(shape, rate)
    elbo = gamma_elbo_term(alpha, beta, shape, rate, mean, log_mean)
    return FactorChunk(mean, log_mean, shape, rate, beta, elbo)
