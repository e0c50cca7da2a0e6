"""Gamma variational factors: moments, entropy and the prior/posterior ELBO term.

All distributions are parametrised by shape ``a`` and rate ``b`` (mean a / b).
"""

from __future__ import annotations

import math

import numpy as np

from ordnmf_dask.model.kernels import jit

_jit = jit(fastmath=False, error_model="numpy")


def gamma_moments(shape: np.ndarray, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(E[x], E[log x])`` of Gamma(shape, rate), elementwise."""
    from scipy.special import digamma  # here: scipy.special is slow to import

    return shape / rate, digamma(shape) - np.log(rate)


_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

# The asymptotic series at x >= ASYMPTOTIC (truncation < 5e-17), as coefficients of f^k,
# f = 1 / x^2, k = 0, 1, ...:
#   psi(x) = log x - 1/(2x) - f * sum_k PSI_SERIES[k] f^k        (B_2k / (2k)),
#   lgamma(x) = (x - 1/2) log x - x + log(2 pi) / 2 + (1/x) sum_k LGAMMA_SERIES[k] f^k
#                                                                  (B_2k / (2k (2k - 1))).
ASYMPTOTIC = 10.0
PSI_SERIES = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)
LGAMMA_SERIES = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)


@_jit
def _horner(coefs: tuple[float, ...], f: float) -> float:
    """sum_k coefs[k] f^k."""
    out = coefs[-1]
    for j in range(len(coefs) - 2, -1, -1):
        out = coefs[j] + f * out
    return out


SHIFTS = 10  # x > 0 reaches ASYMPTOTIC in at most this many unit steps


@jit(fastmath=False, error_model="numpy", inline="always")
def _shift(x: float) -> tuple[float, float, float]:
    """``(x + n, num, den)`` with n the unit steps that take x > 0 to ASYMPTOTIC or above,
    den = prod_{i<n} (x + i) and num / den = sum_{i<n} 1 / (x + i). Always SHIFTS steps, each a
    select, so that a loop over x vectorizes (a data-dependent while loop does not)."""
    num, den = 0.0, 1.0
    for _ in range(SHIFTS):
        low = x < ASYMPTOTIC
        num = num * x + den if low else num
        den = den * x if low else den
        x = x + 1.0 if low else x
    return x, num, den


@jit(fastmath=False, error_model="numpy", inline="always")
def _asymptotic(x: float, num: float, den: float, x0: float) -> tuple[float, float]:
    """``(digamma(x0), lgamma(x0) + log(den))`` from ``_shift(x0)``: psi(x0) = psi(x) - num / den
    and lgamma(x0) = lgamma(x) - log(den), with the asymptotic series up to x^-14 for psi and
    Stirling's series up to x^-13 for lgamma (truncation < 5e-17). The log of den is left to
    the caller, who may take it of a product of many. NaN for x0 <= 0 or NaN."""
    if not x0 > 0.0:
        return math.nan, math.nan
    f = 1.0 / (x * x)
    log_x = math.log(x)
    psi = log_x - 0.5 / x - _horner(PSI_SERIES, f) * f - num / den
    stirling = _horner(LGAMMA_SERIES, f)
    return psi, (x - 0.5) * log_x - x + _HALF_LOG_2PI + stirling / x


@_jit
def digamma_lgamma(x: float) -> tuple[float, float]:
    """``(digamma(x), lgamma(x))`` for x > 0, sharing one shift and one log (:func:`_shift`,
    :func:`_asymptotic`). digamma to ~3e-15 relative of scipy's; lgamma to ~1e-14 absolute (all
    the ELBO needs: it is summed). NaN for x <= 0 or NaN."""
    xs, num, den = _shift(x)
    psi, lgam = _asymptotic(xs, num, den, x)
    return psi, lgam - math.log(den)


# a running product is folded into a sum of logs when it leaves [1 / PRODUCT_RANGE,
# PRODUCT_RANGE] (or is not finite and positive): one log per ~K entries instead of per entry
PRODUCT_RANGE = 1e150


@_jit
def _fold(total: float, product: float) -> tuple[float, float]:
    """``(total, product)`` with the product folded into the sum of logs when out of range."""
    if not 1.0 / PRODUCT_RANGE < product < PRODUCT_RANGE:
        return total + math.log(product), 1.0
    return total, product


@_jit
def gamma_update(  # noqa: ANN201
    alpha, old_mean, shape_stat, rate_base, correction, mean, geo, shape  # noqa: ANN001
):
    """Fused Gamma update of n rows (docs/design.md §2 steps 1 and 3/4), one pass.

    alpha : prior shape; old_mean : (n, K) E[x] before the update (empirical-Bayes rate
    beta = alpha / mean_k E[x]); shape_stat : (n, K) SW or SH; rate_base : (K,) theta_0 times the
    other factor's column sums; correction : (n, K) sparse rate term subtracted from the rate,
    or (0, K) for none.

    Writes mean (n, K), geo = exp(E[log x]) = exp(digamma(a)) / b (n, K) and shape (n, K) into
    the arrays given; returns beta (n, 1) and the rows' sum of E[log p(x)] - E[log q(x)]
    (float64). Per entry that term is (alpha - a) digamma(a) - alpha log b - beta a / b +
    alpha log beta - lgamma(alpha) + a + lgamma(a): the logs of the rates and of the digamma
    shift's denominators are taken of their running products, per row, so that an entry costs
    one log and one exp. Per row, one vector loop computes the shapes, rates, means and digamma
    shifts, and a second the logs, exps and the bound.
    """
    n, k = shape_stat.shape
    has_corr = correction.shape[0] == n and n > 0
    beta = np.empty((n, 1))
    const = -math.lgamma(alpha)
    total = 0.0
    buf = np.empty((4, k))  # per entry of a row: rate, shifted shape, num, den (_shift)
    rate, shifted, num, den = buf[0], buf[1], buf[2], buf[3]
    for u in range(n):
        m = 0.0
        for q in range(k):
            m += old_mean[u, q]
        b0 = alpha / (m / k)
        beta[u, 0] = b0
        prior_const = alpha * math.log(b0) + const
        for q in range(k):  # vectorized: no calls, no branches
            a = alpha + shape_stat[u, q]
            b = b0 + rate_base[q]
            if has_corr:
                b -= correction[u, q]
            mean[u, q] = a / b
            shape[u, q] = a
            rate[q] = b
            shifted[q], num[q], den[q] = _shift(a)
        row = 0.0
        log_rates, rates, log_dens, dens = 0.0, 1.0, 0.0, 1.0
        for q in range(k):
            a, b = shape[u, q], rate[q]
            dg, lg_shifted = _asymptotic(shifted[q], num[q], den[q], a)
            geo[u, q] = math.exp(dg) / b
            row += (alpha - a) * dg - b0 * mean[u, q] + prior_const + a + lg_shifted
            # a rate <= 0 (corrupt statistics) makes the term NaN, as its log would (a product
            # of two negative rates would not)
            log_rates, rates = _fold(log_rates, rates * b if b > 0.0 else math.nan)
            log_dens, dens = _fold(log_dens, dens * den[q] if a > 0.0 else math.nan)
        log_rates += math.log(rates)
        log_dens += math.log(dens)
        total += row - alpha * log_rates - log_dens
    return beta, total
