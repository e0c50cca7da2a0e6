"""One rule for every path a command writes (ordnmf_dask.store.outputs): never inside or equal to a
store, model, checkpoint directory or export, never an input, never another output of the same
command; a directory of ours is replaced only when it holds nothing else; checked before any
work. A run killed half way leaves temporary directories that the same command run again
removes (only those marked as its own), and a fit without --checkpoint-dir checkpoints beside
its model, so that running the same command again continues."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI, dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.engine import checkpoint
from ordnmf_dask.errors import InputError
from ordnmf_dask.modelstore.model import open_model

K = 2


@pytest.fixture
def paths(tmp_path) -> dict[str, Path]:
    """A store, a model fitted on it (in this process) and a CSV of ratings."""
    y = synthetic_ordinal(30, 20, 3, seed=4)
    store = store_from_dense(tmp_path / "b.zarr", *dense_split(y), 3, (2, 2))
    OrdNMF(K, max_iter=2, executor="inprocess", n_members=1).fit(store, out=tmp_path / "bm.zarr")
    csv = tmp_path / "r.csv"
    csv.write_text("1,1,4\n1,2,3\n2,1,5\n2,3,2\n3,2,4\n")
    return {"store": tmp_path / "b.zarr", "model": tmp_path / "bm.zarr", "csv": csv}


def snapshot(*directories: Path) -> dict[str, bytes]:
    """Every file under the directories, with its content."""
    return {
        str(p): p.read_bytes() for d in directories for p in sorted(d.rglob("*")) if p.is_file()
    }


def error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if " INFO " not in line]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["evaluate", "{store}", "{model}", "--json", "{store}/zarr.json"], "{store}"),
        (
            [
                "fit",
                "--n-members",
                "1",
                "{store}",
                "--out",
                "{tmp}/new.zarr",
                "-k",
                "2",
                "--log-file",
                "{model}/zarr.json",
            ],
            "{model}",
        ),
        (
            [
                "fit",
                "--n-members",
                "1",
                "{store}",
                "--out",
                "{tmp}/new.zarr",
                "-k",
                "2",
                "--checkpoint-dir",
                "{store}/ck",
            ],
            "{store}",
        ),
        (
            ["fit", "--n-members", "1", "{store}", "--out", "{model}/W/new.zarr", "-k", "2"],
            "{model}",
        ),
        (["export", "{model}", "--out", "{store}/users/ex"], "{store}"),
        (["recommend", "{store}", "{model}", "--out", "{model}/recs"], "{model}"),
        (["ingest", "{csv}", "--out", "{model}/s.zarr", "--test-fraction", "0"], "{model}"),
        (["ingest", "{csv}", "--out", "{tmp}/new.zarr", "--log-file", "{csv}"], "{csv}"),
    ],
)
def test_no_output_goes_inside_a_store_a_model_or_an_input(paths, tmp_path, capsys, args, where):
    """Refused with exit 2 and one line naming the output and what holds it, before anything
    is read or written: the store, the model and the input are as they were."""
    names = {k: str(v) for k, v in paths.items()} | {"tmp": str(tmp_path)}
    before = snapshot(paths["store"], paths["model"]) | {"csv": paths["csv"].read_bytes()}
    assert main([a.format(**names) for a in args]) == 2
    line = error_line(capsys)
    assert line.startswith(f"ordnmf-dask {args[0]}: error: refusing to write --"), line
    assert where.format(**names) in line
    assert snapshot(paths["store"], paths["model"]) | {"csv": paths["csv"].read_bytes()} == before
    assert not (tmp_path / "new.zarr").exists()


def test_a_checkpoint_dir_that_is_the_model_is_refused_before_the_first_iteration(
    paths, tmp_path, capsys
):
    out = tmp_path / "m.zarr"
    assert (
        main(
            [
                "fit",
                "--n-members",
                "1",
                str(paths["store"]),
                "--out",
                str(out),
                "--checkpoint-dir",
                str(out),
                "-k",
                "2",
                "--max-iter",
                "3",
            ]
        )
        == 2
    )
    assert error_line(capsys) == (
        f"ordnmf-dask fit: error: --checkpoint-dir ({out}) is the same path as --out ({out}): "
        "give each output its own path"
    )
    assert not out.exists()
    seen: list[int] = []
    with pytest.raises(InputError, match=r"checkpoint_dir \(.*\) is inside out"):
        OrdNMF(
            K, max_iter=3, executor="inprocess", checkpoint_dir=str(out / "ck"), n_members=1
        ).fit(paths["store"], out=out, callback=lambda info: seen.append(info.iteration))
    assert seen == []
    assert not out.exists()


def test_a_directory_holding_a_users_file_is_not_replaced(paths, tmp_path, capsys):
    """--overwrite replaces a model, an export or a store of ours, but not one a user put a
    file into: the command names the file and everything stays."""
    model, store = paths["model"], paths["store"]
    (model / "NOTES.txt").write_text("mine")
    before = snapshot(model)
    assert (
        main(
            [
                "fit",
                "--n-members",
                "1",
                str(store),
                "--out",
                str(model),
                "-k",
                "2",
                "--max-iter",
                "2",
                "--overwrite",
            ]
        )
        == 2
    )
    line = error_line(capsys)
    assert f"refusing to overwrite {model}: it holds {model / 'NOTES.txt'}" in line
    assert snapshot(model) == before
    (model / "NOTES.txt").unlink()

    ex = tmp_path / "ex"
    assert main(["export", str(model), "--out", str(ex), "--what", "factors"]) == 0
    (ex / "user_factors" / "notes.txt").write_text("mine")
    before = snapshot(ex)
    assert main(["export", str(model), "--out", str(ex), "--overwrite"]) == 2
    assert f"it holds {ex / 'user_factors' / 'notes.txt'}" in error_line(capsys)
    assert snapshot(ex) == before

    (store / "README").write_text("mine")
    assert (
        main(
            [
                "ingest",
                str(paths["csv"]),
                "--out",
                str(store),
                "--overwrite",
                "--test-fraction",
                "0",
            ]
        )
        == 2
    )
    assert f"it holds {store / 'README'}" in error_line(capsys)
    assert (store / "README").read_text() == "mine"
    assert open_model(str(model)).attrs["n_iter"] == 2


# ------------------------------------------------------------------- killed, then run again


def _kill_when(cmd: list[str], appears: str, where: Path, signum: int, tries: int = 5) -> None:
    """Run ``cmd`` in its own process group and send ``signum`` to the group as soon as a
    path matching ``appears`` exists under ``where``, so that it is still there after (again,
    after removing the command's output, if it got past that point first)."""
    out = Path(cmd[cmd.index("--out") + 1])
    for _ in range(tries):
        job = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 120
            while job.poll() is None and time.monotonic() < deadline:
                if list(where.glob(appears)):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(job.pid, signum)
                    job.wait(30)
                    break
                time.sleep(0.001)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        if job.returncode != 0 and list(where.glob(appears)) and not out.exists():
            return
        assert job.returncode in (0, -signum, 128 + signum), cmd
        shutil.rmtree(out)  # published: the run again leaves as much as before
    pytest.fail(f"{cmd} always got past {appears} before it could be stopped")


def test_an_export_killed_half_way_is_cleaned_by_the_same_command(tmp_path):
    y = synthetic_ordinal(400, 200, 3, density=0.3, seed=2)
    store = store_from_dense(tmp_path / "b.zarr", *dense_split(y), 3, (8, 4))
    model = tmp_path / "bm.zarr"
    OrdNMF(K, max_iter=2, executor="inprocess", n_members=1).fit(store, out=model)
    mine = tmp_path / "ex.tmp-mine"  # named like ours, but not marked: a user's
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    cmd = [*CLI, "export", str(model), "--out", str(tmp_path / "ex"), "-n", "50"]
    _kill_when(cmd, "ex.tmp-[0-9a-f][0-9a-f]*/*/*", tmp_path, signal.SIGKILL)
    assert len(list(tmp_path.glob("ex.tmp-*"))) == 2  # the killed run's and the user's
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert [p.name for p in tmp_path.glob("ex.tmp-*")] == ["ex.tmp-mine"]
    assert (mine / "notes.txt").read_text() == "x"
    assert json.loads((tmp_path / "ex" / "_SUCCESS").read_text())["kind"] == "ordnmf_dask.export"


@pytest.mark.cluster
def test_a_distributed_ingest_killed_half_way_is_cleaned_by_the_same_command(tmp_path):
    rng = np.random.default_rng(0)
    lines = [
        f"{u},{i},{v}"
        for u, i, v in zip(
            rng.integers(0, 3000, 20000),
            rng.integers(0, 500, 20000),
            rng.integers(1, 6, 20000),
            strict=True,
        )
    ]
    csv = tmp_path / "r.csv"
    csv.write_text("\n".join(dict.fromkeys(lines)) + "\n")
    cmd = [
        *CLI,
        "ingest",
        str(csv),
        "--out",
        str(tmp_path / "d.zarr"),
        "--distributed",
        "--workers",
        "1",
        "--chunk-bytes",
        "20000",
        "--duplicates",
        "last",
    ]
    _kill_when(cmd, "d.zarr.tmp-*/*/*", tmp_path, signal.SIGKILL)
    assert list(tmp_path.glob("d.zarr.tmp-*"))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert not list(tmp_path.glob("d.zarr.tmp-*"))


# ------------------------------------------------------- checkpoints beside the model


def test_a_fit_terminated_and_run_again_continues_from_its_checkpoint(tmp_path):
    """Without --checkpoint-dir: the fit checkpoints in MODEL.checkpoints; SIGTERM ends it
    (143), the same command continues from there and removes them once the model is saved,
    which is the uninterrupted fit's."""
    y = synthetic_ordinal(120, 60, 4, density=0.3, seed=3)
    store = store_from_dense(tmp_path / "b.zarr", *dense_split(y), 4, (2, 2))
    out = tmp_path / "m.zarr"
    beside = tmp_path / "m.zarr.checkpoints"
    cmd = [
        *CLI,
        "fit",
        "--n-members",
        "1",
        store.path,
        "--out",
        str(out),
        "-k",
        "3",
        "--max-iter",
        "24",
        "--tol",
        "1e-12",
        "--checkpoint-every",
        "3",
        "--executor",
        "inprocess",
    ]
    _kill_when(cmd, "m.zarr.checkpoints/ckpt-0000000[0-9]", tmp_path, signal.SIGTERM)
    left = sorted(p.name for p in beside.glob("ckpt-*") if not p.name.endswith(".tmp"))
    assert left and not out.exists()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"resuming from {beside / left[-1]}" in run.stderr
    assert not beside.exists()
    whole = OrdNMF(3, max_iter=24, tol=1e-12, executor="inprocess", n_members=1).fit(store)
    assert open_model(str(out)).attrs["elbo"] == whole.elbo_


def test_checkpoints_beside_a_model_of_another_configuration_are_replaced(paths, capsys):
    """They are provably this package's (the directory's marker): a fit with another -k
    replaces them instead of refusing forever; a directory of that name that a user made is
    refused, and kept."""
    store, model = paths["store"], str(paths["model"])
    beside = checkpoint.beside(model)
    checkpoint.make_beside(beside, model)
    OrdNMF(
        K, max_iter=5, checkpoint_every=2, checkpoint_dir=beside, executor="inprocess", n_members=1
    ).fit(store)
    assert sorted(os.listdir(beside)) == ["_ORDNMF_CHECKPOINTS", "ckpt-00000002", "ckpt-00000004"]
    assert (
        main(
            [
                "fit",
                "--n-members",
                "1",
                str(store),
                "--out",
                model,
                "-k",
                "3",
                "--max-iter",
                "4",
                "--checkpoint-every",
                "2",
                "--overwrite",
            ]
        )
        == 0
    )
    assert (
        f"removed 2 checkpoint(s) of another configuration from {beside}" in capsys.readouterr().err
    )
    assert not os.path.exists(beside)
    assert open_model(model).attrs["params"]["n_components"] == 3

    os.mkdir(beside)
    Path(beside, "notes.txt").write_text("mine")
    assert (
        main(["fit", "--n-members", "1", str(store), "--out", model, "-k", "2", "--overwrite"]) == 2
    )
    assert f"error: {beside}: exists and was not made by ordnmf_dask" in error_line(capsys)
    assert os.listdir(beside) == ["notes.txt"]
    assert open_model(model).attrs["params"]["n_components"] == 3


def test_only_marked_temporary_directories_of_a_gone_process_are_removed(tmp_path):
    """What an interrupted write leaves (its tasks may still write there: the marker stays) is
    removed by the next write to the same destination; a directory of another destination, of
    a process still running, or without the marker is not."""
    from ordnmf_dask.store.blocks import TMP_MARK, discard_temporary, temporary_path

    dest = str(tmp_path / "d.zarr")
    tmp, scratch = temporary_path(dest)
    os.makedirs(os.path.join(tmp, "_staging"))
    discard_temporary(scratch, settled=False)
    assert os.listdir(scratch) == [TMP_MARK]
    os.makedirs(os.path.join(tmp, "_staging"))  # a task that was still running writes on
    Path(tmp, "_staging", "0.npy").write_bytes(b"x")
    doc = json.loads(Path(scratch, TMP_MARK).read_text())
    gone = subprocess.Popen(["true"])  # a process that has ended
    gone.wait()
    Path(scratch, TMP_MARK).write_text(json.dumps({**doc, "pid": gone.pid}))
    _, live_scratch = temporary_path(dest)  # this process: running
    _, other_scratch = temporary_path(str(tmp_path / "e.zarr"))
    other_doc = json.loads(Path(other_scratch, TMP_MARK).read_text())
    Path(other_scratch, TMP_MARK).write_text(json.dumps({**other_doc, "pid": gone.pid}))
    unmarked = tmp_path / "d.zarr.tmp-000000000000"
    unmarked.mkdir()
    _, newest_scratch = temporary_path(dest)
    assert not os.path.exists(scratch)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            *(os.path.basename(p) for p in (live_scratch, other_scratch, unmarked, newest_scratch)),
            "d.zarr.lock",  # held by this process's writes, until they discard their directory
            "e.zarr.lock",
        ]
    )
    for held in (newest_scratch, live_scratch, other_scratch):
        discard_temporary(held)
    assert not os.path.exists(newest_scratch)
    assert sorted(p.name for p in tmp_path.iterdir()) == [os.path.basename(unmarked)]
