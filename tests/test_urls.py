"""Stores and models at URLs, on an S3 server on loopback with the real s3fs client.

Object stores cannot rename: a store or model is written between a pending marker and its
complete root, and readers refuse one without both. Fitting from a store at a URL to a model at
a URL gives the same model, bit for bit, as the same fit on a local copy of the store.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile

import fsspec
import numpy as np
import pytest
import zarr
from conftest import CLI
from test_ooc_ingest import assert_same_store

from ordnmf_dask import OrdNMF, ingest
from ordnmf_dask.datasets.synth import synth
from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import open_model, save_model
from ordnmf_dask.runtime.inprocess import InProcessClient
from ordnmf_dask.runtime.runner import Runner
from ordnmf_dask.sources.ingest import ingest_distributed
from ordnmf_dask.store import locations
from ordnmf_dask.store.blocks import open_store, read_block, read_ids, verify_store
from ordnmf_dask.store.staged import save_arrays, staging_dir, temporary_store

pytest_plugins = ["tests.s3server"]


@pytest.fixture
def s3conf(s3, monkeypatch):
    """``s3``, with fsspec's configuration pointing s3:// at it in this process (restored after
    the test), as a user's environment or fsspec configuration would."""
    monkeypatch.setitem(fsspec.config.conf, "s3", dict(s3.storage_options))
    return s3


