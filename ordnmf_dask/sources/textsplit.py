"""Split input files into chunks that are parsed independently, and parse one chunk.

Text: a chunk is the set of lines whose first byte lies in ``[start, stop)`` of its file, so
every line belongs to exactly one chunk, and a chunk can be read without reading the rest of the
file. Line numbers (for error messages) are found by a cheap first pass that counts newlines per
chunk. Delimiter, header and named columns are decided per file from its first non-blank line,
exactly as in ``ordnmf_dask.sources.readers.read_triples``; parsing is ``text.parse_text``. A
compressed file cannot be cut at byte offsets: it is one chunk.

Parquet: a chunk is one row group (``parquet.ParquetChunk``), read by ``parquet.read_row_group``
as the in-memory reader does. Data in memory: a dask DataFrame partition, or the whole data
(``memchunks.MemoryChunk``). ``parse_chunk`` and ``chunk_origin`` take every kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ordnmf_dask.sources.inputs import is_parquet
from ordnmf_dask.sources.memchunks import MemoryChunk, read_memory_chunk
from ordnmf_dask.sources.memchunks import chunk_origin as memory_origin
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.parquet import (
    ParquetChunk,
    ParquetFormat,
    parquet_format_of,
    read_row_group,
)
from ordnmf_dask.sources.parquet import chunk_origin as parquet_origin
from ordnmf_dask.sources.text import (
    Column,
    TextFormat,
    Triples,
    input_size,
    is_compressed,
    line_numbers,
    parse_text,
    read_bytes,
    text_format_of,
)

_SCAN = 2**20  # bytes read at a time while looking for a line boundary


@dataclass(frozen=True)
class FileFormat:
    """How to parse one text file: resolved delimiter, the byte offset of its header line, and
    the 0-based (user, item, value) columns."""

    path: str
    size: int
    delim: str | None
    header_at: int | None
    columns: tuple[int, int, int]
    n_fields: int


@dataclass(frozen=True)
class Chunk:
    """Lines of ``path`` starting in bytes [start, stop); ``first_line``: 1-based, of ``start``.

    ``index`` is the chunk's position in the input order; ``file_index`` the file's.
    """

    index: int
    file_index: int
    path: str
    start: int
    stop: int
    first_line: int
    delim: str | None
    header_at: int | None
    columns: tuple[int, int, int]
    n_fields: int


def input_format(
    path: str,
    delimiter: str | None,
    header: bool | None,
    columns: tuple[Column, Column, Column] | None,
) -> FileFormat | ParquetFormat:
    """Task: how to read one input file (Parquet by its suffix, else delimited text)."""
    if is_parquet(path):
        return parquet_format_of(path, columns)
    return file_format_of(path, delimiter, header, columns)


def file_format_of(
    path: str,
    delimiter: str | None,
    header: bool | None,
    columns: tuple[Column, Column, Column] | None,
) -> FileFormat:
    """Read the start of ``path`` up to its first non-blank line and resolve its format."""
    head = text_format_of(path, delimiter, header, columns)
    fmt = head.fmt
    return FileFormat(path, input_size(path), fmt.delim, head.header_at, fmt.columns, fmt.n_fields)


def line_start(path: str, x: int, size: int) -> int:
    """Offset of the first line starting at or after byte ``x`` (``size`` if none)."""
    if x <= 0:
        return 0
    pos = x - 1
    while pos < size:
        data = read_bytes(path, pos, min(pos + _SCAN, size))
        k = data.find(b"\n")
        if k >= 0:
            return pos + k + 1
        pos += len(data)
    return size


def count_lines(path: str, start: int, stop: int) -> int:
    """Number of newlines in bytes [start, stop) of ``path``, read piece by piece."""
    n, pos = 0, start
    while pos < stop:
        data = read_bytes(path, pos, min(pos + 16 * _SCAN, stop))
        n += data.count(b"\n")
        pos += len(data)
    return n


def scan_range(job: tuple[str, int, int, int]) -> tuple[int, int, int]:
    """Task: (path, x0, x1, size) -> (start, stop, newlines) of the chunk of bytes [x0, x1).

    A compressed file is one chunk, that of ``x0 == 0`` (its newlines are not needed)."""
    path, x0, x1, size = job
    if is_compressed(path):
        return (0, size, 0) if x0 == 0 else (size, size, 0)
    start, stop = line_start(path, x0, size), line_start(path, x1, size)
    return start, stop, count_lines(path, start, stop) if stop > start else 0


def chunk_origin(chunk: Chunk | ParquetChunk | MemoryChunk, line: np.ndarray) -> Origin:
    """Origin of rows of one chunk (``line``: their line, or Parquet or in-memory row,
    numbers)."""
    if isinstance(chunk, ParquetChunk):
        return parquet_origin(chunk, line)
    if isinstance(chunk, MemoryChunk):
        return memory_origin(chunk, line)
    return Origin((chunk.path,), np.zeros(len(line), np.int32), line)


def parse_chunk(chunk: Chunk | ParquetChunk | MemoryChunk) -> Triples | None:
    """Triples of one chunk (line or row numbers in the file), or None if it has none."""
    if isinstance(chunk, ParquetChunk):
        return read_row_group(chunk)
    if isinstance(chunk, MemoryChunk):
        return read_memory_chunk(chunk)
    whole = is_compressed(chunk.path)
    data = read_bytes(chunk.path, chunk.start, None if whole else chunk.stop)
    start = 0
    if chunk.start == 0 and data.startswith(b"\xef\xbb\xbf"):
        start = 3
    header_in = chunk.header_at is not None and (
        whole or chunk.start <= chunk.header_at < chunk.stop
    )
    if header_in:
        at = chunk.header_at - chunk.start  # type: ignore[operator]
        end = data.find(b"\n", at)
        start = len(data) if end < 0 else end + 1
    fmt = TextFormat(chunk.path, chunk.delim, header_in, chunk.columns, chunk.n_fields)
    lines = line_numbers(data[start:], chunk.first_line + data.count(b"\n", 0, start))
    if lines.size == 0:
        return None
    return parse_text(fmt, data, start, chunk.first_line, lines)
