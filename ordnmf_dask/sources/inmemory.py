"""Readers of data in memory: a pandas DataFrame, a pyarrow Table or RecordBatch, a
scipy.sparse matrix or a ``(users, items, values)`` tuple of arrays, read as the same rows a CSV
file of them gives (ids and values checked as Parquet columns are; rows named ``LABEL, row N``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.columns import named_columns
from ordnmf_dask.sources.datakinds import is_pandas, is_sparse
from ordnmf_dask.sources.filtering import ids_from_array
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.parquet import column_ids, column_values
from ordnmf_dask.sources.text import check_columns


@dataclass(eq=False)
class Rows:
    """Raw input rows: ids (pyarrow strings, or np.ndarray of int64 or str, (n,)), values
    float64 (n,), and their origin."""

    users: Any
    items: Any
    values: np.ndarray
    origin: Origin


def memory_rows(data: Any, label: str, columns: Sequence[int | str] | None) -> Rows:
    """The rows of data in memory (``label``: ``memory_label``'s, naming them in messages)."""
    if isinstance(data, tuple):
        users, items, values = data
        return arrays_rows(users, items, values, label)
    if is_sparse(data):
        coo = data.tocoo()
        if np.iscomplexobj(coo.data):
            raise InputError(f"{label}: a complex matrix ({coo.data.dtype}); values must be real")
        stored = coo.data != 0  # an explicit zero is no interaction, as everywhere in scipy.sparse
        row, col = coo.row[stored], coo.col[stored]
        cells = Origin.matrix(row.astype(np.int64) * coo.shape[1] + col, coo.shape[1], label)
        return arrays_rows(row, col, coo.data[stored], label, cells)
    table = as_table(data, label)
    assert table is not None, label  # a Table or DataFrame: memory_label named it
    return table_rows(table, pick_columns(table.column_names, columns, label), label)


def as_table(data: object, label: str) -> pa.Table | None:
    """A pyarrow Table of a pandas DataFrame or a pyarrow Table / RecordBatch, else None; a
    DataFrame column that no Arrow type holds (ints mixed with strings in an object column) is
    an InputError naming it."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if is_pandas(data):
        try:
            return pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            raise InputError(f"{label}: {_mixed_column(data)}") from None
    return None


def _mixed_column(frame: Any) -> str:
    """What makes a pandas DataFrame unconvertible: its first column that Arrow refuses."""
    for name in frame.columns:
        try:
            pa.array(frame[name], from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            kinds = sorted({type(x).__name__ for x in frame[name] if x is not None})
            return (
                f"column {str(name)!r} mixes values of types {', '.join(kinds)}, which no "
                "column type holds; give it one type (e.g. .astype(str) for ids)"
            )
    return "cannot be read as a table"


def pick_columns(
    names: Sequence[Any], columns: Sequence[int | str] | None, label: str
) -> list[str]:
    """The names of the user, item and value columns of a table with columns ``names``: the
    names ``columns`` gives, or (None) those told by ``named_columns``. Positions are refused:
    a frame whose columns were reordered would be fitted silently wrong."""
    names = [str(n) for n in names]
    if columns is None:
        return named_columns(names, label)
    picked = []
    for c in check_columns(columns):
        if not isinstance(c, str):
            raise InputError(
                f"{label}: columns {tuple(columns)!r} are positions; a table's columns are "
                f"picked by name (its columns: {', '.join(names)})"
            )
        if c not in names:
            raise InputError(f"{label}: no column {c!r} (columns: {', '.join(names)})")
        picked.append(c)
    return picked


def table_names(data: Any) -> list[str] | None:
    """The column names of a pandas DataFrame or a pyarrow Table / RecordBatch, else None."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return list(data.schema.names)
    if is_pandas(data):
        return [str(c) for c in data.columns]
    return None


def table_rows(table: pa.Table, picked: list[str], label: str) -> Rows:
    """The user, item and value columns ``picked`` of a table, checked as Parquet columns are;
    rows are named ``LABEL, row N``."""
    if table.num_rows == 0:
        raise InputError(f"{label}: no data rows (it is empty)")
    origin = Origin.arrays(table.num_rows, label)
    cu, ci, cv = (table.column(name) for name in picked)
    return Rows(
        column_ids(cu, origin, "user", picked[0]),
        column_ids(ci, origin, "item", picked[1]),
        column_values(cv, origin, picked[2]),
        origin,
    )


def arrays_rows(
    users: Any,
    items: Any,
    values: Any,
    label: str,
    cells: Origin | None = None,
) -> Rows:
    """The rows of ``(users, items, values)`` arrays; ``cells``: their origin in the sparse
    matrix they come from (:meth:`Origin.matrix`), which messages name instead of the entry's
    position among the stored ones."""
    u = ids_from_array(users, label, "user")
    i = ids_from_array(items, label, "item")
    if np.iscomplexobj(values):
        raise InputError(f"{label}: complex values; values must be real numbers")
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{label}: values are not numbers ({exc})") from None
    if v.ndim != 1 or not len(u) == len(i) == len(v):
        raise InputError(f"{label}: users, items, values must be 1-D of equal length")
    if len(v) == 0:
        raise InputError(f"{label}: no data rows (empty arrays)")
    origin = Origin.arrays(len(v), label) if cells is None else cells
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise InputError(f"{origin.where(int(bad[0]))}: value {v[bad[0]]} is not finite")
    return Rows(u, i, v, origin)
