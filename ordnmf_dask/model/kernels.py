"""Per-block numerical kernels: pure functions of numpy / scipy arrays, no Dask.

A block holds the nonzeros of one (user-block, item-block) cell of the grid in CSR order (sorted
by local row, then local column). Every kernel works on the nonzeros only and never builds an
``nnz x K`` temporary larger than ``_CHUNK x K``.

Dtype policy: factors, sums and the ELBO are float64; classes are uint8; local indices int32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

_CHUNK = 1 << 16  # nonzeros per SDDMM slab: bounds temporaries to _CHUNK x K floats


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
    """Local CAVI step on one block (DESIGN.md section 2).

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
