"""dcPF with the logarithmic element distribution (Basbug & Engelhardt 2016; Gouvert et al. 2019).

Counts y_ui = sum of n_ui i.i.d. Log(p) elements, n_ui ~ Poisson(t Lambda_ui): y is negative
binomial NB(r = t lambda / -log(1 - p), 1 - p). The variational factors are those of PF plus
q(n_ui); the published local step and bound (docs/design.md §5) are implemented here as pure
functions of one block. Limits: p = 0 is PF on the raw counts (E[n] = y), p = 1 is PF on binary
data (E[n] = 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ordnmf_dask.model.gamma import ASYMPTOTIC, LGAMMA_SERIES, PSI_SERIES
from ordnmf_dask.model.kernels import (
    SLAB,
    CsrBlock,
    LocalStats,
    RowStats,
    as_f64,
    sddmm,
    spmm_pair,
)


def local_step_row(
    blocks: Iterable[CsrBlock],
    gw: np.ndarray,
    ghs: Sequence[np.ndarray],
    ew: np.ndarray,
    ehs: Sequence[np.ndarray],
    p: float,
    t: float,
) -> RowStats:
    """Local step of dcPF-Log over blocks (r, c) of one user-block r for a run of item-blocks c;
    ``block.y`` holds the counts (float64).

    Returns SW (n_rows, K) summed over the blocks, SH per block (n_cols_c, K) and
    ``small = [sum E[n], sum y, local bound]`` where the bound is
    ``-sum log y! + (sum y) log p + sum [lgamma(y + r) - lgamma(r)]`` for 0 < p < 1,
    ``-sum log y! + sum y log s`` for p = 0 and ``sum log s`` for p = 1 (s = t Lambda).
    ``ew``, ``ehs`` are unused (the rates have no sparse correction) but keep one signature.

    Lambda is a compiled SDDMM (nnz,), E[n] and the bound use scipy's digamma / gammaln on slabs
    of ``SLAB`` nonzeros (float64 sums), SW / SH one compiled SpMM pass (no nnz x K array).
    """
    gw = as_f64(gw)
    sw = np.zeros(gw.shape)
    sums = np.zeros(3)  # sum E[n], sum y, bound
    sh = []
    for block, gh in zip(blocks, ghs, strict=True):
        gh = as_f64(gh)
        lam_geo = sddmm(block.rows, block.cols, gw, gh)
        ratio = np.empty_like(lam_geo)
        for start in range(0, block.nnz, SLAB):
            part = slice(start, start + SLAB)
            en, elbo = _counts_terms(block.y[part].astype(np.float64), t * lam_geo[part], p)
            ratio[part] = en / lam_geo[part]
            sums += (en.sum(), block.y[part].sum(dtype=np.float64), elbo)
        part_sh = spmm_pair(block, ratio, gw, gh, sw)
        part_sh *= gh
        sh.append(part_sh)
    sw *= gw
    return RowStats(sw, tuple(sh), sums)


def local_step(
    block: CsrBlock,
    gw: np.ndarray,
    gh: np.ndarray,
    ew: np.ndarray,
    eh: np.ndarray,
    p: float,
    t: float,
) -> LocalStats:
    """:func:`local_step_row` of a single block: SW (n_rows, K), SH (n_cols, K), small."""
    row = local_step_row([block], gw, [gh], ew, [eh], p, t)
    return LocalStats(row.sw, row.sh[0], row.small)


def _counts_terms(y: np.ndarray, s: np.ndarray, p: float) -> tuple[np.ndarray, float]:
    """E[n] (n,) and the bound's sum over these nonzeros, for counts y and rates s = t Lambda."""
    from scipy.special import gammaln  # here: scipy.special is slow to import (OrdNMF needs none)

    if p == 0.0:
        return y, float(-gammaln(y + 1).sum() + (y * np.log(s)).sum())
    if p == 1.0:
        return np.ones_like(y), float(np.log(s).sum())
    r = s / -np.log1p(-p)
    d_lgamma, d_digamma = rising_log_terms(y, r)
    en = np.where(y > 1, r * d_digamma, 1.0)
    elbo = -gammaln(y + 1).sum() + y.sum() * np.log(p) + d_lgamma.sum()
    return en, float(elbo)


def _series(coefs: tuple[float, ...], f: np.ndarray) -> np.ndarray:
    """sum_k coefs[k] f^k (Horner), elementwise."""
    out = np.full_like(f, coefs[-1])
    for c in coefs[-2::-1]:
        out = c + f * out
    return out


