"""Per-block numerical kernels: pure functions of numpy arrays, compiled with numba, no Dask.

A block holds the nonzeros of one (user-block, item-block) cell of the grid in CSR order (sorted
by local row, then local column). Every kernel makes one pass over the nonzeros and never builds
an ``nnz x K`` temporary: the ordinal local step computes Lambda (SDDMM with GW, GH), E[n], the
ratio, the SW and SH accumulations (two SpMMs) and the arithmetic-mean lambda of the Delta
statistics in one pass (per chunk of a row's nonzeros: the dot products, then E[n] and the
ratios in one vector loop, then the row updates); the rate corrections are one scatter / gather
SpMM each.
When the block's three item-side tables (GH, E[H], SH) fit in :data:`_L3_BYTES`, the fused
local-step loops go in CSR order and prefetch the item rows of the nonzero ``_AHEAD_LOCAL``
places ahead; larger tables are visited by column tiles (rows in order inside a tile) so that
the randomly accessed item rows stay in cache. The rate corrections, one axpy per nonzero and
so bound by the latency of those rows, go in CSR order and prefetch the row of the nonzero
``_AHEAD`` places ahead. Each order was kept for being the faster one where it is used
(docs/performance.md, "Kernel loop orders"; ``bench/kernels.py`` measures the whole kernels).

Dtype policy:

- inputs: factors are used as C-contiguous float64 (converted if needed, a no-op for the engine's
  chunks); classes are uint8 (counts float64 for dcPF); local column / row indices int32, the CSR
  row pointer int64;
- arithmetic and every accumulation are float64: the K-dot products, the SW / SH sums, and the
  O(V) statistics (per-class E[n] and lambda sums, local ELBO); the local ELBO's per-row partial
  sums are added with compensated (Neumaier) summation so that their error does not grow with nnz;
- numba settings: ``fastmath={"reassoc", "contract"}`` in the loops over K only lets LLVM
  vectorize the K-dot products and fuse multiply-adds (faster: docs/performance.md, "Kernel loop
  orders"; the sums are still float64, their order is fixed by the compiled code, so results are
  deterministic on a given machine and differ from strict left-to-right order by round-off
  only); no ``nnan`` /
  ``ninf`` / approximate functions, and the compensated sum and the special functions
  (:func:`exp_neg_split`) are compiled strictly (LLVM inlines them keeping their own flags);
  ``error_model="numpy"`` (x / 0 gives inf / nan as in numpy, no exception), single threaded
  (one task = one thread), ``nogil=True`` (threads of one process run kernels at once: the
  in-process executor and a worker process of several threads), ``cache=True``: compiled once
  per machine into the package's ``__pycache__`` and loaded from there by every later process
  (:func:`jit`); a compilation (the first run on a machine) is announced on the log
  (:mod:`ordnmf_dask.model.compiling`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ordnmf_dask.model import compiling
from ordnmf_dask.model.rowptr import expand_rows, row_pointer
from ordnmf_dask.model.sizes import held_bytes

if TYPE_CHECKING:
    import scipy.sparse as sp

SLAB = 1 << 16  # nonzeros per slab where nnz-length temporaries are slabbed (dcPF special funcs)

_TILE_BYTES = 3 << 18  # 768 KiB of one item-side factor table per column tile (fits in L2)

_L3_BYTES = 16 << 20  # item-side tables up to this size: CSR order and prefetching, no tiles

_AHEAD = 8  # the rate corrections prefetch the factor row of the nonzero this far ahead

_AHEAD_LOCAL = 2  # the local step (untiled) prefetches the item rows of the nonzero this far ahead


def jit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, nogil=True, **options)``: compiled once per machine and loaded by
    every later process (from the package's ``__pycache__``, or numba's user-wide cache where
    that is not writable), the GIL released while it runs. Where numba finds no writable cache
    directory at all, compiled in each process instead of failing the import."""

    def decorate(fn: Callable[..., Any]) -> Any:
        compiling.install()  # a first call that compiles says so (model/compiling.py)
        try:
            return njit(cache=True, nogil=True, **options)(fn)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return njit(nogil=True, **options)(fn)

    return decorate


_jit = jit(fastmath={"reassoc", "contract"}, error_model="numpy")
_strict_jit = jit(fastmath=False, error_model="numpy")


