"""The top-N items of users, per user-block on the workers: what recommendations, exports, fold-in
and serving share.

Score ``s_ui = (E[W] E[H]^T)_ui`` (docs/design.md §2), every training nonzero of the user
excluded (all of them, whatever the model: also the classes a BePoF model binarized away), ties
broken by the lower item index. For each user-block r, every item-block c gives its candidate
top-n (:func:`ordnmf_dask.model.metrics.topk_block`); the candidates are merged along a fixed
binary tree on the workers, as in :mod:`.evaluate`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.errors import InputError, shown
from ordnmf_dask.model import metrics
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.modelstore import chunkstore, seen
from ordnmf_dask.modelstore.model import ModelInfo, open_model
from ordnmf_dask.postfit.evaluate import check_compatible
from ordnmf_dask.runtime.reduce import tree_reduce
from ordnmf_dask.store import idmap
from ordnmf_dask.store.blocks import StoreInfo, open_store
from ordnmf_dask.store.csr import load_block

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Client, Future


def factor_mean(model: str, name: str, index: int) -> np.ndarray:
    """E[.] of chunk ``index`` of factor ``name`` ("W" or "H"), shape (n_rows, K); on a worker."""
    return chunkstore.read_field(model, name, index, "mean")


def open_pair(
    store: str | os.PathLike | StoreInfo, model: Any, allow_other_store: bool = False
) -> tuple[StoreInfo, ModelInfo]:
    """The store and the model (a path or a fitted estimator), checked to match
    (:func:`~ordnmf_dask.postfit.evaluate.check_compatible`)."""
    info = store if isinstance(store, StoreInfo) else open_store(os.fspath(store))
    m = open_model(os.fspath(getattr(model, "model_path_", model)))
    check_compatible(info, m, allow_other_store)
    return info, m


def _candidates(
    model: str,
    store: str | None,
    r: int,
    c: int,
    col_offset: int,
    n: int,
    rows: np.ndarray | None = None,
    seen_rows: CsrBlock | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-n of item-block c for the users of user-block r (or its local ``rows``), their
    training items read from ``store``, or taken from ``seen_rows`` (the model's index of the
    same users' training items, :mod:`ordnmf_dask.modelstore.seen`)."""
    ew = factor_mean(model, "W", r)
    eh = factor_mean(model, "H", c)
    if seen_rows is not None:
        train = seen.columns(seen_rows, col_offset, col_offset + len(eh))
    else:
        assert store is not None, "the training items come from the store or the model"
        train = load_block(store, "train", r, c)
        if rows is not None:
            train = train.take_rows(rows)
    if rows is not None:
        ew = ew[rows]
    return metrics.topk_block(ew, eh, train, col_offset, n)


def ranked_pairs(scores: np.ndarray, names: Sequence[Any]) -> list[list[tuple[Any, float]]]:
    """Per row of ``scores`` (best first, excluded slots -inf at the end): [(name, score), ...],
    where ``names`` are the names of the finite slots in row-major order."""
    keep = np.isfinite(scores)
    out, j = [], 0
    for row in range(scores.shape[0]):
        m = int(keep[row].sum())
        out.append(list(zip(names[j : j + m], scores[row, :m].tolist(), strict=True)))
        j += m
    return out


def named_top(top: tuple[np.ndarray, np.ndarray], store: str) -> list[list[tuple[Any, float]]]:
    """Per user: [(raw item id, score), ...] best first; excluded (-inf) slots dropped."""
    scores, items = top
    return ranked_pairs(scores, idmap.ids_at(store, "items", items[np.isfinite(scores)]))


def block_top(
    cl: Client,
    m: ModelInfo,
    info: StoreInfo | None,
    r: int,
    n: int,
    rows: np.ndarray | None = None,
) -> Future:
    """Future of the top-n (scores, item indices) of the users of user-block r (or its local
    ``rows``), merged over the item-blocks on the workers; training items from the store
    ``info``, or without one from the model's own index of them (read once per user-block)."""
    cb = list(m.header.col_bounds)
    store = None if info is None else info.path
    seen_rows = None
    if info is None:
        seen_rows = cl.submit(seen.load, m.path, r, cb[-1], rows, pure=False)
    cands = [
        cl.submit(_candidates, m.path, store, r, c, cb[c], n, rows, seen_rows, pure=False)
        for c in range(len(cb) - 1)
    ]
    return tree_reduce(cl, cands, metrics.merge_topk, n)


def check_n(n: int) -> int:
    """``n`` (a list length) as an int; InputError unless it is an integer >= 1."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise InputError(f"n must be an integer >= 1, got {shown(n)}")
    return int(n)
