"""Where each input row came from, so that errors can name the file and line (or row)."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RowGroups:
    """Row groups of (part of) a Parquet file, to name the group of a row in messages.

    ``starts`` are the 0-based first rows (in the file) of groups ``first``, ``first + 1``, ...
    """

    first: int
    starts: tuple[int, ...]

    def group_of(self, row: int) -> int:
        return self.first + max(bisect_right(self.starts, row) - 1, 0)


@dataclass(frozen=True, eq=False)
class Origin:
    """Provenance of n input rows.

    Attributes
    ----------
    sources : tuple of str
        File paths, or a single label such as ``"input arrays"``.
    file_index : np.ndarray of int32, shape (n,)
        Index into ``sources`` of each row.
    line : np.ndarray of int64, shape (n,)
        1-based line number within its file (``is_file``), else 0-based row index.
    is_file : bool
        Whether the rows came from files.
    row_groups : tuple of (RowGroups or None), optional
        Per source: its row groups if it is a Parquet file, whose rows are then counted from 0
        in the file (``line`` is that row number), else None (text: 1-based lines).
    """

    sources: tuple[str, ...]
    file_index: np.ndarray
    line: np.ndarray
    is_file: bool = True
    row_groups: tuple[RowGroups | None, ...] | None = None

    @classmethod
    def arrays(cls, n: int, label: str = "input arrays") -> Origin:
        """Origin of ``n`` rows of in-memory arrays (rows are 0-based indices)."""
        return cls((label,), np.zeros(n, np.int32), np.arange(n, dtype=np.int64), False)

    @classmethod
    def concat(cls, parts: list[Origin]) -> Origin:
        """Concatenate origins of files read one after the other (one source per part)."""
        sources: list[str] = []
        groups: list[RowGroups | None] = []
        index, lines = [], []
        for part in parts:
            index.append(part.file_index + len(sources))
            lines.append(part.line)
            sources.extend(part.sources)
            groups.extend(part.row_groups or (None,) * len(part.sources))
        is_file = all(p.is_file for p in parts)
        row_groups = tuple(groups) if any(g is not None for g in groups) else None
        return cls(tuple(sources), np.concatenate(index), np.concatenate(lines), is_file,
                   row_groups)  # fmt: skip

    def rows(self, file_index: np.ndarray, line: np.ndarray) -> Origin:
        """Origin of rows of these sources (``self`` is used as a template; its rows ignored)."""
        return Origin(self.sources, file_index, line, self.is_file, self.row_groups)

    def __len__(self) -> int:
        return len(self.line)

    def take(self, idx: np.ndarray) -> Origin:
        """Origin of the rows selected by ``idx`` (integer or boolean index)."""
        return self.rows(self.file_index[idx], self.line[idx])

    def where(self, k: int) -> str:
        """Human-readable location of row ``k``: ``"FILE, line N"``, ``"LABEL, row N"`` or, in
        a Parquet file, ``"FILE, row N (row group G)"`` (both 0-based, as pyarrow counts)."""
        f, line = int(self.file_index[k]), int(self.line[k])
        groups = self.row_groups[f] if self.row_groups is not None else None
        if groups is not None:
            return f"{self.sources[f]}, row {line} (row group {groups.group_of(line)})"
        unit = "line" if self.is_file else "row"
        return f"{self.sources[f]}, {unit} {line}"
