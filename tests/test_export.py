"""A saved model's own id maps, and the Parquet export (local and on an S3 server on loopback).

Every value read back is compared with the model's factors and ids and with the recommendations
of the few-users path, which test_recommend.py checks against a dense oracle.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import zarr
from conftest import dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.modelstore.model import open_model
from ordnmf_dask.postfit.export import MANIFEST, PENDING, export
from ordnmf_dask.postfit.recommend import recommend
from ordnmf_dask.store import idmap

pytest_plugins = ["tests.s3server"]

V, K = 4, 3


class Fitted:
    def __init__(self, store, model_path, users, items):
        self.store, self.path = store, model_path
        self.users, self.items = list(users), list(items)  # raw ids in index order
        m = open_model(model_path)
        self.W, self.H = m.factor("W").compute(), m.factor("H").compute()


@pytest.fixture(scope="module")
def named_fit(tmp_path_factory, mclient):
    """(2, 3) grid, string user ids with a comma and non-ASCII, integer item ids; a short fit."""
    d = tmp_path_factory.mktemp("exp")
    train, test = dense_split(synthetic_ordinal(23, 17, V, k=K, density=0.35, seed=5))
    train[4, :] = np.where(train[4] > 0, train[4], 1)  # a user with every item in train
    test[4] = 0
    users = np.array([f"u{j},é" if j % 5 == 0 else f"u{j}" for j in range(23)])
    items = 1000 + 7 * np.arange(17)
    store = store_from_dense(d / "s.zarr", train, test, V, (2, 3), users, items)
    model = OrdNMF(K, max_iter=3, n_members=1).fit(store, mclient, out=d / "m.zarr")
    return Fitted(store, model.model_path_, users.tolist(), items.tolist())


# ------------------------------------------------------------------------------ the id maps


def test_a_saved_model_carries_the_stores_id_maps(named_fit, tmp_path):
    """The model alone names users and items: its copy of the id maps is read after the store
    has gone."""
    m = open_model(named_fit.path)
    assert m.attrs["ids"] is True and m.ids_path == m.path
    moved = tmp_path / "elsewhere"
    shutil.move(named_fit.store.path, moved)
    try:
        assert m.ids_slice("users", 0, 23) == named_fit.users
        assert m.ids_at("items", np.array([16, 0, 16])) == [
            named_fit.items[16],
            named_fit.items[0],
            named_fit.items[16],
        ]
        assert idmap.ids_slice(m.ids_path, "items", 3, 6) == named_fit.items[3:6]
    finally:
        shutil.move(moved, named_fit.store.path)


def test_a_model_saved_without_id_maps_reads_them_from_its_store(named_fit, tmp_path):
    old = tmp_path / "old.zarr"
    shutil.copytree(named_fit.path, old)
    for axis in ("users", "items"):
        shutil.rmtree(old / axis)
    group = zarr.open_group(str(old), mode="r+")
    del group.attrs["ids"]
    m = open_model(str(old))
    assert m.ids_path == named_fit.store.path
    assert m.ids_slice("users", 0, 23) == named_fit.users
    gone = tmp_path / "gone"
    shutil.move(named_fit.store.path, gone)
    try:
        with pytest.raises(StoreError, match="no id maps of its own.*no store here"):
            m.ids_path  # noqa: B018
    finally:
        shutil.move(gone, named_fit.store.path)


def test_a_saved_model_recommends_and_exports_wherever_it_is_copied(
    named_fit, mclient, tmp_path, capsys
):
    """The model holds the index of its users' training items: copied elsewhere with the store
    moved away, its recommendations (in memory, and the exported ones) leave out the training
    items exactly as with the store."""
    m = open_model(named_fit.path)
    assert m.attrs["seen"] is True and m.has_seen
    want = recommend(named_fit.store, named_fit.path, n=4, users=named_fit.users)
    copy = OrdNMF.load(named_fit.path).save(tmp_path / "copy.zarr")
    moved = tmp_path / "elsewhere"
    shutil.move(named_fit.store.path, moved)
    try:
        got = OrdNMF.load(copy).recommend(named_fit.users, n=4)
        assert [[i for i, _ in got[u]] for u in named_fit.users] == [
            [i for i, _ in want[u]] for u in named_fit.users
        ]
        for u in named_fit.users:
            np.testing.assert_allclose([s for _, s in got[u]], [s for _, s in want[u]], rtol=1e-12)
        out = tmp_path / "exp"
        assert main(["export", copy, "--out", str(out), "-n", "4"]) == 0
        assert f"export written to {out}" in capsys.readouterr().out
        rows = [
            {"user": u, "rank": r, "item": item, "score": score}
            for u, lst in want.items()
            for r, (item, score) in enumerate(lst, start=1)
        ]
        assert pq.read_table(out / "recommendations").to_pylist() == rows
    finally:
        shutil.move(moved, named_fit.store.path)


def test_an_old_model_exports_recommendations_with_the_store_passed(
    named_fit, mclient, tmp_path, capsys
):
    """A model saved without that index, its store moved: the export of recommendations says to
    pass --store, and with it writes what the model recorded store gives."""
    old = tmp_path / "old.zarr"
    shutil.copytree(named_fit.path, old)
    shutil.rmtree(old / "seen")
    group = zarr.open_group(str(old), mode="r+")
    del group.attrs["seen"]
    want = tmp_path / "want"
    export(old, want, n=3)
    moved = tmp_path / "moved.zarr"
    shutil.move(named_fit.store.path, moved)
    try:
        assert main(["export", str(old), "--out", str(tmp_path / "e")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert "old.zarr: the model holds no index of its users' training items" in err[0]
        assert "no store here" in err[0]
        assert "pass --store STORE (the training store), or export only the factors" in err[0]
        with pytest.raises(StoreError, match=r"pass store=STORE \(the training store\)"):
            export(old, tmp_path / "e")
        assert not (tmp_path / "e").exists()
        assert (
            main(
                ["export", str(old), "--out", str(tmp_path / "e"), "-n", "3", "--store", str(moved)]
            )
            == 0
        )
        for d in ("recommendations", "user_factors"):
            assert pq.read_table(tmp_path / "e" / d) == pq.read_table(want / d)
    finally:
        shutil.move(moved, named_fit.store.path)


# ------------------------------------------------------------------------------ the export


def check_export(named_fit, read, n):
    """The datasets of an export read back with pyarrow (``read(dataset)`` -> table) equal the
    model's factors with their raw ids and the few-users recommendations."""
    for dataset, ids, mean in (
        ("user_factors", named_fit.users, named_fit.W),
        ("item_factors", named_fit.items, named_fit.H),
    ):
        table = read(dataset)
        assert table.column_names == ["id", *(f"f{j}" for j in range(K))]
        assert table.column("id").to_pylist() == ids
        got = np.column_stack([table.column(f"f{j}").to_numpy() for j in range(K)])
        np.testing.assert_array_equal(got, mean)  # bit for bit: float64 as stored
    recs = read("recommendations").to_pylist()
    want = recommend(named_fit.store, named_fit.path, n=n, users=named_fit.users)
    rows = [
        {"user": u, "rank": r, "item": item, "score": score}
        for u, lst in want.items()
        for r, (item, score) in enumerate(lst, start=1)
    ]
    assert recs == rows
    assert len(want[named_fit.users[4]]) == 0  # every item in train: no row


