"""The (user, item) pairs of ``score --pairs FILE``, read in batches of bounded size.

A pairs file can hold more pairs than memory holds as Python ids (10^7 pairs take several
GiB): it is read twice, :data:`BLOCK_BYTES` of text (or :data:`BATCH_ROWS` Parquet rows) at a
time, first to check every id (a missing or unknown one is an error naming the file and line,
before anything is written), then to score and write the pairs as they come
(:func:`ordnmf_dask.app.tables.write_table` streams them), so the memory the command takes
does not grow with the file (docs/design.md, "Safety rules", "Limits").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ordnmf_dask.errors import InputError, UsageError
from ordnmf_dask.sources.infile import check_row_groups, open_input_file, open_parquet
from ordnmf_dask.sources.inputs import is_parquet

BLOCK_BYTES = 1 << 20  # text parsed at a time
BATCH_ROWS = 1 << 16  # Parquet rows read at a time


def raw_ids(column: Any) -> list[Any]:
    """Raw ids as read (a pyarrow column of strings, or int64 numbers), as Python values,
    strings stripped."""
    values = column.to_pylist() if hasattr(column, "to_pylist") else column.tolist()
    return [v.strip() if isinstance(v, str) else v for v in values]


def check_known(ids_map: Any, ids: list[Any], where: Callable[[int], str] | None) -> None:
    """InputError naming where the first id the model does not know was read (``where(j)`` of
    its position: a file and line; None, ids of a flag: the server's own message)."""
    if where is None:
        return
    try:
        ids_map.index(ids)
    except InputError:
        for j, one in enumerate(ids):
            try:
                ids_map.index([one])
            except InputError as exc:
                raise InputError(f"{where(j)}: {exc}") from None
        raise


@dataclass(frozen=True)
class PairsFile:
    """``--pairs FILE``: CSV / TSV text (a header line unless ``header`` is False) or Parquet,
    its user and item ``columns`` by position or name; text ids stay text (``007`` is not
    ``7``: the strict-id rule of the model's id maps decides)."""

    path: str
    columns: tuple[Any, Any]
    header: bool = True
    delimiter: str | None = None

    @classmethod
    def of(cls, path: str, columns: Any, header: bool | None, delimiter: str | None) -> PairsFile:
        if len(columns) != 2:
            raise UsageError(f"--columns takes user,item, got {columns}")
        return cls(path, (columns[0], columns[1]), header is not False, delimiter)

    def where(self, row: int) -> str:
        """Where the 0-based data row ``row`` is: its line (Parquet: its row)."""
        if is_parquet(self.path):
            return f"{self.path}, row {row}"
        return f"{self.path}, line {row + 1 + self.header}"

    def batches(self) -> Iterator[tuple[int, list[Any], list[Any]]]:
        """(first row, users, items) of each batch, in order; InputError naming the file and
        line of a missing id, or the file when it cannot be read as pairs."""
        import pyarrow as pa

        first = 0
        try:
            for names, batch in self._record_batches():
                picked = [raw_ids(batch.column(j).cast(pa.string())) for j in range(2)]
                for name, ids in zip(names, picked, strict=True):
                    for j, value in enumerate(ids):
                        if value is None or value == "":
                            raise InputError(f"{self.where(first + j)}: no id in column {name!r}")
                yield first, picked[0], picked[1]
                first += batch.num_rows
        except UnicodeDecodeError:  # pyarrow decodes the header's column names itself
            what = ": its column names are" if is_parquet(self.path) else ", line 1: the header is"
            raise InputError(f"{self.path}{what} not UTF-8 text") from None
        except (OSError, pa.ArrowException) as exc:
            detail = " ".join(str(exc).split())
            raise InputError(f"{self.path}: cannot read the pairs ({detail})") from None

    def check(self, server: Any) -> int:
        """The number of pairs, once every id is checked known to the model of ``server``
        (InputError naming the file, line and id of the first unknown one)."""
        total = 0
        for first, users, items in self.batches():
            for ids, known in ((users, server.users), (items, server.items)):
                self._locate(first, ids, known)
            total += len(users)
        return total

    def scored(self, server: Any) -> Iterator[tuple[Any, Any, float]]:
        """(user, item, score) of every pair, a batch at a time."""
        for _, users, items in self.batches():
            yield from zip(users, items, server.score(users, items).tolist(), strict=True)

    def _locate(self, first: int, ids: list[Any], known: Any) -> None:
        """InputError naming the line of the first of ``ids`` (rows from ``first``) that the
        id map ``known`` does not hold."""
        check_known(known, ids, lambda j: self.where(first + j))

    def _record_batches(self) -> Iterator[tuple[list[str], Any]]:
        """(the user and item columns' names, a record batch of those two columns, read as
        text) of the file, in order."""
        import pyarrow as pa

        if is_parquet(self.path):
            with open_input_file(self.path, "pairs file") as fh:
                parquet = open_parquet(fh, self.path)
                check_row_groups(parquet.metadata, self.path)
                wanted = self._names(parquet.schema_arrow.names)
                batches = parquet.iter_batches(BATCH_ROWS, columns=wanted, use_threads=False)
                for batch in batches:
                    yield wanted, batch.select(wanted)
            return
        from pyarrow import csv as pacsv

        tab = self.path.endswith((".tsv", ".tab"))
        read = pacsv.ReadOptions(
            autogenerate_column_names=not self.header, block_size=BLOCK_BYTES, use_threads=False
        )
        parse = pacsv.ParseOptions(delimiter=self.delimiter or ("\t" if tab else ","))
        options = {"read_options": read, "parse_options": parse}
        with open_input_file(self.path, "pairs file") as fh:
            names = pacsv.open_csv(fh, **options).schema.names
        wanted = self._names(names)
        options["convert_options"] = pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string())
        )
        with open_input_file(self.path, "pairs file") as fh:
            for batch in pacsv.open_csv(fh, **options):
                yield wanted, batch.select(wanted)

    def _names(self, names: list[str]) -> list[str]:
        """The names of the user and item columns among the file's ``names``."""
        out = []
        for column in self.columns:
            name = names[column] if isinstance(column, int) and column < len(names) else column
            if name not in names:
                raise InputError(f"{self.path}: no column {column!r} (columns: {', '.join(names)})")
            if names.count(name) > 1:  # which of them is meant cannot be told
                raise InputError(
                    f"{self.path}: {names.count(name)} columns named {name!r} "
                    f"(columns: {', '.join(names)})"
                )
            out.append(name)
        return out
