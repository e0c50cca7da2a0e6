"""Train/test split: random over nonzeros, or a user-supplied test set."""

from __future__ import annotations

import numpy as np

from .errors import InputError


def random_test_mask(n: int, test_fraction: float, seed: int) -> np.ndarray:
    """Mark ``round(test_fraction * n)`` of ``n`` rows as test, at random.

    Uses ``np.random.Generator(np.random.PCG64(seed))``; rows should be in a canonical order
    (sorted by user, item) so that the split depends only on the data and the seed.

    Returns
    -------
    np.ndarray of bool, shape (n,)
    """
    check_test_fraction(test_fraction)
    n_test = int(round(test_fraction * n))
    rng = np.random.Generator(np.random.PCG64(seed))
    mask = np.zeros(n, dtype=bool)
    mask[rng.permutation(n)[:n_test]] = True
    return mask


def check_test_fraction(test_fraction: float) -> None:
    """Raise InputError unless 0 <= test_fraction < 1."""
    if not 0.0 <= float(test_fraction) < 1.0:
        raise InputError(f"test_fraction must be in [0, 1), got {test_fraction!r}")


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
