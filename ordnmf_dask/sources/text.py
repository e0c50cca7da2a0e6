"""Read (user, item, value) triples from delimited text files (and Parquet, see ``parquet``).

Supported: CSV, TSV, MovieLens ``::`` ``.dat`` and whitespace-separated files, with LF or CRLF
line endings, an optional header line and any number of extra columns (e.g. timestamps).
Comma, tab and semicolon files follow RFC 4180 quoting (``"Smith, 7"``, ``"say ""hi"" 2"``),
except that a quoted field may not span lines, so that every record is one line (and byte ranges
cut at newlines are whole records); lines without a quote character take a plain ``str.split``.
Users and items are kept as raw strings (without their quotes, whitespace-stripped; ids with
control characters are refused, as they could not be written back as text); values are parsed
as float64. Files ending in ``.parquet`` / ``.parq``, and directories of them, are read by
``ordnmf_dask.sources.parquet``; the checks of ids and values (``string_ids``, ``string_values``,
``finite_values``) are shared.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.origin import Origin

#: Accepted spellings of ``delimiter``; ``None`` as a value means "any run of whitespace".
DELIMITERS: dict[str, str | None] = {
    ",": ",",
    "comma": ",",
    "\t": "\t",
    "tab": "\t",
    "::": "::",
    ";": ";",
    " ": None,
    "whitespace": None,
}
#: Resolved delimiters whose files follow RFC 4180 quoting (``::`` and whitespace do not).
QUOTING = (",", "\t", ";")
#: Characters refused in ids: C0 and C1 controls (NUL, tab, CR, ...) and the Unicode line and
#: paragraph separators, which would not survive a line-based text file.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True, eq=False)
class Triples:
    """Parsed interactions, one entry per data row.

    Attributes
    ----------
    users, items : np.ndarray of str or int64, shape (n,)
        Raw ids: whitespace-stripped strings (text, Parquet string columns), or int64 (Parquet
        integer columns).
    values : np.ndarray of float64, shape (n,)
        Finite values.
    origin : Origin
        File and 1-based line number of every row (Parquet: 0-based row in the file).
    """

    users: np.ndarray
    items: np.ndarray
    values: np.ndarray
    origin: Origin

    def __len__(self) -> int:
        return len(self.values)


#: A column given by 0-based position or by name (a header field, or a Parquet column).
Column = int | str


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
    paths : path or sequence of paths
        Text files; Parquet files (``.parquet`` / ``.parq``) and directories of them are read
        row group by row group (``ordnmf_dask.sources.parquet``).
    delimiter : str, optional
        One of ``DELIMITERS``; auto-detected per file from the first data line if None
        (tab, then ``::``, then comma, else whitespace).
    header : bool, optional
        True: the first non-blank line is a header. False: there is none. None: the first
        non-blank line is a header iff its value column is not a number.
    columns : (int or str, int or str, int or str)
        User, item and value columns: 0-based indices, or names (text: fields of the header
        line, which must then be there; Parquet: column names).

    Raises
    ------
    InputError
        Missing or unreadable file, bad quoting, a line with too few columns, an empty id or one
        with a control character, a non-numeric or non-finite value, a file without data rows,
        or Parquet files whose user, item and value columns have different names.
    """
    from ordnmf_dask.sources.parquet import (
        check_same_columns,
        expand_inputs,
        is_parquet,
        parquet_format_of,
        read_parquet,
    )

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = expand_inputs(list(paths))
    columns = check_columns(columns)
    if delimiter is not None and delimiter not in DELIMITERS:
        raise InputError(f"unknown delimiter {delimiter!r}; use one of {sorted(DELIMITERS)}")
    formats = {p: parquet_format_of(p, columns) for p in paths if is_parquet(p)}
    check_same_columns(list(formats.values()))
    parts = [
        read_parquet(formats[p]) if p in formats else _read_one(p, delimiter, header, columns)
        for p in paths
    ]
    if len(parts) == 1:
        return parts[0]
    return Triples(
        concat_ids([t.users for t in parts]),
        concat_ids([t.items for t in parts]),
        np.concatenate([t.values for t in parts]),
        Origin.concat([t.origin for t in parts]),
    )


