"""dcPF with the logarithmic element distribution (Basbug & Engelhardt 2016; Gouvert et al. 2019).

Counts y_ui = sum of n_ui i.i.d. Log(p) elements, n_ui ~ Poisson(t Lambda_ui): y is negative
binomial NB(r = t lambda / -log(1 - p), 1 - p). The variational factors are those of PF plus
q(n_ui); the published local step and bound (DESIGN.md section 5) are implemented here as pure
functions of one block. Limits: p = 0 is PF on the raw counts (E[n] = y), p = 1 is PF on binary
data (E[n] = 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from scipy.special import digamma, gammaln
from scipy.stats import nbinom

from . import arena
from .kernels import _CHUNK, CsrBlock, LocalStats, RowStats, _f64, sddmm, spmm_pair


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
    of ``_CHUNK`` nonzeros (float64 sums), SW / SH one compiled SpMM pass (no nnz x K array).
    """
    gw = _f64(gw)
    sw = arena.zeros(gw.shape)
    sums = np.zeros(3)  # sum E[n], sum y, bound
    sh = []
    for block, gh in zip(blocks, ghs, strict=True):
        gh = _f64(gh)
        lam_geo = sddmm(block.rows, block.cols, gw, gh)
        ratio = np.empty_like(lam_geo)
        for start in range(0, block.nnz, _CHUNK):
            part = slice(start, start + _CHUNK)
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
    if p == 0.0:
        return y, float(-gammaln(y + 1).sum() + (y * np.log(s)).sum())
    if p == 1.0:
        return np.ones_like(y), float(np.log(s).sum())
    r = s / -np.log1p(-p)
    en = np.ones_like(y)
    many = y > 1
    en[many] = r[many] * (digamma(y[many] + r[many]) - digamma(r[many]))
    elbo = -gammaln(y + 1).sum() + y.sum() * np.log(p) + (gammaln(y + r) - gammaln(r)).sum()
    return en, float(elbo)


def update_p(p: float, s_en: float, s_y: float, steps: int = 10) -> float:
    """Newton steps on ``s_y log p - s_en log(-log(1 - p))``, as in the published code.

    Each step is halved until p stays in [0, 1]; the result is kept only if it improves the
    objective, otherwise ``p`` is returned unchanged.
    """

    def cost(q: float) -> float:
        return s_y * np.log(q) - s_en * np.log(-np.log1p(-q))

    ratio = s_en / s_y
    q = p
    for _ in range(steps):
        f = (1.0 - q) / q * -np.log1p(-q)
        grad = np.log1p(-q) / q**2 + 1.0 / q
        with np.errstate(divide="ignore", invalid="ignore"):
            step = (f - ratio) / grad
        if not np.isfinite(step):  # gradient cancelled to 0 near p = 0: stop here
            break
        while q - step < 0 or q - step > 1:
            step /= 2
        q -= step
    return q if 0.0 < q < 1.0 and cost(q) > cost(p) else p


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
