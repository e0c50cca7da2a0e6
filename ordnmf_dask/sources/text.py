"""Read (user, item, value) rows from delimited text files.

Files are opened through fsspec, so local paths, ``s3://``, ``gs://``, ``abfs://``, ``hdfs://``
and ``http(s)://`` URLs (and globs of them) are read the same way; ``.gz``, ``.bz2``, ``.zst``
and the other compressions fsspec knows are decompressed by their suffix. Parsing is
``pyarrow.csv`` (multithreaded). Supported: CSV, TSV, semicolon, MovieLens ``::`` ``.dat`` and
whitespace-separated files, with LF or CRLF line endings, an optional header line and extra
columns (every data line has the first data line's number of fields). Comma, tab and semicolon files
follow RFC 4180 quoting (``"Smith, 7"``, ``"say ""hi"" 2"``); spaces after a delimiter are
skipped before an opening quote; a quoted field may not span lines, so every record is one line
and byte ranges cut at newlines are whole records. ``::`` and whitespace, which pyarrow cannot
take as delimiters, are rewritten to one control character (``\\x1f``) before parsing; an input
holding that character is refused like any id with a control character.

Users and items are raw strings (whitespace-stripped; empty ids and ids with control characters
are refused, see ``filtering.encode_ids``); values are float64 and must be finite. Blank lines
are skipped. A comma, tab or semicolon file without quotes is streamed into pyarrow block by
block (``read_text``); the line numbers of a file read in memory are found only when a message
needs one (``LineFinder``); errors name the file and line.
"""

from __future__ import annotations

import csv
import ctypes
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.columns import file_columns
from ordnmf_dask.sources.infile import open_input_file
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.store.locations import READ_ERRORS

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
#: What ``::`` and runs of whitespace are rewritten to before pyarrow parses the text.
_UNIT = b"\x1f"
_WHITESPACE = b" \t\r\x0b\x0c"
_BOM = b"\xef\xbb\xbf"
_HEAD = 2**20  # bytes read at a time while looking for the first lines
#: how far the first non-blank lines (a header, the first row) are looked for: far beyond any
#: real one, far below a file of zeros read whole
HEAD_LIMIT = 64 << 20
#: Where pyarrow allocates whole columns of the input: malloc, whose freed memory
#: ``release_memory`` hands back to the system once the columns are dropped.
POOL = pa.system_memory_pool()


