"""Evaluation on the held-out nonzeros, per user-block on the workers (docs/design.md §3).

NDCG@k, precision@k, recall@k, MAP@k and AUC for each relevance threshold s (relevance
``y_test >= s``, training items excluded) and the test log-likelihood of the nonzeros. Each task
scores one user-block against one item-block, a slab of rows at a time; only per-block sums
travel to the client.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from distributed import Client

from ordnmf_dask.dist.cluster import choose_client
from ordnmf_dask.dist.progress import track
from ordnmf_dask.dist.reduce import tree_reduce, tree_sum
from ordnmf_dask.errors import InputError
from ordnmf_dask.model import dcpf, metrics
from ordnmf_dask.model.kernels import sddmm
from ordnmf_dask.modelstore import chunks as chunkstore
from ordnmf_dask.modelstore.model import ModelInfo, open_model
from ordnmf_dask.store.blocks import StoreInfo, open_store, read_block
from ordnmf_dask.store.csr import load_block


def sampled_users(r: int, n_rows: int, fraction: float, seed: int) -> np.ndarray:
    """Local rows of user-block r whose ranking is evaluated: all of them, or each independently
    with probability ``fraction`` from the stream ``SeedSequence([seed, r])`` (the same sample
    whatever the cluster)."""
    if fraction >= 1.0:
        return np.arange(n_rows)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, r])))
    return np.flatnonzero(rng.random(n_rows) < fraction)


def _held_out_task(
    model: str, store: str, r: int, col_bounds: list[int], keep: np.ndarray
) -> metrics.HeldOut:
    ew = chunkstore.read_field(model, "W", r, "mean")[keep]
    rows, items, ys, xs = [], [], [], []
    for c in range(len(col_bounds) - 1):
        b = load_block(store, "test", r, c).take_rows(keep)
        local = b.rows
        rows.append(local)
        items.append(b.cols.astype(np.int64) + col_bounds[c])
        ys.append(b.y)
        xs.append(sddmm(local, b.cols, ew, chunkstore.read_field(model, "H", c, "mean")))
    return metrics.HeldOut.by_row(*(np.concatenate(a) for a in (rows, items, ys, xs)))


def _candidates_task(
    model: str, store: str, r: int, c: int, col_offset: int, k: int, keep: np.ndarray,
    held: metrics.HeldOut,
) -> metrics.Candidates:
    ew = chunkstore.read_field(model, "W", r, "mean")[keep]
    eh = chunkstore.read_field(model, "H", c, "mean")
    train = load_block(store, "train", r, c).take_rows(keep)
    return metrics.candidates_block(ew, eh, train, col_offset, k, held)


_RANKING = ("ndcg", "n_users", "precision", "recall", "map", "auc", "n_users_auc")  # sums' rows


def _ranking_task(
    cands: metrics.Candidates, held: metrics.HeldOut, levels: list[int], k: int
) -> np.ndarray:
    """One user-block's sums, a row per entry of :data:`_RANKING`, flattened."""
    top = cands.top[1]
    ndcg, counts = metrics.ndcg_sums(top, held.rows, held.items, held.y, levels, k)
    topk = metrics.topk_sums(top, held.rows, held.items, held.y, levels, k)
    auc, auc_counts = metrics.auc_sums(held, cands.below, cands.equal, cands.free, levels)
    return np.concatenate([ndcg, counts, topk.ravel(), auc, auc_counts])


def _loglik_task(model: str, store: str, r: int, c: int, spec: tuple) -> np.ndarray:
    b = read_block(store, "test", r, c)
    rows = b.rows
    ew = chunkstore.load_chunk(model, "W", r).mean
    eh = chunkstore.load_chunk(model, "H", c).mean
    if spec[0] == "ordinal":
        value = metrics.test_loglik(rows, b.cols, b.y, ew, eh, spec[1])
    else:
        _, p, t, edges = spec
        lam = sddmm(rows, b.cols, ew, eh)
        value = float(dcpf.count_loglik(b.y, lam, p, t, edges).sum())
    return np.array([value, len(b.y)])


def _by_level(levels: list[int], values: np.ndarray, kind: type) -> dict[int, Any]:
    return {int(s): kind(v) for s, v in zip(levels, values, strict=True)}


def loglik_spec(store: StoreInfo, model: ModelInfo) -> tuple | None:
    """How to score the test classes under ``model``, or None when it does not model them.

    OrdNMF: the ordinal likelihood with its thresholds. dcPF: the probability of the test class
    (the count range of the class, exactly) on count stores, of the count itself otherwise.
    Binarized models (BePoF, PF, dcPF at p = 1) model {0, 1}, not the classes: None.
    """
    a = model.attrs
    if a.get("family") == "dcpf":
        if float(a["p"]) == 1.0:  # PF on binary data: it does not model the classes
            return None
        counts = store.attrs.get("value_kind") == "counts"
        edges = np.asarray(store.attrs["thresholds"]) if counts else None
        return ("dcpf", float(a["p"]), float(a["t"]), edges)
    if a.get("family") == "ordinal" and len(a["delta"]) == store.n_classes + 1:
        return ("ordinal", model.delta)
    return None