def test_local_export_round_trip(named_fit, mclient, tmp_path):
    out = export(named_fit.path, tmp_path / "exp", n=4)
    assert out == str(tmp_path / "exp")
    assert sorted(os.listdir(tmp_path)) == ["exp"]  # no temporary directory left
    assert sorted(os.listdir(out)) == [MANIFEST, "item_factors", "recommendations", "user_factors"]
    assert sorted(os.listdir(f"{out}/item_factors")) == [f"part-{c:05d}.parquet" for c in range(3)]
    assert sorted(os.listdir(f"{out}/user_factors")) == [f"part-{r:05d}.parquet" for r in range(2)]
    check_export(named_fit, lambda d: pq.read_table(f"{out}/{d}"), 4)
    manifest = json.loads((tmp_path / "exp" / MANIFEST).read_text())
    assert (
        manifest["datasets"]["user_factors"]["rows"] == np.diff(named_fit.store.row_bounds).tolist()
    )
    with pytest.raises(InputError, match="already exists"):
        export(named_fit.path, out, what=["factors"])
    export(named_fit.path, out, what=["factors"], overwrite=True)
    assert sorted(os.listdir(out)) == [MANIFEST, "item_factors", "user_factors"]
    assert sorted(os.listdir(tmp_path)) == ["exp"]