def release_memory() -> None:
    """Hand freed heap memory back to the system: glibc keeps what the reader's threads freed
    (``malloc_trim``; nothing to do without glibc)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


@dataclass(frozen=True, eq=False)
class Triples:
    """Parsed interactions, one entry per data row.

    Attributes
    ----------
    users, items : pyarrow.ChunkedArray of string, or np.ndarray of int64, shape (n,)
        Raw ids as read (strings not yet stripped nor checked: ``filtering.encode_ids`` does both),
        or int64 (Parquet integer columns).
    values : np.ndarray of float64, shape (n,)
        Finite values.
    origin : Origin
        File and 1-based line number of every row (Parquet: 0-based row in the file).
    """

    users: Any
    items: Any
    values: np.ndarray
    origin: Origin

    def __len__(self) -> int:
        return len(self.values)


#: A column given by 0-based position or by name (a header field, or a Parquet column).
Column = int | str


@dataclass(frozen=True)
class TextFormat:
    """How to parse one text file: resolved delimiter (None: whitespace), whether its first
    non-blank line is a header, the 0-based (user, item, value) columns and the number of fields
    of that first line."""

    path: str
    delim: str | None
    header: bool
    columns: tuple[int, int, int]
    n_fields: int


def concat_ids(parts: Sequence[Any]) -> Any:
    """Concatenated raw ids: int64 if every part is, else strings (ints in decimal)."""
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts).astype(np.int64, copy=False)
    cols = [pa.chunked_array([pa.array(p)]) if isinstance(p, np.ndarray) else p for p in parts]
    if len({c.type for c in cols}) > 1:  # e.g. int and string ids, or string and large_string
        cols = [c.cast(pa.large_string()) for c in cols]
    return pa.chunked_array([chunk for c in cols for chunk in c.chunks], cols[0].type)


def check_delimiter(delimiter: str | None) -> None:
    if delimiter is not None and delimiter not in DELIMITERS:
        raise InputError(f"unknown delimiter {delimiter!r}; use one of {sorted(DELIMITERS)}")


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


# --------------------------------------------------------------------------- bytes


def open_input(path: str, compression: str | None = "infer") -> Any:
    """``path`` opened for reading by the one opener of inputs
    (:func:`~ordnmf_dask.sources.infile.open_input_file`: a regular file only), decompressed by
    its suffix unless ``compression`` is None; errors name it."""
    from fsspec.compression import compr
    from fsspec.utils import infer_compression

    raw = open_input_file(path)
    codec = infer_compression(path) if compression == "infer" else compression
    if codec is None:
        return raw
    try:
        return _Decompressed(compr[codec](raw, mode="rb"), raw)
    except READ_ERRORS as exc:
        raw.close()
        raise InputError(f"{path}: cannot read ({exc})") from None


class _Decompressed:
    """A decompressing reader that also closes the file it reads (the decompressors of
    fsspec leave the file they were given open)."""

    def __init__(self, outer: Any, raw: Any) -> None:
        self._outer, self._raw = outer, raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._outer, name)

    def close(self) -> None:
        try:
            self._outer.close()
        finally:
            self._raw.close()

    def __enter__(self) -> _Decompressed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_compressed(path: str) -> bool:
    """Whether fsspec decompresses ``path`` by its suffix (such a file is read in one piece)."""
    from fsspec.utils import infer_compression

    return infer_compression(path) is not None


#: what parsing a text read whole holds beside it (its rows, ids and values), as a multiple of
#: its bytes: a file read whole is at most the memory room divided by this
WHOLE_TEXT_FACTOR = 4


def read_bytes(path: str, start: int = 0, stop: int | None = None) -> bytes:
    """Bytes [start, stop) of a file, decompressed (to the end if ``stop`` is None); errors
    name the file. Read to its end, a file is bounded by what memory can parse
    (:data:`WHOLE_TEXT_FACTOR`): refused from its stored size before a byte is read, and a
    compressed one once its text passes the bound (a 1 TiB file of zeros held 21 GB, then
    ran out of memory)."""
    limit = None
    if stop is None:
        from ordnmf_dask.runtime.memory import memory_room, size_text

        room, what = memory_room()
        limit = max(room // WHOLE_TEXT_FACTOR - start, 0)
        stored = input_size(path)
        if stored - start > limit:
            raise InputError(
                f"{path}: {size_text(stored - start)} of text to read whole, more than the "
                f"{size_text(limit)} it may take to be parsed in the {size_text(room)} {what}"
            )
    count = limit + 1 if limit is not None else max((stop or 0) - start, 0)
    with open_input(path) as fh:
        try:
            if fh.seekable() and start:
                fh.seek(start)
            elif start:
                fh.read(start)
            data = fh.read(count)
        except READ_ERRORS as exc:
            raise InputError(f"{path}: cannot read ({exc})") from None
    if limit is not None and len(data) > limit:
        raise InputError(
            f"{path}: more than {limit} bytes of text once decompressed, more than it may "
            "take to be parsed in the memory this process has"
        )
    return data


def input_size(path: str) -> int:
    """Size in bytes of ``path`` as stored (compressed files are not split, see ``textsplit``)."""
    import fsspec

    with open_input(path, compression=None):
        pass  # the errors for missing files and directories
    fs, p = fsspec.core.url_to_fs(path)
    return int(fs.size(p))


def check_utf8(path: str, data: bytes, first_line: int = 1) -> None:
    """Raise InputError naming the line of the first byte of ``data`` that is not UTF-8."""
    buf = pa.py_buffer(data)
    offsets = pa.array([0, len(buf)], pa.int64()).buffers()[1]
    try:
        pa.LargeStringArray.from_buffers(1, offsets, buf).validate(full=True)
    except pa.ArrowInvalid:
        try:
            bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            line = first_line + bytes(data).count(b"\n", 0, exc.start)
            raise InputError(f"{path}, line {line}: not valid UTF-8 text") from None


def line_numbers(data: bytes, first_line: int = 1) -> np.ndarray:
    """1-based line numbers (int64) of the non-blank lines of ``data``, the data records.

    A line is blank if it holds only spaces, tabs and carriage returns (pyarrow skips empty
    lines; the reader skips blank ones). ``first_line`` is the number of the first line.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size == 0:
        return np.zeros(0, np.int64)
    if not _has_blank_line(data):  # every line is a record
        n = data.count(b"\n") + (not data.endswith(b"\n"))
        return np.arange(first_line, first_line + n, dtype=np.int64)
    ends = np.flatnonzero(buf == 10)
    starts = np.concatenate([[0], ends + 1])
    if starts[-1] == buf.size:
        starts = starts[:-1]
    solid = ~np.isin(buf, np.frombuffer(_WHITESPACE + b"\n", np.uint8))
    counts = np.add.reduceat(solid, starts, dtype=np.int64)
    return np.flatnonzero(counts > 0).astype(np.int64) + first_line