def rising_log_terms(y: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lgamma(r + y) - lgamma(r), digamma(r + y) - digamma(r))`` elementwise, y >= 0, r > 0.

    Accurate to the round-off of the differences themselves at any r: where r >= 10 both are
    the differences of the asymptotic series of :mod:`.gamma`, term by term, with
    log(r + y) - log(r) as log1p(y / r). Subtracting scipy's values instead loses everything at
    large r (r = t Lambda / -log(1 - p) grows as 1 / p: at p = 1e-12, lgamma(r) ~ 1e13 leaves no
    digit of a difference ~ y log r, and E[n] = r (digamma(r + y) - digamma(r)) may exceed y).
    """
    from scipy.special import digamma, gammaln

    y, r = np.broadcast_arrays(np.asarray(y, dtype=np.float64), np.asarray(r, dtype=np.float64))
    d_lgamma, d_digamma = np.empty(y.shape), np.empty(y.shape)
    small = r < ASYMPTOTIC
    ys, rs = y[small], r[small]
    d_lgamma[small] = gammaln(rs + ys) - gammaln(rs)
    d_digamma[small] = digamma(rs + ys) - digamma(rs)
    big = ~small
    yb, rb = y[big], r[big]
    x = rb + yb
    log_ratio = np.log1p(yb / rb)  # log(x) - log(r)
    fx, fr = 1.0 / (x * x), 1.0 / (rb * rb)
    d_lgamma[big] = (
        (rb - 0.5) * log_ratio
        + yb * np.log(x)
        - yb
        + _series(LGAMMA_SERIES, fx) / x
        - _series(LGAMMA_SERIES, fr) / rb
    )
    d_digamma[big] = (
        log_ratio
        + yb / (2.0 * rb * x)
        + fr * _series(PSI_SERIES, fr)
        - fx * _series(PSI_SERIES, fx)
    )
    return d_lgamma, d_digamma


def update_p(p: float, s_en: float, s_y: float, steps: int = 10) -> float:
    """Newton steps on ``s_y log p - s_en log(-log(1 - p))``, as in the published code.

    Its stationarity condition f(p) = (1 - p)/p (-log(1 - p)) = s_en / s_y has a left side that
    falls from 1 (p -> 0) to 0 (p -> 1). When s_en >= s_y (every E[n] = y, as at p = 0), the
    objective rises all the way to p -> 0: the result is the Poisson limit p = 0 (a fixed point:
    E[n] = y there). Otherwise each Newton step is halved until p stays in [0, 1]; the result is
    kept only if it improves the objective, otherwise ``p`` is returned unchanged.
    """

    def cost(q: float) -> float:
        return s_y * np.log(q) - s_en * np.log(-np.log1p(-q))

    if s_en >= s_y:
        return 0.0
    ratio = s_en / s_y
    q = p
    for _ in range(steps):
        with np.errstate(divide="ignore", invalid="ignore"):
            f = (1.0 - np.float64(q)) / q * -np.log1p(-q)
            step = (f - ratio) / _f_prime(q)
        if not np.isfinite(step):  # q reached 0 exactly
            break
        while q - step < 0 or q - step > 1:
            step /= 2
        q -= step
    return q if 0.0 < q < 1.0 and cost(q) > cost(p) else p


def _f_prime(q: float) -> float:
    """d/dq of (1 - q)/q (-log(1 - q)), i.e. (q + log(1 - q)) / q^2; by its series below 1e-4,
    where the two terms of the numerator cancel (-1/2 - q/3 - q^2/4 - ..., to 1e-24)."""
    if q < 1e-4:
        return -(0.5 + q * (1 / 3 + q * (1 / 4 + q * (1 / 5 + q * (1 / 6 + q / 7)))))
    return (q + np.log1p(-q)) / q**2


def count_loglik(
    y: np.ndarray, lam: np.ndarray, p: float, t: float, edges: np.ndarray | None = None
) -> np.ndarray:
    """log P(y | y > 0) under dcPF-Log with rate ``t lam`` (exact, no truncated support).

    ``0 <= p < 1``; at p = 0 the law is Poisson(t lam). (p = 1 models binary data only.)

    With ``edges`` (the store's count thresholds, (V,)), ``y`` are classes 1..V and the class
    probability is the NB mass of counts in (edges[v-1], edges[v]] (edges[V] = +inf), as in the
    paper's Taste Profile evaluation; otherwise ``y`` are counts and the NB pmf is used.
    """
    if p == 0.0:  # the limit is PF on the counts: Poisson(t lam)
        from scipy.stats import poisson

        dist = poisson(t * lam)
    else:
        from scipy.stats import nbinom  # here: scipy.stats is slow to import

        dist = nbinom(t * lam / -np.log1p(-p), 1.0 - p)
    log_pos = np.log(-np.expm1(-t * lam))  # P(y > 0) = 1 - (1 - p)^r = 1 - exp(-t lam)
    if edges is None:
        return dist.logpmf(y) - log_pos
    bounds = np.append(np.floor(np.asarray(edges, dtype=np.float64)), np.inf)
    lo, hi = bounds[y.astype(np.int64) - 1], bounds[y.astype(np.int64)]
    upper_tail = dist.cdf(lo) > 0.5
    with np.errstate(divide="ignore"):
        mass = np.where(upper_tail, dist.sf(lo) - dist.sf(hi), dist.cdf(hi) - dist.cdf(lo))
        return np.log(mass) - log_pos