def test_export_refuses_to_replace_what_it_did_not_write(named_fit, mclient, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "part-00000.parquet").write_bytes(b"not ours")
    with pytest.raises(InputError, match="not a Parquet export written by ordnmf_dask"):
        export(named_fit.path, mine, what=["factors"], overwrite=True)
    assert os.listdir(mine) == ["part-00000.parquet"]
    with pytest.raises(InputError, match="is inside"):
        export(named_fit.path, os.path.join(named_fit.path, "exp"), what=["factors"])
    assert main(["export", named_fit.path, "--out", str(mine), "--overwrite"]) == 2
    assert os.listdir(mine) == ["part-00000.parquet"]


def test_export_command(named_fit, mclient, tmp_path, capsys):
    out = tmp_path / "e"
    assert (
        main(["export", named_fit.path, "--out", str(out), "--what", "recommendations", "-n", "2"])
        == 0
    )
    assert f"export written to {out}" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == [MANIFEST, "recommendations"]
    assert main(["export", named_fit.path, "--out", str(tmp_path / "f"), "--what", "W"]) == 2
    assert "--what must be" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


def test_export_to_s3(named_fit, mclient, s3):
    """Written by the workers through s3fs to an S3 server: parts, then the manifest; the
    pending marker is gone once complete; replaced only with overwrite and only if ours."""
    url = s3.url("exp")
    assert export(named_fit.path, url, n=3, storage_options=s3.storage_options) == url
    s3.fs.invalidate_cache()
    root = f"{s3.bucket}/exp"
    assert not s3.fs.exists(f"{root}/{PENDING}")
    assert json.loads(s3.fs.cat(f"{root}/{MANIFEST}"))["n"] == 3
    check_export(named_fit, lambda d: pq.read_table(f"{root}/{d}", filesystem=s3.fs), 3)
    with pytest.raises(InputError, match="already exists"):
        export(named_fit.path, url, storage_options=s3.storage_options)
    export(
        named_fit.path, url, what=["factors"], storage_options=s3.storage_options, overwrite=True
    )
    s3.fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[1] for p in s3.fs.ls(root)) == [
        MANIFEST,
        "item_factors",
        "user_factors",
    ]
    s3.fs.pipe(s3.url("theirs/data.csv"), b"1,2\n")
    with pytest.raises(InputError, match="not a Parquet export"):
        export(named_fit.path, s3.url("theirs"), storage_options=s3.storage_options, overwrite=True)
    assert s3.fs.cat(s3.url("theirs/data.csv")) == b"1,2\n"
    with pytest.raises(InputError, match="s3://no-such-bucket/exp: cannot write there"):
        export(
            named_fit.path,
            "s3://no-such-bucket/exp",
            what=["factors"],
            storage_options=s3.storage_options,
        )


def test_a_failed_export_leaves_nothing(named_fit, mclient, tmp_path, s3):
    """A part that cannot be written (a chunk file of the model lost) fails the export with the
    file named; locally no temporary directory is left, at a URL no key at all."""
    damaged = tmp_path / "m.zarr"
    shutil.copytree(named_fit.path, damaged)
    lost = next(p for p in (damaged / "H" / "2" / "mean" / "c").rglob("*") if p.is_file())
    lost.unlink()
    with pytest.raises(StoreError, match="chunk file missing"):
        export(str(damaged), tmp_path / "exp", what=["factors"])
    assert sorted(os.listdir(tmp_path)) == ["m.zarr"]
    with pytest.raises(StoreError, match="chunk file missing"):
        export(str(damaged), s3.url("exp"), what=["factors"], storage_options=s3.storage_options)
    s3.fs.invalidate_cache()
    assert s3.fs.ls(s3.url()) == []


@pytest.mark.cluster  # the command starts its own LocalCluster
def test_export_command_to_s3_with_credentials_from_the_environment(named_fit, s3, tmp_path):
    """As a user runs it: the endpoint and keys come from the environment (fsspec's and
    botocore's variables), for the command and the workers of the cluster it starts."""
    import subprocess
    import sys

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ordnmf_dask.app.cli",
            "export",
            named_fit.path,
            "--out",
            s3.url("cli/exp"),
            "--what",
            "factors",
            "--workers",
            "1",
        ],
        env={**os.environ, **s3.env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    s3.fs.invalidate_cache()
    table = pq.read_table(f"{s3.bucket}/cli/exp/item_factors", filesystem=s3.fs)
    assert table.column("id").to_pylist() == named_fit.items
