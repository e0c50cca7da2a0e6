"""The options of every ingest, their defaults, and the plan: every argument of an ingest checked
before any input is read."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import numpy as np

from ordnmf_dask.errors import InputError, shown
from ordnmf_dask.sources.filtering import DUPLICATE_POLICIES, FILTER_MODES
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.split import check_test_fraction, check_validation_fraction
from ordnmf_dask.sources.text import Column, check_columns, check_delimiter
from ordnmf_dask.sources.values import make_spec
from ordnmf_dask.store.blocks import check_target
from ordnmf_dask.store.grid import DEFAULT_NNZ_PER_BLOCK, auto_grid, check_grid

PathLike = str | os.PathLike
DEFAULT_CHUNK_BYTES = 2**24
DEFAULT_ROWS_PER_PARTITION = 2**22


class IngestOptions(TypedDict, total=False):
    """The options of every ingest (``ingest``, ``ingest_arrays``; ``ingest_distributed`` takes
    the same), described in ``ingest``; ``INGEST_DEFAULTS`` holds their defaults."""

    ratings: str | None
    counts: str | Sequence[float] | None
    binarize: float | None
    scale_max: int | None
    min_count: int
    filter_mode: str
    duplicates: str
    test_fraction: float
    validation_fraction: float
    seed: int
    nnz_per_block: int
    grid: tuple[int, int] | None
    overwrite: bool


INGEST_DEFAULTS: IngestOptions = {
    "ratings": None,
    "counts": None,
    "binarize": None,
    "scale_max": None,
    "min_count": 0,
    "filter_mode": "paper",
    "duplicates": "error",
    "test_fraction": 0.2,
    "validation_fraction": 0.0,
    "seed": 0,
    "nnz_per_block": DEFAULT_NNZ_PER_BLOCK,
    "grid": None,
    "overwrite": False,
}


def with_defaults(options: IngestOptions) -> dict[str, Any]:
    """``options`` completed with ``INGEST_DEFAULTS`` and checked (``check_ingest_options``);
    an unknown name is a TypeError."""
    unknown = sorted(set(options) - set(INGEST_DEFAULTS))
    if unknown:
        raise TypeError(f"ingest() got an unexpected keyword argument {unknown[0]!r}")
    opts = {**INGEST_DEFAULTS, **options}
    check_ingest_options(opts)
    return opts


def check_ingest_options(o: dict[str, Any]) -> None:
    """Raise InputError for an option that is wrong whatever the data, before any is read.

    The value rule is resolved on no values (``values.make_spec``), which checks every value
    option; the block options are checked as ``grid`` checks them.
    """
    check_options(o["min_count"], o["filter_mode"], o["duplicates"], o["test_fraction"], o["seed"])
    check_validation_fraction(o["validation_fraction"])
    make_spec(
        np.zeros(0),
        Origin.arrays(0),
        ratings=o["ratings"],
        counts=o["counts"],
        binarize=o["binarize"],
        scale_max=o["scale_max"],
    )
    if o["grid"] is None:
        auto_grid(0, 1, 1, o["nnz_per_block"])
    else:
        check_grid(o["grid"])


def check_options(
    min_count: int, filter_mode: str, duplicates: str, test_fraction: float, seed: int
) -> None:
    if isinstance(min_count, bool) or int(min_count) != min_count or min_count < 0:
        raise InputError(f"min_count must be a non-negative integer, got {shown(min_count)}")
    if filter_mode not in FILTER_MODES:
        raise InputError(f"filter_mode must be one of {FILTER_MODES}, got {filter_mode!r}")
    if duplicates not in DUPLICATE_POLICIES:
        raise InputError(f"duplicates must be one of {DUPLICATE_POLICIES}, got {duplicates!r}")
    check_test_fraction(test_fraction)
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {shown(seed)}")


@dataclass(frozen=True, eq=False)
class IngestPlan:
    """An ingest whose arguments are all checked (``plan_ingest``): the inputs, the store to
    write, the parsing options, the chunk sizes of the chunked pipeline and the ingest options
    with their defaults."""

    inputs: Any
    out: PathLike
    test: Any
    delimiter: str | None
    header: bool | None
    columns: tuple[Column, Column, Column] | None  # None: by name (tables), 0, 1, 2 (files)
    chunk_bytes: int
    rows_per_partition: int
    options: dict[str, Any]


def plan_ingest(
    inputs: Any,
    out: PathLike,
    *,
    test: Any = None,
    delimiter: str | None = None,
    header: bool | None = None,
    columns: Sequence[int | str] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION,
    **options: Unpack[IngestOptions],
) -> IngestPlan:
    """Check ``out`` and every argument of ``ingest`` (the same names) that can be checked
    without reading the inputs (InputError; an unknown option is a TypeError), and return them
    as a plan. A caller that starts a cluster for the ingest
    plans it first."""
    opts = with_defaults(options)
    check_target(out, opts["overwrite"])
    for name, value in (("chunk_bytes", chunk_bytes), ("rows_per_partition", rows_per_partition)):
        if value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    picked = None if columns is None else check_columns(columns)
    check_delimiter(delimiter)
    return IngestPlan(
        inputs, out, test, delimiter, header, picked, chunk_bytes, rows_per_partition, opts
    )