def check_compatible(store: StoreInfo, model: ModelInfo) -> None:
    """InputError unless ``model`` was fitted on a store with the same shape and block grid."""
    s = model.attrs["store"]
    same = (
        s["n_users"] == store.n_users
        and s["n_items"] == store.n_items
        and s["n_classes"] == store.n_classes
        and list(model.attrs["row_bounds"]) == store.row_bounds.tolist()
        and list(model.attrs["col_bounds"]) == store.col_bounds.tolist()
    )
    if not same:
        raise InputError(
            f"model {model.path} was fitted on {s['path']} "
            f"({s['n_users']} users x {s['n_items']} items, V={s['n_classes']}), "
            f"which does not match store {store.path}"
        )


def evaluate(
    store: str | os.PathLike | StoreInfo,
    model: Any,
    client: Client | None = None,
    *,
    k: int = 100,
    levels: list[int] | None = None,
    n_workers: int = 2,
    user_fraction: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """NDCG@k, precision@k, recall@k, MAP@k and AUC per threshold, and the test
    log-likelihood of a fitted model (definitions: docs/design.md §3).

    Parameters
    ----------
    store : the store the model was fitted on (its ``test`` split is evaluated).
    model : a model directory path or a fitted estimator (uses its ``model_path_``).
    levels : relevance thresholds s (default 1..V).
    user_fraction, seed : the ranking metrics over a random sample of the users (each kept with
        probability ``user_fraction``, see :func:`sampled_users`): ranking all items costs
        U x I x K, about an hour for 1M users x 200k items on two cores, where a 2% sample
        takes a minute. The test log-likelihood always covers every test nonzero.

    Returns
    -------
    dict with ``ndcg``, ``precision``, ``recall``, ``map`` ({s: mean over the (sampled) users
    with a relevant item}), ``n_users`` ({s: their number}), ``auc`` ({s: mean over the (sampled)
    users with a relevant item and a non-relevant candidate}), ``n_users_auc`` ({s: their
    number}), ``test_loglik`` (sum over test nonzeros), ``test_loglik_mean`` (per
    nonzero), ``k``, ``nnz_test`` and ``user_fraction``.
    """
    info = store if isinstance(store, StoreInfo) else open_store(os.fspath(store))
    m = open_model(os.fspath(getattr(model, "model_path_", model)))
    check_compatible(info, m)
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}")
    if not 0.0 < user_fraction <= 1.0:
        raise InputError(f"user_fraction must be in (0, 1], got {user_fraction}")
    levels = list(range(1, info.n_classes + 1)) if levels is None else [int(s) for s in levels]
    outside = [s for s in levels if not 1 <= s <= info.n_classes]
    if outside or not levels:
        raise InputError(f"levels must be thresholds in 1..{info.n_classes} (the classes of "
                         f"{info.path}), got {outside or 'none'}")
    n_r, n_c = info.grid
    cb, rb = [int(x) for x in info.col_bounds], [int(x) for x in info.row_bounds]
    k_model = int(m.attrs["params"]["n_components"])
    with choose_client(client, info, k_model, n_workers=n_workers) as cl:
        per_row = []
        for r in range(n_r):
            keep = sampled_users(r, rb[r + 1] - rb[r], user_fraction, seed)
            held = cl.submit(_held_out_task, m.path, info.path, r, cb, keep)
            cands = [
                cl.submit(_candidates_task, m.path, info.path, r, c, cb[c], k, keep, held)
                for c in range(n_c)
            ]
            merged = tree_reduce(cl, cands, metrics.merge_candidates, k)
            per_row.append(cl.submit(_ranking_task, merged, held, levels, k))
        spec = loglik_spec(info, m)
        ll = [
            cl.submit(_loglik_task, m.path, info.path, r, c, spec)
            for r in range(n_r)
            for c in range(n_c)
        ] if spec is not None else []
        track(per_row + ll, "evaluate: user-blocks and blocks")
        ranking = cl.gather(tree_sum(cl, per_row)).reshape(len(_RANKING), len(levels))
        ll_v = cl.gather(tree_sum(cl, ll)) if ll else np.array([np.nan, info.nnz_test])
    sums = dict(zip(_RANKING, ranking, strict=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = {
            name: sums[name] / sums["n_users_auc" if name == "auc" else "n_users"]
            for name in ("ndcg", "precision", "recall", "map", "auc")
        }
    return {
        "k": k,
        "ndcg": _by_level(levels, means["ndcg"], float),
        "n_users": _by_level(levels, sums["n_users"], int),
        "test_loglik": None if spec is None else float(ll_v[0]),
        "test_loglik_mean": None if spec is None or not ll_v[1] else float(ll_v[0] / ll_v[1]),
        "nnz_test": int(ll_v[1]),
        "user_fraction": float(user_fraction),
        **{name: _by_level(levels, means[name], float) for name in ("precision", "recall", "map")},
        "auc": _by_level(levels, means["auc"], float),
        "n_users_auc": _by_level(levels, sums["n_users_auc"], int),
    }
