"""The rules of a test file (a held-out test set instead of the random split): no test pair
is a training pair, its duplicates are merged and classified as training rows are, rows of a
user or item the filtered training data lacks are dropped and counted, and a test set left
empty is an error."""

from __future__ import annotations

import warnings

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.filtering import dedupe
from ordnmf_dask.sources.nonzeros import Nonzeros
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.values import ValueSpec, classify


def classify_test_rows(
    tu: np.ndarray,
    ti: np.ndarray,
    values: np.ndarray,
    origin: Origin,
    duplicates: str,
    t_users: np.ndarray,
    t_items: np.ndarray,
    spec: ValueSpec,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge the duplicate pairs of test rows (codes ``tu``, ``ti`` into the test set's own
    sorted ids ``t_users``, ``t_items``) and classify them.

    Returns
    -------
    rows, y, raw, keep
        Representative rows in (user, item) order, their classes, merged values, and whether
        each is an interaction.
    """
    rows, raw = dedupe(tu, ti, values, origin, duplicates, t_users, t_items)
    y, keep = classify(spec, raw, origin.take(rows))
    return rows, y, raw, keep


def known_test(
    u: np.ndarray, i: np.ndarray, y: np.ndarray, raw: np.ndarray, keep: np.ndarray
) -> tuple[Nonzeros, int]:
    """The test interactions (``keep``) whose final user and item indices ``u``, ``i`` exist
    (not -1), sorted by (user, item), and how many interactions were dropped as unknown."""
    unknown = keep & ((u < 0) | (i < 0))
    keep = keep & ~unknown
    nz = Nonzeros(u[keep], i[keep], y[keep], raw[keep])
    return nz.take(np.lexsort((nz.i, nz.u))), int(unknown.sum())


def check_test_left(label: str, n_test: int, n_unknown: int, n_not: int) -> None:
    """Refuse a test file (``label``) that leaves no test interaction: an empty test set
    measures nothing. ``n_unknown``: its interactions whose user or item is not in the
    (filtered) training data; ``n_not``: its pairs that are not an interaction."""
    if n_test == 0:
        raise InputError(
            f"{label}: no test interactions left: {n_unknown} have a user or an item that is not "
            f"in the (filtered) training data, {n_not} are not an interaction"
        )


def warn_unknown(n_unknown: int, stacklevel: int) -> None:
    """Report test rows dropped because their user or item is not in the training data
    (``stacklevel`` as for ``warnings.warn``, counted from the caller)."""
    if n_unknown:
        warnings.warn(
            f"{n_unknown} test rows dropped: their user or item is not in the (filtered) "
            "training data",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def first_overlap(
    tu: np.ndarray, ti: np.ndarray, n_items: int, train_u: np.ndarray, train_i: np.ndarray
) -> tuple[int, int] | None:
    """The first test row whose (user, item) codes (``tu``, ``ti``; -1 where unknown to the
    training data) are a training pair (``train_u``, ``train_i``), and that pair's index."""
    width = np.int64(max(n_items, 1))
    train_keys = train_u.astype(np.int64) * width + train_i
    order = np.argsort(train_keys)
    known = (tu >= 0) & (ti >= 0)
    if not len(order) or not known.any():
        return None
    test_keys = np.where(known, tu.astype(np.int64) * width + ti, -1)
    pos = np.minimum(np.searchsorted(train_keys[order], test_keys), len(order) - 1)
    shared = np.flatnonzero(known & (train_keys[order][pos] == test_keys))
    if not shared.size:
        return None
    k = int(shared[0])
    return k, int(order[pos[k]])


def overlap_message(
    test_origin: Origin, k: int, user: object, item: object, train_origin: Origin, j: int
) -> str:
    """The error of test row ``k`` (raw ids ``user``, ``item``) whose pair is training row
    ``j``."""
    return (
        f"{test_origin.where(k)}: test pair (user {user!s}, item {item!s}) is also in the "
        f"training data at {train_origin.where(j)}"
    )