def ratings_csv(path) -> str:
    """A small ratings file: 40 users x 30 items, string ids, values 1..5."""
    rng = np.random.default_rng(3)
    lines = ["user,item,rating"] + [
        f"u{u},i{i},{rng.integers(1, 6)}"
        for u in range(40)
        for i in range(30)
        if rng.random() < 0.3
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def keys(s3, prefix: str) -> list[str]:
    s3.fs.invalidate_cache()
    root = f"{s3.bucket}/{prefix}"
    return sorted(k[len(root) + 1 :] for k in s3.fs.find(root))


def fit(store, out, **kw):
    return OrdNMF(3, max_iter=4, executor="inprocess", n_members=1).fit(store, out=out, **kw)


def test_ingest_fit_load_recommend_at_urls_equal_the_local_ones(s3conf, tmp_path):
    """ingest to s3, fit from it to an s3 model, load and recommend: the same store (blocks,
    ids) and the same model (factors, bound) bit for bit as the local ones."""
    s3 = s3conf
    csv = ratings_csv(tmp_path / "r.csv")
    url = s3.url("data/s.zarr")
    info = ingest(csv, url, nnz_per_block=100, seed=1)
    local = ingest(csv, tmp_path / "s.zarr", nnz_per_block=100, seed=1)
    assert info.path == url and info.grid == local.grid and info.grid != (1, 1)
    assert not any(k.startswith(locations.PENDING) for k in keys(s3, "data/s.zarr"))
    assert verify_store(url).nnz_train == local.nnz_train
    for r in range(info.grid[0]):
        for c in range(info.grid[1]):
            a, b = read_block(url, "train", r, c), read_block(local.path, "train", r, c)
            assert all(
                np.array_equal(getattr(a, f), getattr(b, f)) for f in ("indptr", "cols", "y", "raw")
            )
    assert np.array_equal(read_ids(url, "users"), read_ids(local.path, "users"))

    remote = fit(url, s3.url("data/m.zarr"))
    mine = fit(local.path, tmp_path / "m.zarr")
    assert remote.model_path_ == s3.url("data/m.zarr")
    loaded = OrdNMF.load(s3.url("data/m.zarr"))
    for est in (remote, loaded):
        assert np.array_equal(est.W_.compute(), mine.W_.compute())
        assert np.array_equal(est.H_.compute(), mine.H_.compute())
        assert est.elbo_ == mine.elbo_
    assert open_model(s3.url("data/m.zarr")).attrs["store"]["path"] == url
    users = ["u1", "u7", "u30"]
    assert loaded.recommend(users, n=4) == mine.recommend(users, n=4)

    # save: local -> URL -> local, the same model each time
    saved = mine.save(s3.url("copy/m.zarr"))
    back = OrdNMF.load(saved).save(tmp_path / "back.zarr")
    assert np.array_equal(OrdNMF.load(back).H_.compute(), mine.H_.compute())
    assert keys(s3, "copy/m.zarr")[0] == "H/0/geo/c/0/0" and locations.PENDING not in keys(
        s3, "copy/m.zarr"
    )


def test_an_incomplete_store_or_model_at_a_url_is_refused_naming_it(s3conf, tmp_path):
    s3 = s3conf
    url = s3.url("s.zarr")
    ingest(ratings_csv(tmp_path / "r.csv"), url, nnz_per_block=200)
    s3.fs.pipe(f"{s3.bucket}/s.zarr/{locations.PENDING}", b'{"kind": "ordnmf_dask.store"}')
    with pytest.raises(StoreError, match=f"{url}: incomplete store .*{locations.PENDING}"):
        open_store(url)
    s3.fs.rm(f"{s3.bucket}/s.zarr/zarr.json")  # an upload cut before its last key
    with pytest.raises(StoreError, match=f"{url}: incomplete store .*{locations.PENDING}"):
        open_store(url)
    with pytest.raises(StoreError, match=f"{s3.url('nothing')}: no store here"):
        open_store(s3.url("nothing"))

    m = s3.url("m.zarr")
    fit(ingest(tmp_path / "r.csv", tmp_path / "s.zarr", nnz_per_block=200).path, m)
    root = zarr.open_group(m, mode="r+")
    root.attrs["complete"] = False
    with pytest.raises(StoreError, match=f"{m}: model is incomplete"):
        OrdNMF.load(m)
    root.attrs["complete"] = True
    OrdNMF.load(m)
    s3.fs.pipe(f"{s3.bucket}/m.zarr/{locations.PENDING}", b'{"kind": "ordnmf_dask.model"}')
    with pytest.raises(StoreError, match=f"{m}: incomplete model .*{locations.PENDING}"):
        OrdNMF.load(m)
    s3.fs.rm(f"{s3.bucket}/m.zarr/{locations.PENDING}")
    s3.fs.rm(f"{s3.bucket}/m.zarr/W/0/mean/c/0/0")
    with pytest.raises(StoreError, match="W/0/mean/c/0/0: chunk file missing"):
        OrdNMF.load(m)


def test_overwrite_at_a_url_removes_only_our_own_keys(s3conf, tmp_path):
    """A URL holding anything else is never written; a model there holding a file of someone
    else's is not replaced (the file is named); replacing a model removes the keys of its zarr
    hierarchy; a store is not replaced by a model nor the reverse."""
    s3 = s3conf
    store = ingest(ratings_csv(tmp_path / "r.csv"), tmp_path / "s.zarr", nnz_per_block=200)
    s3.fs.pipe(f"{s3.bucket}/theirs/data.csv", b"1,2\n")
    for overwrite in (False, True):
        with pytest.raises(InputError, match="theirs"):
            fit(store.path, s3.url("theirs"), overwrite=overwrite)
        with pytest.raises(InputError, match="theirs"):
            ingest(tmp_path / "r.csv", s3.url("theirs"), overwrite=overwrite)
    assert keys(s3, "theirs") == ["data.csv"]

    m = s3.url("m.zarr")
    first = fit(store.path, m)
    s3.fs.pipe(f"{s3.bucket}/m.zarr/notes.txt", b"mine")  # someone's file inside the model
    s3.fs.pipe(f"{s3.bucket}/m.zarr/W/0/mean/c/0/stale", b"x")  # inside an array: ours
    with pytest.raises(InputError, match="already exists"):
        fit(store.path, m)
    with pytest.raises(InputError, match="not a zarr store written by ordnmf_dask"):
        ingest(tmp_path / "r.csv", m, overwrite=True)
    with pytest.raises(InputError, match=f"it holds {re.escape(m)}/notes.txt, which"):
        OrdNMF(2, max_iter=2, executor="inprocess", n_members=1).fit(
            store.path, out=m, overwrite=True
        )
    assert s3.fs.cat(f"{s3.bucket}/m.zarr/notes.txt") == b"mine"
    s3.fs.rm(f"{s3.bucket}/m.zarr/notes.txt")
    second = OrdNMF(2, max_iter=2, executor="inprocess", n_members=1).fit(
        store.path, out=m, overwrite=True
    )
    assert second.W_.shape[1] == 2 != first.n_components
    assert "W/0/mean/c/0/stale" not in keys(s3, "m.zarr")


def test_a_failed_write_at_a_url_leaves_nothing_of_ours(s3conf, tmp_path):
    """An upload that fails part way (a chunk file that cannot be read) and a model whose
    worker fails (replacing one: at a URL the old one is removed first): the keys already
    written and the pending marker are removed."""
    s3 = s3conf
    csv = ratings_csv(tmp_path / "r.csv")
    store = ingest(csv, tmp_path / "s.zarr", nnz_per_block=200)
    from ordnmf_dask.store.blocks import publish, temporary_path

    url = s3.url("s.zarr")
    tmp, scratch = temporary_path(url)
    os.rename(store.path, tmp)
    os.symlink(tmp_path / "gone", os.path.join(tmp, "train", "y", "c", "zz"))  # read fails
    with pytest.raises(FileNotFoundError):
        publish(tmp, url, lambda p: None)
    assert keys(s3, "s.zarr") == []
    os.remove(os.path.join(tmp, "train", "y", "c", "zz"))  # the store as it was: no link in it
    os.rename(tmp, store.path)
    os.rmdir(scratch)

    m = s3.url("m.zarr")
    model = fit(store.path, m)  # replaced below: at a URL the old one goes first
    chunk = chunkstore.load_chunk(model.model_path_, "W", 0)
    attrs = dict(open_model(model.model_path_).attrs)

    def broken():
        raise OSError("the disk went away")

    with InProcessClient() as client:
        w = [client.submit(lambda: chunk)]
        h = [client.submit(broken)]
        with pytest.raises(OSError, match="went away"):
            save_model(client, w, h, m, attrs, overwrite=True)
    assert keys(s3, "m.zarr") == []


def test_a_store_write_cut_short_while_a_task_may_run_keeps_its_marker(s3conf, tmp_path):
    """A failure that leaves a task of the writing runner possibly running (an interrupt):
    what was written at the URL is removed but the pending marker stays, so the store is
    refused as unfinished, and ``overwrite`` replaces it."""
    s3 = s3conf
    url = s3.url("s.zarr")
    runner = Runner(None)
    with pytest.raises(KeyboardInterrupt):
        with temporary_store(url, False, runner) as (_, tmp):
            save_arrays(locations.join(staging_dir(tmp), "x"), {"a": np.arange(3)})
            runner.settled = False  # as ``gather_all`` leaves it when tasks are still running
            raise KeyboardInterrupt
    assert keys(s3, "s.zarr") == [locations.PENDING]
    csv = ratings_csv(tmp_path / "r.csv")
    with pytest.raises(InputError, match="overwrite"):
        ingest(csv, url)
    ingest(csv, url, overwrite=True)
    assert locations.PENDING not in keys(s3, "s.zarr")
    verify_store(url)


@pytest.mark.cluster  # the fit starts its own LocalCluster
def test_the_commands_read_and_write_urls_with_credentials_from_the_environment(s3, tmp_path):
    """As a user runs them: ingest to s3, fit on a LocalCluster whose worker processes read
    the blocks from s3, info, evaluate, recommend and export from s3 (in the command's process);
    endpoint and keys from the environment."""
    csv = ratings_csv(tmp_path / "r.csv")
    env = {**os.environ, **s3.env}
    store, model = s3.url("cli/s.zarr"), s3.url("cli/m.zarr")

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [*CLI, "-q", *args], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return done

    run("ingest", csv, "--out", store, "--nnz-per-block", "200")
    assert json.loads(s3.fs.cat(f"{s3.bucket}/cli/s.zarr/zarr.json"))["attributes"]["complete"]
    run(
        "fit",
        "--n-members",
        "1",
        store,
        "--out",
        model,
        "-k",
        "2",
        "--max-iter",
        "3",
        "--executor",
        "cluster",
        "--workers",
        "1",
    )
    assert "incomplete" not in run("info", store).stdout
    run("evaluate", store, model, "--k", "5")
    shown = run("recommend", store, model, "--users", "u1", "-n", "3").stdout
    assert "u1" in shown
    # in the command's process (a small model): the workers of a cluster the export command
    # starts reach s3 the same way in tests/test_export.py
    run("export", model, "--out", s3.url("cli/exp"), "--what", "factors")
    s3.fs.invalidate_cache()
    assert s3.fs.exists(f"{s3.bucket}/cli/exp/_SUCCESS")
    bad = subprocess.run(
        [*CLI, "info", s3.url("cli/none.zarr")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and s3.url("cli/none.zarr") in bad.stderr


def test_checkpoints_at_a_url_are_kept_rotated_and_resumed_from(s3conf, tmp_path):
    """A fit checkpointing to a URL: the newest two complete checkpoints stay there, a fit
    resuming from them gives the model of one uninterrupted run, bit for bit, and restart
    removes only the checkpoints."""
    s3 = s3conf
    store = ingest(ratings_csv(tmp_path / "r.csv"), tmp_path / "s.zarr", nnz_per_block=200)
    ckpt = s3.url("ckpt")
    s3.fs.pipe(f"{s3.bucket}/ckpt/README", b"mine")

    def est(n: int, **kw) -> OrdNMF:
        return OrdNMF(
            3, max_iter=n, tol=1e-12, checkpoint_every=2, executor="inprocess", **kw, n_members=1
        )

    est(5, checkpoint_dir=ckpt).fit(store.path, out=tmp_path / "a")
    names = sorted({k.split("/")[0] for k in keys(s3, "ckpt")})
    assert names == ["README", "ckpt-00000002", "ckpt-00000004"]
    for name in names[1:]:
        assert zarr.open_group(f"{ckpt}/{name}", mode="r").attrs["complete"] is True
    resumed = est(8, checkpoint_dir=ckpt).fit(store.path, out=tmp_path / "b", resume=True)
    whole = est(8).fit(store.path, out=tmp_path / "c")
    assert np.array_equal(resumed.W_.compute(), whole.W_.compute())
    assert np.array_equal(resumed.H_.compute(), whole.H_.compute())
    assert resumed.elbo_ == whole.elbo_
    est(1, checkpoint_dir=ckpt).fit(store.path, out=tmp_path / "d", restart=True)
    assert keys(s3, "ckpt") == ["README"]


def _swap_s3_conf(options: dict | None) -> dict | None:
    """On a worker: fsspec's s3 configuration set to ``options`` (None: removed); returns the
    one it replaces."""
    import fsspec

    before = fsspec.config.conf.get("s3")
    if options is None:
        fsspec.config.conf.pop("s3", None)
    else:
        fsspec.config.conf["s3"] = dict(options)
    return before


@pytest.fixture
def workers_s3conf(s3conf, client):
    """``s3conf``, with the cluster's workers configured the same way (each worker's own
    configuration restored after the test)."""
    before = client.run(_swap_s3_conf, dict(s3conf.storage_options))
    try:
        yield s3conf
    finally:
        for address, conf in before.items():
            client.run(_swap_s3_conf, conf, workers=[address])


@pytest.mark.parametrize("what", ["ingest", "synth"])
def test_a_distributed_write_to_a_url_stages_there(
    workers_s3conf, client, tmp_path, monkeypatch, what
):
    """The workers stage in the bucket and write the chunk files in place: no filesystem in
    common with the client is needed (its temporary directory here does not even exist, so
    whatever the user, nothing can be made there), the store is the one a local write gives,
    and nothing staged is left."""
    s3 = workers_s3conf
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    url = s3.url(f"{what}.zarr")
    if what == "ingest":
        csv = ratings_csv(tmp_path / "r.csv")
        info = ingest_distributed(
            csv, url, client=client, chunk_bytes=2000, rows_per_partition=200, grid=(2, 2)
        )
        local = ingest(csv, tmp_path / "local.zarr", grid=(2, 2))
    else:
        shape = {"n_users": 60, "n_items": 40, "nnz": 900, "n_components": 2, "nnz_per_block": 300}
        info = synth(url, client=client, **shape)
        local = synth(tmp_path / "local.zarr", client=client, **shape)
    assert info.path == url and info.grid == local.grid and info.grid != (1, 1)
    names = keys(s3, f"{what}.zarr")
    assert locations.PENDING not in names and not any("_staging" in n for n in names)
    assert_same_store(local.path, url)
    verify_store(url)
    assert not (tmp_path / "no-such-directory").exists()


def test_a_failed_distributed_ingest_to_a_url_leaves_nothing(workers_s3conf, client, tmp_path):
    """Bad input found on the workers after they staged rows in the bucket: the error names
    the file and line, and nothing is left at the URL (staged files, arrays, marker)."""
    s3 = workers_s3conf
    csv = ratings_csv(tmp_path / "r.csv")
    with open(csv, "a") as fh:
        fh.write("u1,i1,x\n")
    with pytest.raises(InputError, match=r"r\.csv, line \d+"):
        ingest_distributed(
            csv, s3.url("bad.zarr"), client=client, chunk_bytes=2000, rows_per_partition=200
        )
    assert keys(s3, "") == []


def test_a_store_at_a_url_with_a_users_key_under_its_staging_prefix_is_not_replaced(
    s3conf, tmp_path
):
    """A user's key that happens to lie under ``<store>/_staging/`` is not the package's: the
    store is not replaced (the key is named, and stays); without it, the replacement is
    complete and leaves no staged file."""
    s3 = s3conf
    csv = ratings_csv(tmp_path / "r.csv")
    url = s3.url("again.zarr")
    ingest_distributed(csv, url, chunk_bytes=2000, rows_per_partition=200)
    s3.fs.pipe(f"{s3.bucket}/again.zarr/_staging/mine.txt", b"mine")
    with pytest.raises(InputError, match=f"it holds {re.escape(url)}/_staging/mine.txt"):
        ingest_distributed(
            csv, url, chunk_bytes=2000, rows_per_partition=200, seed=1, overwrite=True
        )
    assert s3.fs.cat(f"{s3.bucket}/again.zarr/_staging/mine.txt") == b"mine"
    s3.fs.rm(f"{s3.bucket}/again.zarr/_staging/mine.txt")
    info = ingest_distributed(
        csv, url, chunk_bytes=2000, rows_per_partition=200, seed=1, overwrite=True
    )
    assert info.attrs["seed"] == 1
    assert [n for n in keys(s3, "again.zarr") if "_staging" in n] == []
    verify_store(url)


def test_a_model_is_never_written_into_its_store_at_a_url(s3conf, tmp_path):
    s3 = s3conf
    url = s3.url("s.zarr")
    ingest(ratings_csv(tmp_path / "r.csv"), url, nnz_per_block=200)
    for out, where in ((url, "is"), (f"{url}/m.zarr", "is inside"), (s3.url(), "contains")):
        with pytest.raises(InputError, match=f"it {where} the training store {url}"):
            fit(url, out, overwrite=True)


def test_a_file_url_is_the_local_path(tmp_path):
    csv = ratings_csv(tmp_path / "r.csv")
    info = ingest(csv, f"file://{tmp_path}/f.zarr", nnz_per_block=200)
    assert info.path == str(tmp_path / "f.zarr") and open_store(tmp_path / "f.zarr").nnz_train
