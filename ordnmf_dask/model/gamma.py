"""Gamma variational factors: moments, entropy and the prior/posterior ELBO term.

All distributions are parametrised by shape ``a`` and rate ``b`` (mean a / b).
"""

from __future__ import annotations

import math

import numpy as np

from ordnmf_dask.model.kernels import LN2_HI, LN2_LO, exp_neg_split, jit

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


@_jit
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


@_jit
def _asymptotic(x: float, num: float, den: float, x0: float) -> tuple[float, float]:
    """``(digamma(x0) - log x, lgamma(x0) - (x - 1/2) log x + log(den))`` from
    ``(x, num, den) = _shift(x0)``: psi(x0) = psi(x) - num / den and lgamma(x0) = lgamma(x) -
    log(den), with the asymptotic series up to x^-14 for psi and Stirling's series up to x^-13
    for lgamma (truncation < 5e-17). The logs are left to the caller. NaN for x0 <= 0 or NaN."""
    if not x0 > 0.0:
        return math.nan, math.nan
    inv = 1.0 / x
    f = inv * inv
    psi = -0.5 * inv - _horner(PSI_SERIES, f) * f - num / den
    return psi, -x + _HALF_LOG_2PI + _horner(LGAMMA_SERIES, f) * inv


@_jit
def digamma_lgamma(x: float) -> tuple[float, float]:
    """``(digamma(x), lgamma(x))`` for x > 0, sharing one shift and one log (:func:`_shift`,
    :func:`_asymptotic`). digamma to ~3e-15 relative of scipy's; lgamma to ~1e-14 absolute (all
    the ELBO needs: it is summed). NaN for x <= 0 or NaN."""
    xs, num, den = _shift(x)
    psi, lgam = _asymptotic(xs, num, den, x)
    log_x = math.log(xs)
    return psi + log_x, lgam + (xs - 0.5) * log_x - math.log(den)


# log x = e ln 2 + log m for x = m 2^e, m in [sqrt(1/2), sqrt(2)), as fdlibm's log: with
# f = m - 1 and s = f / (2 + f), log m = f - (f^2 / 2 - s (f^2 / 2 + R)), R = sum_n>=1
# 2 s^2n / (2n + 1) (|s| <= 0.172: to s^20, truncation < 1e-17 relative). The exponent and
# mantissa are read from the bits (:func:`_log_split`); subnormal x is scaled by 2^54 first.
_LOG_SERIES = tuple(2.0 / (2 * n + 1) for n in range(1, 11))  # R = z sum_n c_n z^(n-1), z = s^2
_FRACTION = (1 << 52) - 1
_ONE_BITS = 1023 << 52  # the bits of 1.0
_MIN_NORMAL = 2.2250738585072014e-308
_TWO54 = 2.0**54
_SQRT2 = math.sqrt(2.0)


@_jit
def _log_input(x: float) -> float:
    """What :func:`_log_split` reads the bits of: x, scaled by 2^54 when subnormal."""
    return x * _TWO54 if x < _MIN_NORMAL else x


@_jit
def _log_split(bits: int, x: float) -> tuple[float, int]:
    """``(e, mantissa bits)`` of ``_log_input(x)`` (whose int64 bits are ``bits``): x =
    m 2^e with m in [1, 2) the float of the returned bits."""
    e = float((bits >> 52) - 1023) - (54.0 if x < _MIN_NORMAL else 0.0)
    return e, (bits & _FRACTION) | _ONE_BITS


@_jit
def _log_finish(e: float, m: float, x: float) -> float:
    """``log x`` from :func:`_log_split` (m the float of its bits) to ~1 ulp; -inf at 0, inf
    at inf, NaN for x < 0 or NaN, as libm's log. Branch-free: a loop of these vectorizes."""
    high = m > _SQRT2
    m = m * 0.5 if high else m
    e = e + 1.0 if high else e
    f = m - 1.0
    hfsq = 0.5 * f * f
    s = f / (2.0 + f)
    z = s * s
    r = z * _horner(_LOG_SERIES, z)
    out = e * LN2_HI - ((hfsq - (s * (hfsq + r) + e * LN2_LO)) - f)
    out = out if x < math.inf else x
    return out if x > 0.0 else (-math.inf if x == 0.0 else math.nan)