_WHITESPACE_BYTES = tuple(bytes([b]) for b in _WHITESPACE)
_BLANK_AT_START = re.compile(rb"[ \t\r\x0b\x0c]*(?:\n|\Z)")
_BLANK_AFTER_NEWLINE = re.compile(rb"\n[ \t\r\x0b\x0c]*(?:\n|\Z)")


def _has_blank_line(data: bytes) -> bool:
    """Whether ``data`` (not empty) has a line of only whitespace (a final newline ends the last
    line, it does not start an empty one)."""
    if not any(w in data for w in _WHITESPACE_BYTES):  # a blank line is then an empty one
        newline = np.frombuffer(data, np.uint8) == 10
        return bool(newline[0] or np.any(newline[1:] & newline[:-1]))
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    return (
        _BLANK_AT_START.match(data, 0, end + 1 if end == 0 else end) is not None
        or _BLANK_AFTER_NEWLINE.search(data, 0, end) is not None
    )


@dataclass(eq=False)
class LineFinder:
    """The 1-based line of a text file's k-th data record, found by reading the file again
    (only when a message needs one)."""

    path: str
    skip_header: bool
    _lines: np.ndarray | None = field(default=None, repr=False)

    def __call__(self, record: int) -> int:
        if self._lines is None:
            lines = line_numbers(read_bytes(self.path))
            self._lines = lines[1:] if self.skip_header else lines
        return int(self._lines[record])


# --------------------------------------------------------------------------- format


def first_line(path: str, data: bytes, start: int = 0) -> tuple[str, int, int, int] | None:
    """(text, 1-based number, byte offsets of its start and after its end) of the first
    non-blank line of ``data``,
    or None if every line is blank (the line must end within ``data`` unless it is the last).
    The search starts at byte ``start`` (line numbers count from there); a byte-order mark at
    the start of ``data`` is skipped."""
    if start == 0 and data.startswith(_BOM):
        start = len(_BOM)
    number = 1
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end + 1
        if data[start:end].strip(_WHITESPACE + b"\n"):
            check_utf8(path, data[start:end], number)
            return data[start:end].decode("utf-8").rstrip("\r\n"), number, start, end
        start, number = end, number + 1
    return None


def sniff_delimiter(line: str) -> str | None:
    """The delimiter of a first line by ``csv.Sniffer``: tab, comma, semicolon, ``::``, or None
    for whitespace (also when the sniffer finds none)."""
    try:
        found = csv.Sniffer().sniff(line, delimiters="\t,;: ").delimiter
    except csv.Error:
        return None
    if found == ":":
        return "::" if "::" in line else None
    return None if found == " " else found


