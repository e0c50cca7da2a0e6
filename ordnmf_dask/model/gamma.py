"""Gamma variational factors: moments, entropy and the prior/posterior ELBO term.

All distributions are parametrised by shape ``a`` and rate ``b`` (mean a / b).
"""

from __future__ import annotations

import numpy as np
from scipy.special import digamma, gammaln


def gamma_moments(shape: np.ndarray, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(E[x], E[log x])`` of Gamma(shape, rate), elementwise."""
    return shape / rate, digamma(shape) - np.log(rate)


def gamma_elbo_term(
    alpha: float,
    beta: np.ndarray,
    shape: np.ndarray,
    rate: np.ndarray,
    mean: np.ndarray,
    log_mean: np.ndarray,
) -> float:
    """Sum over entries of ``E_q[log p(x)] - E_q[log q(x)]``.

    Parameters
    ----------
    alpha : prior shape (scalar).
    beta : prior rate, shape (n, 1) (one rate per row, empirical Bayes).
    shape, rate : posterior parameters, shape (n, K).
    mean, log_mean : E[x] and E[log x] under the posterior, shape (n, K).
    """
    prior = (alpha - 1.0) * log_mean - beta * mean + alpha * np.log(beta) - gammaln(alpha)
    entropy = shape - np.log(rate) + gammaln(shape) + (1.0 - shape) * digamma(shape)
    return float(prior.sum() + entropy.sum())
