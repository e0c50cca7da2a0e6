"""Ranking metrics (docs/design.md §3) against a dense reference written here from their
definitions: NDCG@k, precision@k, recall@k, MAP@k and AUC by relevance threshold s.

The factors are small integers in most cases, so that scores tie exactly (in the top-k lists,
ties go to the lower item index; in the AUC they count 1/2) whatever the order of the sums.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import store_from_dense
from distributed import Client

from ordnmf_dask.model import metrics
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.modelstore.model import save_model, store_fingerprint
from ordnmf_dask.postfit.evaluate import evaluate, sampled_users

V = 3
NAMES = ("ndcg", "precision", "recall", "map", "auc")


def reference(
    w: np.ndarray, h: np.ndarray, train: np.ndarray, test: np.ndarray, s: int, k: int
) -> tuple[dict[str, float], int, int]:
    """Each metric's mean over the users it counts, and the two user counts, by plain loops."""
    scores = w @ h.T
    per_user: dict[str, list[float]] = {name: [] for name in NAMES}
    for u in range(train.shape[0]):
        candidates = [i for i in range(train.shape[1]) if train[u, i] == 0]
        relevant = {i for i in candidates if test[u, i] >= s}
        if not relevant:
            continue
        ranked = sorted(candidates, key=lambda i: (-scores[u, i], i))[:k]
        dcg = sum(1 / math.log2(r + 2) for r, i in enumerate(ranked) if i in relevant)
        idcg = sum(1 / math.log2(r + 2) for r in range(min(len(relevant), k)))
        per_user["ndcg"].append(dcg / idcg)
        hits = [i in relevant for i in ranked]
        per_user["precision"].append(sum(hits) / k)
        per_user["recall"].append(sum(hits) / len(relevant))
        ap, found = 0.0, 0
        for rank, hit in enumerate(hits, start=1):
            if hit:
                found += 1
                ap += found / rank
        per_user["map"].append(ap / min(len(relevant), k))
        others = [i for i in candidates if i not in relevant]
        if others:
            won = 0.0
            for p in relevant:
                for n in others:
                    won += (
                        1.0
                        if scores[u, p] > scores[u, n]
                        else (0.5 if scores[u, p] == scores[u, n] else 0.0)
                    )
            per_user["auc"].append(won / (len(relevant) * len(others)))
    means = {name: float(np.mean(v)) if v else math.nan for name, v in per_user.items()}
    return means, len(per_user["ndcg"]), len(per_user["auc"])