def file_format(
    path: str,
    line: str,
    line_no: int,
    delimiter: str | None,
    header: bool | None,
    columns: tuple[Column, Column, Column] | None,
) -> TextFormat:
    """The format of a file from its first non-blank line (number ``line_no``).

    ``delimiter`` (one of ``DELIMITERS``) and ``header`` override the detection. Columns given
    by name are looked up in the first line, which is then the header (an error if ``header``
    is False); without ``columns`` (None) a header's names may choose them (``file_columns``),
    else they are 0, 1, 2.
    """
    check_delimiter(delimiter)
    delim = DELIMITERS[delimiter] if delimiter is not None else sniff_delimiter(line)
    first = [f.strip() for f in _fields(path, line.encode("utf-8"), line_no, delim)]
    if columns is None:
        named = header or (header is None and len(first) > 2 and not _is_number(first[2]))
        columns = file_columns(first, path) if named else (0, 1, 2)
    if any(isinstance(c, str) for c in columns):
        if header is False:
            raise InputError(f"{path}: columns given by name need a header line")
        missing = [c for c in columns if isinstance(c, str) and c not in first]
        if missing:
            raise InputError(
                f"{path}: no column {missing[0]!r} in the header line (columns: {', '.join(first)})"
            )
        cols = tuple(first.index(c) if isinstance(c, str) else c for c in columns)
        if len(set(cols)) != 3:
            raise InputError(f"{path}: columns {columns!r} name the same column twice")
        return TextFormat(path, delim, True, cols, len(first))  # type: ignore[arg-type]
    at = (int(columns[0]), int(columns[1]), int(columns[2]))  # none is a name here
    need = max(at) + 1
    if len(first) < need:
        shown = "whitespace" if delim is None else repr(delim)
        raise InputError(
            f"{path}, line {line_no}: expected at least {need} columns separated "
            f"by {shown}, found {len(first)}"
        )
    if header is None:
        header = not _is_number(first[at[2]])
    return TextFormat(path, delim, bool(header), at, len(first))


def with_data_fields(fmt: TextFormat, data: bytes, after: int) -> TextFormat:
    """``fmt`` with the number of fields of the first data line, if a header line ends at byte
    ``after`` of ``data`` (data lines may have more fields than the header)."""
    if not fmt.header:
        return fmt
    found = first_line(fmt.path, data, after)
    if found is None:
        return fmt
    n = len(_fields(fmt.path, found[0].encode("utf-8"), found[1], fmt.delim))
    return TextFormat(fmt.path, fmt.delim, True, fmt.columns, n)


@dataclass(frozen=True)
class Head:
    """Where a text file's data starts: its format, the byte offset and 1-based number of its
    header line (None and 0 without one), and the offset of the first data byte."""

    fmt: TextFormat
    header_at: int | None
    header_line: int
    data_at: int


def text_format_of(
    path: str,
    delimiter: str | None,
    header: bool | None,
    columns: tuple[Column, Column, Column] | None,
) -> Head:
    """Read the start of ``path`` up to its first non-blank line(s) and resolve its format."""
    check_delimiter(delimiter)
    n = _HEAD
    while True:
        data = read_bytes(path, 0, n)
        complete = len(data) < n
        found = first_line(path, data if complete else data[: data.rfind(b"\n") + 1])
        if found is not None:
            line, number, start, after = found
            fmt = with_data_fields(
                file_format(path, line, number, delimiter, header, columns), data, after
            )
            if fmt.header:
                return Head(fmt, start, number, after)
            return Head(fmt, None, 0, len(_BOM) if data.startswith(_BOM) else 0)
        if complete:
            raise InputError(f"{path}: no data rows (the file is empty)")
        if n >= HEAD_LIMIT:  # a file of zeros, or of one endless line: no rows to read
            raise InputError(
                f"{path}: no complete non-blank line in its first {HEAD_LIMIT} bytes "
                "(not a text file of rows)"
            )
        n = min(4 * n, HEAD_LIMIT)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _fields(path: str, line: bytes, line_no: int, delim: str | None) -> list[str]:
    """The fields of one line, parsed by pyarrow as the whole file will be."""
    fmt = TextFormat(path, delim, False, (0, 1, 2), 0)
    table = _parse(fmt, _prepare(fmt, line + b"\n", 0, line_no), None, line_no)
    return [str(x) for x in table.to_pylist()[0].values()]


