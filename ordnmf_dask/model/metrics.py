"""Evaluation numerics (docs/design.md §3): top-k candidates, NDCG@k, test log-likelihood.

Pure numpy functions over one block or one user-block; the orchestration is in
:mod:`ordnmf_dask.postfit.evaluate`. Ties in scores are broken by the lower item index.
"""

from __future__ import annotations

import numpy as np

from ordnmf_dask.model.kernels import CsrBlock, sddmm
from ordnmf_dask.model.thresholds import theta_from_delta

_SCORE_BUDGET = 1 << 22  # floats in one dense (users x items) score slab


def topk_block(
    ew: np.ndarray, eh: np.ndarray, train: CsrBlock, col_offset: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
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
    n_rows, n_cols = ew.shape[0], eh.shape[0]
    kk = min(k, n_cols)
    scores = np.empty((n_rows, kk))
    items = np.empty((n_rows, kk), dtype=np.int64)
    step = max(1, _SCORE_BUDGET // max(n_cols, 1))
    train_rows = train.rows
    for start in range(0, n_rows, step):
        stop = min(n_rows, start + step)
        s = ew[start:stop] @ eh.T
        lo, hi = train.indptr[start], train.indptr[stop]
        s[train_rows[lo:hi] - start, train.cols[lo:hi]] = -np.inf
        if kk < n_cols:
            part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        else:
            part = np.broadcast_to(np.arange(n_cols), s.shape)
        top = np.take_along_axis(s, part, axis=1)
        order = np.lexsort((part, -top), axis=1)
        scores[start:stop] = np.take_along_axis(top, order, axis=1)
        items[start:stop] = np.take_along_axis(part, order, axis=1) + col_offset
    return scores, items


def merge_topk(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merge two per-user candidate lists (scores, items) into the best ``k``."""
    scores = np.concatenate([a[0], b[0]], axis=1)
    items = np.concatenate([a[1], b[1]], axis=1)
    order = np.lexsort((items, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(items, order, axis=1)


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
    n_rows, depth = top_items.shape
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    width = np.int64(max(int(top_items.max(initial=0)), int(test_items.max(initial=0))) + 1)
    top_keys = np.arange(n_rows, dtype=np.int64)[:, None] * width + top_items
    sums = np.zeros(len(levels))
    counts = np.zeros(len(levels))
    for j, s in enumerate(levels):
        rel = test_y >= s
        keys = np.sort(test_rows[rel].astype(np.int64) * width + test_items[rel])
        n_rel = np.bincount(test_rows[rel], minlength=n_rows)
        hit = np.isin(top_keys, keys, assume_unique=False)
        dcg = (hit * discount[:depth]).sum(axis=1)
        ideal = np.concatenate([[0.0], np.cumsum(discount)])[np.minimum(n_rel, k)]
        users = n_rel > 0
        sums[j] = float((dcg[users] / ideal[users]).sum())
        counts[j] = float(users.sum())
    return sums, counts


def test_loglik(
    rows: np.ndarray, cols: np.ndarray, y: np.ndarray, ew: np.ndarray, eh: np.ndarray,
    delta: np.ndarray,
) -> float:
    """Sum over test nonzeros of log P(y | y > 0, lambda), lambda = E[w].E[h].

    ``log P(y = v) = -lambda theta_v + log(1 - exp(-lambda Delta_v))`` minus
    ``log(1 - exp(-lambda theta_0))``. A class with Delta_v = 0 has probability 0 (-inf).
    """
    lam = sddmm(rows, cols, ew, eh)
    theta = theta_from_delta(delta)
    with np.errstate(divide="ignore"):
        ll = (
            -lam * theta[y]
            + np.log(-np.expm1(-lam * delta[y]))
            - np.log(-np.expm1(-lam * theta[0]))
        )
    return float(ll.sum())
