"""Where each input row came from, so that errors can name the file and line (or row)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
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
class Named:
    """Rows of ``origin`` whose messages also say what each row holds (``label(k)``: its ids,
    say), after where it is: ``FILE, line 3 (user 'u', item 'i')``."""

    origin: Origin
    label: Callable[[int], str]

    def where(self, k: int) -> str:
        return f"{self.origin.where(k)} ({self.label(k)})"


@dataclass(frozen=True, eq=False)
class Taken:
    """Rows ``idx`` of ``origin`` (``Origin.take`` without gathering their lines: a message
    names one row, so only that row's place is looked up)."""

    origin: Origin
    idx: np.ndarray

    def where(self, k: int) -> str:
        return self.origin.where(int(self.idx[k]))


@dataclass(frozen=True, eq=False)
class Origin:
    """Provenance of n input rows.

    Attributes
    ----------
    sources : tuple of str
        File paths, or a single label such as ``"input arrays"``.
    file_index : np.ndarray of int, shape (n,), or None
        Index into ``sources`` of each row (None: every row is from the first source).
    line : np.ndarray of int64, shape (n,), or int
        1-based line number within its file (``is_file``), else 0-based row index; an int n
        stands for the rows 0 .. n - 1 in order (no array is held for them).
    is_file : bool
        Whether the rows came from files.
    row_groups : tuple of (RowGroups or None), optional
        Per source: its row groups if it is a Parquet file, whose rows are then counted from 0
        in the file (``line`` is that row number), else None (text: 1-based lines).
    lines : tuple of (callable or None), optional
        Per source: None if ``line`` is the line (or row) itself, else a function of a 0-based
        data record index that returns its 1-based line; the line numbers of a text file read
        as a whole are found only when a message needs one (``text.LineFinder``).
    matrix_cols : int, optional
        Rows from a sparse matrix of this many columns: ``line`` is then each stored entry's
        position ``row * matrix_cols + column`` in the matrix, and messages name its row and
        column (``LABEL, row 6, column 3``), not its place among the stored entries.
    """

    sources: tuple[str, ...]
    file_index: np.ndarray | None
    line: np.ndarray | int
    is_file: bool = True
    row_groups: tuple[RowGroups | None, ...] | None = None
    lines: tuple[Callable[[int], int] | None, ...] | None = None
    matrix_cols: int | None = None

    @classmethod
    def arrays(cls, n: int, label: str = "input arrays") -> Origin:
        """Origin of ``n`` rows of in-memory arrays (rows are 0-based indices)."""
        return cls((label,), None, n, False)

    @classmethod
    def matrix(cls, cells: np.ndarray, n_cols: int, label: str) -> Origin:
        """Origin of the stored entries of a sparse matrix of ``n_cols`` columns, at the
        positions ``cells`` (``row * n_cols + column``, int64)."""
        return cls((label,), None, cells, False, matrix_cols=n_cols)

    @classmethod
    def concat(cls, parts: list[Origin]) -> Origin:
        """Concatenate origins of files read one after the other (one source per part)."""
        sources: list[str] = []
        groups: list[RowGroups | None] = []
        finders: list[Callable[[int], int] | None] = []
        index, lines = [], []
        for part in parts:
            n = len(part)
            own = np.zeros(n, np.int32) if part.file_index is None else part.file_index
            index.append(own.astype(np.int32) + len(sources))
            lines.append(np.arange(n, dtype=np.int64) if isinstance(part.line, int) else part.line)
            sources.extend(part.sources)
            groups.extend(part.row_groups or (None,) * len(part.sources))
            finders.extend(part.lines or (None,) * len(part.sources))
        is_file = all(p.is_file for p in parts)
        row_groups = tuple(groups) if any(g is not None for g in groups) else None
        found = tuple(finders) if any(f is not None for f in finders) else None
        return cls(
            tuple(sources), np.concatenate(index), np.concatenate(lines), is_file, row_groups, found
        )

    def rows(self, file_index: np.ndarray | None, line: np.ndarray | int) -> Origin:
        """Origin of rows of these sources (``self`` is used as a template; its rows ignored)."""
        return Origin(
            self.sources,
            file_index,
            line,
            self.is_file,
            self.row_groups,
            self.lines,
            self.matrix_cols,
        )

    def __len__(self) -> int:
        return self.line if isinstance(self.line, int) else len(self.line)

    def take(self, idx: np.ndarray) -> Origin:
        """Origin of the rows selected by ``idx`` (integer or boolean index)."""
        idx = np.asarray(idx)
        if isinstance(self.line, int):
            line = np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64, copy=False)
        else:
            line = self.line[idx]
        return self.rows(None if self.file_index is None else self.file_index[idx], line)

    def where(self, k: int) -> str:
        """Human-readable location of row ``k``: ``"FILE, line N"``, ``"LABEL, row N"`` or, in
        a Parquet file, ``"FILE, row N (row group G)"`` (both 0-based, as pyarrow counts)."""
        f = 0 if self.file_index is None else int(self.file_index[k])
        line = k if isinstance(self.line, int) else int(self.line[k])
        if self.matrix_cols is not None:
            row, col = divmod(line, self.matrix_cols)
            return f"{self.sources[f]}, row {row}, column {col}"
        finder = self.lines[f] if self.lines is not None else None
        if finder is not None:
            line = finder(line)
        groups = self.row_groups[f] if self.row_groups is not None else None
        if groups is not None:
            return f"{self.sources[f]}, row {line} (row group {groups.group_of(line)})"
        unit = "line" if self.is_file else "row"
        return f"{self.sources[f]}, {unit} {line}"
