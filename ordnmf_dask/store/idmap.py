"""Raw ids <-> contiguous indices, read piecewise from a store's id maps (on the workers).

The store keeps ``users/ids`` and ``items/ids`` in index order (int64, or strings). These helpers
read only a slice, or only the rows asked for, so that no process needs a whole id map; a lookup
of raw ids runs per block and returns only the matches. Every chunk file a read decodes is
checked against the array's chunk inventory (size and CRC-32, :class:`ChunkFiles`), so a lost or
changed id chunk is an error naming it, never wrong ids.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from ordnmf_dask.errors import InputError, shown
from ordnmf_dask.store.decode import ChunkFiles

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Client


#: Text of an integral float (``7.0``, ``-12.00``): the id whose text is the integer's (``7``), in
#: every input format (a Parquet float id column gives the same) and on the command line.
INTEGRAL_FLOAT = r"^(0|-?[1-9][0-9]*)\.0+$"
#: The canonical decimal text of an int64 id: ASCII digits, a minus sign on a nonzero value, no
#: leading zeros, nothing else (``1_0``, ``+7``, ``007`` and Arabic-Indic digits are other texts,
#: so other ids). The one rule by which text becomes an integer id, in ingest and in lookups.
CANONICAL_INT = r"^(?:0|-?[1-9][0-9]{0,18})$"
_CANONICAL = re.compile(CANONICAL_INT)
_INTEGRAL_FLOAT = re.compile(INTEGRAL_FLOAT)
_INT64 = (-(2**63), 2**63 - 1)


def id_text(text: str) -> str:
    """A raw id given as text as the ingest reads it: stripped, integral float text as the
    integer's."""
    text = text.strip()
    return _INTEGRAL_FLOAT.sub(r"\1", text) if "." in text else text  # the pattern needs a dot


def is_missing(value: Any) -> bool:
    """Whether ``value`` is a missing value (None, NaN, NaT, pandas NA), which names no id."""
    if type(value) is str:  # the common case, first
        return False
    if value is None or type(value).__name__ in ("NAType", "NaTType"):
        return True
    if isinstance(value, float | np.floating):
        return bool(np.isnan(value))
    if isinstance(value, np.datetime64 | np.timedelta64):
        return bool(np.isnat(value))
    return False


def int_id(value: Any) -> int | None:
    """The int64 id that the raw id ``value`` names, or None when it names none: an integer in
    int64, an integral float within it, or text in the canonical decimal form
    (:data:`CANONICAL_INT`, after :func:`id_text`)."""
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, float | np.floating):
        if not float(value).is_integer() or not -(2.0**63) <= value < 2.0**63:
            return None
        value = int(value)
    if isinstance(value, int | np.integer):
        return int(value) if _INT64[0] <= value <= _INT64[1] else None
    if isinstance(value, str):
        text = id_text(value)
        if _CANONICAL.fullmatch(text) is None:
            return None
        number = int(text)
        return number if _INT64[0] <= number <= _INT64[1] else None
    return None


def str_id(value: Any) -> str:
    """The text of the raw id ``value`` in a store of string ids (as the ingest reads it)."""
    if isinstance(value, str):
        return id_text(value)
    number = int_id(value)
    return str(number) if number is not None else str(value)


def id_list(ids: Any, name: str) -> list[Any]:
    """``ids`` (a list, tuple, array or other sequence of raw ids) as a list; TypeError for a
    bare string or a single value, which would otherwise be read as its characters or as one
    id where a list was meant; InputError for a missing value (None, NaN, NaT) among them."""
    if isinstance(ids, str | bytes) or not _sequence(ids):
        what = f"the string {ids!r}" if isinstance(ids, str | bytes) else shown(ids)
        raise TypeError(f"{name} must be a list of ids, got {what} (pass [{ids!r}] for one id)")
    out = list(ids)
    for j, value in enumerate(out):
        if is_missing(value):
            raise InputError(f"{name}[{j}] is {shown(value)}, which names no id")
    return out


