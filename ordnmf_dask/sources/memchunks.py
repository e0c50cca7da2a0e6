"""Data in memory as chunks of the ingest pipeline: each partition of a dask DataFrame is one
chunk, computed where it is parsed (as a Parquet row group is read there), and other data in
memory (pandas DataFrame, pyarrow Table, scipy.sparse matrix, arrays) is one chunk.

The rows of a chunk are read by ``memory.table_rows`` and ``memory.memory_rows``, whose checks
name the row; a partition's rows are
named ``"input DataFrame, partition P, row N"`` (N 0-based within the partition).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ordnmf_dask.sources.datakinds import is_sparse
from ordnmf_dask.sources.inmemory import (
    as_table,
    memory_rows,
    pick_columns,
    table_names,
    table_rows,
)
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.text import Column, Triples


@dataclass(frozen=True)
class MemoryChunk:
    """Rows in memory: partition ``file_index`` of a dask DataFrame (``data``: its key and the
    tasks it needs, culled from the frame's optimized graph) or a whole in-memory input
    (``data``: the object; ``file_index`` 0).

    ``index`` is the chunk's position in the input order; ``path`` names it in messages;
    ``columns`` are the picked column names of a partition or table (None for a matrix or
    arrays); ``partition`` says which of the two ``data`` is. ``data`` is
    dropped (``light``) once the chunk is parsed, so later tasks do not carry it.
    """

    index: int
    file_index: int
    path: str
    columns: tuple[str, ...] | None
    partition: bool
    data: Any = field(default=None, compare=False, repr=False)
    matrix_cols: int | None = None  # a sparse matrix's columns (its rows are named by cell)

    def light(self) -> MemoryChunk:
        """This chunk without its data (for the tasks after parsing)."""
        return dataclasses.replace(self, data=None)


def frame_chunks(
    frame: Any, columns: tuple[Column, Column, Column] | None, role: str, first_index: int
) -> tuple[list[MemoryChunk], str]:
    """One chunk per partition of a dask DataFrame, numbered from ``first_index``, and the
    label naming the frame; the columns are checked against the frame's (no data is read)."""
    import dask
    from dask.optimization import cull

    label = f"{role} DataFrame"
    picked = tuple(pick_columns(list(frame.columns), columns, label))
    named = {str(c): c for c in frame.columns}  # a table's column names are strings
    frame = frame[[named[c] for c in picked]]  # only the three columns are read
    # an expression-based frame (dask >= 2025) optimizes itself; a legacy one through dask
    frame = frame.optimize() if hasattr(frame, "optimize") else dask.optimize(frame)[0]
    graph = dict(frame.__dask_graph__())
    return [
        MemoryChunk(
            first_index + p,
            p,
            f"{label}, partition {p}",
            picked,
            True,
            (cull(graph, [key])[0], key),
        )
        for p, key in enumerate(frame.__dask_keys__())
    ], label


def memory_chunk(
    data: Any, label: str, columns: tuple[Column, Column, Column] | None, first_index: int
) -> MemoryChunk:
    """The one chunk of data in memory that is not a dask DataFrame (``label``:
    ``memory.memory_label``); a table's columns are picked here, before any task."""
    cols = int(data.shape[1]) if is_sparse(data) else None
    names = table_names(data)
    picked = None if names is None else tuple(pick_columns(names, columns, label))
    return MemoryChunk(first_index, 0, label, picked, False, data, cols)


def chunk_origin(chunk: MemoryChunk, rows: np.ndarray) -> Origin:
    """Origin of rows (0-based; of a sparse matrix, the entries' positions in it) of one
    chunk."""
    return Origin(
        (chunk.path,), np.zeros(len(rows), np.int32), rows, False, matrix_cols=chunk.matrix_cols
    )


def read_memory_chunk(chunk: MemoryChunk) -> Triples | None:
    """Triples of one chunk (None for an empty partition); errors name the row."""
    if chunk.partition:
        from dask.local import get_sync

        frame = get_sync(*chunk.data)  # in this task's process
        if len(frame) == 0:
            return None
        assert chunk.columns is not None  # a partition's columns were picked
        rows = table_rows(as_table(frame, chunk.path), list(chunk.columns), chunk.path)
    else:
        rows = memory_rows(chunk.data, chunk.path, chunk.columns)
    line = rows.origin.line
    line = np.arange(line, dtype=np.int64) if isinstance(line, int) else line
    return Triples(rows.users, rows.items, rows.values, chunk_origin(chunk, line))