@_jit
def gamma_update(  # noqa: ANN201
    alpha,
    old_mean,
    shape_stat,
    rate_base,
    correction,
    mean,
    geo,
    shape,  # noqa: ANN001
):
    """Fused Gamma update of n rows (docs/design.md §2 steps 1 and 3/4), one pass.

    alpha : prior shape; old_mean : (n, K) E[x] before the update (empirical-Bayes rate
    beta = alpha / mean_k E[x]); shape_stat : (n, K) SW or SH; rate_base : (K,) theta_0 times the
    other factor's column sums; correction : (n, K) sparse rate term subtracted from the rate,
    or (0, K) for none.

    Writes mean (n, K), geo = exp(E[log x]) = exp(digamma(a)) / b (n, K) and shape (n, K) into
    the arrays given; returns beta (n, 1) and the rows' sum of E[log p(x)] - E[log q(x)]
    (float64). Per entry that term is (alpha - a) digamma(a) - alpha log b - beta a / b +
    alpha log beta - lgamma(alpha) + a + lgamma(a). Per row, three vector loops (no calls, no
    branches): shapes, rates, means and the digamma shifts (:func:`_shift`); the bits of the
    three logs per entry (shifted shape, rate, the shift's denominator); digamma, lgamma, the
    logs, exp(digamma(a)) = x exp(digamma(a) - log x) with x the shifted shape, and the term.
    """
    n, k = shape_stat.shape
    has_corr = correction.shape[0] == n and n > 0
    beta = np.empty((n, 1))
    const = -math.lgamma(alpha)
    total = 0.0
    # per entry of a row: rate, shifted shape, den, num (_shift), term of the bound; the inputs
    # of the logs of the first three (_log_input), and their exponents and mantissas
    buf = np.empty((14, k))
    bits = buf.view(np.int64)
    rate, shifted, den, num, term = buf[0], buf[1], buf[2], buf[3], buf[4]
    for u in range(n):
        m = 0.0
        for q in range(k):
            m += old_mean[u, q]
        b0 = alpha / (m / k)
        beta[u, 0] = b0
        prior_const = alpha * math.log(b0) + const
        for q in range(k):
            a = alpha + shape_stat[u, q]
            b = b0 + rate_base[q]
            if has_corr:
                b -= correction[u, q]
            mean[u, q] = a / b
            shape[u, q] = a
            rate[q] = b
            x, num[q], d = _shift(a)
            shifted[q], den[q] = x, d
            buf[5, q], buf[6, q], buf[7, q] = _log_input(b), x, _log_input(d)
        for j in range(3):
            for q in range(k):
                buf[8 + j, q], bits[11 + j, q] = _log_split(bits[5 + j, q], buf[j, q])
        for q in range(k):
            a, b, x = shape[u, q], rate[q], shifted[q]
            log_b = _log_finish(buf[8, q], buf[11, q], b)
            log_x = _log_finish(buf[9, q], buf[12, q], x)
            log_den = _log_finish(buf[10, q], buf[13, q], den[q])
            w, lg_shifted = _asymptotic(x, num[q], den[q], a)  # digamma(a) - log x
            s, p = exp_neg_split(-w)
            geo[u, q] = x * (s + s * p) / b
            term[q] = (
                (alpha - a) * (log_x + w)
                - b0 * mean[u, q]
                + prior_const
                + a
                + (lg_shifted + (x - 0.5) * log_x)
                - alpha * log_b
                - log_den
            )
        row = 0.0
        for q in range(k):
            row += term[q]
        total += row
    return beta, total