@dataclass(frozen=True)
class CsrBlock:
    """Nonzeros of one block, CSR-ordered.

    indptr : int64 (n_rows + 1,) row pointer; cols : int32 (nnz,) local column (sorted within a
    row); y : (nnz,) values: uint8 ordinal classes 1..V, or float64 counts for dcPF;
    shape : (n_rows, n_cols). ``rows`` (int32 (nnz,) local row of each nonzero) is derived.
    """

    __sizeof__ = held_bytes  # what Dask counts for memory and transfers

    indptr: np.ndarray
    cols: np.ndarray
    y: np.ndarray
    shape: tuple[int, int]

    @classmethod
    def from_coo(
        cls, rows: np.ndarray, cols: np.ndarray, y: np.ndarray, shape: tuple[int, int]
    ) -> CsrBlock:
        """Build from (row, col)-sorted coordinates."""
        n_rows, n_cols = shape
        indptr = row_pointer(rows, n_rows)
        return cls(indptr, cols.astype(np.int32, copy=False), y, (n_rows, n_cols))

    @property
    def nnz(self) -> int:
        return int(self.cols.shape[0])

    @property
    def rows(self) -> np.ndarray:
        """int32 (nnz,) local row of each nonzero (expanded from ``indptr``)."""
        return expand_rows(self.indptr)

    def take_rows(self, keep: np.ndarray) -> CsrBlock:
        """The block restricted to local rows ``keep`` (increasing), renumbered 0..len(keep)-1."""
        counts = np.diff(self.indptr)[keep]
        indptr = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        idx = np.arange(indptr[-1]) + np.repeat(self.indptr[keep] - indptr[:-1], counts)
        return CsrBlock(indptr, self.cols[idx], self.y[idx], (len(keep), self.shape[1]))

    def matrix(self, data: np.ndarray) -> sp.csr_matrix:
        """The block as a CSR matrix with the given values at its nonzeros."""
        import scipy.sparse as sp  # here: only the postfit steps and tests use it

        return sp.csr_matrix((data, self.cols, self.indptr), shape=self.shape)


@dataclass(frozen=True)
class LocalStats:
    """Partial sums of a local step over one block.

    sw : (n_rows, K) sum_i E[c_uik]; sh : (n_cols, K) sum_u E[c_uik];
    small : the model's O(V) statistics (summed over blocks, sent to the client); for the
    ordinal model see :func:`ordinal_small`.
    """

    __sizeof__ = held_bytes  # what Dask counts for memory and transfers

    sw: np.ndarray
    sh: np.ndarray
    small: np.ndarray


@dataclass(frozen=True)
class RowStats:
    """Partial sums of a local step over the blocks of one user-block (a run of item-blocks).

    sw : (n_rows, K) summed over the blocks; sh : per block, (n_cols_c, K); small : as in
    :class:`LocalStats`.
    """

    __sizeof__ = held_bytes  # what Dask counts for memory and transfers

    sw: np.ndarray
    sh: tuple[np.ndarray, ...]
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


def as_f64(a: np.ndarray) -> np.ndarray:
    """C-contiguous float64 view (no copy when it already is one)."""
    return np.ascontiguousarray(a, dtype=np.float64)


# --- compiled loops -----------------------------------------------------------------------------


@_jit
def row_dot(a: np.ndarray, u: int, b: np.ndarray, i: int) -> float:
    """``a[u] . b[i]`` (vectorized by LLVM: reassociation allowed); callable from numba code."""
    s = 0.0
    for q in range(a.shape[1]):
        s += a[u, q] * b[i, q]
    return s


@_strict_jit
def _add(total: np.ndarray, comp: np.ndarray, j: int, value: float) -> None:
    """Neumaier-compensated ``total[j] += value`` (``comp[j]`` holds the lost low-order bits)."""
    t = total[j] + value
    if abs(total[j]) >= abs(value):
        comp[j] += (total[j] - t) + value
    else:
        comp[j] += (value - t) + total[j]
    total[j] = t