def tied_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(w, h, train, test) on 23 users x 17 items with integer factors (ties everywhere) and
    users of every kind: no test item, test items all of class 1, every candidate a test item
    (no non-relevant candidate at s <= 2), fewer candidates than k."""
    rng = np.random.default_rng(seed)
    n_users, n_items = 23, 17
    w = rng.integers(1, 3, (n_users, 2)).astype(float)
    h = rng.integers(0, 3, (n_items, 2)).astype(float)
    y = rng.integers(1, V + 1, (n_users, n_items))
    where = rng.random((n_users, n_items))
    train = np.where(where < 0.35, y, 0)
    test = np.where((where >= 0.35) & (where < 0.6), y, 0)
    train[:, 0] = np.where(train[:, 0] > 0, train[:, 0], 1)  # every class in train, item 0
    train[0, 1 : V + 1] = np.arange(1, V + 1)  # used by every user
    test[:, 0] = 0
    test[0, 1 : V + 1] = 0
    test[1] = 0  # no test item
    test[2] = np.where(test[2] > 0, 1, 0)  # only class 1: relevant at s = 1 only
    train[3], test[3] = 0, 2  # every item but one in test
    train[3, 0], test[3, 0] = 1, 0
    train[4, :10] = 2  # a user with 17 - 10 - (test items) candidates
    test[4, :10] = 0
    return w, h, train, test


def blocks_of(m: np.ndarray, rb: list[int], cb: list[int], r: int, c: int) -> CsrBlock:
    part = m[rb[r] : rb[r + 1], cb[c] : cb[c + 1]]
    rows, cols = np.nonzero(part)
    return CsrBlock.from_coo(rows, cols, part[rows, cols].astype(np.uint8), part.shape)


def test_topk_ties_at_the_kth_place_go_to_the_lower_items():
    """The top-k tie rule (lower item first) holds also where the tied scores straddle the k-th
    place, including the -inf of training items when a user has fewer than k candidates."""
    rng = np.random.default_rng(0)
    ew = rng.integers(1, 3, (50, 2)).astype(float)
    eh = rng.integers(0, 3, (40, 2)).astype(float)
    train = np.where(rng.random((50, 40)) < 0.3, 1, 0)
    train[0, 2:] = 1  # two candidates
    scores = np.where(train > 0, -np.inf, ew @ eh.T)
    for k in (1, 3, 7):
        got_scores, got_items = metrics.topk_block(
            ew, eh, blocks_of(train, [0, 50], [0, 40], 0, 0), 5, k
        )
        want = np.array(
            [sorted(range(40), key=lambda i: (-scores[u, i], i))[:k] for u in range(50)]
        )
        np.testing.assert_array_equal(got_items, want + 5)
        np.testing.assert_array_equal(got_scores, np.take_along_axis(scores, want, axis=1))


@pytest.mark.parametrize("budget", [1, 40, 1 << 22])
@pytest.mark.parametrize("bounds", [([0, 23], [0, 17]), ([0, 9, 23], [0, 5, 6, 17])])
def test_block_numerics_match_the_reference(monkeypatch, budget, bounds):
    """The per-block functions, merged along the item-blocks as evaluate does, for score slabs
    of one row (budget 1), a few rows, and all rows; factors with ties and without, k below,
    near and above the number of items, every threshold s."""
    monkeypatch.setattr(metrics, "_SCORE_BUDGET", budget)
    rb, cb = bounds
    rng = np.random.default_rng(5)
    for seed in range(6):
        w, h, train, test = tied_data(seed // 2)
        if seed % 2:  # the same data without ties
            w, h = rng.gamma(1, 1, w.shape), rng.gamma(1, 1, h.shape)
        for k in (1, 4, 40):
            sums = {name: np.zeros(V) for name in NAMES}
            n_users, n_users_auc = np.zeros(V), np.zeros(V)
            levels = list(range(1, V + 1))
            for r in range(len(rb) - 1):
                ew, t = w[rb[r] : rb[r + 1]], test[rb[r] : rb[r + 1]]
                rows, items = np.nonzero(t)
                x = (ew[rows] * h[items]).sum(axis=1)
                held = metrics.HeldOut.by_row(  # given in another order
                    rows[::-1], items[::-1], t[rows, items][::-1], x[::-1]
                )
                parts = [
                    metrics.candidates_block(
                        ew, h[cb[c] : cb[c + 1]], blocks_of(train, rb, cb, r, c), cb[c], k, held
                    )
                    for c in range(len(cb) - 1)
                ]
                merged = parts[0]
                for p in parts[1:]:
                    merged = metrics.merge_candidates(merged, p, k)
                top = merged.top[1]
                ndcg, counts = metrics.ndcg_sums(top, held.rows, held.items, held.y, levels, k)
                prec, rec, ap = metrics.topk_sums(top, held.rows, held.items, held.y, levels, k)
                auc, auc_counts = metrics.auc_sums(
                    held, merged.below, merged.equal, merged.free, levels
                )
                for name, v in zip(NAMES, (ndcg, prec, rec, ap, auc), strict=True):
                    sums[name] += v
                n_users += counts
                n_users_auc += auc_counts
            for j, s in enumerate(levels):
                want, n, n_auc = reference(w, h, train, test, s, k)
                assert (n_users[j], n_users_auc[j]) == (n, n_auc)
                for name in NAMES:
                    denominator = n_users_auc[j] if name == "auc" else n_users[j]
                    assert sums[name][j] / denominator == pytest.approx(
                        want[name], rel=1e-12, abs=1e-12
                    ), (name, s, k)


def test_reference_counts_the_users_it_should():
    """The reference data has users each metric must leave out: no relevant item (all), and
    relevant items but no non-relevant candidate (AUC only)."""
    w, h, train, test = tied_data(0)
    _, n, n_auc = reference(w, h, train, test, 1, 5)
    assert n_auc < n < train.shape[0]
    _, n3, _ = reference(w, h, train, test, 3, 5)
    assert n3 < n


def write_model(client: Client, path, store, w: np.ndarray, h: np.ndarray) -> str:
    """A model directory holding exactly these factors (E[W] = w, E[H] = h) for ``store``."""
    rb, cb = store.row_bounds.tolist(), store.col_bounds.tolist()

    def chunks(m: np.ndarray, b: list[int]) -> list:
        return client.scatter(
            [FactorChunk.initial(m[b[j] : b[j + 1]].copy()) for j in range(len(b) - 1)]
        )

    attrs = {
        "params": {"n_components": w.shape[1]},
        "elbo": [0.0],
        "family": "ordinal",
        "delta": [0.0] + [0.5] * store.n_classes,
        "row_bounds": rb,
        "col_bounds": cb,
        "store": {
            "path": store.path,
            "n_users": store.n_users,
            "n_items": store.n_items,
            "n_classes": store.n_classes,
            "fingerprint": store_fingerprint(store.path),
        },
    }
    return save_model(client, chunks(w, rb), chunks(h, cb), str(path), attrs)


@pytest.mark.parametrize("grid", [(1, 1), (2, 3), (3, 2)])
def test_evaluate_matches_the_reference(tmp_path, mclient, grid):
    """Every metric from evaluate on the workers, with ties (integer factors) and without
    (continuous factors), all users and a sample of them, over several block grids."""
    w, h, train, test = tied_data(7)
    store = store_from_dense(tmp_path / "s.zarr", train, test, V, grid)
    rng = np.random.default_rng(1)
    for name, (ww, hh) in {
        "tied": (w, h),
        "gamma": (rng.gamma(1, 1, w.shape), rng.gamma(1, 1, h.shape)),
    }.items():
        model = write_model(mclient, tmp_path / f"{name}.zarr", store, ww, hh)
        full = evaluate(store, model, mclient, k=4)
        part = evaluate(store, model, mclient, k=4, user_fraction=0.5, seed=3)
        rb = store.row_bounds
        kept = np.concatenate(
            [rb[r] + sampled_users(r, int(rb[r + 1] - rb[r]), 0.5, 3) for r in range(grid[0])]
        )
        assert 0 < len(kept) < train.shape[0]
        for res, users in ((full, slice(None)), (part, kept)):
            assert set(res) >= {*NAMES, "n_users", "n_users_auc", "test_loglik"}
            for s in range(1, V + 1):
                want, n, n_auc = reference(ww[users], hh, train[users], test[users], s, 4)
                assert (res["n_users"][s], res["n_users_auc"][s]) == (n, n_auc)
                for metric in NAMES:
                    assert res[metric][s] == pytest.approx(
                        want[metric], rel=1e-12, abs=1e-12, nan_ok=True
                    ), (name, metric, s)


@pytest.mark.parametrize(("k", "levels"), [(1, [1, 3]), (40, None)])
def test_evaluate_matches_the_reference_at_other_k(tmp_path, mclient, k, levels):
    """evaluate at k = 1 (chosen thresholds) and k above the number of items (every threshold),
    continuous factors, on a (2, 3) grid."""
    w, h, train, test = tied_data(3)
    store = store_from_dense(tmp_path / "s.zarr", train, test, V, (2, 3))
    rng = np.random.default_rng(2)
    ww, hh = rng.gamma(1, 1, w.shape), rng.gamma(1, 1, h.shape)
    res = evaluate(
        store, write_model(mclient, tmp_path / "m.zarr", store, ww, hh), mclient, k=k, levels=levels
    )
    assert sorted(res["ndcg"]) == (levels or list(range(1, V + 1)))
    for s in res["ndcg"]:
        want, n, n_auc = reference(ww, hh, train, test, s, k)
        assert (res["n_users"][s], res["n_users_auc"][s]) == (n, n_auc)
        for metric in NAMES:
            assert res[metric][s] == pytest.approx(
                want[metric], rel=1e-12, abs=1e-12, nan_ok=True
            ), (metric, s, k)
