"""Evaluation numerics (docs/design.md §3): top-k candidates, rank counts, NDCG@k, precision@k,
recall@k, MAP@k, AUC, test log-likelihood.

Pure numpy functions over one block or one user-block; the orchestration is in
:mod:`ordnmf_dask.postfit.evaluate`. Ties in scores are broken by the lower item index in the
top-k lists and count 1/2 in the AUC.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from ordnmf_dask.model.kernels import CsrBlock, sddmm
from ordnmf_dask.model.thresholds import theta_from_delta

_SCORE_BUDGET = 1 << 22  # floats in one dense (users x items) score slab

TopK = tuple[np.ndarray, np.ndarray]  # (scores, global items) per user, best first


class HeldOut(NamedTuple):
    """The test nonzeros of a user-block, sorted by (local row, item), with their scores."""

    rows: np.ndarray  # int64 local row
    items: np.ndarray  # int64 global item
    y: np.ndarray  # class
    x: np.ndarray  # float64 score E[w_u] . E[h_i]

    @classmethod
    def by_row(cls, rows: np.ndarray, items: np.ndarray, y: np.ndarray, x: np.ndarray) -> HeldOut:
        """The pairs given in any order, sorted."""
        order = np.lexsort((items, rows))
        return cls(rows[order].astype(np.int64), items[order].astype(np.int64), y[order], x[order])


class Candidates(NamedTuple):
    """What one item-block (or a merge of several) contributes to a user-block's ranking.

    top : the best k items per user; below, equal : per test pair, how many of the user's
    other candidates (items in neither train nor test) score strictly lower / the same;
    free : per user, the number of those other candidates.
    """

    top: TopK
    below: np.ndarray
    equal: np.ndarray
    free: np.ndarray


def _score_slabs(
    ew: np.ndarray, eh: np.ndarray, train: CsrBlock
) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(start, stop, ew[start:stop] @ eh.T)`` with the training entries at -inf, a slab of at
    most ``_SCORE_BUDGET`` floats at a time (at least one row)."""
    n_rows, n_cols = ew.shape[0], eh.shape[0]
    step = max(1, _SCORE_BUDGET // max(n_cols, 1))
    train_rows = train.rows
    for start in range(0, n_rows, step):
        stop = min(n_rows, start + step)
        s = ew[start:stop] @ eh.T
        lo, hi = train.indptr[start], train.indptr[stop]
        s[train_rows[lo:hi] - start, train.cols[lo:hi]] = -np.inf
        yield start, stop, s


def _lowest_ties(s: np.ndarray, kth: np.ndarray, kk: int) -> np.ndarray:
    """Columns of the best ``kk`` entries of each row of ``s``, whose kk-th best is ``kth``:
    all those above it and, of those equal to it, the lowest columns."""
    above = s > kth[:, None]
    tie = s == kth[:, None]
    room = kk - np.count_nonzero(above, axis=1)
    chosen = above | (tie & (np.cumsum(tie, axis=1) <= room[:, None]))
    return np.nonzero(chosen)[1].reshape(s.shape[0], kk)


def _slab_topk(s: np.ndarray, kk: int, col_offset: int) -> TopK:
    """Best ``kk`` entries of each row of ``s``, descending, ties to the lower column."""
    n_cols = s.shape[1]
    if kk < n_cols:
        part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        kth = np.take_along_axis(s, part, axis=1).min(axis=1)
        tied = np.flatnonzero(np.count_nonzero(s >= kth[:, None], axis=1) > kk)
        if tied.size:  # argpartition picks any of the entries tied at the kk-th place
            part[tied] = _lowest_ties(s[tied], kth[tied], kk)
    else:
        part = np.broadcast_to(np.arange(n_cols), s.shape)
    top = np.take_along_axis(s, part, axis=1)
    order = np.lexsort((part, -top), axis=1)
    items = np.take_along_axis(part, order, axis=1) + col_offset
    return np.take_along_axis(top, order, axis=1), items


def topk_block(ew: np.ndarray, eh: np.ndarray, train: CsrBlock, col_offset: int, k: int) -> TopK:
    """Best ``k`` items of one block per user, training items excluded.

    Parameters
    ----------
    ew : (n_rows, K) E[W] of the user-block; eh : (n_cols, K) E[H] of the item-block.
    train : the training nonzeros of the block (they get score -inf).
    col_offset : global index of the block's first item.

    Returns
    -------
    scores : (n_rows, min(k, n_cols)) float64, descending; items : same shape, int64 global ids.
    """
    kk = min(k, eh.shape[0])
    scores = np.empty((ew.shape[0], kk))
    items = np.empty((ew.shape[0], kk), dtype=np.int64)
    for start, stop, s in _score_slabs(ew, eh, train):
        scores[start:stop], items[start:stop] = _slab_topk(s, kk, col_offset)
    return scores, items


def candidates_block(
    ew: np.ndarray, eh: np.ndarray, train: CsrBlock, col_offset: int, k: int, pairs: HeldOut
) -> Candidates:
    """:func:`topk_block` and, from the same scores, the rank counts of the user-block's test
    ``pairs`` (all item-blocks) against this block's items in neither train nor test.

    Memory: the score slab and a few temporaries of its size (at most ``_SCORE_BUDGET``
    entries each), besides the outputs.
    """
    n_rows, n_cols = ew.shape[0], eh.shape[0]
    kk = min(k, n_cols)
    scores = np.empty((n_rows, kk))
    items = np.empty((n_rows, kk), dtype=np.int64)
    below = np.zeros(len(pairs.x), dtype=np.int64)
    equal = np.zeros(len(pairs.x), dtype=np.int64)
    free = np.zeros(n_rows, dtype=np.int64)
    mine = (pairs.items >= col_offset) & (pairs.items < col_offset + n_cols)
    per_copy = max(1, _SCORE_BUDGET // max(n_cols, 1))  # test pairs per copy of their rows
    for start, stop, s in _score_slabs(ew, eh, train):
        scores[start:stop], items[start:stop] = _slab_topk(s, kk, col_offset)
        lo, hi = np.searchsorted(pairs.rows, [start, stop])
        here = np.flatnonzero(mine[lo:hi]) + lo
        s[s == -np.inf] = np.nan  # training entries: neither below nor equal to anything
        s[pairs.rows[here] - start, pairs.items[here] - col_offset] = np.nan
        free[start:stop] = n_cols - np.count_nonzero(np.isnan(s), axis=1)
        for a in range(lo, hi, per_copy):
            b = min(hi, a + per_copy)
            x = pairs.x[a:b, None]
            against = s[pairs.rows[a:b] - start]
            below[a:b] = np.count_nonzero(against < x, axis=1)
            equal[a:b] = np.count_nonzero(against == x, axis=1)
    return Candidates((scores, items), below, equal, free)


def merge_topk(a: TopK, b: TopK, k: int) -> TopK:
    """Merge two per-user candidate lists (scores, items) into the best ``k``."""
    scores = np.concatenate([a[0], b[0]], axis=1)
    items = np.concatenate([a[1], b[1]], axis=1)
    order = np.lexsort((items, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(items, order, axis=1)


def merge_candidates(a: Candidates, b: Candidates, k: int) -> Candidates:
    """Two item-blocks' :class:`Candidates` as one: the best ``k`` of both, the counts added."""
    return Candidates(
        merge_topk(a.top, b.top, k), a.below + b.below, a.equal + b.equal, a.free + b.free
    )


def _hits(
    top_items: np.ndarray, test_rows: np.ndarray, test_items: np.ndarray, rel: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Which of each user's top items are relevant test items (``rel`` marks the relevant
    pairs), and each user's number of relevant test items."""
    n_rows = top_items.shape[0]
    width = np.int64(max(int(top_items.max(initial=0)), int(test_items.max(initial=0))) + 1)
    top_keys = np.arange(n_rows, dtype=np.int64)[:, None] * width + top_items
    keys = np.sort(test_rows[rel].astype(np.int64) * width + test_items[rel])
    return np.isin(top_keys, keys), np.bincount(test_rows[rel], minlength=n_rows)


def ndcg_sums(
    top_items: np.ndarray,
    test_rows: np.ndarray,
    test_items: np.ndarray,
    test_y: np.ndarray,
    levels: list[int],
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Sum of NDCG@k over the users of one user-block, for each relevance level s.

    Parameters
    ----------
    top_items : (n_rows, <= k) ranked global item ids per local user.
    test_rows, test_items, test_y : the block-row's test nonzeros (local row, global item, class).
    levels : thresholds s; relevance is ``y_test >= s``.

    Returns
    -------
    sums, counts : (len(levels),) NDCG summed over users with >= 1 relevant item, and their number.
    """
    depth = top_items.shape[1]
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    sums = np.zeros(len(levels))
    counts = np.zeros(len(levels))
    for j, s in enumerate(levels):
        hit, n_rel = _hits(top_items, test_rows, test_items, test_y >= s)
        dcg = (hit * discount[:depth]).sum(axis=1)
        ideal = np.concatenate([[0.0], np.cumsum(discount)])[np.minimum(n_rel, k)]
        users = n_rel > 0
        sums[j] = float((dcg[users] / ideal[users]).sum())
        counts[j] = float(users.sum())
    return sums, counts


def topk_sums(
    top_items: np.ndarray,
    test_rows: np.ndarray,
    test_items: np.ndarray,
    test_y: np.ndarray,
    levels: list[int],
    k: int,
) -> np.ndarray:
    """Sums of precision@k, recall@k and MAP@k over the users of one user-block with >= 1
    relevant item (the users :func:`ndcg_sums` counts), for each relevance level s.

    Per user, with h hits (relevant items) in the top k and R relevant items: precision h / k,
    recall h / R, average precision: the sum over the hits of (hits up to its rank) / rank,
    divided by min(R, k). Arguments as for :func:`ndcg_sums`.

    Returns
    -------
    (3, len(levels)): the precision, recall and MAP sums.
    """
    ranks = np.arange(1, top_items.shape[1] + 1)
    sums = np.zeros((3, len(levels)))
    for j, s in enumerate(levels):
        hit, n_rel = _hits(top_items, test_rows, test_items, test_y >= s)
        users = n_rel > 0
        hit, n_rel = hit[users], n_rel[users]
        n_hit = hit.sum(axis=1)
        precision_at_hits = (hit * np.cumsum(hit, axis=1) / ranks).sum(axis=1)
        sums[0, j] = float((n_hit / k).sum())
        sums[1, j] = float((n_hit / n_rel).sum())
        sums[2, j] = float((precision_at_hits / np.minimum(n_rel, k)).sum())
    return sums


def _run_starts(n: int, *keys: np.ndarray) -> np.ndarray:
    """Where a new run of equal ``keys`` (all of length n) begins."""
    new = np.zeros(n, dtype=bool)
    new[:1] = True
    for key in keys:
        new[1:] |= key[1:] != key[:-1]
    return new


def auc_sums(
    pairs: HeldOut, below: np.ndarray, equal: np.ndarray, free: np.ndarray, levels: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Sum of the AUC over the users of one user-block, for each relevance level s.

    A user's AUC is the probability that a relevant test item (``y >= s``) scores above a
    non-relevant candidate (an item outside the user's training set that is not relevant), ties
    counted 1/2; users with at least one of each count.

    Parameters
    ----------
    pairs : the user-block's test nonzeros; below, equal, free : the merged
        :class:`Candidates` counts (test pairs against the items in neither train nor test).

    Returns
    -------
    sums, counts : (len(levels),) AUC summed over the users that count, and their number.
    """
    n, n_rows = len(pairs.x), len(free)
    order = np.lexsort((pairs.x, pairs.rows))  # by user, then score: ties are runs
    rows, x, y = pairs.rows[order], pairs.x[order], pairs.y[order]
    below, equal = below[order], equal[order]
    index = np.arange(n)
    new_row, new_tie = _run_starts(n, rows), _run_starts(n, rows, x)
    row_start = np.maximum.accumulate(np.where(new_row, index, 0))
    tie_start = np.maximum.accumulate(np.where(new_tie, index, 0))
    tie_stop = np.append(np.flatnonzero(new_tie)[1:], n)[np.cumsum(new_tie) - 1]
    sums = np.zeros(len(levels))
    counts = np.zeros(len(levels))
    for j, s in enumerate(levels):
        rel = y >= s
        seen = np.concatenate([[0], np.cumsum(~rel)])  # non-relevant test pairs so far
        lower = seen[tie_start] - seen[row_start]  # the user's, scoring lower
        same = seen[tie_stop] - seen[tie_start]  # the user's, scoring the same
        wins = below + lower + 0.5 * (equal + same)
        n_rel = np.bincount(rows[rel], minlength=n_rows)
        n_neg = free + np.bincount(rows[~rel], minlength=n_rows)
        won = np.bincount(rows[rel], weights=wins[rel], minlength=n_rows)
        users = (n_rel > 0) & (n_neg > 0)
        sums[j] = float((won[users] / (n_rel[users] * n_neg[users])).sum())
        counts[j] = float(users.sum())
    return sums, counts


def test_loglik(
    rows: np.ndarray,
    cols: np.ndarray,
    y: np.ndarray,
    ew: np.ndarray,
    eh: np.ndarray,
    delta: np.ndarray,
) -> float:
    """Sum over test nonzeros of log P(y | y > 0, lambda), lambda = E[w].E[h].

    ``log P(y = v) = -lambda theta_v + log(1 - exp(-lambda Delta_v))`` minus
    ``log(1 - exp(-lambda theta_0))``. A class with Delta_v = 0 has probability 0 (-inf).
    """
    ll, _ = loglik_terms(rows, cols, y, ew, eh, delta)
    return float(ll.sum())


def loglik_terms(
    rows: np.ndarray,
    cols: np.ndarray,
    y: np.ndarray,
    ew: np.ndarray,
    eh: np.ndarray,
    delta: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per test nonzero, log P(y | y > 0, lambda) (the terms of :func:`test_loglik`) and
    P(y > 0 | lambda) = 1 - exp(-lambda theta_0), which weighs a member of an ensemble."""
    lam = sddmm(rows, cols, ew, eh)
    theta = theta_from_delta(delta)
    reach = -np.expm1(-lam * theta[0])
    with np.errstate(divide="ignore"):
        ll = -lam * theta[y] + np.log(-np.expm1(-lam * delta[y])) - np.log(reach)
    return ll, reach


def ensemble_loglik(
    rows: np.ndarray,
    cols: np.ndarray,
    y: np.ndarray,
    ew: np.ndarray,
    eh: np.ndarray,
    deltas: list[np.ndarray],
    k: int,
) -> float:
    """Sum over test nonzeros of log P(y | y > 0) under an ensemble's mixture of its members'
    ordinal laws (member m: columns m K .. (m + 1) K - 1, E[w] held divided by M):
    ``log sum_m P_m(y > 0) P_m(y | y > 0) - log sum_m P_m(y > 0)``."""
    n = len(deltas)
    logs, reach = [], []
    for m, delta in enumerate(deltas):
        part = slice(m * k, (m + 1) * k)
        ll, r = loglik_terms(rows, cols, y, ew[:, part] * n, eh[:, part], delta)
        with np.errstate(divide="ignore"):
            logs.append(ll + np.log(r))
        reach.append(r)
    with np.errstate(divide="ignore"):
        mixed = np.logaddexp.reduce(np.array(logs), axis=0) - np.log(np.sum(reach, axis=0))
    return float(mixed.sum())
