"""One writer per output, one version per reader, for the Python API (docs/design.md, "Safety
rules"): every writer of a local output (ingest, synth, fit, save, export, predict_pairs)
takes its lock where it prepares and starts writing (``store/blocks.py``), so a second writer
is refused before any work, naming the first; a store replaced while it is read is an error
saying it changed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SMALL_CSV, dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF, export, ingest, predict_pairs
from ordnmf_dask.datasets.synth import synth
from ordnmf_dask.errors import InputError
from ordnmf_dask.store import writelock


def api_writers(small_fitted: tuple[Path, Path], tmp_path: Path) -> dict[str, object]:
    """Each API writer of a local output, as a function of that output."""
    store, model = small_fitted
    csv = tmp_path / "r.csv"
    csv.write_text(SMALL_CSV)
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"user": np.array([0, 1]), "item": np.array([0, 2])}), pairs)
    return {
        "ingest": lambda out: ingest(str(csv), out, test_fraction=0.2),
        "synth": lambda out: synth(out, 20, 15, 100, 2, n_classes=3),
        "save": lambda out: OrdNMF.load(model).save(out),
        "export": lambda out: export(str(model), out, store=str(store), n=2),
        "predict_pairs": lambda out: predict_pairs(str(model), str(pairs), out),
    }


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def left_beside(out: Path) -> list[str]:
    """What the writes to ``out`` left beside it (its lock, temporary directories)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f"{out.name}."))


def test_a_second_api_writer_of_the_same_out_is_refused_and_the_first_goes_on(
    small_fitted, tmp_path
):
    """A fit through the API in another process writes ``m.zarr`` (paused by its callback);
    every API writer of ``m.zarr`` in this process is refused in one line naming that process,
    writes nothing, and the first then publishes an intact model."""
    store, _ = small_fitted
    out, started, stop = tmp_path / "m.zarr", tmp_path / "started", tmp_path / "stop"
    script = textwrap.dedent(f"""
        import os, time
        from ordnmf_dask import OrdNMF

        def pause(info):
            open({str(started)!r}, "w").close()
            while not os.path.exists({str(stop)!r}):
                time.sleep(0.05)
            return True

        OrdNMF(2, max_iter=50, executor="inprocess", n_members=1).fit(
            {str(store)!r}, out={str(out)!r}, callback=pause
        )
    """)
    first = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(started, first)
        for name, write in api_writers(small_fitted, tmp_path).items():
            with pytest.raises(InputError) as caught:
                write(str(out))
            [line] = str(caught.value).splitlines()
            assert f"is being written by process {first.pid} on " in line, (name, line)
            assert f"lock file {out}.lock" in line, (name, line)
            assert left_beside(out) == ["m.zarr.lock"], name  # nothing of the second writer
            assert first.poll() is None, name  # the first goes on
    finally:
        stop.touch()
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert OrdNMF.load(out).n_components == 2  # the first writer's model, complete
    assert left_beside(out) == []  # its lock given back


def test_a_second_api_writer_is_refused_while_a_save_writes(small_fitted, tmp_path):
    """The lock of a writer other than fit: a live process holding ``dest.zarr.lock`` (as
    ``save`` takes it) refuses this process's save; a live one holding it by another pid of
    this host is never taken over."""
    _, model = small_fitted
    out = tmp_path / "dest.zarr"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        doc = {"kind": writelock.LOCK_KIND, "host": socket.gethostname(), "pid": live.pid}
        (tmp_path / "dest.zarr.lock").write_text(json.dumps(doc))
        with pytest.raises(InputError, match=f"being written by process {live.pid} on "):
            OrdNMF.load(model).save(out)
        assert left_beside(out) == ["dest.zarr.lock"] and not out.exists()
        assert json.loads((tmp_path / "dest.zarr.lock").read_text()) == doc
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait()


@pytest.mark.parametrize("name", ["ingest", "synth", "save", "export", "predict_pairs"])
def test_a_stale_lock_of_a_dead_pid_is_taken_over_by_every_api_writer(small_fitted, tmp_path, name):
    gone = subprocess.Popen(["true"])
    gone.wait()
    out = tmp_path / "w.out"
    doc = {"kind": writelock.LOCK_KIND, "host": socket.gethostname(), "pid": gone.pid}
    (tmp_path / "w.out.lock").write_text(json.dumps(doc))
    api_writers(small_fitted, tmp_path)[name](str(out))
    assert out.is_dir()
    assert left_beside(out) == []  # taken over, then given back


def test_a_signal_while_the_lock_is_written_leaves_no_lock(small_fitted, tmp_path, monkeypatch):
    _, model = small_fitted

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(writelock.json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        OrdNMF.load(model).save(tmp_path / "dest.zarr")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_locks_are_on_local_paths_only():
    assert writelock.take("memory://bucket/m.zarr") is None
    writelock.give_back(None)
    assert os.path.basename(writelock.lock_path("/a/m.zarr/")) == "m.zarr.lock"


def replace_store(path: Path, tmp_path: Path) -> None:
    """``ingest --overwrite`` of another store at ``path``, by another process."""
    from conftest import CLI

    csv = tmp_path / "other.csv"
    csv.write_text(SMALL_CSV)
    done = subprocess.run(
        [*CLI, "ingest", str(csv), "--out", str(path), "--overwrite", "-q"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr


def test_a_store_replaced_after_it_was_opened_is_an_error_saying_it_changed(tmp_path):
    """One version per reader: blocks read after a publish replaced the store opened are
    refused, never blocks of the new store under the old one's bounds; opening it again reads
    the new one."""
    from ordnmf_dask.errors import StoreError
    from ordnmf_dask.store.blocks import open_store, read_block, read_ids

    train, test = dense_split(synthetic_ordinal(20, 15, 3, seed=2))
    info = store_from_dense(tmp_path / "s.zarr", train, test, 3, (2, 2))
    before = read_block(info.path, "train", 0, 0)
    replace_store(Path(info.path), tmp_path)
    with pytest.raises(StoreError, match="the store changed while it was read"):
        read_block(info.path, "train", 0, 0)
    with pytest.raises(StoreError, match="the store changed while it was read"):
        read_ids(info.path, "users")
    with pytest.raises(StoreError, match="the store changed while it was read"):
        with info.reading():
            pass
    again = open_store(info.path)  # a new reader: the new version
    assert again.version != info.version and again.n_users == 12 != info.n_users
    assert read_block(info.path, "train", 0, 0).shape != before.shape or again.grid != info.grid
    with again.reading():
        read_block(info.path, "train", 0, 0)


def test_evaluate_of_a_store_replaced_meanwhile_says_it_changed(small_fitted, tmp_path):
    import shutil

    from ordnmf_dask import evaluate
    from ordnmf_dask.errors import StoreError
    from ordnmf_dask.store.blocks import open_store

    store, model = small_fitted
    copy = tmp_path / "o.zarr"
    shutil.copytree(store, copy)
    info = open_store(copy)  # opened, then replaced before its blocks are read
    replace_store(copy, tmp_path)
    with pytest.raises(StoreError, match="the store changed while it was read"):
        evaluate(info, str(model), allow_other_store=True, n_workers=1)
