"""One interface to every reader: ``rows_of`` gives the rows of files (text or Parquet, local
or at URLs) or of data in memory, with the label that names them in messages and the sources
the store records."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ordnmf_dask.sources.datakinds import memory_label
from ordnmf_dask.sources.filtering import raw_ids
from ordnmf_dask.sources.inputs import as_list, expand_inputs, inputs_label, is_parquet, source_name
from ordnmf_dask.sources.memory import Rows, memory_rows
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.parquet import (
    check_same_columns,
    check_some_rows,
    parquet_format_of,
    read_parquet,
)
from ordnmf_dask.sources.text import (
    Column,
    Triples,
    check_columns,
    check_delimiter,
    concat_ids,
    read_text,
)


def rows_of(
    data: Any,
    delimiter: str | None,
    header: bool | None,
    columns: Sequence[int | str],
    role: str,
    ids: bool = False,
) -> tuple[Rows, str, list[str]]:
    """Rows of files or of data in memory, the label that names them in messages and the
    sources recorded in the store. ``ids``: raw ids as arrays (for a test set)."""
    label = memory_label(data, role)
    sources: list[str] = []  # files only
    if label is None:
        paths = as_list(data)
        parsed = read_triples(paths, delimiter=delimiter, header=header, columns=columns)
        rows = Rows(parsed.users, parsed.items, parsed.values, parsed.origin)
        del parsed  # the build frees the ids once encoded
        label, sources = inputs_label(paths), [source_name(p) for p in paths]
    else:
        rows = memory_rows(data, label, columns)
    if ids:
        rows.users = raw_ids(rows.users, rows.origin, "user")
        rows.items = raw_ids(rows.items, rows.origin, "item")
    return rows, label, sources


def read_triples(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    delimiter: str | None = None,
    header: bool | None = None,
    columns: Sequence[Column] = (0, 1, 2),
) -> Triples:
    """Read and concatenate triples from one or more files (line numbers are per file).

    Parameters
    ----------
    paths : path, URL or glob, or a sequence of them
        Text files (compressed by suffix); Parquet files (``.parquet`` / ``.parq``) and
        directories of them are read row group by row group (``ordnmf_dask.sources.parquet``).
    delimiter : str, optional
        One of ``DELIMITERS``; if None, found per file from its first non-blank line by
        ``csv.Sniffer`` (tab, comma, semicolon, ``::`` or whitespace).
    header : bool, optional
        True: the first non-blank line is a header. False: there is none. None: the first
        non-blank line is a header iff its value column is not a number.
    columns : (int or str, int or str, int or str)
        User, item and value columns: 0-based indices, or names (text: fields of the header
        line, which must then be there; Parquet: column names).

    Raises
    ------
    InputError
        Missing or unreadable file, bad quoting, a line with too few or too many columns, a
        non-numeric or non-finite value, a file without data rows, or Parquet files whose user,
        item and value columns have different names.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = expand_inputs(list(paths))
    columns = check_columns(columns)
    check_delimiter(delimiter)
    formats = {p: parquet_format_of(p, columns) for p in paths if is_parquet(p)}
    check_same_columns(list(formats.values()))
    check_some_rows(list(formats.values()), len(paths))
    parts = [
        read_parquet(formats[p]) if p in formats else read_text(p, delimiter, header, columns)
        for p in paths
        if p not in formats or formats[p].n_rows
    ]
    if len(parts) == 1:
        return parts[0]
    return Triples(
        concat_ids([t.users for t in parts]),
        concat_ids([t.items for t in parts]),
        np.concatenate([t.values for t in parts]),
        Origin.concat([t.origin for t in parts]),
    )
