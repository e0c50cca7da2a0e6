"""A fit replaces only what it can prove it wrote: a model at ``--out`` (never a store or any
other directory), checkpoints of its own fingerprint (others are kept and the fit refuses), and,
with ``--restart``, only the checkpoints this package wrote."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI, dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF, ingest
from ordnmf_dask.errors import InputError
from ordnmf_dask.store.blocks import open_store
from ordnmf_dask.store.kinds import is_model

K = 2


@pytest.fixture
def store_30x20(tmp_path):
    y = synthetic_ordinal(30, 20, 3, seed=4)
    return store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (2, 2))


def fit_cli(client, *args: str) -> subprocess.CompletedProcess:
    """``ordnmf-dask fit ARGS`` in its own process, on the test cluster."""
    return subprocess.run(
        [
            *CLI,
            "fit",
            "--n-members",
            "1",
            *args,
            "-k",
            str(K),
            "--scheduler",
            client.scheduler.address,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " INFO " not in line]


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("keep", "it is not a model written by ordnmf_dask"),
        ("s.zarr", "it is the training store"),
        ("s.zarr/m.zarr", "it is inside the training store"),
        (".", "it contains the training store"),
    ],
)
def test_fit_overwrite_replaces_nothing_but_a_model(tmp_path, store_30x20, client, target, reason):
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("x")
    before = open_store(store_30x20.path).attrs
    out = tmp_path / target
    r = fit_cli(client, store_30x20.path, "--out", str(out), "--max-iter", "2", "--overwrite")
    assert r.returncode == 2, r.stderr
    [line] = error_lines(r.stderr)
    assert line.startswith("ordnmf-dask fit: error: ") and str(out.resolve()) in line
    assert reason in line
    assert (tmp_path / "keep" / "notes.txt").read_text() == "x"
    assert open_store(store_30x20.path).attrs == before
    assert not (tmp_path / "s.zarr" / "m.zarr").exists()
    # the API refuses the same, and so does save()
    with pytest.raises(InputError, match=re.escape(reason)):
        OrdNMF(K, max_iter=1, n_members=1).fit(store_30x20, client, out=out, overwrite=True)


def test_overwrite_replaces_a_model_and_nothing_else_does(tmp_path, store_30x20, client):
    model = tmp_path / "m.zarr"
    first = OrdNMF(K, max_iter=2, executor="inprocess", n_members=1).fit(store_30x20, out=model)
    assert (
        json.loads((model / "zarr.json").read_text())["attributes"]["kind"] == "ordnmf_dask.model"
    )
    copy = OrdNMF.load(first.save(tmp_path / "copy.zarr"))
    r = fit_cli(client, store_30x20.path, "--out", str(model), "--max-iter", "3", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert OrdNMF.load(model).n_iter_ == 3
    # save() replaces a model only with overwrite, and never a non-model directory
    with pytest.raises(InputError, match="pass overwrite=True"):
        copy.save(model)
    (tmp_path / "keep").mkdir()
    with pytest.raises(InputError, match="not a model"):
        copy.save(tmp_path / "keep", overwrite=True)
    assert names(tmp_path / "keep") == []
    assert OrdNMF.load(copy.save(model, overwrite=True)).n_iter_ == 2
    # a model is not a store: ingest --overwrite refuses to replace it
    csv = tmp_path / "r.csv"
    csv.write_text("1,1,4\n1,2,3\n2,1,5\n")
    with pytest.raises(InputError, match="not a zarr store written by ordnmf_dask"):
        ingest(csv, model, overwrite=True)
    assert OrdNMF.load(model).n_iter_ == 2


def test_a_model_of_the_format_without_the_marker_is_recognised(tmp_path, store_30x20):
    """(In-process: the model a fit writes does not depend on where it ran.)"""
    model = tmp_path / "m.zarr"
    OrdNMF(K, max_iter=1, executor="inprocess", n_members=1).fit(store_30x20, out=model)
    meta = model / "zarr.json"
    doc = json.loads(meta.read_text())
    del doc["attributes"]["kind"]
    meta.write_text(json.dumps(doc))
    assert is_model(str(model))
    assert not is_model(store_30x20.path)
    refit = OrdNMF(K, max_iter=1, executor="inprocess", n_members=1).fit(
        store_30x20, out=model, overwrite=True
    )
    assert refit.n_iter_ == 1


def test_api_fit_refuses_an_existing_out_before_any_iteration(tmp_path, store_30x20, client):
    model = tmp_path / "m.zarr"
    OrdNMF(K, max_iter=1, n_members=1).fit(store_30x20, client, out=model)
    seen: list[int] = []
    with pytest.raises(InputError, match="already exists; pass overwrite=True"):
        OrdNMF(K, max_iter=3, n_members=1).fit(
            store_30x20, client, out=model, callback=lambda info: seen.append(info.iteration)
        )
    assert seen == []
    assert OrdNMF.load(model).n_iter_ == 1


def test_checkpoints_of_another_fit_are_kept_and_restart_removes_only_checkpoints(
    tmp_path, store_30x20, client
):
    ckpt = tmp_path / "ckpt"
    # the API fits in-process (the same bits as on the cluster), the CLI's on the cluster
    OrdNMF(
        K,
        max_iter=5,
        checkpoint_every=2,
        checkpoint_dir=str(ckpt),
        executor="inprocess",
        n_members=1,
    ).fit(store_30x20)
    ckpt.joinpath("notes.txt").write_text("not a checkpoint")
    ckpt.joinpath("ckpt-notes").mkdir()
    theirs = names(ckpt)
    assert theirs == ["ckpt-00000002", "ckpt-00000004", "ckpt-notes", "notes.txt"]

    other = [
        store_30x20.path,
        "--out",
        str(tmp_path / "b.zarr"),
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "2",
        "--max-iter",
        "5",
        "--seed",
        "1",
    ]
    r = fit_cli(client, *other)
    assert r.returncode == 2, r.stderr
    [line] = error_lines(r.stderr)
    assert f"{ckpt} holds checkpoints of another store or configuration" in line
    assert re.search(r"pass (--restart|restart=True) to discard them", line)  # (CLI spelling)
    with pytest.raises(InputError, match="holds checkpoints of another .* restart=True"):
        OrdNMF(
            K, max_iter=5, seed=1, checkpoint_dir=str(ckpt), executor="inprocess", n_members=1
        ).fit(store_30x20, resume=True)
    assert names(ckpt) == theirs
    assert not (tmp_path / "b.zarr").exists()

    r = fit_cli(client, *other, "--restart")
    assert r.returncode == 0, r.stderr
    assert f"restart: removed 2 checkpoint(s) from {ckpt}: ckpt-00000004 ckpt-00000002" in r.stderr
    assert names(ckpt) == theirs  # the new fit's own, at the same iterations
    assert ckpt.joinpath("notes.txt").read_text() == "not a checkpoint"
    fresh = OrdNMF(K, max_iter=5, seed=1, executor="inprocess", n_members=1).fit(store_30x20)
    assert OrdNMF.load(tmp_path / "b.zarr").elbo_ == fresh.elbo_


def test_an_unreadable_look_alike_is_refused_even_with_restart(tmp_path, store_30x20, client):
    """A directory named like a checkpoint that holds something else (here a user's file) is
    never removed; an empty one holds nothing to lose (a removal cut short) and goes."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "ckpt-00000003").mkdir(parents=True)
    (ckpt / "ckpt-00000003" / "notes.txt").write_text("mine")
    (ckpt / "ckpt-00000001").mkdir()
    for restart in (False, True):
        with pytest.raises(InputError, match="ckpt-00000003: named like a checkpoint"):
            est = OrdNMF(K, max_iter=2, checkpoint_dir=str(ckpt), n_members=1)
            est.fit(store_30x20, client, restart=restart)
    assert names(ckpt) == ["ckpt-00000003"]
    assert (ckpt / "ckpt-00000003" / "notes.txt").read_text() == "mine"


def test_a_second_identical_fit_resumes_to_the_uninterrupted_model(
    tmp_path, store_30x20, client, caplog
):
    # the uninterrupted fit and the first in-process (the same bits as on the cluster, and its
    # checkpoints are the cluster's too); the second resumes on the cluster
    whole = OrdNMF(K, max_iter=9, tol=1e-12, executor="inprocess", n_members=1).fit(store_30x20)
    ckpt = tmp_path / "ckpt"
    settings = dict(max_iter=9, tol=1e-12, checkpoint_every=4, checkpoint_dir=str(ckpt))
    OrdNMF(K, **settings, executor="inprocess", n_members=1).fit(
        store_30x20, out=tmp_path / "first.zarr"
    )
    assert names(ckpt) == ["ckpt-00000004", "ckpt-00000008"]
    seen: list[int] = []
    with caplog.at_level(logging.INFO, logger="ordnmf_dask"):
        again = OrdNMF(K, **settings, n_members=1).fit(
            store_30x20,
            client,
            out=tmp_path / "again.zarr",
            callback=lambda info: seen.append(info.iteration),
        )
    assert f"resuming from {ckpt / 'ckpt-00000008'} (iteration 8)" in caplog.text
    assert seen == [9]
    assert again.elbo_ == whole.elbo_
    np.testing.assert_array_equal(again.W_.compute(), whole.W_.compute())
    np.testing.assert_array_equal(again.H_.compute(), whole.H_.compute())
    # resume=True requires a checkpoint of this fit
    empty = tmp_path / "empty"
    with pytest.raises(InputError, match="cannot resume: no usable checkpoint"):
        OrdNMF(K, max_iter=9, checkpoint_dir=str(empty), executor="inprocess", n_members=1).fit(
            store_30x20, resume=True
        )


def test_restarts_share_a_checkpoint_dir_and_leave_only_what_was_there(tmp_path, store_30x20):
    """With n_init > 1, each run's checkpoints (named like the next run's) are removed when it
    ends; the directory's other files stay, and the result is the best single run's. (In-process:
    the checkpoints are the same on a cluster, test_engine checks the bits are.)"""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ckpt.joinpath("notes.txt").write_text("x")
    inprocess = dict(max_iter=5, executor="inprocess")
    best = OrdNMF(
        K, checkpoint_every=2, n_init=2, checkpoint_dir=str(ckpt), **inprocess, n_members=1
    ).fit(store_30x20)
    assert names(ckpt) == ["notes.txt"]
    singles = [OrdNMF(K, seed=s, **inprocess, n_members=1).fit(store_30x20).elbo_ for s in (0, 1)]
    assert best.elbo_ == max(singles, key=lambda e: e[-1])


def test_a_store_given_as_a_model_is_named_as_a_store(store_30x20):
    """Not a message about model format versions: the reader says what the path holds."""
    from ordnmf_dask.errors import StoreError
    from ordnmf_dask.modelstore.model import open_model

    with pytest.raises(StoreError, match=r"s\.zarr: is an ordnmf_dask store, not a model$"):
        open_model(store_30x20.path)


def test_a_symbolic_link_is_never_replaced(tmp_path, store_30x20):
    """--overwrite replaces only a directory the package wrote, never a link to one (removing a
    link's target, or failing half way through, are both wrong)."""
    from ordnmf_dask.store.blocks import check_target

    link = tmp_path / "link.zarr"
    link.symlink_to(store_30x20.path)
    with pytest.raises(InputError, match="is a symbolic link"):
        check_target(link, overwrite=True)
    assert open_store(store_30x20.path).nnz_train == store_30x20.nnz_train


def test_a_failed_replacement_leaves_the_old_directory(tmp_path, store_30x20, monkeypatch):
    """The old store goes aside and is removed only once the new one is in place."""
    import os

    from ordnmf_dask.store import blocks

    fresh = tmp_path / "fresh.zarr"
    fresh.mkdir()
    real_rename = os.rename

    def failing(src, dst):
        if os.fspath(src) == str(fresh):
            raise OSError("disk gone")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError, match="disk gone"):
        blocks.publish(str(fresh), store_30x20.path, lambda p: blocks.check_target(p, True))
    monkeypatch.undo()
    assert open_store(store_30x20.path).nnz_train == store_30x20.nnz_train
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.zarr", "s.zarr"]
