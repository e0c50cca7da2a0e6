"""The ``ordnmf-dask`` command end to end: real processes, real stores, exit codes, messages."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI, ML, data_file, dense_split, store_from_dense, synthetic_ordinal
from daskprocs import dask_processes

from ordnmf_dask import OrdNMF
from ordnmf_dask.app.cli import main


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.data
def test_ingest_info_fit_evaluate_on_movielens(tmp_path):
    """The commands in turn on MovieLens; the fit in-process (a fit on a LocalCluster the
    command starts: tests/test_urls.py; on `dask scheduler`: below)."""
    store, model = tmp_path / "ml.zarr", tmp_path / "m.zarr"
    r = run(
        "ingest",
        str(data_file(ML)),
        "--out",
        str(store),
        "--ratings",
        "halfstar",
        "--min-count",
        "20",
    )
    assert r.returncode == 0, r.stderr
    assert "566 users x 1297 items" in r.stdout
    r = run("info", str(store), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["nnz_train"] == 53679
    r = run(
        "fit",
        "--n-members",
        "1",
        str(store),
        "--out",
        str(model),
        "-k",
        "5",
        "--max-iter",
        "8",
        "--executor",
        "inprocess",
    )
    assert r.returncode == 0, r.stderr
    assert "iter    8" in r.stderr  # one log line per iteration
    r = run("evaluate", str(store), str(model), "--json", str(tmp_path / "res.json"))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "res.json").read_text())
    assert set(res["ndcg"]) == {str(s) for s in range(1, 11)}
    assert 0.05 < res["ndcg"]["1"] < 1.0  # 8 iterations at K = 5: well above random ranking
    assert "NDCG@100" in r.stdout and "test log-likelihood" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ingest", "missing.csv", "--out", "s.zarr"], "missing.csv"),
        (["info", "nothing.zarr"], "nothing.zarr"),
        (
            ["fit", "--n-members", "1", "STORE", "--out", "m.zarr", "-k", "0"],
            "--n-components must be an integer >= 1",
        ),
        (
            ["fit", "--n-members", "1", "STORE", "--out", "m.zarr", "-k", "2", "--init", "bad.npz"],
            "bad.npz",
        ),
        pytest.param(
            ["evaluate", "STORE", "OTHER_MODEL"], "does not match", marks=pytest.mark.cluster
        ),  # fits OTHER_MODEL on its own LocalCluster
        (["info", "STORE", "--log-file", "no-such-dir/x.log"], "log-file"),
    ],
)
def test_bad_input_exits_2_with_one_clear_message(tmp_path, args, message, capsys, monkeypatch):
    y = synthetic_ordinal(12, 10, 3, seed=1)
    train, test = dense_split(y)
    store_from_dense(tmp_path / "STORE", train, test, 3, (1, 1))
    other = store_from_dense(tmp_path / "OTHER", train[:, :8], test[:, :8], 3, (1, 1))
    if "OTHER_MODEL" in args:
        OrdNMF(2, max_iter=2, n_members=1).fit(other, out=tmp_path / "OTHER_MODEL")
    np.savez(tmp_path / "bad.npz", W=np.ones((3, 2)), H=np.ones((10, 2)))
    monkeypatch.chdir(tmp_path)
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "m.zarr").exists() and not (tmp_path / "s.zarr").exists()


def test_incomplete_store_is_refused(tmp_path):
    y = synthetic_ordinal(12, 10, 3, seed=1)
    info = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (1, 1))
    meta = Path(info.path) / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["complete"] = False
    meta.write_text(json.dumps(doc))
    r = run("info", info.path)
    assert r.returncode == 2 and "incomplete" in r.stderr.lower()


def test_warm_start_from_npz_matches_api(tmp_path):
    """``--init`` of an .npz is the API's ``init=``, bit for bit; both in-process (the
    in-process fit is the cluster's: tests/test_inprocess.py)."""
    y = synthetic_ordinal(20, 15, 3, seed=2)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (2, 2))
    rng = np.random.default_rng(0)
    w0, h0 = rng.gamma(1, 1, (20, 2)), rng.gamma(1, 1, (15, 2))
    np.savez(tmp_path / "init.npz", W=w0, H=h0)
    api = OrdNMF(2, max_iter=10, executor="inprocess", n_members=1).fit(store, init=(w0, h0))
    assert (
        main(
            [
                "fit",
                "--n-members",
                "1",
                store.path,
                "--out",
                str(tmp_path / "m.zarr"),
                "-k",
                "2",
                "--max-iter",
                "10",
                "--init",
                str(tmp_path / "init.npz"),
                "--executor",
                "inprocess",
            ]
        )
        == 0
    )
    cli = OrdNMF.load(tmp_path / "m.zarr")
    assert cli.elbo_ == api.elbo_