# --------------------------------------------------------------------------- parsing


def read_text(
    path: str,
    delimiter: str | None,
    header: bool | None,
    columns: tuple[Column, Column, Column] | None,
) -> Triples:
    """Every data row of one text file.

    Comma, tab and semicolon files without a quote character are streamed into pyarrow from the
    file (no copy of the whole text is held); any other file, and any file pyarrow refuses
    that way, is read whole and parsed by ``parse_text``, whose errors name the line.
    """
    head = text_format_of(path, delimiter, header, columns)
    if head.fmt.delim in QUOTING:
        fast = _read_streamed(head)
        if fast is not None:
            return fast
    data = read_bytes(path)
    triples = parse_text(head.fmt, data, head.data_at, 1, None)
    if triples is None:
        raise InputError(f"{path}: no data rows (only a header line)")
    return triples


class _Watch(io.RawIOBase):
    """A file passed on to pyarrow that notes whether a quote character went through."""

    def __init__(self, fh: Any) -> None:
        super().__init__()
        self.fh, self.quoted = fh, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.fh.read(len(buffer))
        self.quoted = self.quoted or data.find(b'"') >= 0
        buffer[: len(data)] = data
        return len(data)


def _read_streamed(head: Head) -> Triples | None:
    """Triples of a file without quotes, read by pyarrow from the file in blocks; None if the
    file holds a quote character or anything pyarrow refuses (``parse_text`` then reads it)."""
    fmt = head.fmt
    names = [f"f{k}" for k in range(fmt.n_fields)]
    keep = [names[c] for c in fmt.columns]
    read = pacsv.ReadOptions(column_names=names, use_threads=True, block_size=1 << 24)
    parse = pacsv.ParseOptions(
        delimiter=fmt.delim,
        quote_char=False,
        newlines_in_values=False,
        ignore_empty_lines=True,
        invalid_row_handler=lambda row: "skip" if not row.text.strip() else "error",
    )
    convert = pacsv.ConvertOptions(
        include_columns=keep,
        null_values=[],
        strings_can_be_null=False,
        column_types={keep[0]: pa.string(), keep[1]: pa.string(), keep[2]: pa.float64()},
    )
    with open_input(fmt.path) as fh:
        watch = _Watch(fh)
        try:
            fh.read(head.data_at)
            table = pacsv.read_csv(
                watch,
                read_options=read,
                parse_options=parse,
                convert_options=convert,
                memory_pool=POOL,
            )
        except (pa.ArrowInvalid, *READ_ERRORS):  # ``read_bytes`` names a damaged file
            return None
    if watch.quoted or table.num_rows == 0:
        return None
    n = table.num_rows
    origin = Origin((fmt.path,), None, n, lines=(LineFinder(fmt.path, fmt.header),))
    # numpy's own copy: no pyarrow buffer outlives the text columns, so freeing them frees
    # whole pages of pyarrow's allocator
    values = finite_values(
        np.concatenate([c.to_numpy() for c in table.column(keep[2]).chunks]), origin
    )
    users, items = table.column(keep[0]), table.column(keep[1])
    del table
    release_memory()  # the blocks of text pyarrow read
    return Triples(users, items, values, origin)


def parse_text(
    fmt: TextFormat, data: bytes, start: int, first_line: int, lines: np.ndarray | None
) -> Triples | None:
    """Triples of the data records of ``data[start:]`` (no header), None if there are none.

    ``first_line`` is the 1-based line of ``data``'s first byte. ``lines``: the line numbers of
    the records if known (``line_numbers``); if None (``data`` is the whole file), the origin
    finds them when a message needs one.
    """
    if _SOLID.search(data, start) is None:
        return None
    check_utf8(fmt.path, data, first_line)
    body_line = first_line + data.count(b"\n", 0, start)
    prepared = _prepare(fmt, data, start, body_line)
    table = _parse(fmt, prepared, fmt.columns, body_line)
    del prepared
    n = table.num_rows
    if n == 0:
        return None
    if lines is None:
        origin = Origin((fmt.path,), None, n, lines=(LineFinder(fmt.path, fmt.header),))
    else:
        origin = Origin((fmt.path,), np.zeros(n, np.int32), lines)
    names = table.column_names
    values = text_values(table.column(names[2]), origin)
    return Triples(table.column(names[0]), table.column(names[1]), values, origin)


