"""A model's index of its users' training items, so that recommendations leave them out without
the training store: per user-block r, a CSR of the global item indices of each user's training
nonzeros (``MODEL/seen/indptr/<r>``, int64, and ``MODEL/seen/indices/<r>``, int32; layout in
docs/model-format.md). Written at save time by one task per user-block, which reads that
user-block's training blocks (columns only) from the store, through the model's chunk writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import zarr

from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.store.blocks import read_block

if TYPE_CHECKING:
    from distributed import Client, Future

INDPTR, INDICES = "seen/indptr", "seen/indices"


def write(store: str, model: str, r: int, col_bounds: list[int]) -> None:
    """Write the index of user-block ``r`` of ``store`` into the model being written at
    ``model``; on a worker. Holds the user-block's training columns and the index (2 x its
    nonzeros int32)."""
    blocks = [read_block(store, "train", r, c, values=()) for c in range(len(col_bounds) - 1)]
    lengths = np.stack([np.diff(b.indptr) for b in blocks])  # (C, n_r)
    indptr = np.zeros(lengths.shape[1] + 1, dtype=np.int64)
    np.cumsum(lengths.sum(axis=0), out=indptr[1:])
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    cursor = indptr[:-1].copy()  # next free slot of each row
    for c, b in enumerate(blocks):  # item-blocks in order: each row's items stay increasing
        dest = np.repeat(cursor - b.indptr[:-1], lengths[c]) + np.arange(len(b.cols))
        indices[dest] = b.cols.astype(np.int32) + np.int32(col_bounds[c])
        cursor += lengths[c]
    chunkstore.save_array(indptr, model, INDPTR, r, dtype=np.int64)
    chunkstore.save_array(indices, model, INDICES, r, dtype=np.int32)


def start_writing(
    client: Client,
    store: str,
    root: zarr.Group,
    model: str,
    row_bounds: list[int],
    col_bounds: list[int],
) -> list[Future]:
    """Start writing the index of every user-block of ``store`` into the model being written
    at ``model`` (whose group is ``root``)."""
    seen = root.create_group("seen")
    seen.create_group("indptr")
    seen.create_group("indices")
    bounds = [int(x) for x in col_bounds]
    return [
        client.submit(write, store, model, r, bounds, pure=False)
        for r in range(len(row_bounds) - 1)
    ]


def load_index(model: str, r: int) -> tuple[np.ndarray, np.ndarray]:
    """The index of user-block ``r``: its CSR row pointer (int64) and global item indices
    (int32), each file checked on read."""
    return chunkstore.load_array(model, INDPTR, r), chunkstore.load_array(model, INDICES, r)


def load(model: str, r: int, n_items: int, rows: np.ndarray | None = None) -> CsrBlock:
    """The training items (global indices) of the users of user-block ``r`` (only its local
    ``rows``, increasing, if given), as a (n_rows, n_items) CSR; each file checked on read."""
    indptr, indices = load_index(model, r)
    block = CsrBlock(
        indptr, indices, np.ones(len(indices), dtype=np.uint8), (len(indptr) - 1, n_items)
    )
    return block if rows is None else block.take_rows(rows)


def columns(block: CsrBlock, lo: int, hi: int) -> CsrBlock:
    """The entries of ``block`` in the columns ``lo .. hi - 1``, renumbered from 0: the
    training nonzeros of one item-block, as :func:`ordnmf_dask.store.csr.load_block` gives
    them."""
    keep = (block.cols >= lo) & (block.cols < hi)
    return CsrBlock.from_coo(
        block.rows[keep], block.cols[keep] - lo, block.y[keep], (block.shape[0], hi - lo)
    )
