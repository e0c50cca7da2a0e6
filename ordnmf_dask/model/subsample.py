"""Numerics of the subsample start (docs/design.md §2): how large the subsample is, what each
block gives of it, and the sparse matrices the sub-fit and the two fold-ins read.

Pure numpy on one block's nonzeros or on the (small) parts taken from the blocks; the
orchestration is :mod:`ordnmf_dask.engine.substart`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.model.sizes import held_bytes

FRACTION = 0.1  # of the users and of the items in the subsample, at least MIN_ROWS_PER_K * K
MIN_ROWS_PER_K = 10  # rows of each side per component, at least (all of them when fewer)
MAX_ROWS = 100_000  # rows of each side at most: the sub-fit's factors stay small on the client
MAX_NNZ = 2_000_000  # expected nonzeros of the sub-matrix at most: the sub-fit stays short
SUB_MAX_ITER = 100  # CAVI iterations of the sub-fit at most (it also stops at the fit's tol)


def fractions(n_users: int, n_items: int, nnz: int, k: int) -> tuple[float, float]:
    """The probabilities with which a user and an item enter the subsample: FRACTION, raised
    to give about MIN_ROWS_PER_K * K rows of a side, lowered to MAX_ROWS rows; then both
    scaled down alike while the expected nonzeros of the sub-matrix exceed MAX_NNZ."""

    def side(n: int) -> float:
        return min(1.0, max(FRACTION, MIN_ROWS_PER_K * k / n), MAX_ROWS / n)

    p_u, p_i = side(n_users), side(n_items)
    excess = p_u * p_i * nnz / MAX_NNZ
    if excess > 1.0:
        p_u, p_i = p_u / math.sqrt(excess), p_i / math.sqrt(excess)
    return p_u, p_i


@dataclass(frozen=True)
class Part:
    """Nonzeros taken from one block: ``own`` (a row of the side they are read for), ``other``
    (the global index on the other side) and ``y`` (the family's values), in CSR order."""

    __sizeof__ = held_bytes  # what Dask counts for memory and transfers

    own: np.ndarray
    other: np.ndarray
    y: np.ndarray


def block_parts(
    block: CsrBlock, r0: int, c0: int, users: np.ndarray, items: np.ndarray
) -> tuple[Part, Part, Part]:
    """What block (r, c) gives the start (``r0``, ``c0``: its first global row and column;
    ``users``, ``items``: boolean masks of its sampled rows and columns):

    - its nonzeros with a sampled item, for the users' fold-in (own: local row, other:
      global item);
    - its nonzeros with a sampled user, for the items' fold-in (own: local column, other:
      global user);
    - its nonzeros with both, for the sub-fit (own: global user, other: global item).
    """
    rows, cols, y = block.rows, block.cols, block.y
    in_u, in_i = users[rows], items[cols]
    both = in_u & in_i
    return (
        Part(rows[in_i].astype(np.int64), cols[in_i] + np.int64(c0), y[in_i]),
        Part(cols[in_u].astype(np.int64), rows[in_u] + np.int64(r0), y[in_u]),
        Part(rows[both] + np.int64(r0), cols[both] + np.int64(c0), y[both]),
    )


def sub_matrix(parts: list[Part]) -> tuple[CsrBlock, np.ndarray, np.ndarray]:
    """The sub-matrix of the sub-fit from the blocks' third parts: a CSR block over the users
    and the items that have a nonzero in it, and their global indices (increasing). Its order
    depends on the global indices only, not on the blocks the parts came from."""
    user = np.concatenate([p.own for p in parts])
    item = np.concatenate([p.other for p in parts])
    y = np.concatenate([p.y for p in parts])
    users, items = np.unique(user), np.unique(item)
    row, col = np.searchsorted(users, user), np.searchsorted(items, item)
    order = np.lexsort((col, row))
    block = CsrBlock.from_coo(row[order], col[order], y[order], (len(users), len(items)))
    return block, users, items


def fold_matrix(parts: list[Part], n_own: int, fitted: np.ndarray) -> CsrBlock:
    """The (n_own, len(fitted)) CSR block of one user-block's (or item-block's) nonzeros with
    the other side's rows of the sub-fit (``fitted``: their global indices, increasing), from
    its blocks' parts in grid order; nonzeros with other rows are dropped."""
    own = np.concatenate([p.own for p in parts])
    other = np.concatenate([p.other for p in parts])
    y = np.concatenate([p.y for p in parts])
    pos = np.searchsorted(fitted, other)
    keep = pos < len(fitted)
    keep[keep] = fitted[pos[keep]] == other[keep]
    own, pos, y = own[keep], pos[keep], y[keep]
    order = np.lexsort((pos, own))
    return CsrBlock.from_coo(own[order], pos[order], y[order], (n_own, len(fitted)))
