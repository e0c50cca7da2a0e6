"""Id maps, duplicate handling and min-count filtering of interactions."""

from __future__ import annotations

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.origin import Origin

DUPLICATE_POLICIES = ("error", "sum", "max", "last")
FILTER_MODES = ("paper", "stable")
_INT64_MAX = np.iinfo(np.int64).max


def normalize_text_ids(tokens: np.ndarray) -> np.ndarray:
    """Ids read from text: int64 if every token is the canonical decimal form of an int64.

    Parameters
    ----------
    tokens : np.ndarray of str, shape (n,)
        (Integer arrays, e.g. from Parquet integer columns, are returned as int64.)

    Returns
    -------
    np.ndarray of int64 or str, shape (n,)
        Strings such as ``"007"`` or ``"1e3"`` keep every id a string, so distinct raw ids
        never merge.
    """
    if tokens.dtype.kind in "iu":
        return tokens.astype(np.int64, copy=False)
    if tokens.size == 0:
        return tokens.astype(str)
    try:
        ints = tokens.astype(np.int64)
    except (ValueError, OverflowError):
        return tokens
    if np.array_equal(ints.astype(str), np.char.strip(tokens)):
        return ints
    return tokens


def ids_from_array(ids: object, what: str) -> np.ndarray:
    """Raw ids given in memory: int64 for integer (or integral float) arrays, else str."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise InputError(f"{what} ids must be a 1-D array, got shape {arr.shape}")
    if arr.dtype == bool:
        raise InputError(f"{what} ids must be integers or strings, not booleans")
    if arr.dtype.kind in "iu":
        if arr.dtype.kind == "u" and arr.size and arr.max() > _INT64_MAX:
            raise InputError(f"{what} id {arr.max()} does not fit in int64")
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            raise InputError(f"{what} id {arr[bad[0]]!r} at row {bad[0]} is not an integer")
        return arr.astype(np.int64)
    return arr.astype(str)


def factorize(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct ids (n_distinct,) and the int64 code of every entry (n,)."""
    uniques, codes = np.unique(ids, return_inverse=True)
    return uniques, codes.astype(np.int64).ravel()


def dedupe(
    u: np.ndarray,
    i: np.ndarray,
    values: np.ndarray,
    origin: Origin,
    policy: str,
    user_ids: np.ndarray,
    item_ids: np.ndarray,
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
    user_ids, item_ids : np.ndarray
        Raw ids, to name a duplicate pair in the error message.

    Returns
    -------
    rows : np.ndarray of int64, shape (m,)
        One representative row (the last occurrence) per distinct pair.
    merged : np.ndarray of float64, shape (m,)
        The merged value of each pair.
    """
    if policy not in DUPLICATE_POLICIES:
        raise InputError(f"duplicates must be one of {DUPLICATE_POLICIES}, got {policy!r}")
    key = u * np.int64(max(len(item_ids), 1)) + i
    order = np.argsort(key, kind="stable")
    sk = key[order]
    new = np.ones(len(sk), dtype=bool)
    new[1:] = sk[1:] != sk[:-1]
    if new.all():
        return np.arange(len(u), dtype=np.int64), values
    starts = np.flatnonzero(new)
    if policy == "error":
        dup = int(np.flatnonzero(~new)[0])
        a, b = int(order[dup - 1]), int(order[dup])
        raise InputError(
            f"duplicate (user {user_ids[u[a]]!s}, item {item_ids[i[a]]!s}) at "
            f"{origin.where(a)} and {origin.where(b)}; "
            "pass duplicates='sum', duplicates='max' or duplicates='last'"
        )
    ends = np.append(starts[1:], len(sk))
    rows = order[ends - 1]
    if policy == "sum":
        merged = np.add.reduceat(values[order], starts)
    elif policy == "max":
        merged = np.maximum.reduceat(values[order], starts)
    else:
        merged = values[rows]
    return rows.astype(np.int64), merged


def min_count_mask(
    u: np.ndarray, i: np.ndarray, n_users: int, n_items: int, min_count: int, mode: str
) -> np.ndarray:
    """Rows kept after removing users and items with fewer than ``min_count`` interactions.

    Parameters
    ----------
    u, i : np.ndarray of int64, shape (n,)
    n_users, n_items : int
        Number of distinct user / item codes.
    min_count : int
    mode : {"paper", "stable"}
        "paper": one pass, items first, then users (as the OrdNMF preprocessing scripts do; some
        items may end below ``min_count``). "stable": repeat until every remaining user and item
        has at least ``min_count`` interactions.

    Returns
    -------
    np.ndarray of bool, shape (n,)
    """
    if mode not in FILTER_MODES:
        raise InputError(f"filter_mode must be one of {FILTER_MODES}, got {mode!r}")
    keep = np.ones(len(u), dtype=bool)
    if min_count <= 1:
        return keep
    while True:
        before = int(keep.sum())
        item_deg = np.bincount(i[keep], minlength=n_items)
        keep &= item_deg[i] >= min_count
        user_deg = np.bincount(u[keep], minlength=n_users)
        keep &= user_deg[u] >= min_count
        if mode == "paper" or int(keep.sum()) == before:
            return keep
