"""Read (user, item, value) rows from Parquet files, one row group at a time.

A row group is the chunk unit of Parquet input (what a byte range is for text): the in-memory
reader (``readers.read_triples``) and the distributed ingest (:mod:`.distributed`) both read a file
group by group with ``read_row_group``, never a whole file in one piece. Columns are chosen by
name or by 0-based position in the file's schema (``columns``, as for text). Ids may be integer
columns (kept as int64), string columns (whitespace-stripped, then treated exactly like text
ids) or integral floats within int64; values may be numeric or string columns (parsed like
text). The checks of ids and values are the text reader's (``filtering.encode_ids``,
``text.text_values``). Rows are numbered from 0 in their file; messages name the file, the row
and its row group. A file without rows adds nothing (``check_some_rows``). All Parquet files of
one input must have the same user, item and value column names (``check_same_columns``), so
that files with different schemas are never merged by position.

Needs pyarrow (the ``parquet`` extra); without it a Parquet input is an ``InputError`` saying
so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.columns import file_columns
from ordnmf_dask.sources.filtering import float_ids
from ordnmf_dask.sources.infile import check_row_groups, open_parquet
from ordnmf_dask.sources.origin import Origin, RowGroups
from ordnmf_dask.sources.text import (
    Column,
    Triples,
    concat_ids,
    open_input,
    release_memory,
    text_values,
)

_INT64_MAX = np.iinfo(np.int64).max
log = logging.getLogger(__name__)


def _pyarrow(path: str) -> tuple[Any, Any]:
    """(pyarrow, pyarrow.parquet), or an InputError naming the extra to install."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise InputError(
            f"{path}: reading Parquet needs pyarrow; install it with the 'parquet' extra "
            "(pip install 'ordnmf-dask[parquet]')"
        ) from None
    return pyarrow, pyarrow.parquet


def _open(path: str) -> Any:
    _pyarrow(path)
    return open_parquet(open_input(path, compression=None), path)


@dataclass(frozen=True)
class ParquetFormat:
    """A Parquet file's resolved (user, item, value) column names, their types and row groups."""

    path: str
    columns: tuple[str, str, str]
    types: tuple[str, str, str]  # pyarrow type names ("int64", "string", ...), not dictionary
    starts: tuple[int, ...]  # first row (0-based, in the file) of each row group
    counts: tuple[int, ...]  # rows of each row group

    @property
    def n_rows(self) -> int:
        return sum(self.counts)

    @property
    def row_groups(self) -> RowGroups:
        return RowGroups(0, self.starts)


@dataclass(frozen=True)
class ParquetChunk:
    """Row group ``group`` of ``path`` (rows ``first_row .. first_row + n_rows - 1``).

    ``index`` is the chunk's position in the input order; ``file_index`` the file's.
    """

    index: int
    file_index: int
    path: str
    group: int
    first_row: int
    n_rows: int
    columns: tuple[str, str, str]


