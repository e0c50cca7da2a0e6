"""Per-block numerical kernels: pure functions of numpy arrays, compiled with numba, no Dask.

A block holds the nonzeros of one (user-block, item-block) cell of the grid in CSR order (sorted
by local row, then local column). Every kernel makes one pass over the nonzeros and never builds
an ``nnz x K`` temporary: the ordinal local step computes Lambda (SDDMM with GW, GH), E[n], the
ratio, the SW and SH accumulations (two SpMMs) and the arithmetic-mean lambda of the Delta
statistics in a single fused loop; the rate corrections are one scatter / gather SpMM each.
The fused loops visit the nonzeros by column tiles (rows in order inside a tile) so that the
randomly accessed item-side factor rows stay in cache: ~1.7x over a plain row-wise loop at
K = 50 on 2^21-nonzero blocks (``bench/kernels.py`` measures the whole kernels).

Dtype policy:

- inputs: factors are used as C-contiguous float64 (converted if needed, a no-op for the engine's
  chunks); classes are uint8 (counts float64 for dcPF); local column / row indices int32, the CSR
  row pointer int64;
- arithmetic and every accumulation are float64: the K-dot products (four interleaved partial
  sums), the SW / SH sums, and the O(V) statistics (per-class E[n] and lambda sums, local ELBO),
  which use compensated (Neumaier) summation so that their error does not grow with nnz;
- numba settings: ``fastmath=False`` (IEEE semantics, no reassociation beyond what is written
  here), ``error_model="numpy"`` (x / 0 gives inf / nan as in numpy, no exception), single
  threaded (one Dask worker = one thread), ``cache=True``: compiled once per machine into the
  package's ``__pycache__`` and loaded from there by every later process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from numba import njit

_CHUNK = 1 << 16  # nonzeros per slab where nnz-length temporaries are slabbed (dcPF special funcs)

_TILE_BYTES = 3 << 18  # 768 KiB of one item-side factor table per column tile (fits in L2)

_jit = njit(cache=True, fastmath=False, error_model="numpy", nogil=True)


@dataclass(frozen=True)
class CsrBlock:
    """Nonzeros of one block, CSR-ordered.

    indptr : int64 (n_rows + 1,); cols : int32 (nnz,) local column; rows : int32 (nnz,) local row;
    y : (nnz,) values: uint8 ordinal classes 1..V, or float64 counts for dcPF;
    shape : (n_rows, n_cols).
    """

    indptr: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    y: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def from_coo(
        cls, rows: np.ndarray, cols: np.ndarray, y: np.ndarray, shape: tuple[int, int]
    ) -> CsrBlock:
        """Build from (row, col)-sorted coordinates."""
        counts = np.bincount(rows, minlength=shape[0])
        indptr = np.zeros(shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        return cls(indptr, rows.astype(np.int32), cols.astype(np.int32), y, tuple(shape))

    @property
    def nnz(self) -> int:
        return int(self.cols.shape[0])

    def matrix(self, data: np.ndarray) -> sp.csr_matrix:
        """The block as a CSR matrix with the given values at its nonzeros."""
        return sp.csr_matrix((data, self.cols, self.indptr), shape=self.shape)


@dataclass(frozen=True)
class LocalStats:
    """Partial sums of a local step over one block.

    sw : (n_rows, K) sum_i E[c_uik]; sh : (n_cols, K) sum_u E[c_uik];
    small : the model's O(V) statistics (summed over blocks, sent to the client); for the
    ordinal model see :func:`ordinal_small`.
    """

    sw: np.ndarray
    sh: np.ndarray
    small: np.ndarray


def ordinal_small(
    en_by_class: np.ndarray, lam_by_class: np.ndarray, elbo: float, bound: float
) -> np.ndarray:
    """Pack the ordinal local statistics: ``[en_by_class, lam_by_class, elbo, bound]``.

    en_by_class, lam_by_class : (V + 1,) per-class sums of E[n] and of lambda = E[w].E[h];
    elbo : sum over nonzeros of log(expm1(Lambda Delta_y)) (the reported bound);
    bound : the local term of the bound CAVI ascends: ``elbo`` in exact mode, and
    sum log(Lambda Delta_y) with q(n) = delta_1 (approx mode), where ``elbo`` may decrease.
    """
    return np.concatenate([en_by_class, lam_by_class, [elbo, bound]])


def split_ordinal_small(small: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Inverse of :func:`ordinal_small`."""
    v1 = (len(small) - 2) // 2
    return small[:v1], small[v1 : 2 * v1], float(small[-2]), float(small[-1])


def _f64(a: np.ndarray) -> np.ndarray:
    """C-contiguous float64 view (no copy when it already is one)."""
    return np.ascontiguousarray(a, dtype=np.float64)


# --- compiled loops -----------------------------------------------------------------------------


