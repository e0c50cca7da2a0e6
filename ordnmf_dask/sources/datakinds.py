"""What kind of data in memory an object is, told by its type's module and name, so that
asking loads none of the libraries (pyarrow, pandas, scipy, Dask) that make such data."""

from __future__ import annotations


def _made_by(data: object, package: str) -> bool:
    return type(data).__module__.split(".")[0] == package


def is_dask_dataframe(data: object) -> bool:
    """Whether ``data`` is a dask DataFrame."""
    return _made_by(data, "dask") and hasattr(data, "npartitions")


def is_sparse(data: object) -> bool:
    """Whether ``data`` is a scipy.sparse matrix or array."""
    return type(data).__module__.startswith("scipy.sparse") and hasattr(data, "tocoo")


def is_pandas(data: object) -> bool:
    """Whether ``data`` is a pandas DataFrame."""
    return _made_by(data, "pandas") and hasattr(data, "columns")


def is_arrow(data: object, name: str) -> bool:
    """Whether ``data`` is the pyarrow class ``name`` ("Table" or "RecordBatch")."""
    return _made_by(data, "pyarrow") and type(data).__name__ == name


def memory_label(data: object, role: str) -> str | None:
    """How messages name ``role`` data ("input" or "test") held in memory: a
    ``(users, items, values)`` tuple, a scipy.sparse matrix, a pyarrow Table or a DataFrame
    (pandas, or a pyarrow RecordBatch); None for files."""
    if isinstance(data, tuple) and len(data) == 3:
        return f"{role} arrays"
    if is_sparse(data):
        return f"{role} matrix"
    if is_arrow(data, "Table"):
        return f"{role} Table"
    return f"{role} DataFrame" if is_arrow(data, "RecordBatch") or is_pandas(data) else None