@pytest.mark.cluster
def test_fit_against_dask_scheduler_and_worker_processes(tmp_path):
    """`dask scheduler` + two `dask worker` processes on loopback, driven through the CLI."""
    y = synthetic_ordinal(25, 20, 3, seed=3)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (2, 2))
    with dask_processes(tmp_path / "scheduler.json", 2) as address:
        r = run(
            "fit",
            "--n-members",
            "1",
            store.path,
            "--out",
            str(tmp_path / "m.zarr"),
            "-k",
            "3",
            "--max-iter",
            "4",
            "--seed",
            "5",
            "--scheduler",
            address,
        )
        assert r.returncode == 0, r.stderr
    local = OrdNMF(3, max_iter=4, seed=5, n_members=1).fit(store)
    remote = OrdNMF.load(tmp_path / "m.zarr")
    assert remote.elbo_ == local.elbo_
    np.testing.assert_array_equal(remote.W_.compute(), local.W_.compute())


def test_unreachable_scheduler_exits_3(tmp_path):
    y = synthetic_ordinal(12, 10, 3, seed=1)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (1, 1))
    r = subprocess.run(
        [
            *CLI,
            "fit",
            "--n-members",
            "1",
            store.path,
            "--out",
            str(tmp_path / "m.zarr"),
            "-k",
            "2",
            "--scheduler",
            "tcp://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"},
    )
    assert r.returncode == 3, r.stderr
    assert "cluster failure" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("flags", "klass", "params"),
    [
        (["--model", "bepof", "--threshold", "2"], "BePoF", {"threshold": 2}),
        (["--model", "dcpf", "--p", "0.3"], "DcPF", {"p": 0.3}),
    ],
)
def test_fit_other_models_from_the_cli(tmp_path, client, flags, klass, params):
    import ordnmf_dask

    y = synthetic_ordinal(20, 15, 3, seed=4)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (1, 2))
    assert (
        main(
            [
                "fit",
                "--n-members",
                "1",
                store.path,
                "--out",
                str(tmp_path / "m.zarr"),
                "-k",
                "2",
                "--max-iter",
                "3",
                "--scheduler",
                client.scheduler.address,
                *flags,
            ]
        )
        == 0
    )
    api = getattr(ordnmf_dask, klass)(2, max_iter=3, n_members=1, **params).fit(store, client)
    cli = getattr(ordnmf_dask, klass).load(tmp_path / "m.zarr")
    assert type(cli).__name__ == klass and cli.elbo_ == api.elbo_


def test_starts_client_only_when_a_cluster_is_named():
    """``starts_client`` is true for a scheduler, a local cluster setting or TLS, else false:
    ``fit`` checks its inputs in a pass of its own only before it starts or joins a cluster
    (with no cluster setting the fit itself checks them before it chooses where to run)."""
    from ordnmf_dask.app.config import ClusterSection, LocalSpec
    from ordnmf_dask.app.connect import starts_client

    assert not starts_client(ClusterSection())
    assert starts_client(ClusterSection(local=LocalSpec(workers=1)))
    assert starts_client(ClusterSection(scheduler="tcp://127.0.0.1:8786"))
    assert starts_client(ClusterSection(scheduler_file="scheduler.json"))
    assert starts_client(ClusterSection(ca_file="ca.pem"))


def _info_json(store, capsys) -> dict:
    """``info STORE --json``, parsed (in this process: what it prints is the claim, not the
    process, which the MovieLens test above runs)."""
    assert main(["info", str(store), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info_prints_the_split_as_it_is(tmp_path, capsys):
    """The split named as ``info --json`` names it: a random split says what share it holds
    out (none: every nonzero trains), with its seed when it holds some out."""
    from ordnmf_dask import ingest_arrays

    users, items = np.repeat(np.arange(20), 5), np.tile(np.arange(5), 20)
    values = 1 + (users + items) % 4
    for fraction, path in ((0.0, "all.zarr"), (0.25, "split.zarr")):
        ingest_arrays(users, items, values, tmp_path / path, test_fraction=fraction, seed=3)
    assert main(["info", str(tmp_path / "all.zarr")]) == 0
    out = capsys.readouterr().out
    split = _info_json(tmp_path / "all.zarr", capsys)["split"]
    assert split == "random"
    assert f"split      {split}, none held out: every nonzero trains (no test pairs)" in out
    assert "seed" not in out
    assert main(["info", str(tmp_path / "split.zarr")]) == 0
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("split")]
    nnz_test = _info_json(tmp_path / "split.zarr", capsys)["nnz_test"]
    assert 0 < nnz_test < 100
    assert line == f"split      random, {nnz_test:.1f}% of the nonzeros held out for test (seed 3)"
