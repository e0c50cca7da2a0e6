"""Tuning: the pure schedule and space (tuning/schedule.py), the checks made before any
cluster, and one small search on a real LocalCluster (tuning/search.py, ``ordnmf-dask tune``)."""

from __future__ import annotations

import csv
import json
import logging
import math
import re
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr
from conftest import synthetic_ordinal

from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError, UsageError
from ordnmf_dask.estimator import OrdNMF
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import open_model, save_model
from ordnmf_dask.postfit.evaluate import evaluate
from ordnmf_dask.sources.ingest import ingest_arrays
from ordnmf_dask.store.kinds import is_model
from ordnmf_dask.tuning import schedule
from ordnmf_dask.tuning.search import tune

# -- the pure parts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("min_budget", "max_iter", "eta", "expected"),
    [
        (10, 90, 3, [10, 30, 90]),
        (100, 1000, 3, [111, 333, 1000]),
        (4, 8, 2, [4, 8]),
        (7, 20, 3, [20]),  # 7 * 3 > 20: one rung
        (20, 20, 3, [20]),
        (1, 16, 2, [1, 2, 4, 8, 16]),
    ],
)
def test_rungs(min_budget, max_iter, eta, expected):
    budgets = schedule.rungs(min_budget, max_iter, eta)
    assert budgets == expected
    assert budgets[0] >= min_budget and budgets[-1] == max_iter
    assert all(b < c for b, c in zip(budgets, budgets[1:], strict=False))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 10, 3), "min_budget must be an integer >= 1"),
        ((5, 4, 3), "min_budget must be <= max_iter"),
        ((1, 10, 1), "eta must be an integer >= 2"),
        ((1, 10.0, 2), "max_iter must be an integer"),
    ],
)
def test_rungs_refused(args, message):
    with pytest.raises(InputError, match=message):
        schedule.rungs(*args)


def test_kept_and_ranked():
    assert [schedule.n_kept(n, 3) for n in (1, 2, 3, 8, 9)] == [1, 1, 1, 2, 3]
    scores = {0: 0.2, 1: math.nan, 2: 0.5, 3: 0.2, 4: -1.0}
    assert schedule.ranked(scores) == [2, 0, 3, 4, 1]  # ties by trial number, NaN last


def test_grid_is_every_combination_in_order():
    trials = schedule.grid({"n_components": [2, 4], "alpha_W": [0.1, 1.0, 3.0]})
    assert trials == [{"n_components": k, "alpha_W": a} for k in (2, 4) for a in (0.1, 1.0, 3.0)]


def test_sample_is_seeded_and_inside_the_space():
    space = {
        "n_components": schedule.LogUniform(5, 50),
        "alpha_W": [0.1, 0.3],
        "alpha_H": schedule.LogUniform(0.01, 10.0),
    }
    a, b = schedule.sample(space, 40, seed=3), schedule.sample(space, 40, seed=3)
    assert a == b
    assert a != schedule.sample(space, 40, seed=4)
    ks = [t["n_components"] for t in a]
    assert all(isinstance(k, int) and 5 <= k <= 50 for k in ks)
    assert {t["alpha_W"] for t in a} == {0.1, 0.3}
    alphas = np.array([t["alpha_H"] for t in a])
    assert alphas.min() >= 0.01 and alphas.max() <= 10.0
    assert alphas.min() < 0.1 and alphas.max() > 1.0  # spread over the decades, not linear


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({}, "the search space is empty"),
        ({"tol": [1e-4]}, "cannot search 'tol'"),
        ({"n_components": [2, 0]}, "search space n_components must be an integer >= 1, got 0"),
        (
            {"alpha_W": schedule.LogUniform(0.0, 1.0)},
            "search space alpha_W must be a finite number > 0",
        ),
        ({"alpha_W": schedule.LogUniform(2.0, 1.0)}, "must be a range low <= high"),
        ({"alpha_W": []}, "must be a non-empty list"),
    ],
)
def test_space_refused(space, message):
    with pytest.raises(InputError, match=message):
        schedule.sample(space, 2, seed=0)


