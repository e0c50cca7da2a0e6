"""Id maps, duplicate handling and min-count filtering of interactions."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ordnmf_dask.errors import InputError, shown
from ordnmf_dask.params import DUPLICATE_POLICIES
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.text import POOL
from ordnmf_dask.store.idmap import CANONICAL_INT, INTEGRAL_FLOAT, is_missing

_INT64_MAX = np.iinfo(np.int64).max
_INT64_END = 2.0**63  # the first float beyond int64


_CANONICAL = CANONICAL_INT  # ids that are the canonical decimal form of an int64
#: Characters refused in ids: C0 and C1 controls (NUL, tab, CR, ...) and the Unicode line and
#: paragraph separators, which would not survive a line-based text file.
_CONTROL = r"[\x00-\x1f\x7f-\x{9f}\x{2028}\x{2029}]"


def encode_ids(ids: Any, origin: Origin, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct raw ids (int64 or str ``<U``) and the code (index into them, int32) of
    every row: ``distinct_ids``, then a sort of the distinct ids only."""
    uniques, codes = distinct_ids(ids, origin, what)
    uniques, codes = _sorted(uniques, codes, np.argsort(uniques, kind="stable"))
    if uniques.dtype.kind == "S":
        uniques = uniques.astype(f"U{uniques.dtype.itemsize}")
    return uniques, codes


