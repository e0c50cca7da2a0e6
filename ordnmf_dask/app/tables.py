"""Tables the serving commands print (``recommend --users``, ``similar-items``,
``similar-users``, ``fold-in``, ``score``): named columns, written to standard output with a
header as TSV (default), CSV (floats to 10 significant digits), JSON (an array of one object per
row) or Parquet (binary; refused on a terminal)."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from typing import IO, Any

from ordnmf_dask.errors import UsageError

FORMATS = ("tsv", "csv", "json", "parquet")


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it is; anything else as it is."""
    return value.item() if hasattr(value, "item") else value


def _text(value: Any) -> Any:
    """A value as text formats print it: floats to 10 significant digits (JSON and Parquet keep
    every bit), so that the lists of two executors print alike despite round-off."""
    value = _plain(value)
    return f"{value:.10g}" if isinstance(value, float) else value


def write_table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, out: IO[str] | None = None
) -> None:
    """Write ``rows`` (one value per column, in order) as ``fmt`` to ``out`` (default stdout)."""
    out = sys.stdout if out is None else out
    if fmt in ("tsv", "csv"):
        writer = csv.writer(out, delimiter="\t" if fmt == "tsv" else ",", lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[_text(v) for v in row] for row in rows])
    elif fmt == "json":
        records = [dict(zip(columns, (_plain(v) for v in row), strict=True)) for row in rows]
        for piece in json.JSONEncoder(indent=1).iterencode(records):  # streamed, as TSV is:
            out.write(piece)  # a reader gone (`| head`) is seen as the table is written
        out.write("\n")
    elif fmt == "parquet":
        if getattr(out, "isatty", lambda: False)():
            raise UsageError(
                "--format parquet writes binary: redirect it to a file (> out.parquet)"
            )
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({name: [_plain(row[j]) for row in rows] for j, name in enumerate(columns)})
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        out.flush()
        binary = out.buffer  # type: ignore[union-attr]  # a text stream over bytes
        binary.write(buffer.getvalue())
        binary.flush()
    else:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def ranked_rows(lists: dict[Any, list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """``{key: [(id, score, ...), ...]}`` as rows (key, rank from 1, id, score, ...)."""
    return [
        (key, rank, *entry)
        for key, entries in lists.items()
        for rank, entry in enumerate(entries, start=1)
    ]