def _tile_cols(k: int, block: CsrBlock) -> int:
    """Columns per tile: all of them when the three item-side tables fit in _L3_BYTES;
    otherwise one factor table's tile takes about _TILE_BYTES, and there are at most
    (nnz / n_rows) / 4 tiles: every tile visits every row, which costs more than the cache
    misses it saves when rows hold only a few nonzeros (sparse blocks: one tile)."""
    n_rows, n_cols = block.shape
    if 3 * 8 * k * n_cols <= _L3_BYTES:
        return max(1, n_cols)
    by_cache = -(-n_cols // max(64, _TILE_BYTES // (8 * max(k, 1))))
    tiles = max(1, min(by_cache, block.nnz // (4 * max(n_rows, 1))))
    return max(1, -(-n_cols // tiles))


# exp(-y) (:func:`exp_neg_split`): y = k ln 2 + r with |r| <= ln(2) / 2 (fdlibm's split of
# ln 2, so that k ln2_hi is exact), expm1(-r) by its Taylor series to r^14 / 14! (truncation
# < 2e-17 relative), 2^-k from a table of exact powers
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_EXPM1_SERIES = tuple(1.0 / math.factorial(n) for n in range(1, 15))  # 1 / n!, n = 1..14
_EXP_CAP = 746.0  # exp(-y) rounds to 0 for y > 745.2
_POW2_NEG = np.ldexp(1.0, -np.arange(1077))  # 2^-k, k = 0..1076 (the last two round to 0)

_CHUNK = 64  # nonzeros of one row whose scalar work the local step does as one vector loop


@_strict_jit
def exp_neg_split(y: float) -> tuple[float, float]:
    """``(s, p)`` with ``exp(-y) = s (1 + p)`` for y >= 0, s a power of 2 and p = expm1(-r),
    |r| <= ln(2) / 2, to ~1 ulp each; branch-free, so that a loop over y vectorizes (libm's
    exp and expm1 are a call per value). p is NaN for y < 0 or NaN."""
    z = y if y < _EXP_CAP else _EXP_CAP
    z = z if z > 0.0 else 0.0
    k = math.floor(z * _INV_LN2 + 0.5)
    t = (k * LN2_HI - z) + k * LN2_LO  # -r
    p = _EXPM1_SERIES[13]
    for n in range(12, -1, -1):
        p = _EXPM1_SERIES[n] + t * p
    p *= t
    return _POW2_NEG[int(k)], p if y >= 0.0 else math.nan


@_strict_jit
def _one_minus_exp_neg(x: float) -> float:
    """``1 - exp(-x) = -expm1(-x)`` for x >= 0 to ~1 ulp, vectorizable (:func:`exp_neg_split`);
    NaN for x < 0 or NaN."""
    s, p = exp_neg_split(x)
    return (1.0 - s) - s * p  # 1 - 2^-k is exact


@_jit
def _ordinal_pass(  # noqa: ANN202
    indptr,
    cols,
    y,
    gw,
    gh,
    ew,
    eh,
    delta,
    approx,
    tile,
    sw,
    sh,
    total,
    comp,  # noqa: ANN001
):
    """Fused ordinal local step of one block: adds ``R @ GH`` into ``sw`` (n_rows, K),
    ``R^T @ GW`` into ``sh`` (n_cols, K) and the O(V) sums into ``total`` / ``comp`` (Neumaier
    pairs, 2 V + 4). R holds E[n] / Lambda; the caller scales by GW, GH once per strip.

    The nonzeros are visited by column tiles of ``tile`` columns, rows in order within a tile
    (each row's nonzeros in a tile are a contiguous run of its CSR range, found with a cursor
    per row), so that the item-side rows (GH, E[H], SH) of a tile stay in cache. A row's run is
    done in chunks of up to _CHUNK nonzeros, in three loops: the two K-dot products per nonzero;
    E[n] and the ratio of every nonzero of the chunk (one vector loop); the two row updates
    per nonzero. Per row the summation order of SW is the CSR order, as in a plain row-wise
    SpMM. With one tile the order is the CSR order, and the item rows of the nonzero
    _AHEAD_LOCAL places ahead are prefetched.
    """
    n_rows, k = gw.shape
    n_cols = gh.shape[0]
    v1 = delta.shape[0]
    nnz = cols.shape[0]
    ahead = _AHEAD_LOCAL if tile >= n_cols else nnz  # no prefetching across tiles
    buf = np.empty((5, _CHUNK))  # per nonzero of a chunk: Lambda, Delta_y, 1 - exp(-x), ratio, E[n]
    lam_geo, d_buf, one_minus, ratio, en = buf[0], buf[1], buf[2], buf[3], buf[4]
    cursor = indptr[:-1].copy()
    for c_end in range(tile, n_cols + tile, tile):
        for u in range(n_rows):
            first, stop = cursor[u], cursor[u]
            while stop < indptr[u + 1] and cols[stop] < c_end:
                stop += 1
            if stop == first:
                continue
            sw_u, gw_u, ew_u = sw[u], gw[u], ew[u]
            # sum log(expm1(x)) = sum x + log(prod (1 - exp(-x))): one log per run (and one
            # whenever the product falls below 1e-150, far from underflow), not per nonzero
            x_run, prod, log_run, bound_run = 0.0, 1.0, 0.0, 0.0
            for start in range(first, stop, _CHUNK):
                m = min(_CHUNK, stop - start)
                for t in range(m):
                    j = start + t
                    if j + ahead < nnz:
                        nxt = cols[j + ahead]
                        _prefetch_row(gh, nxt)
                        _prefetch_row(eh, nxt)
                    gh_i, eh_i = gh[cols[j]], eh[cols[j]]
                    geo = 0.0  # gw_u . gh_i
                    lam = 0.0  # ew_u . eh_i
                    for q in range(k):  # one loop: the same sums, one pass of loop overhead
                        geo += gw_u[q] * gh_i[q]
                        lam += ew_u[q] * eh_i[q]
                    lam_geo[t] = geo
                    d_buf[t] = delta[y[j]]
                    total[v1 + y[j]] += lam
                for t in range(m):  # vectorized: no calls, no gathers
                    d = d_buf[t]
                    x = lam_geo[t] * d
                    om = _one_minus_exp_neg(x)
                    x_run += x
                    one_minus[t] = om
                    # E[n] = x / (1 - exp(-x)), ratio E[n] / Lambda; E[n] = 1 at x = 0 and
                    # in approx mode
                    exact = not approx and x > 0.0
                    ratio[t] = d / om if exact else 1.0 / lam_geo[t]
                    en[t] = d / om * lam_geo[t] if exact else 1.0
                for t in range(m):
                    j = start + t
                    if t + _AHEAD_LOCAL < m:
                        _prefetch_row(sh, cols[j + _AHEAD_LOCAL])
                    prod *= one_minus[t]
                    if prod < 1e-150:
                        log_run += math.log(prod)
                        prod = 1.0
                    if approx:
                        bound_run += math.log(lam_geo[t] * d_buf[t])
                    total[y[j]] += en[t]
                    r, gh_i, sh_i = ratio[t], gh[cols[j]], sh[cols[j]]
                    for q in range(k):
                        sw_u[q] += r * gh_i[q]
                        sh_i[q] += r * gw_u[q]
            elbo_run = x_run + (log_run + math.log(prod))
            _add(total, comp, 2 * v1, elbo_run)
            _add(total, comp, 2 * v1 + 1, bound_run if approx else elbo_run)
            cursor[u] = stop


@_jit
def _spmm_pair(indptr, cols, ratio, gw, gh, tile, sw, sh):  # noqa: ANN001, ANN202
    """Adds ``R @ gh`` into ``sw`` and ``R^T @ gw`` into ``sh`` for R the block with values
    ``ratio`` (unscaled, as :func:`_ordinal_pass`). Same column-tiled visiting order.
    """
    n_rows, k = gw.shape
    n_cols = gh.shape[0]
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
                    sh_i[q] += r * gw_u[q]
                j += 1
            cursor[u] = j


@_jit
def _sddmm(rows, cols, a, b):  # noqa: ANN001, ANN202
    out = np.empty(rows.shape[0])
    for j in range(rows.shape[0]):
        out[j] = row_dot(a, rows[j], b, cols[j])
    return out


@intrinsic
def _prefetch_row(typingctx, table, i):  # noqa: ANN001, ANN202
    """Hint the CPU to fetch row ``i`` of the C-contiguous 2-D float64 ``table`` into cache
    (one ``llvm.prefetch`` per 64-byte line; a hint never faults): numba code only."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        tty, ity = signature.args
        ary = context.make_array(tty)(context, builder, args[0])
        row_stride = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
        row_bytes = builder.mul(
            cgutils.unpack_tuple(builder, ary.shape, 2)[1], context.get_constant(types.intp, 8)
        )
        index = context.cast(builder, args[1], ity, types.intp)
        byte = ir.IntType(8).as_pointer()
        start = builder.gep(builder.bitcast(ary.data, byte), [builder.mul(index, row_stride)])
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch",
            [byte],
            ir.FunctionType(ir.VoidType(), [byte] + [ir.IntType(32)] * 3),
        )
        zero, line = context.get_constant(types.intp, 0), context.get_constant(types.intp, 64)
        read, keep, data = (ir.Constant(ir.IntType(32), v) for v in (0, 3, 1))
        with cgutils.for_range_slice(builder, zero, row_bytes, line) as (offset, _):
            builder.call(fn, [builder.gep(start, [offset]), read, keep, data])
        return context.get_dummy_value()

    return types.void(table, i), codegen


@_jit
def _row_corr(indptr, cols, y, gap, eh, out):  # noqa: ANN001, ANN202
    """``out[u] += sum_j gap[y_j] eh[cols_j]`` over row u's nonzeros, in CSR order."""
    n_rows, k = indptr.shape[0] - 1, eh.shape[1]
    nnz = cols.shape[0]
    for u in range(n_rows):
        out_u = out[u]
        for j in range(indptr[u], indptr[u + 1]):
            if j + _AHEAD < nnz:
                _prefetch_row(eh, cols[j + _AHEAD])
            g, eh_i = gap[y[j]], eh[cols[j]]
            for q in range(k):
                out_u[q] += g * eh_i[q]


@_jit
def _col_corr(indptr, cols, y, gap, ew, out):  # noqa: ANN001, ANN202
    """``out[i] += sum_j gap[y_j] ew[row_j]`` over column i's nonzeros, in CSR order."""
    n_rows, k = indptr.shape[0] - 1, ew.shape[1]
    nnz = cols.shape[0]
    for u in range(n_rows):
        ew_u = ew[u]
        for j in range(indptr[u], indptr[u + 1]):
            if j + _AHEAD < nnz:
                _prefetch_row(out, cols[j + _AHEAD])
            g, out_i = gap[y[j]], out[cols[j]]
            for q in range(k):
                out_i[q] += g * ew_u[q]


# --- public kernels -----------------------------------------------------------------------------


def _check_classes(block: CsrBlock, n_values: int) -> None:
    if block.nnz and int(block.y.max()) >= n_values:
        raise ValueError(f"block holds class {int(block.y.max())} > V = {n_values - 1}")


def sddmm(rows: np.ndarray, cols: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[j] = a[rows[j]] . b[cols[j]]``: (nnz,) float64; a (n, K), b (m, K)."""
    return _sddmm(np.asarray(rows), np.asarray(cols), as_f64(a), as_f64(b))


def spmm_pair(
    block: CsrBlock, ratio: np.ndarray, gw: np.ndarray, gh: np.ndarray, sw: np.ndarray
) -> np.ndarray:
    """Add ``R @ gh`` into ``sw`` (n_rows, K, float64) and return ``R^T @ gw`` (n_cols, K), with
    R the block holding ``ratio`` (nnz,) float64 (neither is scaled by gw / gh)."""
    gw, gh = as_f64(gw), as_f64(gh)
    sh = np.zeros((gh.shape[0], gh.shape[1]))
    _spmm_pair(
        block.indptr, block.cols, as_f64(ratio), gw, gh, _tile_cols(gw.shape[1], block), sw, sh
    )
    return sh


def expected_n(x: np.ndarray) -> np.ndarray:
    """Mean of ZTP(x): ``x / (1 - exp(-x))``, computed stably, equal to 1 at x = 0."""
    out = np.ones_like(x)
    pos = x > 0
    out[pos] = x[pos] / -np.expm1(-x[pos])
    return out


def log_expm1(x: np.ndarray) -> np.ndarray:
    """``log(exp(x) - 1)`` for x > 0 without overflow."""
    return x + np.log(-np.expm1(-x))


def local_step_row(
    blocks: Iterable[CsrBlock],
    gw: np.ndarray,
    ghs: Sequence[np.ndarray],
    ew: np.ndarray,
    ehs: Sequence[np.ndarray],
    delta: np.ndarray,
    approx: bool,
) -> RowStats:
    """Local CAVI step (docs/design.md §2) over blocks (r, c) of one user-block r for a run of
    item-blocks c, one fused pass over each block's nonzeros.

    Parameters
    ----------
    blocks : the blocks, in item-block order (may be an iterator: blocks read one at a time).
    gw, ew : (n_rows, K) exp(E[log W]) and E[W] of user-block r.
    ghs, ehs : per block, (n_cols_c, K) exp(E[log H]) and E[H] of its item-block.
    delta : (V + 1,) threshold decrements.
    approx : q(n) = delta_1 (E[n] = 1, "PF on binarized data"); the returned bound is still
        the local ELBO sum log(expm1(Lambda Delta_y)), as in the published code.

    Returns SW (n_rows, K) summed over the blocks (one accumulator: no per-block partials), SH
    per block and ``small`` (:func:`ordinal_small`), float64.
    """
    delta, gw, ew = as_f64(delta), as_f64(gw), as_f64(ew)
    v1 = delta.shape[0]
    sw = np.zeros(gw.shape)
    total, comp = np.zeros(2 * v1 + 2), np.zeros(2 * v1 + 2)  # Neumaier pairs
    sh = []
    for block, gh, eh in zip(blocks, ghs, ehs, strict=True):
        _check_classes(block, v1)
        gh = as_f64(gh)
        part = np.zeros(gh.shape)
        _ordinal_pass(
            block.indptr,
            block.cols,
            block.y,
            gw,
            gh,
            ew,
            as_f64(eh),
            delta,
            bool(approx),
            _tile_cols(gw.shape[1], block),
            sw,
            part,
            total,
            comp,
        )
        part *= gh
        sh.append(part)
    sw *= gw
    return RowStats(sw, tuple(sh), total + comp)


def local_step(
    block: CsrBlock,
    gw: np.ndarray,
    gh: np.ndarray,
    ew: np.ndarray,
    eh: np.ndarray,
    delta: np.ndarray,
    approx: bool,
) -> LocalStats:
    """:func:`local_step_row` of a single block: SW (n_rows, K), SH (n_cols, K), small."""
    row = local_step_row([block], gw, [gh], ew, [eh], delta, approx)
    return LocalStats(row.sw, row.sh[0], row.small)


def _corrections(kernel, axis: int, blocks, gap, factors) -> np.ndarray:  # noqa: ANN001
    """Run a rate-correction ``kernel`` over ``blocks`` into one (block.shape[axis], K) array."""
    gap = as_f64(gap)
    out = None
    for block, f in zip(blocks, factors, strict=True):
        _check_classes(block, gap.shape[0])
        f = as_f64(f)
        if out is None:
            out = np.zeros((block.shape[axis], f.shape[1]))
        kernel(block.indptr, block.cols, block.y, gap, f, out)
    if out is None:
        raise ValueError("a rate correction of no blocks")
    return out


def row_correction_row(
    blocks: Iterable[CsrBlock], gap: np.ndarray, ehs: Sequence[np.ndarray]
) -> np.ndarray:
    """``out[u] = sum_{i: y_ui > 0} G_{y_ui} E[h_i]`` over the blocks of one user-block (one
    accumulator), shape (n_rows, K): the sparse W-rate term. ``ehs``: per block (n_cols_c, K).
    ``blocks`` may be an iterator (blocks read one at a time)."""
    return _corrections(_row_corr, 0, blocks, gap, ehs)


def row_correction(block: CsrBlock, gap: np.ndarray, eh: np.ndarray) -> np.ndarray:
    """:func:`row_correction_row` of a single block, shape (n_rows, K)."""
    return row_correction_row([block], gap, [eh])


def col_correction_col(
    blocks: Iterable[CsrBlock], gap: np.ndarray, ews: Sequence[np.ndarray]
) -> np.ndarray:
    """``out[i] = sum_{u: y_ui > 0} G_{y_ui} E[w_u]`` over the blocks of one item-block for a run
    of user-blocks (one accumulator), shape (n_cols, K): the sparse H-rate term. ``ews``: per
    block (n_rows_r, K). ``blocks`` may be an iterator (blocks read one at a time)."""
    return _corrections(_col_corr, 1, blocks, gap, ews)


def col_correction(block: CsrBlock, gap: np.ndarray, ew: np.ndarray) -> np.ndarray:
    """:func:`col_correction_col` of a single block, shape (n_cols, K)."""
    return col_correction_col([block], gap, [ew])