def _sequence(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim == 1
    return hasattr(value, "__len__") and hasattr(value, "__iter__") and not isinstance(value, dict)


def coerce(raw: Sequence[Any], integer: bool) -> tuple[np.ndarray, list[int]]:
    """Raw ids as given, in the type of a map of int64 (``integer``) or string ids.

    Returns
    -------
    wanted : (m',) the ids that can be of that type (int64 or ``<U``), in order.
    bad : positions in ``raw`` of ids that cannot (``"x"`` or ``"1_0"`` for integer ids):
        unknown ids.
    """
    bad: list[int] = []
    values: list[int | str] = []
    for j, value in enumerate(raw):
        if is_missing(value):
            raise InputError(f"id {shown(value)} (position {j}) is missing: it names no id")
        if integer:
            number = int_id(value)
            if number is None:
                bad.append(j)
            else:
                values.append(number)
        else:
            values.append(str_id(value))
    if integer:
        return np.array(values, dtype=np.int64), bad
    return _as_plain(np.array(values, dtype=str)), bad


def _array(store: str, axis: str) -> zarr.Array:
    """The id array of ``axis`` (its metadata; nothing is read)."""
    return zarr.open_array(f"{store}/{axis}/ids", mode="r")


def _read(store: str, axis: str, rows: slice | np.ndarray) -> np.ndarray:
    """The ids of ``axis`` at ``rows`` (a slice, or sorted distinct indices), after checking the
    chunk files they lie in against the array's inventory: zarr would read a missing file as
    empty ids, a changed one as other ids."""
    array = _array(store, axis)
    files = ChunkFiles.of(array, f"{store}/{axis}/ids", owner="id map")
    size = int(array.chunks[0])
    if isinstance(rows, slice):
        lo, hi, _ = rows.indices(array.shape[0])
        chunks = np.arange(lo // size, -(-hi // size)) if hi > lo else np.arange(0)
    else:
        chunks = np.unique(rows // size)
    for i in chunks:
        files.load(int(i))
    return np.asarray(
        array[rows] if isinstance(rows, slice) else array.get_orthogonal_selection(rows)
    )


def _as_plain(ids: np.ndarray) -> np.ndarray:
    """int64 ids as they are; string ids as a fixed-width ``<U`` array (sortable, searchable)."""
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        return ids.astype(np.int64)
    width = int(np.strings.str_len(ids).max()) if ids.size else 1
    return ids.astype(f"<U{max(width, 1)}")


def ids_at(store: str, axis: str, index: np.ndarray) -> list[Any]:
    """Raw ids (Python int or str) of the given indices of ``axis`` ("users" or "items").

    Parameters
    ----------
    index : (m,) int, any order, repeats allowed; only the distinct rows are read.

    Returns
    -------
    list of m raw ids, in the order of ``index``.
    """
    index = np.asarray(index, dtype=np.int64)
    if index.size == 0:
        return []
    uniq, inverse = np.unique(index, return_inverse=True)
    values = _as_plain(_read(store, axis, uniq))
    return values[inverse].tolist()


def ids_slice(store: str, axis: str, start: int, stop: int) -> list[Any]:
    """Raw ids of the indices ``start .. stop - 1`` of ``axis`` (Python int or str)."""
    return _as_plain(_read(store, axis, slice(start, stop))).tolist()


def coerce_ids(store: str, axis: str, raw: Sequence[Any]) -> tuple[np.ndarray, list[int]]:
    """Raw ids as given (e.g. strings from a command line) in the dtype of the store's ids
    (:func:`coerce`)."""
    return coerce(raw, _array(store, axis).dtype.kind in "iu")


def find_in_slice(
    store: str, axis: str, start: int, stop: int, wanted: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``wanted`` (raw ids) are among the indices ``start .. stop - 1``.

    Returns
    -------
    positions : (m,) int64 positions in ``wanted`` that were found here.
    local : (m,) int64 their indices relative to ``start``.
    """
    ids = _as_plain(_read(store, axis, slice(start, stop)))
    if ids.size == 0 or wanted.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    pos = np.minimum(np.searchsorted(sorted_ids, wanted), len(ids) - 1)
    hit = sorted_ids[pos] == wanted
    return np.flatnonzero(hit).astype(np.int64), order[pos[hit]].astype(np.int64)


def lookup(
    client: Client, store: str, axis: str, bounds: Sequence[int], raw: Sequence[Any]
) -> np.ndarray:
    """Global indices of the raw ids ``raw`` of ``axis``, looked up per block on the workers.

    Parameters
    ----------
    bounds : (n_blocks + 1,) index boundaries of the blocks of ``axis``.
    raw : m raw ids (int or str; coerced to the store's id type).

    Returns
    -------
    (m,) int64 indices. Raises InputError naming the first unknown id.
    """
    wanted, bad = coerce_ids(store, axis, raw)
    skip = set(bad)
    good = [j for j in range(len(raw)) if j not in skip]
    index = np.full(len(raw), -1, dtype=np.int64)
    if good:
        futures = [
            client.submit(find_in_slice, store, axis, int(lo), int(hi), wanted, pure=False)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        for lo, (pos, local) in zip(bounds[:-1], client.gather(futures), strict=True):
            index[np.asarray(good, dtype=np.int64)[pos]] = int(lo) + local
    missing = np.flatnonzero(index < 0)
    if missing.size:
        names = ", ".join(shown(raw[j]) for j in missing[:5])
        more = f" (and {missing.size - 5} more)" if missing.size > 5 else ""
        noun = "user" if axis == "users" else "item"
        raise InputError(f"unknown {noun} id {names}{more}: not in store {store}")
    return index