@_jit
def _dot(a: np.ndarray, u: int, b: np.ndarray, i: int) -> float:
    """``a[u] . b[i]`` with four interleaved float64 partial sums."""
    k = a.shape[1]
    s0 = s1 = s2 = s3 = 0.0
    q = 0
    while q + 4 <= k:
        s0 += a[u, q] * b[i, q]
        s1 += a[u, q + 1] * b[i, q + 1]
        s2 += a[u, q + 2] * b[i, q + 2]
        s3 += a[u, q + 3] * b[i, q + 3]
        q += 4
    while q < k:
        s0 += a[u, q] * b[i, q]
        q += 1
    return (s0 + s1) + (s2 + s3)


@_jit
def _add(total: np.ndarray, comp: np.ndarray, j: int, value: float) -> None:
    """Neumaier-compensated ``total[j] += value`` (``comp[j]`` holds the lost low-order bits)."""
    t = total[j] + value
    if abs(total[j]) >= abs(value):
        comp[j] += (total[j] - t) + value
    else:
        comp[j] += (value - t) + total[j]
    total[j] = t


def _tile_cols(k: int) -> int:
    """Columns per tile: one factor table's tile takes about _TILE_BYTES."""
    return max(64, _TILE_BYTES // (8 * max(k, 1)))


@_jit
def _ordinal_pass(indptr, cols, y, gw, gh, ew, eh, delta, approx, tile):  # noqa: ANN001, ANN202
    """Fused ordinal local step; returns sw (n_rows, K), sh (n_cols, K), small (2 V + 4,).

    The nonzeros are visited by column tiles of ``tile`` columns, rows in order within a tile
    (each row's nonzeros in a tile are a contiguous run of its CSR range, found with a cursor
    per row), so that the item-side rows (GH, E[H], SH) of a tile stay in cache. Per row the
    summation order of SW is the CSR order, as in a plain row-wise SpMM.
    """
    n_rows, k = gw.shape
    n_cols = gh.shape[0]
    v1 = delta.shape[0]
    sw = np.zeros((n_rows, k))
    sh = np.zeros((n_cols, k))
    total = np.zeros(2 * v1 + 2)  # [E[n] by class, lambda by class, elbo, bound]
    comp = np.zeros(2 * v1 + 2)
    cursor = indptr[:-1].copy()
    for c_end in range(tile, n_cols + tile, tile):
        for u in range(n_rows):
            j, end = cursor[u], indptr[u + 1]
            if j == end or cols[j] >= c_end:
                continue
            sw_u, gw_u, ew_u = sw[u], gw[u], ew[u]
            elbo_run = bound_run = 0.0
            while j < end and cols[j] < c_end:
                i = cols[j]
                c = y[j]
                gh_i, eh_i, sh_i = gh[i], eh[i], sh[i]
                # lam_geo = gw_u . gh_i and lam = ew_u . eh_i, four partial sums each
                s0 = s1 = s2 = s3 = t0 = t1 = t2 = t3 = 0.0
                q = 0
                while q + 4 <= k:
                    s0 += gw_u[q] * gh_i[q]
                    s1 += gw_u[q + 1] * gh_i[q + 1]
                    s2 += gw_u[q + 2] * gh_i[q + 2]
                    s3 += gw_u[q + 3] * gh_i[q + 3]
                    t0 += ew_u[q] * eh_i[q]
                    t1 += ew_u[q + 1] * eh_i[q + 1]
                    t2 += ew_u[q + 2] * eh_i[q + 2]
                    t3 += ew_u[q + 3] * eh_i[q + 3]
                    q += 4
                while q < k:
                    s0 += gw_u[q] * gh_i[q]
                    t0 += ew_u[q] * eh_i[q]
                    q += 1
                lam_geo, lam = (s0 + s1) + (s2 + s3), (t0 + t1) + (t2 + t3)
                x = lam_geo * delta[c]
                one_minus = -math.expm1(-x)  # 1 - exp(-x)
                tail = x + math.log(one_minus)  # log(expm1(x))
                elbo_run += tail
                if approx:
                    en = 1.0
                    bound_run += math.log(x)
                else:
                    en = x / one_minus if x > 0.0 else 1.0
                total[c] += en
                total[v1 + c] += lam
                ratio = en / lam_geo
                for q in range(k):
                    sw_u[q] += ratio * gh_i[q]
                for q in range(k):
                    sh_i[q] += ratio * gw_u[q]
                j += 1
            _add(total, comp, 2 * v1, elbo_run)
            _add(total, comp, 2 * v1 + 1, bound_run if approx else elbo_run)
            cursor[u] = j
    sw *= gw
    sh *= gh
    return sw, sh, total + comp


@_jit
def _spmm_pair(indptr, cols, ratio, gw, gh, tile):  # noqa: ANN001, ANN202
    """``gw * (R @ gh)`` and ``gh * (R^T @ gw)`` for R the block with values ``ratio``.

    Same column-tiled visiting order as :func:`_ordinal_pass`.
    """
    n_rows, k = gw.shape
    n_cols = gh.shape[0]
    sw = np.zeros((n_rows, k))
    sh = np.zeros((n_cols, k))
    cursor = indptr[:-1].copy()
    for c_end in range(tile, n_cols + tile, tile):
        for u in range(n_rows):
            j, end = cursor[u], indptr[u + 1]
            if j == end or cols[j] >= c_end:
                continue
            sw_u, gw_u = sw[u], gw[u]
            while j < end and cols[j] < c_end:
                r, gh_i, sh_i = ratio[j], gh[cols[j]], sh[cols[j]]
                for q in range(k):
                    sw_u[q] += r * gh_i[q]
                for q in range(k):
                    sh_i[q] += r * gw_u[q]
                j += 1
            cursor[u] = j
    sw *= gw
    sh *= gh
    return sw, sh


@_jit
def _sddmm(rows, cols, a, b):  # noqa: ANN001, ANN202
    out = np.empty(rows.shape[0])
    for j in range(rows.shape[0]):
        out[j] = _dot(a, rows[j], b, cols[j])
    return out


@_jit
def _row_corr(indptr, cols, y, gap, eh):  # noqa: ANN001, ANN202
    n_rows, k = indptr.shape[0] - 1, eh.shape[1]
    out = np.zeros((n_rows, k))
    for u in range(n_rows):
        out_u = out[u]
        for j in range(indptr[u], indptr[u + 1]):
            g = gap[y[j]]
            if g != 0.0:  # G_0 = G_1 = 0: skipping adds exactly nothing
                eh_i = eh[cols[j]]
                for q in range(k):
                    out_u[q] += g * eh_i[q]
    return out


@_jit
def _col_corr(indptr, cols, y, gap, ew, n_cols):  # noqa: ANN001, ANN202
    k = ew.shape[1]
    out = np.zeros((n_cols, k))
    for u in range(indptr.shape[0] - 1):
        ew_u = ew[u]
        for j in range(indptr[u], indptr[u + 1]):
            g = gap[y[j]]
            if g != 0.0:
                out_i = out[cols[j]]
                for q in range(k):
                    out_i[q] += g * ew_u[q]
    return out


# --- public kernels -----------------------------------------------------------------------------


def _check_classes(block: CsrBlock, n_values: int) -> None:
    if block.nnz and int(block.y.max()) >= n_values:
        raise ValueError(f"block holds class {int(block.y.max())} > V = {n_values - 1}")


def sddmm(rows: np.ndarray, cols: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[j] = a[rows[j]] . b[cols[j]]``: (nnz,) float64; a (n, K), b (m, K)."""
    return _sddmm(np.asarray(rows), np.asarray(cols), _f64(a), _f64(b))


def spmm_pair(
    block: CsrBlock, ratio: np.ndarray, gw: np.ndarray, gh: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(gw * (R @ gh), gh * (R^T @ gw))`` with R the block holding ``ratio`` (nnz,) float64."""
    gw, gh = _f64(gw), _f64(gh)
    return _spmm_pair(block.indptr, block.cols, _f64(ratio), gw, gh, _tile_cols(gw.shape[1]))


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
    """Local CAVI step on one block (DESIGN.md section 2), one fused pass over the nonzeros.

    Parameters
    ----------
    gw, gh : (n_rows, K), (n_cols, K) geometric means exp(E[log W]), exp(E[log H]).
    ew, eh : (n_rows, K), (n_cols, K) arithmetic means E[W], E[H] (for the Delta statistics).
    delta : (V + 1,) threshold decrements.
    approx : q(n) = delta_1 (E[n] = 1, "PF on binarized data"); the returned bound is still
        the local ELBO sum log(expm1(Lambda Delta_y)), as in the published code.

    Returns SW (n_rows, K), SH (n_cols, K) and ``small`` (:func:`ordinal_small`), float64.
    """
    delta = _f64(delta)
    _check_classes(block, delta.shape[0])
    gw = _f64(gw)
    sw, sh, small = _ordinal_pass(
        block.indptr, block.cols, block.y, gw, _f64(gh), _f64(ew), _f64(eh), delta,
        bool(approx), _tile_cols(gw.shape[1]),
    )  # fmt: skip
    return LocalStats(sw, sh, small)


def row_correction(block: CsrBlock, gap: np.ndarray, eh: np.ndarray) -> np.ndarray:
    """``out[u] = sum_{i: y_ui > 0} G_{y_ui} E[h_i]``, shape (n_rows, K): the sparse W-rate term."""
    gap = _f64(gap)
    _check_classes(block, gap.shape[0])
    return _row_corr(block.indptr, block.cols, block.y, gap, _f64(eh))


def col_correction(block: CsrBlock, gap: np.ndarray, ew: np.ndarray) -> np.ndarray:
    """``out[i] = sum_{u: y_ui > 0} G_{y_ui} E[w_u]``, shape (n_cols, K): the sparse H-rate term."""
    gap = _f64(gap)
    _check_classes(block, gap.shape[0])
    return _col_corr(block.indptr, block.cols, block.y, gap, _f64(ew), block.shape[1])
