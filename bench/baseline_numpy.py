"""The per-block kernels as they were before the numba rewrite (numpy einsum + scipy SpMM).

Kept only as the baseline that ``bench/kernels.py`` times against the fused numba kernels of
``ordnmf_dask.model.kernels``; nothing in the package imports it. Same signatures and results.
"""

from __future__ import annotations

import numpy as np
from scipy.special import digamma, gammaln

from ordnmf_dask.model.kernels import CsrBlock, LocalStats, ordinal_small

_CHUNK = 1 << 16  # nonzeros per SDDMM slab: bounds temporaries to _CHUNK x K floats


def sddmm(rows: np.ndarray, cols: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[j] = a[rows[j]] . b[cols[j]]`` (float64, shape (nnz,)), in slabs of _CHUNK."""
    out = np.empty(rows.shape[0])
    for start in range(0, rows.shape[0], _CHUNK):
        stop = start + _CHUNK
        out[start:stop] = np.einsum("ij,ij->i", a[rows[start:stop]], b[cols[start:stop]])
    return out


def expected_n(x: np.ndarray) -> np.ndarray:
    """Mean of ZTP(x): ``x / (1 - exp(-x))``, computed stably, equal to 1 at x = 0."""
    out = np.ones_like(x)
    pos = x > 0
    out[pos] = x[pos] / -np.expm1(-x[pos])
    return out


def log_expm1(x: np.ndarray) -> np.ndarray:
    """``log(exp(x) - 1)`` for x > 0 without overflow."""
    return x + np.log(-np.expm1(-x))


def local_step(
    block: CsrBlock,
    gw: np.ndarray,
    gh: np.ndarray,
    ew: np.ndarray,
    eh: np.ndarray,
    delta: np.ndarray,
    approx: bool,
) -> LocalStats:
    """Local CAVI step on one block (docs/design.md §2).

    Parameters
    ----------
    gw, gh : (n_rows, K), (n_cols, K) geometric means exp(E[log W]), exp(E[log H]).
    ew, eh : (n_rows, K), (n_cols, K) arithmetic means E[W], E[H] (for the Delta statistics).
    delta : (V + 1,) threshold decrements.
    approx : q(n) = delta_1 (E[n] = 1, "PF on binarized data"); the returned bound is still
        the local ELBO sum log(expm1(Lambda Delta_y)), as in the published code.
    """
    n_classes = delta.shape[0] - 1
    lam_geo = sddmm(block.rows, block.cols, gw, gh)
    x = lam_geo * delta[block.y]
    en = np.ones_like(x) if approx else expected_n(x)
    ratio = block.matrix(en / lam_geo)
    sw = gw * (ratio @ gh)
    sh = gh * (ratio.T @ gw)
    lam = sddmm(block.rows, block.cols, ew, eh)
    elbo = float(log_expm1(x).sum())
    small = ordinal_small(
        np.bincount(block.y, weights=en, minlength=n_classes + 1),
        np.bincount(block.y, weights=lam, minlength=n_classes + 1),
        elbo,
        float(np.log(x).sum()) if approx else elbo,
    )
    return LocalStats(sw, sh, small)


def row_correction(block: CsrBlock, gap: np.ndarray, eh: np.ndarray) -> np.ndarray:
    """``out[u] = sum_{i: y_ui > 0} G_{y_ui} E[h_i]``, shape (n_rows, K): the sparse W-rate term."""
    return block.matrix(gap[block.y]) @ eh


def col_correction(block: CsrBlock, gap: np.ndarray, ew: np.ndarray) -> np.ndarray:
    """``out[i] = sum_{u: y_ui > 0} G_{y_ui} E[w_u]``, shape (n_cols, K): the sparse H-rate term."""
    return block.matrix(gap[block.y]).T @ ew


def dcpf_local_step(
    block: CsrBlock,
    gw: np.ndarray,
    gh: np.ndarray,
    ew: np.ndarray,
    eh: np.ndarray,
    p: float,
    t: float,
) -> LocalStats:
    """Local step of dcPF-Log on one block; ``block.y`` holds the counts (float64).

    Returns SW, SH and ``small = [sum E[n], sum y, local bound]`` where the bound is
    ``-sum log y! + (sum y) log p + sum [lgamma(y + r) - lgamma(r)]`` for 0 < p < 1,
    ``-sum log y! + sum y log s`` for p = 0 and ``sum log s`` for p = 1 (s = t Lambda).
    ``ew``, ``eh`` are unused (the rates have no sparse correction) but keep one signature.
    """
    y = block.y.astype(np.float64)
    lam_geo = sddmm(block.rows, block.cols, gw, gh)
    s = t * lam_geo
    if p == 0.0:
        en = y
        elbo = float(-gammaln(y + 1).sum() + (y * np.log(s)).sum())
    elif p == 1.0:
        en = np.ones_like(y)
        elbo = float(np.log(s).sum())
    else:
        r = s / -np.log1p(-p)
        en = np.ones_like(y)
        many = y > 1
        en[many] = r[many] * (digamma(y[many] + r[many]) - digamma(r[many]))
        elbo = float(
            -gammaln(y + 1).sum() + y.sum() * np.log(p) + (gammaln(y + r) - gammaln(r)).sum()
        )
    ratio = block.matrix(en / lam_geo)
    sw = gw * (ratio @ gh)
    sh = gh * (ratio.T @ gw)
    return LocalStats(sw, sh, np.array([en.sum(), y.sum(), elbo]))