_BLANK = rb"[ \t\x0b\x0c]+"
_SOLID = re.compile(rb"[^ \t\r\n\x0b\x0c]")


def _prepare(fmt: TextFormat, data: bytes, start: int, first_line: int) -> Any:
    """``data[start:]`` as pyarrow will parse it: ``::`` and whitespace runs rewritten to
    ``\\x1f``; spaces between a delimiter and an opening quote dropped (after checking the
    quoting). Without quotes, comma, tab and semicolon text is passed on without a copy."""
    if fmt.delim in QUOTING:
        if data.find(b'"', start) < 0:
            return pa.py_buffer(data).slice(start)
        body = data[start:]
        _check_quoting(fmt, fmt.delim, body, first_line)
        delim = re.escape(fmt.delim.encode())
        return re.sub(rb"(?m)(?<=" + delim + rb')[ ]+(?="(?!"))|^[ ]+(?="(?!"))', b"", body)
    body = data[start:]
    if (k := body.find(_UNIT)) >= 0:
        line = first_line + body.count(b"\n", 0, k)
        raise InputError(
            f"{fmt.path}, line {line}: the control character U+001F is not allowed in text input"
        )
    if fmt.delim == "::":
        return body.replace(b"::", _UNIT)
    body = re.sub(rb"(?m)^" + _BLANK + rb"|" + _BLANK + rb"(?=\r?$)", b"", body)
    return re.sub(_BLANK, _UNIT, body)


def _check_quoting(fmt: TextFormat, delim: str, body: bytes, first_line: int) -> None:
    """RFC 4180 quoting of the lines holding a quote (``csv``, strict): each quoted field is
    closed on its line and followed by a delimiter or the end of the line."""
    for match in re.finditer(rb'(?m)^[^\n]*"[^\n]*$', body):
        text = match.group().decode("utf-8").rstrip("\r")
        try:
            next(csv.reader((text,), delimiter=delim, strict=True, skipinitialspace=True))
        except csv.Error as exc:
            reason = str(exc)
            if reason == "unexpected end of data":
                reason = "a quoted field is not closed on its line (fields may not span lines)"
            line = first_line + body.count(b"\n", 0, match.start())
            raise InputError(f"{fmt.path}, line {line}: bad CSV quoting: {reason}") from None


def _parse(
    fmt: TextFormat,
    prepared: Any,
    columns: tuple[int, int, int] | None,
    first_line: int,
) -> pa.Table:
    """pyarrow.csv over prepared bytes; ``columns``: the (user, item, value) columns to keep
    (ids as strings), or None for all, as strings. Rows with another number of fields than
    ``fmt.n_fields`` are errors naming their line."""
    delim = fmt.delim if fmt.delim in QUOTING else _UNIT.decode()
    bad: list[int] = []

    def invalid(row: Any) -> str:
        if not row.text.strip():
            return "skip"
        bad.append(row.actual_columns)
        return "error"

    n_fields = fmt.n_fields if columns is not None else None
    names = [f"f{k}" for k in range(n_fields)] if n_fields else None
    read = pacsv.ReadOptions(
        column_names=names,
        autogenerate_column_names=names is None,
        use_threads=True,
        block_size=1 << 24,
    )
    parse = pacsv.ParseOptions(
        delimiter=delim,
        quote_char='"' if fmt.delim in QUOTING else False,
        double_quote=True,
        newlines_in_values=False,
        ignore_empty_lines=True,
        invalid_row_handler=invalid,
    )
    if columns is None:
        convert = pacsv.ConvertOptions(
            null_values=[],
            strings_can_be_null=False,
            column_types={f"f{k}": pa.string() for k in range(256)},
        )
    else:
        keep = [f"f{c}" for c in columns]
        types = {keep[0]: pa.large_string(), keep[1]: pa.large_string()}
        convert = pacsv.ConvertOptions(
            include_columns=keep,
            column_types=types,
            null_values=[],
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )
    try:
        return pacsv.read_csv(
            pa.BufferReader(prepared),
            read_options=read,
            parse_options=parse,
            convert_options=convert,
            memory_pool=POOL,
        )
    except (pa.ArrowInvalid, ValueError) as exc:
        if not bad:
            raise InputError(f"{fmt.path}: cannot parse ({exc})") from None
    _column_error(fmt, prepared, columns, first_line)
    raise AssertionError("unreachable")  # pragma: no cover


