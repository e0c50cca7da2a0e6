"""The validation subset of a store and validation during a fit: scores on the workers from the
running factors (each held-out ranking excluding the user's other pairs), the early-stopping
rule and the state it keeps, restarts chosen by validation."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import zarr

from ordnmf_dask import BePoF, OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.engine.control import early_stopping
from ordnmf_dask.engine.stops import stop_words
from ordnmf_dask.errors import InputError
from ordnmf_dask.modelstore.model import open_model
from ordnmf_dask.postfit.evaluate import SavedChunk, evaluate, score_split
from ordnmf_dask.runtime.inprocess import InProcessClient
from ordnmf_dask.sources.ingest import ingest, ingest_arrays, ingest_distributed
from ordnmf_dask.sources.split import id_hashes, pair_hash, split_rule
from ordnmf_dask.store.blocks import open_store, read_block, read_ids

K = 3


def triples(seed: int = 0, n: int = 6000, n_users: int = 150, n_items: int = 90):
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, n_users, n) * 1000 + rng.integers(0, n_items, n))
    u, i = np.divmod(keys, 1000)
    lam = rng.gamma(1.0, 1.0, (n_users, K)) @ rng.gamma(1.0, 1.0, (K, n_items))
    v = 1 + np.minimum(4, (lam[u, i] * rng.gamma(2.0, 0.5, len(u))).astype(int))
    return u, i, v


def pairs(store, split: str) -> set[tuple[int, int]]:
    """(global user, global item) of every nonzero of ``split``."""
    rb, cb = store.row_bounds, store.col_bounds
    out = set()
    for r in range(store.grid[0]):
        for c in range(store.grid[1]):
            b = read_block(store.path, split, r, c)
            out |= set(zip((b.rows + rb[r]).tolist(), (b.cols + cb[c]).tolist(), strict=True))
    return out


@pytest.fixture
def vstore(tmp_path):
    u, i, v = triples()
    return ingest_arrays(
        u,
        i,
        v,
        tmp_path / "v.zarr",
        ratings="integer",
        scale_max=5,
        validation_fraction=0.15,
        seed=3,
        grid=(2, 2),
    )


def test_validation_is_carved_from_train_by_the_same_hash(tmp_path, vstore):
    u, i, v = triples()
    plain = ingest_arrays(
        u, i, v, tmp_path / "p.zarr", ratings="integer", scale_max=5, seed=3, grid=(2, 2)
    )
    assert plain.splits == ("train", "test") and plain.nnz_validation == 0
    with pytest.raises(ValueError, match="split must be one of"):
        read_block(plain.path, "validation", 0, 0)
    assert vstore.splits == ("train", "test", "validation")
    train, val, test = (pairs(vstore, s) for s in ("train", "validation", "test"))
    # the same test set; train of the plain store = train + validation
    assert test == pairs(plain, "test") and not (train & val) and not (val & test)
    assert train | val == pairs(plain, "train")
    n = plain.nnz_train
    assert len(val) == vstore.nnz_validation
    assert abs(len(val) - 0.15 * n) < 4 * np.sqrt(0.15 * 0.85 * n)  # binomial: 4 sd
    assert vstore.attrs["validation_fraction"] == 0.15
    assert sum(vstore.attrs["hist_validation"]) == len(val)
    # the validation pairs are the training pairs whose raw-id hash (the split's seed) falls in
    # the range just above the test pairs'
    users, items = read_ids(vstore.path, "users"), read_ids(vstore.path, "items")

    def h(s: set) -> np.ndarray:
        u, i = np.array(sorted(s)).T
        return pair_hash(id_hashes(users[u]), id_hashes(items[i]), 3)

    rule = split_rule(0.2, 0.15)
    assert h(test).max() < rule.test_below <= h(val).min()
    assert h(val).max() < rule.validation_below <= h(train).min()


def test_distributed_ingest_writes_the_same_validation_subset(tmp_path):
    u, i, v = triples(1)
    path = tmp_path / "in.csv"
    path.write_text("".join(f"{a},{b},{c}\n" for a, b, c in zip(u, i, v, strict=True)))
    kw = dict(ratings="integer", validation_fraction=0.2, seed=5, nnz_per_block=900)
    mem = ingest(path, tmp_path / "mem.zarr", **kw)
    ooc = ingest_distributed(
        path, tmp_path / "ooc.zarr", chunk_bytes=5000, rows_per_partition=700, **kw
    )
    ga, gb = zarr.open_group(mem.path, mode="r"), zarr.open_group(ooc.path, mode="r")
    attrs = [dict(g.attrs) for g in (ga, gb)]
    for a in attrs:
        a.pop("created")
    assert attrs[0] == attrs[1] and attrs[0]["nnz_validation"] > 0
    for split in ("train", "test", "validation"):
        for field in ("indptr", "cols", "y", "raw", "offsets"):
            np.testing.assert_array_equal(ga[f"{split}/{field}"][:], gb[f"{split}/{field}"][:])


def test_the_command_line_makes_and_shows_the_validation_subset(tmp_path, capsys):
    u, i, v = triples(2)
    path = tmp_path / "in.csv"
    path.write_text("".join(f"{a},{b},{c}\n" for a, b, c in zip(u, i, v, strict=True)))
    out = tmp_path / "s.zarr"
    assert (
        main(
            [
                "ingest",
                str(path),
                "--out",
                str(out),
                "--ratings",
                "integer",
                "--validation-fraction",
                "0.25",
            ]
        )
        == 0
    )
    store = open_store(out)
    n = store.nnz_train + store.nnz_validation
    assert abs(store.nnz_validation - 0.25 * n) < 4 * np.sqrt(0.25 * 0.75 * n)  # binomial: 4 sd
    assert f"validation {store.nnz_validation}" in capsys.readouterr().out
    assert (
        main(
            ["ingest", str(path), "--out", str(tmp_path / "x.zarr"), "--validation-fraction", "1.5"]
        )
        == 2
    )
    said = "ingest: --validation-fraction must be a number in [0, 1), got 1.5"
    assert said in capsys.readouterr().err


def test_bad_validation_fraction_is_refused(tmp_path):
    u, i, v = triples()
    for bad in (-0.1, 1.0, True):
        with pytest.raises(
            InputError, match=r"ingest: validation_fraction must be a number in \[0, 1\), got "
        ):
            ingest_arrays(u, i, v, tmp_path / "x.zarr", validation_fraction=bad)
    assert not list(tmp_path.iterdir())


def test_validation_range_that_selects_no_pair_is_refused(tmp_path):
    """A store's training pairs ingested again with its test pairs as a --test file and the
    same seed: that split sent every pair of the validation range to the test set, so the
    validation subset would be empty; refused naming the seed, and no store is left; another
    seed carves one."""
    u, i, v = triples()
    first = ingest_arrays(u, i, v, tmp_path / "first.zarr", ratings="integer", seed=3)
    users, items = read_ids(first.path, "users"), read_ids(first.path, "items")
    for split in ("train", "test"):
        rows = sorted(pairs(first, split))
        lines = [f"{users[a]},{items[b]},1\n" for a, b in rows]
        (tmp_path / f"{split}.csv").write_text("".join(lines))
    kw = dict(ratings="integer", validation_fraction=0.1, test=tmp_path / "test.csv")
    with pytest.raises(
        InputError,
        match=r"train\.csv: validation_fraction=0\.1 put none of its \d+ training pairs in the "
        r"validation subset \(seed 3\); .* give another seed",
    ):
        ingest(tmp_path / "train.csv", tmp_path / "again.zarr", seed=3, **kw)
    assert not (tmp_path / "again.zarr").exists()
    assert ingest(tmp_path / "train.csv", tmp_path / "again.zarr", seed=4, **kw).nnz_validation


def test_early_stopping_keeps_the_best_state(vstore, caplog):
    """In-process (bitwise the cluster's fit, tests/test_inprocess.py; the cluster's scoring of
    held-out subsets is the last test of this file); the fit's last line says why it stopped."""
    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        est = OrdNMF(
            K,
            tol=1e-12,
            max_iter=60,
            validation_every=2,
            validation_patience=2,
            validation_s=3,
            checkpoint_every=3,
            executor="inprocess",
            n_members=1,
        ).fit(vstore)
    attrs = open_model(est.model_path_).attrs
    [end] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fit: ")][-1:]
    assert end.startswith(f"fit: {stop_words(attrs['stop_reason'], est.converged_)} after")
    assert ("stopped early on validation" in end) == (attrs["stop_reason"] == "patience")
    history = attrs["validation"]["history"]
    assert [v["iteration"] for v in history] == list(range(2, est.n_iter_ + 1, 2))
    metric = [v["metric"] for v in history]
    best = attrs["best_iteration"]
    assert metric[best // 2 - 1] == max(metric)
    if attrs["stop_reason"] == "patience":
        assert est.n_iter_ == best + 4 and max(metric[-2:]) <= metric[best // 2 - 1]
    assert best < est.n_iter_  # the data overfit within 60 iterations at K = 3
    assert est.runs_[0]["best_iteration"] == best
    # the saved state is iteration ``best`` of the same trajectory
    plain = OrdNMF(
        K, tol=1e-12, max_iter=best, validation_every=0, executor="inprocess", n_members=1
    )
    plain.fit(vstore)
    assert plain.n_iter_ == best and open_model(plain.model_path_).attrs["validation"] is None
    np.testing.assert_array_equal(est.W_.compute(), plain.W_.compute())
    np.testing.assert_array_equal(est.H_.compute(), plain.H_.compute())
    np.testing.assert_array_equal(est.theta_, plain.theta_)
    assert est.elbo_[best - 1] == plain.elbo_[-1]
    # the scores of the running fit's futures are those of the saved model
    model = open_model(est.model_path_)
    w = [SavedChunk(model.path, "W", r) for r in range(vstore.grid[0])]
    h = [SavedChunk(model.path, "H", c) for c in range(vstore.grid[1])]
    with InProcessClient() as threads:
        again = score_split(threads, vstore, "validation", w, h, [1, 3], 100, None)
        assert {str(s): x for s, x in again["ndcg"].items()} == history[best // 2 - 1]["ndcg"]
        # validation is scored as test is: the same function on the other held-out subset
        test = score_split(threads, vstore, "test", w, h, [1], 100, None)
        assert evaluate(vstore, est, threads, levels=[1])["ndcg"] == test["ndcg"]


def test_restarts_are_chosen_by_validation(vstore):
    est = OrdNMF(
        K,
        tol=1e-4,
        max_iter=15,
        n_init=3,
        validation_every=5,
        validation_patience=0,
        executor="inprocess",
        n_members=1,
    ).fit(vstore)
    runs = est.runs_
    assert all(r["validation"] is not None for r in runs)
    kept = [r for r in runs if r["kept"]]
    assert len(kept) == 1 and kept[0]["validation"] == max(r["validation"] for r in runs)
    history = open_model(est.model_path_).attrs["validation"]["history"]
    assert max(v["metric"] for v in history) == kept[0]["validation"]


def test_validation_settings_are_checked_before_a_cluster_starts(vstore):
    with pytest.raises(InputError, match="validation_s = 9"):
        OrdNMF(K, validation_s=9, max_iter=2, n_members=1).fit(vstore)
    with pytest.raises(InputError, match="validation_metric must be"):
        OrdNMF(K, validation_metric="auc", max_iter=2, n_members=1).fit(vstore)
    with pytest.raises(InputError, match="validation_metric = 'loglik'"):
        BePoF(K, validation_metric="loglik", max_iter=2, n_members=1).fit(vstore)


def test_early_stopping_alone_is_patience_after_the_first_best_score():
    scores = [0.1, 0.3, 0.3, 0.2, 0.25]
    assert early_stopping(scores[:1], 2) == (0, False)
    assert early_stopping(scores[:3], 2) == (1, False)  # a tie is not an improvement
    assert early_stopping(scores[:4], 2) == (1, True)  # two scores after the kept one
    assert early_stopping(scores, 0) == (1, False)  # patience 0: never early
    assert early_stopping([0.2, 0.1], 1, window=3) == (0, True)


def test_a_window_follows_the_trend_and_keeps_the_end_of_the_best_stretch():
    # a noisy rise: one high score (index 2) then higher ones on average
    scores = [0.10, 0.20, 0.35, 0.25, 0.30, 0.32, 0.34]
    assert early_stopping(scores[:6], 3) == (2, True)  # each score alone: the spike stops it
    # means over 3: 0.1, 0.15, 0.2167, 0.2667, 0.30, 0.29, 0.32
    assert early_stopping(scores[:6], 3, window=3) == (4, False)
    assert early_stopping(scores, 3, window=3) == (6, False)
    assert early_stopping([*scores, 0.2, 0.2], 2, window=3) == (6, True)


@pytest.mark.parametrize("window", [1, 2, 5])
def test_early_stopping_agrees_with_a_moving_average_reference(window):
    rng = np.random.default_rng(window)
    scores = list(np.cumsum(rng.normal(0.0, 1.0, 40)))
    for n in range(1, len(scores) + 1):
        x = np.asarray(scores[:n])
        csum = np.concatenate([[0.0], np.cumsum(x)])
        lo = np.maximum(0, np.arange(n) - window + 1)
        means = (csum[1:] - csum[lo]) / (np.arange(n) + 1 - lo)
        kept = int(np.argmax(means))
        assert early_stopping(scores[:n], 4, window) == (kept, n - 1 - kept >= 4)


def test_the_fit_keeps_the_state_the_windowed_rule_keeps(vstore):
    est = OrdNMF(
        K,
        tol=1e-12,
        max_iter=60,
        validation_every=2,
        validation_patience=2,
        validation_window=3,
        validation_s=3,
        executor="inprocess",
        n_members=1,
    ).fit(vstore)
    attrs = open_model(est.model_path_).attrs
    assert attrs["validation"]["window"] == 3
    metric = [v["metric"] for v in attrs["validation"]["history"]]
    kept, stop = early_stopping(metric, 2, 3)
    assert attrs["best_iteration"] == attrs["validation"]["history"][kept]["iteration"]
    assert stop == (attrs["stop_reason"] == "patience")
    assert not any(early_stopping(metric[:j], 2, 3)[1] for j in range(1, len(metric)))


def _reference_ndcg(store, est, split: str, s: int, k: int = 100) -> float:
    """Mean NDCG@k (relevance class >= s) of ``split`` with dense numpy: each user's candidates
    are the items with no pair of that user in any other subset."""
    w, h = est.W_.compute(), est.H_.compute()
    scores = w @ h.T
    held = np.zeros(scores.shape, dtype=bool)
    for other in store.splits:
        for u, i in pairs(store, other):
            if other == split:
                continue
            scores[u, i] = -np.inf
    rb, cb = store.row_bounds, store.col_bounds
    for r in range(store.grid[0]):
        for c in range(store.grid[1]):
            b = read_block(store.path, split, r, c)
            keep = b.y >= s
            held[b.rows[keep] + rb[r], b.cols[keep] + cb[c]] = True
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = (np.take_along_axis(held, top, axis=1) * discount[: top.shape[1]]).sum(axis=1)
    n_rel = held.sum(axis=1)
    ideal = np.concatenate([[0.0], np.cumsum(discount)])[np.minimum(n_rel, k)]
    users = n_rel > 0
    return float(np.mean(dcg[users] / ideal[users]))


def test_held_out_rankings_exclude_the_users_pairs_in_the_other_subsets(vstore, client):
    est = OrdNMF(K, tol=1e-12, max_iter=5, validation_every=0, n_members=1).fit(vstore, client)
    model = open_model(est.model_path_)
    w = [SavedChunk(model.path, "W", r) for r in range(vstore.grid[0])]
    h = [SavedChunk(model.path, "H", c) for c in range(vstore.grid[1])]
    for split in ("test", "validation"):
        got = score_split(client, vstore, split, w, h, [1, 4], 100, None)["ndcg"]
        for s in (1, 4):
            assert got[s] == pytest.approx(_reference_ndcg(vstore, est, split, s), abs=1e-12)
