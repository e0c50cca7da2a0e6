"""Train/test/validation split: random over nonzeros by a seeded pair hash, or a user-supplied
test set; the validation set is always carved from the training pairs by the same hash."""

from __future__ import annotations

import numpy as np

from ordnmf_dask.errors import InputError, shown

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
#: The top ``HASH_BIN_BITS`` bits of a pair hash name its bin (distributed threshold search).
HASH_BIN_BITS = 16


def _mix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finalizer, a bijection of uint64 (wrap-around arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def pair_hash(u: np.ndarray, i: np.ndarray, n_items: int, seed: int) -> np.ndarray:
    """Seeded hash of (user, item) index pairs, distinct for distinct pairs.

    ``mix64(key * GAMMA + mix64(seed + GAMMA))`` with ``key = u * n_items + i``: a bijection of
    the key for a fixed seed (odd multiplier, then the SplitMix64 finalizer), so two distinct
    pairs never tie.

    Parameters
    ----------
    u, i : np.ndarray of int, shape (n,)
        Final (contiguous) user and item indices.
    n_items : int
    seed : int

    Returns
    -------
    np.ndarray of uint64, shape (n,)
    """
    with np.errstate(over="ignore"):
        offset = _mix64(np.asarray([seed], dtype=np.uint64) + _GAMMA)[0]
        key = np.asarray(u, np.int64) * np.int64(max(n_items, 1)) + np.asarray(i, np.int64)
        return _mix64(key.astype(np.uint64) * _GAMMA + offset)


def n_test_rows(n: int, test_fraction: float) -> int:
    """``round(test_fraction * n)``, the size of the random test set of ``n`` nonzeros."""
    check_test_fraction(test_fraction)
    return int(round(test_fraction * n))


def random_test_mask(
    u: np.ndarray, i: np.ndarray, n_items: int, test_fraction: float, seed: int
) -> np.ndarray:
    """Mark ``round(test_fraction * n)`` of ``n`` nonzeros as test, at random.

    The test set is the ``n_test`` pairs with the smallest ``pair_hash(u, i, n_items, seed)``.
    It depends only on the set of pairs and the seed (not on their order), and a chunked
    computation reproduces it exactly: histogram the hash bins, find the bin holding the
    ``n_test``-th smallest hash, select within that bin (see ``ordnmf_dask.sources.distributed``).

    Parameters
    ----------
    u, i : np.ndarray of int, shape (n,)
        Distinct (user, item) index pairs.
    n_items : int
    test_fraction : float
    seed : int

    Returns
    -------
    np.ndarray of bool, shape (n,)
    """
    return smallest_hashes(u, i, n_items, n_test_rows(len(u), test_fraction), seed)


def smallest_hashes(u: np.ndarray, i: np.ndarray, n_items: int, n: int, seed: int) -> np.ndarray:
    """Mask of the ``n`` pairs with the smallest ``pair_hash(u, i, n_items, seed)``."""
    if n == 0:
        return np.zeros(len(u), dtype=bool)
    h = pair_hash(u, i, n_items, seed)
    threshold = np.partition(h, n - 1)[n - 1]
    return h <= threshold


def n_validation_rows(n_train: int, validation_fraction: float) -> int:
    """``round(validation_fraction * n_train)``: the validation set's size, carved from the
    ``n_train`` training nonzeros left by the test split."""
    check_validation_fraction(validation_fraction)
    return int(round(validation_fraction * n_train))


def validation_mask(
    u: np.ndarray, i: np.ndarray, n_items: int, validation_fraction: float, seed: int
) -> np.ndarray:
    """Mark ``round(validation_fraction * n)`` of the ``n`` training pairs as validation: those
    with the smallest pair hash (the test split's hash and seed). After a random test split,
    these are the pairs ranked just after the test pairs, so a chunked computation finds them
    as it finds the test set (a threshold at rank n_test + n_validation of all pairs)."""
    n_val = n_validation_rows(len(u), validation_fraction)
    return smallest_hashes(u, i, n_items, n_val, seed)


def check_test_fraction(test_fraction: float) -> None:
    """Raise InputError unless 0 <= test_fraction < 1."""
    if not 0.0 <= float(test_fraction) < 1.0:
        raise InputError(f"test_fraction must be in [0, 1), got {shown(test_fraction)}")


def check_validation_fraction(validation_fraction: float) -> None:
    """Raise InputError unless 0 <= validation_fraction < 1."""
    if isinstance(validation_fraction, bool) or not 0.0 <= float(validation_fraction) < 1.0:
        raise InputError(
            f"validation_fraction must be in [0, 1), got {shown(validation_fraction)}"
        )


def lookup(known: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index of each query id in the sorted array ``known``, or -1 if absent.

    Parameters
    ----------
    known : np.ndarray of int64 or str, shape (m,), sorted and distinct
    query : np.ndarray of int64 or str, shape (n,)
        Converted to the kind of ``known`` first (strings that are not the canonical decimal
        form of an integer are absent from integer ids).

    Returns
    -------
    np.ndarray of int64, shape (n,)
    """
    query, ok = _as_kind(query, known)
    out = np.full(len(query), -1, dtype=np.int64)
    if known.size == 0 or query.size == 0:
        return out
    pos = np.minimum(np.searchsorted(known, query), known.size - 1)
    found = ok & (known[pos] == query)
    out[found] = pos[found]
    return out


def _as_kind(query: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.ones(len(query), dtype=bool)
    if known.dtype.kind != "i":
        return query.astype(str), ok
    if query.dtype.kind == "i":
        return query.astype(np.int64), ok
    tokens = query.astype(str)
    out = np.zeros(len(tokens), dtype=np.int64)
    for k, tok in enumerate(tokens):
        try:
            out[k] = int(tok)
        except (ValueError, OverflowError):
            ok[k] = False
            continue
        ok[k] = str(out[k]) == tok
    return out, ok