def parquet_format_of(path: str, columns: tuple[Column, Column, Column] | None) -> ParquetFormat:
    """Read the footer of ``path``: resolve the columns (None: as ``file_columns`` chooses
    them from the schema's names) and list the row groups."""
    pf = _open(path)
    names = list(pf.schema_arrow.names)
    if columns is None:
        columns = file_columns(names, path)
    resolved = []
    for c in columns:
        if isinstance(c, str):
            if c not in names:
                raise InputError(f"{path}: no column {c!r} (columns: {', '.join(names)})")
            resolved.append(c)
        elif c >= len(names):
            raise InputError(
                f"{path}: no column {c} (0-based); the file has {len(names)} columns: "
                f"{', '.join(names)}"
            )
        else:
            resolved.append(names[c])
    if len(set(resolved)) != 3:
        raise InputError(f"{path}: columns {columns!r} name the same column twice")
    pa, _ = _pyarrow(path)
    plain = [pf.schema_arrow.field(name).type for name in resolved]
    types = tuple(str(t.value_type if pa.types.is_dictionary(t) else t) for t in plain)
    meta = pf.metadata
    check_row_groups(meta, path)
    counts = tuple(int(meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
    starts = tuple(int(x) for x in np.cumsum((0, *counts))[:-1])  # none without row groups
    return ParquetFormat(path, tuple(resolved), types, starts, counts)  # type: ignore[arg-type]


def check_same_columns(formats: Sequence[ParquetFormat]) -> None:
    """Raise InputError unless every file has the first one's user, item and value column names.

    The message names both files and each differing column with its type. Types may differ
    where the readers treat them alike (integer, integral float and string ids are all raw ids;
    numeric and string values are parsed as numbers); other types are refused per file.
    """
    if not formats:
        return
    first = formats[0]
    for fmt in formats[1:]:
        diff = [
            f"{role} {a!r} ({ta}) vs {b!r} ({tb})"
            for role, a, ta, b, tb in zip(
                ("user", "item", "value"),
                fmt.columns,
                fmt.types,
                first.columns,
                first.types,
                strict=True,
            )
            if a != b
        ]
        if diff:
            raise InputError(
                f"{fmt.path}: columns differ from {first.path}: {'; '.join(diff)}; all Parquet "
                "files of one input need the same column names"
            )


def check_some_rows(formats: Sequence[ParquetFormat], n_files: int) -> None:
    """Raise InputError if the ``n_files`` files of an input are all Parquet files without rows.

    A 0-row file (a part file as Spark and Dask write them) adds nothing to an input, as long as
    its columns are the others' (``check_same_columns``) and some file has rows.
    """
    if not formats or len(formats) < n_files or any(f.n_rows for f in formats):
        return
    if len(formats) == 1:
        raise InputError(f"{formats[0].path}: no data rows (the file is empty)")
    raise InputError(
        f"{formats[0].path} and {len(formats) - 1} more Parquet files: no data rows "
        "(every file is empty)"
    )


def parquet_chunks(fmt: ParquetFormat, file_index: int, first_index: int) -> list[ParquetChunk]:
    """One chunk per non-empty row group of a file, numbered from ``first_index``."""
    out: list[ParquetChunk] = []
    for g, (start, n) in enumerate(zip(fmt.starts, fmt.counts, strict=True)):
        if n:
            out.append(
                ParquetChunk(first_index + len(out), file_index, fmt.path, g, start, n, fmt.columns)
            )
    return out


def chunk_origin(chunk: ParquetChunk, rows: np.ndarray) -> Origin:
    """Origin of rows (0-based, in the file) of one row group."""
    groups = (RowGroups(chunk.group, (chunk.first_row,)),)
    return Origin((chunk.path,), np.zeros(len(rows), np.int32), rows, True, groups)


def read_row_group(chunk: ParquetChunk) -> Triples | None:
    """Triples of one row group (None if it has no rows); errors name the file and row."""
    pa, _ = _pyarrow(chunk.path)
    pf = _open(chunk.path)
    try:
        table = pf.read_row_group(chunk.group, columns=list(chunk.columns))
    except (OSError, ValueError) as exc:
        raise InputError(f"{chunk.path}, row group {chunk.group}: cannot read ({exc})") from None
    if table.num_rows == 0:
        return None
    rows = chunk.first_row + np.arange(table.num_rows, dtype=np.int64)
    origin = chunk_origin(chunk, rows)
    cu, ci, cv = (table.column(name) for name in chunk.columns)
    users = column_ids(cu, origin, "user", chunk.columns[0])
    items = column_ids(ci, origin, "item", chunk.columns[1])
    values = column_values(cv, origin, chunk.columns[2])
    return Triples(users, items, values, origin)


def read_parquet(fmt: ParquetFormat) -> Triples:
    """Every row of a Parquet file (its format from ``parquet_format_of``), group by group."""
    path = fmt.path
    parts = [t for c in parquet_chunks(fmt, 0, 0) if (t := read_row_group(c)) is not None]
    release_memory()  # what reading the row groups freed
    # the row groups in order hold rows 0 .. n - 1 of the file: no array needed to name them
    origin = Origin((path,), None, sum(len(t) for t in parts), True, (fmt.row_groups,))
    return Triples(
        concat_ids([t.users for t in parts]),
        concat_ids([t.items for t in parts]),
        np.concatenate([t.values for t in parts]),
        origin,
    )


def _plain(pa: Any, col: Any, origin: Origin, what: str) -> Any:
    """``col`` without dictionary encoding; an error names the first null row."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if col.null_count:
        k = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"{origin.where(k)}: null {what}")
    return col


def _is_string(pa: Any, t: Any) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or str(t) == "string_view"


def column_ids(col: Any, origin: Origin, what: str, name: str) -> Any:
    """int64 ids of an integer or integral float column, or the strings of a string column
    (Parquet, or a table in memory); errors name the row."""
    import pyarrow as pa

    col = _plain(pa, col, origin, f"{what} id")
    t = col.type
    if pa.types.is_integer(t):
        ids = col.to_numpy()
        if pa.types.is_unsigned_integer(t) and ids.size and ids.max() > _INT64_MAX:
            k = int(np.argmax(ids > _INT64_MAX))
            raise InputError(f"{origin.where(k)}: {what} id {ids[k]} does not fit in int64")
        return ids.astype(np.int64)
    if pa.types.is_floating(t):
        return float_ids(col.to_numpy(), origin.where, what)
    if _is_string(pa, t):
        return col
    raise InputError(
        f"{origin.sources[0]}: column {name!r} ({what} ids) has type {t}; "
        "ids must be integers or strings"
    )


def column_values(col: Any, origin: Origin, name: str) -> np.ndarray:
    """Finite float64 values of a numeric or string column; errors name the row."""
    import pyarrow as pa

    col = _plain(pa, col, origin, "value")
    t = col.type
    if pa.types.is_decimal(t):
        col = col.cast(pa.float64())
    if (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or _is_string(pa, t)
        or pa.types.is_decimal(t)
    ):
        return text_values(col, origin)
    raise InputError(
        f"{origin.sources[0]}: column {name!r} (values) has type {t}; values must be numbers"
    )
