"""The entry point of every ingest: ``options.plan_ingest`` checks every argument before any
input is read (the check a command runs before it starts a cluster), ``run_plan`` builds the
store with the chunked pipeline, its tasks run in this process or on a cluster; ``ingest`` is
the two in one call."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Unpack

import numpy as np

from ordnmf_dask.params import DEFAULT_CHUNK_BYTES, DEFAULT_ROWS_PER_PARTITION, rows_doc
from ordnmf_dask.runtime.progress import shows_progress
from ordnmf_dask.runtime.runner import Runner
from ordnmf_dask.sources.distributed import build_chunked
from ordnmf_dask.sources.options import IngestOptions, IngestPlan, plan_ingest
from ordnmf_dask.store.blocks import StoreInfo

PathLike = str | os.PathLike

log = logging.getLogger("ordnmf_dask")


def run_plan(plan: IngestPlan, client: Any = None) -> StoreInfo:
    """Build the store of ``plan`` with the chunked pipeline (:mod:`.distributed`): its tasks
    run on ``client``, or in this process when it is None."""
    start = time.monotonic()
    info = build_chunked(plan, Runner(client))
    log.info(
        "ingest: %s: %d users x %d items, %d train / %d test nonzeros in %d x %d blocks (%.1f s)",
        info.path,
        info.n_users,
        info.n_items,
        info.nnz_train,
        info.nnz_test,
        *info.grid,
        time.monotonic() - start,
    )
    return info


@shows_progress
@rows_doc("ingest")
def ingest(
    inputs: Any,
    out: PathLike,
    *,
    client: Any = None,
    test: Any = None,
    delimiter: str | None = None,
    header: bool | None = None,
    columns: Sequence[int | str] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION,
    **options: Unpack[IngestOptions],
) -> StoreInfo:
    """Ingest (user, item, value) rows into a block store at ``out``.

    Parameters
    ----------
    inputs : path, URL or glob, a sequence of them, or data in memory
        Training data (all data if ``test`` is None). Files: several are concatenated;
        delimited text (compressed by suffix: ``.gz``, ``.bz2``, ``.zst``, ...) or Parquet
        (files ending in ``.parquet`` / ``.parq``, or directories of them, read row group by row
        group), local or at any fsspec URL (``s3://``, ``gs://``, ``http(s)://``, ...). In
        memory: a pandas DataFrame or a pyarrow Table (its user, item and value columns told
        by name, ``columns.COLUMN_NAMES``, or named by ``columns``), a scipy.sparse matrix
        (users are rows, items columns, values its stored entries; explicit zeros are
        dropped) or a ``(users, items, values)`` tuple of arrays; each gives the same store
        as a CSV file of the same rows. A dask DataFrame (here or as ``test``) is read
        partition by partition.
    out : path
        Store directory to create (see ``ordnmf_dask.store.blocks``).
    test : same kinds as ``inputs``, optional
        A held-out test set (same format and value rules) instead of a random split. Rows whose
        user or item is not in the filtered training data are dropped, counted in the attribute
        ``test_unknown_dropped`` and reported with a warning; a pair also in ``inputs`` is an error,
        and so is a test set left empty.
    delimiter, header, columns
        Parsing options; see ``ordnmf_dask.sources.readers.read_triples``. ``columns`` are 0-based
        positions or column names (a text header's fields, Parquet column names) of files,
        by default the columns a file's names tell, else 0, 1, 2 (``columns.file_columns``);
        the column names of a DataFrame or Table, whose columns are otherwise told by their
        names (never by position).
    <the rows of params.COMMAND_PARAMS["ingest"]>
    client : distributed.Client, optional
        Run the tasks of the chunked pipeline (:mod:`.distributed`) on this cluster: every
        worker must see the input files, and ``out``'s directory when it is local. None: they
        run in this process (a small input staged in memory, a larger one in files).

    Returns
    -------
    StoreInfo

    Raises
    ------
    InputError
        Any invalid input; nothing is left at ``out`` nor in a temporary sibling.

    Examples
    --------
    >>> from pathlib import Path
    >>> from ordnmf_dask import ingest
    >>> rows = ["user,item,rating", "1,10,4", "1,11,5", "2,10,3", "2,12,4", "3,11,2"]
    >>> _ = Path("r.csv").write_text("\\n".join(rows) + "\\n")
    >>> store = ingest("r.csv", "r.zarr", test_fraction=0)  # every rating trains
    >>> store.n_users, store.n_items, store.nnz_train
    (3, 3, 5)
    """
    plan = plan_ingest(
        inputs,
        out,
        test=test,
        delimiter=delimiter,
        header=header,
        columns=columns,
        chunk_bytes=chunk_bytes,
        rows_per_partition=rows_per_partition,
        **options,
    )
    return run_plan(plan, client)


#: The same function as :func:`ingest` (one pipeline, in this process or on ``client``), under
#: the name that code written for inputs larger than memory calls.
ingest_distributed = ingest


@shows_progress
def ingest_arrays(
    users: Sequence | np.ndarray,
    items: Sequence | np.ndarray,
    values: Sequence | np.ndarray,
    out: PathLike,
    *,
    test: tuple[Sequence, Sequence, Sequence] | None = None,
    **options: Unpack[IngestOptions],
) -> StoreInfo:
    """``ingest((users, items, values), out, ...)``: in-memory arrays of shape (n,); raw ids may
    be integers (stored as int64) or strings; errors name the 0-based row.

    Examples
    --------
    >>> from ordnmf_dask import ingest_arrays
    >>> users, items, stars = ["ann", "ann", "bob"], [10, 11, 10], [4, 5, 3]
    >>> store = ingest_arrays(users, items, stars, "a.zarr", test_fraction=0)
    >>> store.n_users, store.n_items, store.nnz_train
    (2, 2, 3)
    """
    return run_plan(plan_ingest((users, items, values), out, test=test, **options))
