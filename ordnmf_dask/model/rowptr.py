"""CSR row pointers of one block's nonzeros, both ways (pure numpy: the store and the kernels)."""

from __future__ import annotations

import numpy as np


def row_pointer(rows: np.ndarray, n_rows: int) -> np.ndarray:
    """CSR row pointer, int64 (n_rows + 1,), of the local rows (nnz,) of a block's nonzeros
    (in any order: only their counts matter)."""
    out = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=out[1:])
    return out


def expand_rows(indptr: np.ndarray) -> np.ndarray:
    """int32 (nnz,) local row of each nonzero, from a CSR row pointer (n_rows + 1,)."""
    n_rows = len(indptr) - 1
    return np.repeat(np.arange(n_rows, dtype=np.int32), np.diff(indptr))
