"""Where each input row came from, so that errors can name the file and line."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
        Whether the rows came from text files.
    """

    sources: tuple[str, ...]
    file_index: np.ndarray
    line: np.ndarray
    is_file: bool = True

    @classmethod
    def arrays(cls, n: int, label: str = "input arrays") -> Origin:
        """Origin of ``n`` rows of in-memory arrays (rows are 0-based indices)."""
        return cls((label,), np.zeros(n, np.int32), np.arange(n, dtype=np.int64), False)

    @classmethod
    def concat(cls, parts: list[Origin]) -> Origin:
        """Concatenate origins of files read one after the other (one source per part)."""
        sources: list[str] = []
        index, lines = [], []
        for part in parts:
            index.append(part.file_index + len(sources))
            lines.append(part.line)
            sources.extend(part.sources)
        is_file = all(p.is_file for p in parts)
        return cls(tuple(sources), np.concatenate(index), np.concatenate(lines), is_file)

    def __len__(self) -> int:
        return len(self.line)

    def take(self, idx: np.ndarray) -> Origin:
        """Origin of the rows selected by ``idx`` (integer or boolean index)."""
        return Origin(self.sources, self.file_index[idx], self.line[idx], self.is_file)

    def where(self, k: int) -> str:
        """Human-readable location of row ``k``: ``"FILE, line N"`` or ``"LABEL, row N"``."""
        source = self.sources[int(self.file_index[k])]
        unit = "line" if self.is_file else "row"
        return f"{source}, {unit} {int(self.line[k])}"
