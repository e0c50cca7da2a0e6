"""Tables the serving commands print (``recommend --users``, ``similar-items``,
``similar-users``, ``fold-in``, ``score``): named columns, written to standard output with a
header as TSV (default), CSV (floats to 10 significant digits), JSON (an array of one object per
row) or Parquet (binary; refused on a terminal)."""

from __future__ import annotations

import csv
import itertools
import json
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import IO, Any

from ordnmf_dask.errors import UsageError
from ordnmf_dask.params import FORMATS

BATCH = 1 << 16  # rows of a Parquet table written at a time


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it is; anything else as it is."""
    return value.item() if hasattr(value, "item") else value


def _text(value: Any) -> Any:
    """A value as text formats print it: floats to 10 significant digits (JSON and Parquet keep
    every bit), so that the lists of two executors print alike despite round-off."""
    value = _plain(value)
    return f"{value:.10g}" if isinstance(value, float) else value


def write_table(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], fmt: str, out: IO[str] | None = None
) -> None:
    """Write ``rows`` (one value per column, in order) as ``fmt`` to ``out`` (default stdout),
    as they come: an iterator of rows is never held whole (``score --pairs`` streams its
    pairs), and a reader gone (``| head``) is seen as the table is written."""
    out = sys.stdout if out is None else out
    if fmt in ("tsv", "csv"):
        writer = csv.writer(out, delimiter="\t" if fmt == "tsv" else ",", lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_text(v) for v in row] for row in rows)
    elif fmt == "json":
        _write_json(columns, rows, out)
    elif fmt == "parquet":
        if getattr(out, "isatty", lambda: False)():
            raise UsageError(
                "--format parquet writes binary: redirect it to a file (> out.parquet)"
            )
        _write_parquet(columns, rows, out)
    else:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def _write_json(columns: Sequence[str], rows: Iterable[Sequence[Any]], out: IO[str]) -> None:
    """An array of one object per row, as ``json.dumps(records, indent=1)`` writes it, one
    record at a time."""
    first = True
    for row in rows:
        record = dict(zip(columns, (_plain(v) for v in row), strict=True))
        out.write("[\n" if first else ",\n")
        out.write(textwrap.indent(json.dumps(record, indent=1), " "))
        first = False
    out.write("[]\n" if first else "\n]\n")


def _write_parquet(columns: Sequence[str], rows: Iterable[Sequence[Any]], out: IO[str]) -> None:
    """One Parquet file, written :data:`BATCH` rows at a time (its columns typed by the first
    batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def table(batch: list[Sequence[Any]], schema: pa.Schema | None) -> pa.Table:
        data = {name: [_plain(row[j]) for row in batch] for j, name in enumerate(columns)}
        return pa.table(data, schema=schema)

    out.flush()
    writer = None
    iterator = iter(rows)
    while True:
        batch = list(itertools.islice(iterator, BATCH))
        if writer is not None and not batch:
            break
        piece = table(batch, None if writer is None else writer.schema)
        if writer is None:
            binary = out.buffer  # type: ignore[attr-defined]  # a text stream over bytes
            writer = pq.ParquetWriter(pa.PythonFile(binary, mode="w"), piece.schema)
        writer.write_table(piece)
        if len(batch) < BATCH:
            break
    writer.close()
    out.buffer.flush()  # type: ignore[attr-defined]


def ranked_rows(lists: dict[Any, list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """``{key: [(id, score, ...), ...]}`` as rows (key, rank from 1, id, score, ...)."""
    return [
        (key, rank, *entry)
        for key, entries in lists.items()
        for rank, entry in enumerate(entries, start=1)
    ]