def _column_error(
    fmt: TextFormat, prepared: Any, columns: tuple[int, int, int] | None, first_line: int
) -> None:
    """Raise the error naming the first line whose number of fields is wrong (read again
    serially, which numbers the rows)."""
    delim = fmt.delim if fmt.delim in QUOTING else _UNIT.decode()
    found: list[tuple[int, int]] = []

    def invalid(row: Any) -> str:
        if not row.text.strip():
            return "skip"
        found.append((row.number, row.actual_columns))
        return "error"

    read = pacsv.ReadOptions(autogenerate_column_names=True, use_threads=False)
    parse = pacsv.ParseOptions(
        delimiter=delim,
        quote_char='"' if fmt.delim in QUOTING else False,
        newlines_in_values=False,
        invalid_row_handler=invalid,
    )
    try:
        pacsv.read_csv(
            pa.BufferReader(prepared),
            read_options=read,
            parse_options=parse,
            convert_options=pacsv.ConvertOptions(column_types={}),
        )
    except (pa.ArrowInvalid, ValueError):
        pass
    number, actual = found[0] if found else (1, 0)
    # pyarrow numbers the non-empty lines from 1: map that to the line in the file
    buf = np.frombuffer(prepared, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    starts = np.concatenate([[0], ends + 1])
    lengths = np.append(ends, buf.size) - starts
    cr = (lengths == 1) & (buf[np.minimum(starts, max(buf.size - 1, 0))] == 13)
    nonempty = np.flatnonzero((lengths > 0) & ~cr)
    line = first_line + int(nonempty[number - 1]) if number - 1 < nonempty.size else first_line
    need = max(columns) + 1 if columns is not None else fmt.n_fields
    shown = "whitespace" if fmt.delim is None else repr(fmt.delim)
    if columns is not None and actual < need:
        raise InputError(
            f"{fmt.path}, line {line}: expected at least {need} columns separated "
            f"by {shown}, found {actual}"
        )
    raise InputError(
        f"{fmt.path}, line {line}: found {actual} columns separated by {shown}, "
        f"where the first line has {fmt.n_fields}"
    )


def text_values(col: Any, origin: Origin) -> np.ndarray:
    """Finite float64 values (n,) of a numeric or string column (errors name the row)."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        stripped = pc.utf8_trim_whitespace(col)
        try:
            col = pc.cast(stripped, pa.float64())
        except pa.ArrowInvalid:
            start = 0
            for chunk in stripped.chunks:
                try:
                    pc.cast(chunk, pa.float64())
                except pa.ArrowInvalid:
                    for k, tok in enumerate(chunk.to_pylist()):
                        if not _is_number(tok):
                            raise InputError(
                                f"{origin.where(start + k)}: value {tok!r} is not a number"
                            ) from None
                start += len(chunk)
            raise
    elif not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise InputError(f"{origin.where(0)}: value {str(col[0])!r} is not a number")
    return finite_values(np.asarray(col.to_numpy(), dtype=np.float64), origin)


def finite_values(values: np.ndarray, origin: Origin) -> np.ndarray:
    """``values`` if all are finite, else an error naming the first other row."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        k = int(bad[0])
        raise InputError(f"{origin.where(k)}: value {values[k]:g} is not finite")
    return values