def test_grid_takes_no_range():
    with pytest.raises(InputError, match="alpha_H is a range"):
        schedule.grid({"alpha_H": schedule.LogUniform(0.1, 1.0)})


def test_parse_values():
    assert schedule.parse_values("n_components", "10,20,50", "-k") == [10, 20, 50]
    assert schedule.parse_values("alpha_W", "0.1:3", "--alpha-w") == schedule.LogUniform(0.1, 3.0)
    for bad in ("", "a,b", "1:2:3", "1.5,2"):
        with pytest.raises(UsageError, match="-k takes integers"):
            schedule.parse_values("n_components", bad, "-k")


# -- checks before the cluster --------------------------------------------------------------


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same small ordinal data with and without a validation subset, on a 2 x 1 grid (the
    block layout is not what tune is about; two blocks keep the saves' many chunks)."""
    root = tmp_path_factory.mktemp("tune-stores")
    y = synthetic_ordinal(150, 90, 5, k=3, density=0.3, seed=0)
    u, i = np.nonzero(y)
    common = dict(ratings="integer", grid=(2, 1), test_fraction=0.2, seed=1)
    return {
        "validation": ingest_arrays(
            u, i, y[u, i], root / "val.zarr", validation_fraction=0.2, **common
        ),
        "plain": ingest_arrays(u, i, y[u, i], root / "plain.zarr", **common),
    }


def test_no_validation_subset_needs_allow_test(stores, tmp_path):
    with pytest.raises(InputError, match="has no validation subset.*allow_test=True"):
        tune(stores["plain"], {"n_components": [2]}, out=tmp_path / "t")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": {"max_iter": 5}}, "give max_iter to tune itself"),
        ({"params": {"n_components": 3}}, "n_components is both searched and fixed"),
        ({"params": {"checkpoint_dir": "x"}}, "checkpoint_dir is set by tune"),
        ({"params": {"threshold": 2}}, "OrdNMF has no parameter 'threshold'"),
        (
            {"validation_metric": "auc"},
            "tune: validation_metric must be 'ndcg' or 'loglik', got 'auc'",
        ),
        ({"validation_s": 6}, "validation_s must be a class in 1..5"),
        ({"model": "bepof", "validation_metric": "loglik"}, "BePoF models binarized data"),
        ({"model": "svd"}, "model must be one of"),
        ({"n_jobs": 0}, "tune: n_jobs must be an integer >= 1, got 0"),
        ({"eta": 1}, "tune: eta must be an integer >= 2, got 1"),
        ({"user_fraction": 0.0}, r"tune: user_fraction must be a number in \(0, 1\], got 0.0"),
        ({"validation_k": 0}, "tune: validation_k must be an integer >= 1, got 0"),
    ],
)
def test_settings_refused_before_anything_is_written(stores, tmp_path, kwargs, message):
    with pytest.raises(InputError, match=message):
        tune(stores["validation"], {"n_components": [2]}, out=tmp_path / "t", **kwargs)
    assert not (tmp_path / "t").exists()


