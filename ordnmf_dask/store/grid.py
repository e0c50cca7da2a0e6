"""Choose the block grid by nonzeros and sort nonzeros block by block."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ordnmf_dask.errors import InputError, shown
from ordnmf_dask.model.rowptr import row_pointer
from ordnmf_dask.params import DEFAULT_NNZ_PER_BLOCK

# Users (items) per block at most, whatever the nonzeros: the factor chunks follow the block
# grid, and a (n, K) float64 array of 2^17 rows takes 52 MB at K = 50, so a worker's memory per
# chunk stays bounded on sparse data too (1M users with 1e6 nonzeros is 8 user-blocks, not 1).
MAX_BLOCK_ROWS = 2**17
# Two cores should share every pass of a fit, which a one-block grid runs as one task. From
# SPLIT_LONG_NNZ nonzeros on, a grid has at least 2 blocks along its longer side (the passes over
# the nonzeros and the larger factor's update have two tasks); from SPLIT_BOTH_NNZ on, along both
# (the shorter factor's update too). Below, a pass takes well under a millisecond, and every
# extra block adds tasks, which cost a fit on a cluster more than they save.
SPLIT_LONG_NNZ = 2**15
SPLIT_BOTH_NNZ = 2**20


@dataclass(frozen=True, eq=False)
class BlockedNonzeros:
    """Nonzeros sorted by (block row r, block col c, local row, local col).

    In-memory form of a split (the store keeps CSR row pointers instead of ``rows``: see
    :func:`block_indptr`).

    Attributes
    ----------
    rows, cols : np.ndarray of int32, shape (nnz,)
        Local indices within the block (``user - row_bounds[r]``, ``item - col_bounds[c]``).
    y : np.ndarray of uint8, shape (nnz,)
    raw : np.ndarray of float64, shape (nnz,)
    offsets : np.ndarray of int64, shape (n_r * n_c + 1,)
        Block ``b = r * n_c + c`` occupies ``[offsets[b], offsets[b + 1])``.
    """

    rows: np.ndarray
    cols: np.ndarray
    y: np.ndarray
    raw: np.ndarray
    offsets: np.ndarray


def auto_grid(nnz: int, n_users: int, n_items: int, nnz_per_block: int) -> tuple[int, int]:
    """Grid of about ``sqrt(nnz / nnz_per_block)`` blocks per side, at least 2 along the longer
    side from SPLIT_LONG_NNZ nonzeros on and along both from SPLIT_BOTH_NNZ on, at most U x I,
    and at least ``ceil(U / MAX_BLOCK_ROWS)`` x ``ceil(I / MAX_BLOCK_ROWS)``."""
    if nnz_per_block < 1:
        raise InputError(f"nnz_per_block must be >= 1, got {nnz_per_block}")
    side = max(1, round(math.sqrt(nnz / nnz_per_block)))
    both = 2 if nnz >= SPLIT_BOTH_NNZ else 1
    long = 2 if nnz >= SPLIT_LONG_NNZ else 1
    n_r = max(side, both, long if n_users >= n_items else 1, math.ceil(n_users / MAX_BLOCK_ROWS))
    n_c = max(side, both, long if n_items > n_users else 1, math.ceil(n_items / MAX_BLOCK_ROWS))
    return min(n_r, n_users), min(n_c, n_items)


def split_long(bounds: np.ndarray, max_len: int = MAX_BLOCK_ROWS) -> np.ndarray:
    """``bounds`` with every range longer than ``max_len`` cut into equal pieces of <= max_len."""
    out = [np.int64(0)]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        pieces = max(1, math.ceil((b - a) / max_len))
        out.extend(np.linspace(a, b, pieces + 1).round().astype(np.int64)[1:])
    return np.asarray(out, dtype=np.int64)


def balanced_bounds(degrees: np.ndarray, n_parts: int) -> np.ndarray:
    """Cut ``len(degrees)`` indices into ``n_parts`` contiguous non-empty ranges of ~equal nnz.

    Parameters
    ----------
    degrees : np.ndarray of int, shape (n,)
        Nonzeros per index.
    n_parts : int
        1 <= n_parts <= n.

    Returns
    -------
    np.ndarray of int64, shape (n_parts + 1,)
        Strictly increasing, from 0 to n; cuts sit at nnz quantiles.
    """
    n = len(degrees)
    if not 1 <= n_parts <= n:
        raise InputError(f"cannot cut {n} indices into {n_parts} non-empty blocks")
    cum = np.cumsum(degrees, dtype=np.float64)
    total = cum[-1] if n else 0.0
    targets = total * np.arange(1, n_parts) / n_parts
    # bound b puts indices [0, b) before the cut, holding cum[b - 1] nonzeros.
    hi = np.searchsorted(cum, targets, side="left") + 1
    lo = hi - 1
    cum0 = np.concatenate([[0.0], cum])
    pick = np.where(np.abs(cum0[lo] - targets) <= np.abs(cum0[hi] - targets), lo, hi)
    bounds = np.concatenate([[0], pick, [n]]).astype(np.int64)
    for k in range(1, n_parts):  # make every range non-empty
        bounds[k] = max(bounds[k], bounds[k - 1] + 1)
    for k in range(n_parts - 1, 0, -1):
        bounds[k] = min(bounds[k], bounds[k + 1] - 1)
    return bounds


def bounds_from_degrees(
    user_deg: np.ndarray,
    item_deg: np.ndarray,
    nnz_per_block: int = DEFAULT_NNZ_PER_BLOCK,
    grid: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Row bounds (n_r + 1,) and col bounds (n_c + 1,), int64, from train degrees: user_deg
    (U,) and item_deg (I,), int64."""
    if grid is not None:
        n_r, n_c = check_grid(grid)
        return balanced_bounds(user_deg, n_r), balanced_bounds(item_deg, n_c)
    nnz = int(user_deg.sum())
    n_r, n_c = auto_grid(nnz, len(user_deg), len(item_deg), nnz_per_block)
    # nnz quantiles can still put many low-degree indices in one range: cut those too
    return split_long(balanced_bounds(user_deg, n_r)), split_long(balanced_bounds(item_deg, n_c))


