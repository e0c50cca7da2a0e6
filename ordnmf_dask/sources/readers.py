"""Read whole files (text or Parquet, local or at URLs) into triples: ``read_triples``, the
ingest's parsing rules applied to files read in one go."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ordnmf_dask.sources.inputs import expand_inputs, is_parquet
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


def read_triples(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    delimiter: str | None = None,
    header: bool | None = None,
    columns: Sequence[Column] | None = None,
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
    columns : (int or str, int or str, int or str), optional
        User, item and value columns: 0-based indices, or names (text: fields of the header
        line, which must then be there; Parquet: column names). None: the names of a header
        line or of a Parquet schema, where they tell all three, else 0, 1, 2
        (``columns.file_columns``).

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
    picked = None if columns is None else check_columns(columns)
    check_delimiter(delimiter)
    formats = {p: parquet_format_of(p, picked) for p in paths if is_parquet(p)}
    check_same_columns(list(formats.values()))
    check_some_rows(list(formats.values()), len(paths))
    parts = [
        read_parquet(formats[p]) if p in formats else read_text(p, delimiter, header, picked)
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