def distinct_ids(ids: Any, origin: Origin, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Distinct raw ids in the order first seen, and the code (index into them) of every row.

    The work per row is pyarrow's dictionary encoding; stripping and the checks run on the
    distinct ids only.

    Parameters
    ----------
    ids : pyarrow string array (chunked or not), or np.ndarray of int or str, shape (n,)
        Raw ids as read. Strings are whitespace-stripped; an empty one or one with a control
        character is an error naming its row (via ``origin``). If every distinct string is the
        canonical decimal form of an int64, the ids are int64 (``"007"`` or ``"1e3"`` keep all
        of them strings, so distinct raw ids never merge). The text of an integral float
        (``"7.0"``) is read as the integer's text (``"7"``), as a Parquet float id is.
    origin : Origin
    what : str
        "user" or "item", for messages.

    Returns
    -------
    uniques : np.ndarray, shape (m,)
        int64; or strings: ASCII ones as NUL-padded bytes (``S``, the form they are staged in;
        ``widen`` gives str), others as str (``<U``).
    codes : np.ndarray of int32, shape (n,)
    """
    if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu":
        col = pa.chunked_array([pa.array(ids.astype(np.int64, copy=False))])
    elif isinstance(ids, pa.ChunkedArray):
        col = ids
    else:
        col = pa.chunked_array([pa.array(ids)])
    encoded = pc.dictionary_encode(col, memory_pool=POOL)
    codes = (
        np.concatenate([c.indices.to_numpy() for c in encoded.chunks])
        if encoded.num_chunks
        else np.zeros(0, np.int32)
    )
    dictionary = encoded.chunk(0).dictionary if encoded.num_chunks else pa.array([], col.type)
    del encoded
    if pa.types.is_integer(dictionary.type):
        return dictionary.to_numpy().astype(np.int64), codes
    dictionary, codes = _clean_strings(dictionary, codes, origin, what)
    canonical = _all_canonical(dictionary)
    if not canonical:  # ids all in integer form hold no float text
        found = dictionary
        dictionary, codes = _integral_floats(dictionary, codes)
        canonical = dictionary is not found and _all_canonical(dictionary)
    if len(dictionary) and canonical:
        try:
            return pc.cast(dictionary, pa.int64()).to_numpy(), codes
        except pa.ArrowInvalid:  # beyond int64
            pass
    return _numpy_strings(dictionary), codes


def _all_canonical(strings: pa.Array, head: int = 64) -> bool:
    """Whether every string is the canonical decimal form of an int64 (``_CANONICAL``); the
    first ``head`` are matched first, which settles it for most string ids."""
    if not pc.all(pc.match_substring_regex(strings[:head], _CANONICAL)).as_py():
        return False
    return bool(pc.all(pc.match_substring_regex(strings, _CANONICAL)).as_py())


def _numpy_strings(strings: pa.Array) -> np.ndarray:
    """A pyarrow string array (no nulls) in numpy: all ASCII as NUL-padded bytes (``S``), by
    one padding kernel and a view of its buffer, with no Python object per string; else str."""
    if not len(strings):
        return np.zeros(0, "<U1")
    if not pc.all(pc.string_is_ascii(strings)).as_py():
        return strings.to_numpy(zero_copy_only=False).astype(str)
    width = max(1, pc.max(pc.binary_length(strings)).as_py())
    padded = pc.utf8_rpad(strings, width=width, padding="\x00").cast(pa.large_binary())
    start = int(np.frombuffer(padded.buffers()[1], np.int64, 1, padded.offset * 8)[0])
    return np.frombuffer(padded.buffers()[2], f"S{width}", len(padded), start)


def _sorted(
    uniques: np.ndarray, codes: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values put in ``order`` (the order that sorts them), and the codes into them
    renumbered to match (int32, in place where they already are)."""
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    if codes.dtype != np.int32 or not codes.flags.writeable:  # pyarrow's are read-only
        codes = codes.astype(np.int32)
    np.take(rank, codes, out=codes, mode="clip")  # in place: every code is in range
    return uniques[order], codes


def encode_sorted(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` (codes as int32) of ids already checked (no
    stripping): byte strings (staged ASCII ids, padded with NULs) go through pyarrow's hash
    table zero-copy, str through a pyarrow string array, and only their distinct values are
    sorted (byte order is numpy's order)."""
    if ids.dtype.kind not in "SU" or not len(ids):
        uniques, inverse = np.unique(ids, return_inverse=True)
        return uniques, inverse.astype(np.int32).reshape(-1)
    width = ids.dtype.itemsize
    if ids.dtype.kind == "S" and width <= 8:
        return _encode_words(ids)
    if ids.dtype.kind == "S":
        buffer = pa.py_buffer(np.ascontiguousarray(ids))
        arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(ids), [None, buffer])
    else:
        arr = pa.array(ids)
    encoded = pc.dictionary_encode(arr, memory_pool=POOL)
    dictionary, codes = encoded.dictionary, encoded.indices.to_numpy()
    order = pc.array_sort_indices(dictionary).to_numpy()
    if ids.dtype.kind == "S":
        distinct = np.frombuffer(
            dictionary.buffers()[1], ids.dtype, len(dictionary), dictionary.offset * width
        )
    else:
        distinct = dictionary.to_numpy(zero_copy_only=False).astype(ids.dtype)
    return _sorted(distinct, codes, order)


def _encode_words(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``encode_sorted`` of byte strings of at most 8 bytes: each read as a big-endian uint64
    (NUL-padded, so the integers' order is the strings' byte order), hashed as integers
    (about 3x faster than as fixed-size binary)."""
    n, width = len(ids), ids.dtype.itemsize
    words = np.zeros((n, 8), np.uint8)
    words[:, :width] = np.ascontiguousarray(ids).view(np.uint8).reshape(n, width)
    keys = words.view(">u8").ravel().astype(np.uint64)
    del words
    encoded = pc.dictionary_encode(pa.array(keys), memory_pool=POOL)
    del keys
    found = encoded.dictionary.to_numpy()
    words = found.astype(">u8").view(np.uint8).reshape(-1, 8)
    distinct = np.ascontiguousarray(words[:, :width]).view(ids.dtype).ravel()
    return _sorted(distinct, encoded.indices.to_numpy(), np.argsort(found))


def encode_pair(
    users: Any, items: Any, origin: Origin, encode: Callable = encode_ids
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``encode`` (``encode_ids`` or ``distinct_ids``) of the user and of the item ids, on two
    threads (pyarrow releases the GIL); an error in the user ids is raised first, as if encoded
    one after the other."""
    with ThreadPoolExecutor(2) as pool:
        jobs = [
            pool.submit(encode, ids, origin, what)
            for ids, what in ((users, "user"), (items, "item"))
        ]
    return jobs[0].result(), jobs[1].result()


def _clean_strings(
    dictionary: pa.Array, codes: np.ndarray, origin: Origin, what: str
) -> tuple[pa.Array, np.ndarray]:
    """Distinct stripped ids and the codes into them; errors name the first row of a bad id."""
    stripped = pc.utf8_trim_whitespace(dictionary)
    control = pc.match_substring_regex(stripped, _CONTROL).to_numpy(zero_copy_only=False)
    empty = (pc.utf8_length(stripped).to_numpy() == 0) & ~control
    for bad, kind in ((control, "control"), (empty, "empty")):
        if bad.any():
            k = int(np.flatnonzero(bad[codes])[0])
            tok = stripped[int(codes[k])].as_py()
            if kind == "empty":
                raise InputError(f"{origin.where(k)}: empty {what} id")
            hit = next(ch for ch in tok if re.match(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", ch))
            raise InputError(
                f"{origin.where(k)}: {what} id {shown(tok)} contains the control character "
                f"U+{ord(hit):04X}; ids must be printable text"
            )
    if pc.all(pc.equal(pc.binary_length(stripped), pc.binary_length(dictionary))).as_py():
        return dictionary, codes
    merged = stripped.dictionary_encode()
    return merged.dictionary, merged.indices.to_numpy()[codes]


def _integral_floats(dictionary: pa.Array, codes: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Distinct ids with integral float text (``"7.0"``) read as the integer's (``"7"``), merged
    with that id where both are there, and the codes into them."""
    if not pc.any(pc.match_substring_regex(dictionary, INTEGRAL_FLOAT)).as_py():
        return dictionary, codes
    merged = pc.replace_substring_regex(dictionary, INTEGRAL_FLOAT, r"\1").dictionary_encode()
    return merged.dictionary, merged.indices.to_numpy()[codes]


def float_ids(ids: np.ndarray, where: Callable[[int], str], what: str) -> np.ndarray:
    """int64 of float ids (n,); an id that is no integer, or beyond int64, is an error naming
    its row (``where``: the row's place, e.g. ``Origin.where``)."""
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(ids) | (ids != np.round(ids)) | (ids < -_INT64_END) | (ids >= _INT64_END)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        value = float(ids[k])
        reason = "does not fit in int64" if value.is_integer() else "is not an integer"
        raise InputError(f"{where(k)}: {what} id {value!r} {reason}")
    return ids.astype(np.int64)


def ids_from_array(ids: object, label: str, what: str) -> np.ndarray:
    """Raw ids given in memory (``label``: how messages name them): int64 for integer (or
    integral float) arrays, else str."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise InputError(f"{label}: {what} ids must be a 1-D array, got shape {arr.shape}")
    if arr.dtype == bool:
        raise InputError(f"{label}: {what} ids must be integers or strings, not booleans")
    if arr.dtype.kind in "iu":
        if arr.dtype.kind == "u" and arr.size and arr.max() > _INT64_MAX:
            raise InputError(f"{label}: {what} id {arr.max()} does not fit in int64")
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        return float_ids(arr, Origin.arrays(len(arr), label).where, what)
    if arr.dtype.kind in "OMm":  # None, NaN, NaT or pd.NA would become the text 'None', 'nan'
        gone = np.isnat(arr) if arr.dtype.kind in "Mm" else np.array([is_missing(x) for x in arr])
        if gone.any():
            k = int(np.flatnonzero(gone)[0])
            where = Origin.arrays(len(arr), label).where(k)
            raise InputError(f"{where}: {what} id is missing ({arr[k]!r})")
    return arr.astype(str)


class Ids(Protocol):
    """Ids by code: an array, or ranges staged on disk that are read only for the ids a
    message names (``distributed_tasks.IdRanges``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, code: int, /) -> Any: ...


def dedupe(
    u: np.ndarray,
    i: np.ndarray,
    values: np.ndarray,
    origin: Origin,
    policy: str,
    user_ids: Ids,
    item_ids: Ids,
) -> tuple[np.ndarray, np.ndarray]:
    """Merge rows with the same (user, item) pair.

    Parameters
    ----------
    u, i : np.ndarray of int64, shape (n,)
        User and item codes (indices into ``user_ids`` / ``item_ids``).
    values : np.ndarray of float64, shape (n,)
    origin : Origin
    policy : {"error", "sum", "max", "last"}
        "last" keeps the value of the last row in input order (files in the order given).
    user_ids, item_ids : Ids
        Raw ids, to name a duplicate pair in the error message.

    Returns
    -------
    rows : np.ndarray of int64, shape (m,)
        One representative row (the last occurrence) per distinct pair, in (user, item) order.
    merged : np.ndarray of float64, shape (m,)
        The merged value of each pair.
    """
    if policy not in DUPLICATE_POLICIES:
        raise InputError(f"duplicates must be one of {DUPLICATE_POLICIES}, got {policy!r}")
    key = u.astype(np.int64) * np.int64(max(len(item_ids), 1))
    key += i
    order, sk = stable_sort(key)  # input order within a pair: "last", messages
    del key
    new = np.ones(len(sk), dtype=bool)
    np.not_equal(sk[1:], sk[:-1], out=new[1:])
    del sk
    if new.all():
        return order, values[order]
    starts = np.flatnonzero(new)
    if policy == "error":
        dup = int(np.flatnonzero(~new)[0])
        a, b = int(order[dup - 1]), int(order[dup])
        raise InputError(
            f"duplicate (user {user_ids[u[a]]!s}, item {item_ids[i[a]]!s}) at "
            f"{origin.where(a)} and {origin.where(b)}; "
            "pass duplicates='sum', duplicates='max' or duplicates='last'"
        )
    ends = np.append(starts[1:], len(new))
    rows = order[ends - 1]
    if policy == "sum":
        merged = np.add.reduceat(values[order], starts)
    elif policy == "max":
        merged = np.maximum.reduceat(values[order], starts)
    else:
        merged = values[rows]
    return rows.astype(np.int64), merged


def stable_sort(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order that sorts ``key`` (int64 (n,), overwritten) stably, and ``key`` in that order.

    Where the key's range and the row numbers fit in 63 bits together, one sort of each key
    packed with its row number (distinct, so any sort gives the stable order): numpy sorts
    int64 several times faster than it argsorts them. Otherwise an argsort.
    """
    n = len(key)
    if not n:
        return np.zeros(0, np.int64), key
    lo = int(key.min())
    shift = max((n - 1).bit_length(), 1)
    if (int(key.max()) - lo).bit_length() + shift > 63:
        order = np.argsort(key, kind="stable")
        return order, key[order]
    key -= lo
    key <<= shift
    key |= np.arange(n, dtype=np.int64)
    key.sort()
    order = key & np.int64((1 << shift) - 1)
    key >>= shift
    key += lo
    return order, key