def concat_ids(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenated raw ids: int64 if every part is, else strings (ints in decimal)."""
    if all(p.dtype.kind in "iu" for p in parts):
        return np.concatenate(parts).astype(np.int64, copy=False)
    return np.concatenate([p.astype(str) for p in parts])


def check_columns(columns: Sequence[Column]) -> tuple[Column, Column, Column]:
    """Validate (user, item, value) columns: 3 distinct non-negative indices or non-empty names."""
    bad = InputError(
        f"columns must be 3 distinct non-negative indices or column names, got {columns!r}"
    )
    if isinstance(columns, str):
        raise bad
    cols: list[Column] = []
    for c in columns:
        if isinstance(c, str):
            if not c.strip():
                raise bad
            cols.append(c)
        elif isinstance(c, (int, np.integer)) and not isinstance(c, bool) and c >= 0:
            cols.append(int(c))
        else:
            raise bad
    if len(cols) != 3 or len(set(cols)) != 3:
        raise bad
    return tuple(cols)  # type: ignore[return-value]


def read_bytes(path: str, start: int = 0, stop: int | None = None) -> bytes:
    """Bytes [start, stop) of a file (to the end if ``stop`` is None); errors name the file."""
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            return fh.read() if stop is None else fh.read(max(stop - start, 0))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def decode(path: str, data: bytes, first_line: int = 1, bom: bool = True) -> str:
    """UTF-8 text of ``data`` (``bom``: strip a leading byte-order mark); errors name the line.

    ``first_line`` is the 1-based line number of the first byte of ``data`` in its file.
    """
    try:
        return data.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        raise InputError(f"{path}, line {line}: not valid UTF-8 text") from None


def _read_text(path: str) -> str:
    return decode(path, read_bytes(path))


def _detect_delimiter(line: str) -> str | None:
    line = re.sub(r'"[^"]*"', "", line)  # a quoted id may hold any delimiter
    for delim in ("\t", "::", ","):
        if delim in line:
            return delim
    return None


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _read_one(
    path: str, delimiter: str | None, header: bool | None, columns: tuple[Column, Column, Column]
) -> Triples:
    text = _read_text(path)
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    keep = [k for k, ln in enumerate(lines) if ln.strip()]
    if not keep:
        raise InputError(f"{path}: no data rows (the file is empty)")
    delim, header, columns = file_format(
        path, lines[keep[0]], delimiter, header, columns, line=keep[0] + 1
    )
    line_no = np.asarray(keep, dtype=np.int64) + 1
    data = [lines[k] for k in keep]
    if header:
        data, line_no = data[1:], line_no[1:]
        if not data:
            raise InputError(f"{path}: no data rows (only a header line)")
    return parse_lines(path, data, line_no, delim, columns)


def file_format(
    path: str,
    first_line: str,
    delimiter: str | None,
    header: bool | None,
    columns: tuple[Column, Column, Column],
    line: int = 1,
) -> tuple[str | None, bool, tuple[int, int, int]]:
    """(delimiter, has_header, column indices) of a file from its first non-blank line.

    ``delimiter`` (one of ``DELIMITERS``) and ``header`` override the detection; the resolved
    delimiter is None for "any whitespace". Columns given by name are looked up in the first
    line, which is then the header (an error if ``header`` is False). ``line`` is the 1-based
    number of ``first_line``, for messages.
    """
    delim = DELIMITERS[delimiter] if delimiter is not None else _detect_delimiter(first_line)
    first = split_fields(path, first_line, line, delim)
    if any(isinstance(c, str) for c in columns):
        if header is False:
            raise InputError(f"{path}: columns given by name need a header line")
        names = [f.strip() for f in first]
        missing = [c for c in columns if isinstance(c, str) and c not in names]
        if missing:
            raise InputError(
                f"{path}: no column {missing[0]!r} in the header line (columns: "
                f"{', '.join(names)})"
            )
        cols = tuple(names.index(c) if isinstance(c, str) else c for c in columns)
        if len(set(cols)) != 3:
            raise InputError(f"{path}: columns {columns!r} name the same column twice")
        return delim, True, cols  # type: ignore[return-value]
    if header is None:
        header = len(first) > columns[2] and not _is_number(first[columns[2]])  # type: ignore[index]
    return delim, bool(header), columns  # type: ignore[return-value]


def parse_lines(
    path: str,
    lines: Sequence[str],
    line_no: np.ndarray,
    delim: str | None,
    columns: tuple[int, int, int],
) -> Triples:
    """Parse non-blank data lines (no header) of ``path`` into triples.

    Parameters
    ----------
    path : str
        Named in error messages.
    lines : sequence of str, length n >= 1
    line_no : np.ndarray of int64, shape (n,)
        1-based line number of each line in its file.
    delim : str or None
        Resolved delimiter (None: any whitespace).
    columns : (int, int, int)
    """
    if delim is None:
        fields = [ln.split() for ln in lines]
    elif delim in QUOTING and any('"' in ln for ln in lines):
        numbered = zip(lines, line_no.tolist(), strict=True)
        fields = [split_fields(path, ln, n, delim) for ln, n in numbered]
    else:
        fields = [ln.split(delim) for ln in lines]
    cu, ci, cv = columns
    need = max(columns) + 1
    ncol = np.fromiter(map(len, fields), dtype=np.int64, count=len(fields))
    short = np.flatnonzero(ncol < need)
    if short.size:
        k = int(short[0])
        shown = "whitespace" if delim is None else repr(delim)
        raise InputError(
            f"{path}, line {line_no[k]}: expected at least {need} columns separated by "
            f"{shown}, found {ncol[k]}"
        )
    origin = Origin((path,), np.zeros(len(lines), np.int32), line_no)
    users = string_ids([f[cu] for f in fields], origin, "user")
    items = string_ids([f[ci] for f in fields], origin, "item")
    values = string_values([f[cv] for f in fields], origin)
    return Triples(users, items, values, origin)


def split_fields(path: str, line: str, line_no: int, delim: str | None) -> list[str]:
    """Fields of one line: RFC 4180 quoting for ``QUOTING`` delimiters, else a plain split.

    Spaces after a delimiter are skipped before an opening quote; a quoted field must be closed
    on its line and followed by a delimiter or the end of the line (errors name the line).
    """
    if delim is None:
        return line.split()
    if delim not in QUOTING or '"' not in line:
        return line.split(delim)
    try:
        return next(csv.reader((line,), delimiter=delim, strict=True, skipinitialspace=True))
    except csv.Error as exc:
        reason = str(exc)
        if reason == "unexpected end of data":
            reason = "a quoted field is not closed on its line (fields may not span lines)"
        raise InputError(f"{path}, line {line_no}: bad CSV quoting: {reason}") from None


def string_ids(tokens: Sequence[str] | np.ndarray, origin: Origin, what: str) -> np.ndarray:
    """Raw ids from text tokens (n,): whitespace-stripped, none empty and none holding a
    control character (errors name the row)."""
    if _CONTROL.search("".join(tokens)) is not None:  # one scan; the loop only on a hit
        for k, tok in enumerate(tokens):
            if (hit := _CONTROL.search(str(tok).strip())) is not None:
                raise InputError(
                    f"{origin.where(k)}: {what} id {str(tok).strip()!r} contains the control "
                    f"character U+{ord(hit.group()):04X}; ids must be printable text"
                )
    ids = np.char.strip(np.asarray(tokens, dtype=str))
    empty = np.flatnonzero(np.char.str_len(ids) == 0)
    if empty.size:
        raise InputError(f"{origin.where(int(empty[0]))}: empty {what} id")
    return ids


def string_values(tokens: Sequence[str] | np.ndarray, origin: Origin) -> np.ndarray:
    """Finite float64 values (n,) from text tokens (errors name the row and the token)."""
    try:
        values = np.array(tokens, dtype=np.float64)
    except ValueError:
        for k, tok in enumerate(tokens):
            if not _is_number(tok):
                raise InputError(
                    f"{origin.where(k)}: value {tok.strip()!r} is not a number"
                ) from None
        raise  # pragma: no cover - numpy and float() disagree
    return finite_values(values, origin, tokens)


def finite_values(
    values: np.ndarray, origin: Origin, tokens: Sequence[str] | np.ndarray | None = None
) -> np.ndarray:
    """``values`` if all are finite, else an error naming the first other row (and its token)."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        k = int(bad[0])
        shown = repr(str(tokens[k]).strip()) if tokens is not None else f"{values[k]:g}"
        raise InputError(f"{origin.where(k)}: value {shown} is not finite")
    return values