def test_out_must_be_new_or_an_earlier_tune(stores, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not a directory written by ordnmf-dask tune"):
        tune(stores["validation"], {"n_components": [2]}, out=other, overwrite=True)
    assert (other / "notes.txt").read_text() == "mine"


def test_cli_bad_values_exit_2(stores, tmp_path, capsys):
    code = main(["tune", stores["validation"].path, "--out", str(tmp_path / "t"), "-k", "2,x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        "ordnmf-dask tune: error: --n-components takes integers "
        "joined by commas or a range LOW:HIGH, got '2,x'"
    ]
    code = main(["tune", stores["plain"].path, "--out", str(tmp_path / "t"), "-k", "2,3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--allow-test" in err[0]
    assert not (tmp_path / "t").exists()


# -- one search on a real cluster -----------------------------------------------------------


@pytest.mark.cluster
def test_search_runs_fits_at_once_and_saves_the_best(stores, client, tmp_path, caplog):
    info = stores["validation"]
    out = tmp_path / "tune"
    space = {"n_components": [2, 4], "alpha_W": [0.3, 1.0]}
    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        res = tune(
            info,
            space,
            client,
            out=out,
            max_iter=8,
            min_budget=4,
            eta=2,
            n_jobs=3,
            params={"tol": 1e-12, "seed": 2},
        )
    rows = res.rows
    assert res.split == "validation" and res.metric == "validation ndcg@100 s>=1"
    # rungs of 4 and 8 iterations: 4 trials, then the best 4 // 2 = 2
    assert [(r["rung"], r["max_iter"]) for r in rows] == [(0, 4)] * 4 + [(1, 8)] * 2
    first = [r for r in rows if r["rung"] == 0]
    assert [(r["n_components"], r["alpha_W"]) for r in first] == [
        (k, a) for k in (2, 4) for a in (0.3, 1.0)
    ]
    assert all(r["alpha_H"] == 0.3 and r["status"] == "fit" for r in rows)
    assert [r["n_iter"] for r in rows] == [4] * 4 + [8] * 2
    ranked = sorted(first, key=lambda r: (-r["value"], r["trial"]))
    second = [r for r in rows if r["rung"] == 1]
    assert [r["trial"] for r in second] == sorted(r["trial"] for r in ranked[:2])
    assert {r["trial"] for r in first if r["kept"]} == {r["trial"] for r in second}
    # fits of a rung ran at the same time: some two of them overlap in time
    spans = sorted((r["start"], r["end"]) for r in first)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
    # the best row is the best of the last rung, and its model is the one saved at out/best
    best = max(second, key=lambda r: r["value"])
    assert res.best == best and best["kept"]
    saved = zarr.open_group(str(out / "best"), mode="r").attrs
    assert saved["params"]["n_components"] == best["n_components"]
    assert saved["params"]["alpha_W"] == best["alpha_W"]
    assert saved["elbo"][saved["best_iteration"] - 1] == best["elbo"] and saved["n_iter"] == 8
    fitted = OrdNMF.load(out / "best")
    trial = OrdNMF.load(best["model"])
    np.testing.assert_array_equal(fitted.W_.compute(), trial.W_.compute())
    # a survivor continued from its checkpoints (taken every 4 // 4 = 1 iteration; the last,
    # iteration 4, is never checkpointed) along the trajectory of one uninterrupted fit
    resumed = sorted(r.getMessage() for r in caplog.records if "resuming from" in r.getMessage())
    assert resumed == [
        f"resuming from {out}/trials/{r['trial']:04d}/checkpoints/ckpt-00000003 (iteration 3)"
        for r in second
    ]
    alone = OrdNMF(
        best["n_components"],
        alpha_W=best["alpha_W"],
        tol=1e-12,
        seed=2,
        max_iter=8,
        n_members=1,
    ).fit(info, client)
    assert alone.elbo_ == fitted.elbo_
    # the table, as CSV and Parquet; no checkpoint is left behind
    with open(res.csv, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [int(r["trial"]) for r in table] == [r["trial"] for r in rows]
    assert [float(r["value"]) for r in table] == [r["value"] for r in rows]
    assert pq.read_table(res.parquet).to_pylist() == [
        {c: r[c] for c in pq.read_table(res.parquet).column_names} for r in rows
    ]
    assert not list(out.glob("trials/*/checkpoints"))
    assert json.loads((out / "tune.json").read_text())["best"]["trial"] == best["trial"]
    # a second tune into the same directory replaces it only when told to
    with pytest.raises(InputError, match="holds an earlier tune's results"):
        tune(info, space, client, out=out, max_iter=8)
    # a file of the user's among the trials stops the replacement, named, before anything of
    # the earlier tune is removed (its last trial's model included)
    models = sorted(out.glob("trials/*/model"))
    assert models
    for mine in (
        out / "trials" / "0000" / "checkpoints" / "notes.txt",
        out / "trials" / f"{len(models) - 1:04d}" / "notes.txt",
    ):
        mine.parent.mkdir(exist_ok=True)
        mine.write_text("mine")
        with pytest.raises(InputError, match=re.escape(f"{mine}: not written by ordnmf-dask tune")):
            tune(info, {"n_components": [3]}, client, out=out, max_iter=2, overwrite=True)
        assert mine.read_text() == "mine"
        assert sorted(out.glob("trials/*/model")) == models
        assert all(is_model(str(m)) for m in models)
        mine.unlink()
    # ... and then replaces what the earlier tune wrote, and only that
    again = tune(info, {"n_components": [3]}, client, out=out, max_iter=2, overwrite=True)
    assert [r["trial"] for r in again.rows] == [0] and again.best["n_components"] == 3
    assert sorted(p.name for p in (out / "trials").iterdir()) == ["0000"]
    assert OrdNMF.load(out / "best").n_components == 3


@pytest.mark.cluster
def test_command_on_the_test_subset_when_allowed(stores, cluster, client, tmp_path, capsys):
    info, out = stores["plain"], tmp_path / "t"
    code = main(
        [
            "tune",
            info.path,
            "--out",
            str(out),
            "-k",
            "3",
            "--alpha-h",
            "0.3,3",
            "--max-iter",
            "3",
            "--min-budget",
            "3",
            "--allow-test",
            "--scheduler",
            cluster.scheduler_address,
        ]
    )
    printed = capsys.readouterr()
    assert code == 0
    assert "TUNING ON THE TEST SUBSET" in printed.err
    with open(out / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["rung"], r["max_iter"], r["alpha_H"]) for r in rows] == [
        ("0", "3", "0.3"),
        ("0", "3", "3.0"),
    ]  # one rung
    assert {r["metric"] for r in rows} == {"test ndcg@100 s>=1"}
    best = max(rows, key=lambda r: float(r["value"]))
    assert printed.out.splitlines() == [
        f"best: trial {best['trial']} (n_components=3 alpha_W=0.3 "
        f"alpha_H={float(best['alpha_H']):.4g}): "
        f"test ndcg@100 s>=1 {float(best['value']):.6g} after 3 iterations",
        f"model {out / 'best'}",
        f"table {out / 'results.csv'} (2 rows), {out / 'results.parquet'}",
    ]
    # the score is evaluate's figure for the saved model
    assert float(best["value"]) == evaluate(info, out / "best", client, levels=[1])["ndcg"][1]


@pytest.mark.cluster
def test_models_of_one_store_saved_at_once(stores, client, tmp_path):
    """Concurrent fits save at the same time, each copying the store's id maps: Dask lost a
    hashed scattered key shared by two saves (a copy task cancelled for lost dependencies)."""
    info = stores["validation"]
    model = open_model(
        OrdNMF(2, max_iter=1, n_members=1).fit(info, client, out=tmp_path / "m").model_path_
    )
    n_r, n_c = model.n_blocks
    errors: list[BaseException] = []

    def saves(j: int) -> None:
        w = [
            client.submit(chunkstore.load_chunk, model.path, "W", r, pure=False) for r in range(n_r)
        ]
        h = [
            client.submit(chunkstore.load_chunk, model.path, "H", c, pure=False) for c in range(n_c)
        ]
        for _ in range(8):
            try:
                save_model(client, w, h, str(tmp_path / f"m{j}"), dict(model.attrs), overwrite=True)
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                errors.append(exc)

    threads = [threading.Thread(target=saves, args=(j,)) for j in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for j in range(6):
        saved = open_model(str(tmp_path / f"m{j}"))
        np.testing.assert_array_equal(saved.factor("W").compute(), model.factor("W").compute())
