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

from ordnmf_dask.params import DEFAULT_CHUNK_BYTES, DEFAULT_ROWS_PER_PARTITION
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
        by name, ``memory.COLUMN_NAMES``, or named by ``columns``), a scipy.sparse matrix
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
        default 0, 1, 2; the column names of a DataFrame or Table, whose columns are otherwise
        told by their names (never by position).
    ratings : {"halfstar", "integer"}, optional
    counts : "paper" or sequence of float, optional
        Count thresholds; see ``ordnmf_dask.sources.values``.
    binarize : float, optional
        Keep rows with value (class, if ratings/counts is given) >= S as class 1; drop the rest.
    scale_max : int, optional
        V for ``ratings="integer"`` (default: largest value in train and test).
        With none of ratings/counts/binarize, all-positive-integer data are integer ratings.
    min_count : int
        Remove users and items with fewer interactions (before the split).
    filter_mode : {"paper", "stable"}
        "paper": items then users, once; "stable": repeat until nothing changes.
    duplicates : {"error", "sum", "max", "last"}
        What to do with repeated (user, item) pairs (values are merged before classes).
    test_fraction : float
        Fraction of the nonzeros drawn at random for test (ignored if ``test`` is given).
    validation_fraction : float
        Fraction of the training nonzeros (those left by the test split) kept apart as the
        validation subset, for validation during the fit, by the same seeded pair hash
        (``ordnmf_dask.sources.split.split_rule``). 0: no validation subset.
    seed : int
        Seed of the random split: a pair is test if the seeded hash of its raw (user, item) ids
        is below ``test_fraction * 2^64`` (``ordnmf_dask.sources.split``), so each pair keeps
        its subset when data are added; the test set holds about ``test_fraction`` of them.
    nnz_per_block : int
        Target train nonzeros per block when ``grid`` is None.
    grid : (int, int), optional
        Explicit (n_r, n_c).
    overwrite : bool
        Replace an existing store at ``out`` (only after the new one is complete).
    client : distributed.Client, optional
        Run the tasks of the chunked pipeline (:mod:`.distributed`) on this cluster: every
        worker must see the input files, and ``out``'s directory when it is local. None: they
        run in this process (a small input staged in memory, a larger one in files).
    chunk_bytes : int
        Bytes of text per parsing task of the chunked pipeline (default 16 MiB; about 20x that
        in memory while parsing). Parquet files are parsed one row group per task.
    rows_per_partition : int
        Average input rows per merge/filter/route task of the chunked pipeline.

    Returns
    -------
    StoreInfo

    Raises
    ------
    InputError
        Any invalid input; nothing is left at ``out`` nor in a temporary sibling.
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
    be integers (stored as int64) or strings; errors name the 0-based row."""
    return run_plan(plan_ingest((users, items, values), out, test=test, **options))
