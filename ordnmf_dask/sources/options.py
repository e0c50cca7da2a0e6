"""The options of every ingest, their defaults, and the plan: every argument of an ingest checked
before any input is read."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack, cast

import numpy as np

from ordnmf_dask.params import (
    COMMAND_PARAMS,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_ROWS_PER_PARTITION,
    validate_call,
)
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.text import Column, check_columns, check_delimiter
from ordnmf_dask.sources.values import make_spec
from ordnmf_dask.store.blocks import check_target
from ordnmf_dask.store.grid import auto_grid, check_grid

PathLike = str | os.PathLike


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


#: the defaults of the options, the rows of ``params.COMMAND_PARAMS["ingest"]``
INGEST_DEFAULTS: IngestOptions = cast(
    IngestOptions,
    {name: COMMAND_PARAMS["ingest"][name].default for name in IngestOptions.__annotations__},
)


def with_defaults(options: IngestOptions) -> dict[str, Any]:
    """``options`` completed with ``INGEST_DEFAULTS``, checked (``check_ingest_options``) and
    converted by their rows; an unknown name is a TypeError."""
    unknown = sorted(set(options) - set(INGEST_DEFAULTS))
    if unknown:
        raise TypeError(f"ingest() got an unexpected keyword argument {unknown[0]!r}")
    return check_ingest_options({**INGEST_DEFAULTS, **options})


def check_ingest_options(o: dict[str, Any]) -> dict[str, Any]:
    """The options ``o`` checked by their rows of the table (InputError naming the first that
    breaks its rule) and converted, then as a whole, before any input is read: the value rule
    resolved on no values (``values.make_spec``), the block options as ``grid`` checks them."""
    o = validate_call("ingest", o)
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
    return o


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
    columns: tuple[Column, Column, Column] | None  # None: by name (tables), file_columns (files)
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
    sizes = {"chunk_bytes": chunk_bytes, "rows_per_partition": rows_per_partition}
    chunk_bytes, rows_per_partition = validate_call("ingest", sizes).values()
    picked = None if columns is None else check_columns(columns)
    check_delimiter(delimiter)
    return IngestPlan(
        inputs, out, test, delimiter, header, picked, chunk_bytes, rows_per_partition, opts
    )