def check_grid(grid: tuple[int, int]) -> tuple[int, int]:
    """``grid`` as a pair of positive ints; InputError otherwise."""
    try:
        n_r, n_c = (int(g) for g in grid)
    except (TypeError, ValueError):
        raise InputError(f"grid must be a pair of positive ints, got {shown(grid)}") from None
    if n_r < 1 or n_c < 1 or (n_r, n_c) != tuple(grid):
        raise InputError(f"grid must be a pair of positive ints, got {shown(grid)}")
    return n_r, n_c


def block_sort(
    u: np.ndarray,
    i: np.ndarray,
    y: np.ndarray,
    raw: np.ndarray,
    row_bounds: np.ndarray,
    col_bounds: np.ndarray,
    presorted: bool = False,
    groups: np.ndarray | None = None,
    n_groups: int = 1,
) -> BlockedNonzeros:
    """Sort global nonzeros (u, i int (nnz,)) into blocks with local int32 indices.

    ``presorted``: the nonzeros are sorted by (u, i) already. A stable sort of their block
    numbers (a radix sort of small numbers) then keeps the (row, col) order within each
    block. ``groups`` (presorted only): a group in ``[0, n_groups)`` of each nonzero (a
    split's subset, say); the blocks of group 0 come first, then those of group 1, ...,
    ``offsets`` then has ``n_groups * n_r * n_c + 1`` entries.
    """
    n_c = len(col_bounds) - 1
    n_blocks = (len(row_bounds) - 1) * n_c
    if presorted:
        return _block_sort_sorted(u, i, y, raw, row_bounds, col_bounds, groups, n_groups)
    r = np.searchsorted(row_bounds, u, side="right") - 1
    c = np.searchsorted(col_bounds, i, side="right") - 1
    rows = (u - row_bounds[r]).astype(np.int32)
    cols = (i - col_bounds[c]).astype(np.int32)
    b = r * n_c + c
    order = np.lexsort((cols, rows, b))
    offsets = np.zeros(n_blocks + 1, dtype=np.int64)
    np.cumsum(np.bincount(b, minlength=n_blocks), out=offsets[1:])
    return BlockedNonzeros(
        rows[order], cols[order], y[order].astype(np.uint8), raw[order].astype(np.float64), offsets
    )


def _block_sort_sorted(
    u: np.ndarray,
    i: np.ndarray,
    y: np.ndarray,
    raw: np.ndarray,
    row_bounds: np.ndarray,
    col_bounds: np.ndarray,
    groups: np.ndarray | None,
    n_groups: int,
) -> BlockedNonzeros:
    """``block_sort`` of nonzeros sorted by (u, i): one stable sort of (group, block)."""
    n_r, n_c = len(row_bounds) - 1, len(col_bounds) - 1
    cuts = np.searchsorted(u, row_bounds)
    r = np.repeat(np.arange(n_r, dtype=np.int64), np.diff(cuts))
    c = np.searchsorted(col_bounds, i, side="right") - 1
    rows = np.subtract(u, row_bounds[r], dtype=np.int64).astype(np.int32)
    cols = np.subtract(i, col_bounds[c], dtype=np.int64).astype(np.int32)
    key = r * n_c + c
    del r
    if groups is not None:
        key += groups.astype(np.int64) * (n_r * n_c)
    n_keys = n_groups * n_r * n_c
    small = key.astype(np.uint16) if n_keys <= 2**16 else key
    order = np.argsort(small, kind="stable")  # a radix sort for 16-bit keys
    offsets = np.zeros(n_keys + 1, dtype=np.int64)
    np.cumsum(np.bincount(key, minlength=n_keys), out=offsets[1:])
    return BlockedNonzeros(
        rows[order],
        cols[order],
        y[order].astype(np.uint8, copy=False),
        raw[order].astype(np.float64, copy=False),
        offsets,
    )


def indptr_starts(row_bounds: np.ndarray, n_c: int) -> np.ndarray:
    """Where each block's row pointer starts in a split's ``indptr`` array, int64
    (n_r n_c + 1,): block b = r n_c + c takes n_rows_r + 1 entries, blocks in order."""
    sizes = np.repeat(np.diff(np.asarray(row_bounds, dtype=np.int64)) + 1, n_c)
    out = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    return out


def block_indptr(part: BlockedNonzeros, row_bounds: np.ndarray, n_c: int) -> np.ndarray:
    """The row pointers of every block of ``part``, one after another (see indptr_starts)."""
    n_rows = np.diff(np.asarray(row_bounds, dtype=np.int64))
    pieces = [
        row_pointer(part.rows[part.offsets[b] : part.offsets[b + 1]], int(n_rows[b // n_c]))
        for b in range(len(part.offsets) - 1)
    ]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
