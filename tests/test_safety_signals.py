"""The safety rule about signals (docs/design.md, "Safety rules"): SIGINT or SIGTERM at any
moment of a write leaves no temporary directory behind, and the command README advises to run
again afterwards works. Numbered cases are those of issue 38."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI, dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF
from ordnmf_dask.sources.ingest import ingest_arrays
from ordnmf_dask.store import blocks

SAFETY = 240.0  # seconds: only a bound for a stuck command, never a timing assertion


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("signals")
    train, test = dense_split(synthetic_ordinal(20, 15, 3, seed=2))
    store = store_from_dense(where / "s.zarr", train, test, 3, (2, 2))
    return Path(
        OrdNMF(2, max_iter=2, executor="inprocess", n_members=1)
        .fit(store, out=where / "m.zarr")
        .model_path_
    )


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name or p.suffix == ".lock")


def test_16_a_signal_before_the_temporary_marker_leaves_no_directory(model, tmp_path, monkeypatch):
    """The window between making OUT.tmp-<id> and writing its marker: the directory goes."""
    real_dump = json.dump

    def interrupted(doc, fh, *args, **kwargs):
        if str(fh.name).endswith(f"{blocks.TMP_MARK}.part"):  # the marker, not the lock
            raise KeyboardInterrupt
        return real_dump(doc, fh, *args, **kwargs)

    monkeypatch.setattr(blocks.json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        OrdNMF.load(model).save(tmp_path / "dest.zarr")
    monkeypatch.setattr(blocks.json, "dump", real_dump)
    assert leftovers(tmp_path) == []


def test_16_what_a_killed_save_left_before_its_marker_is_removed_by_the_next(model, tmp_path):
    """A process killed (SIGKILL, or SIGTERM without a handler) right after making its
    temporary directory leaves it without a marker: the next write to the same place removes
    it once it is older than a live writer can be, and nothing else."""
    old = time.time() - 3600
    left = tmp_path / "dest.zarr.tmp-0123456789ab"
    left.mkdir()
    (left / "_ORDNMF_TMP.part").write_text("")
    os.utime(left, (old, old))
    recent = tmp_path / "dest.zarr.tmp-abcdefabcdef"  # a live writer's, a moment ago
    recent.mkdir()
    mine = tmp_path / "dest.zarr.tmp-notes"  # not a name this package makes
    mine.mkdir()
    os.utime(mine, (old, old))
    OrdNMF.load(model).save(tmp_path / "dest.zarr")
    assert not left.exists() and recent.exists() and mine.exists()


def test_16_an_interrupted_write_leaves_nothing_once_its_pool_is_closed(model, tmp_path):
    """A write interrupted while its tasks ran keeps its directory (marked) while a task might
    still write there; once the in-process pool or LocalCluster that ran them is closed, it
    goes."""
    from ordnmf_dask.runtime.cluster import choose_client
    from ordnmf_dask.store.blocks import open_store

    info = open_store(model.parent / "s.zarr")
    with choose_client(None, info, 2, "inprocess"):
        _, scratch = blocks.temporary_path(str(tmp_path / "d.zarr"))
        blocks.discard_temporary(scratch, settled=False)  # interrupted, tasks unsettled
        assert os.path.isdir(scratch)  # kept while the pool may still run them
    assert leftovers(tmp_path) == []


def wait_for(found, job: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + SAFETY
    while not found():
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.02)


@pytest.mark.cluster
def test_16_sigterm_during_a_distributed_ingest_leaves_no_staged_files(tmp_path):
    rng = np.random.default_rng(0)
    n = 400_000
    rows = np.column_stack(
        [rng.integers(0, 5000, n), rng.integers(0, 3000, n), rng.integers(1, 6, n)]
    )
    np.savetxt(tmp_path / "big.csv", rows, fmt="%d", delimiter=",")
    job = subprocess.Popen(
        [
            *CLI,
            "ingest",
            str(tmp_path / "big.csv"),
            "--out",
            str(tmp_path / "d.zarr"),
            "--distributed",
            "--workers",
            "1",
            "--chunk-bytes",
            "1000000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: list(tmp_path.glob("d.zarr.tmp-*/out/_staging")), job, "staging")
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=SAFETY)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 143, err
    assert [line for line in err.splitlines() if " INFO " not in line] == [
        "ordnmf-dask ingest: error: terminated (SIGTERM)"
    ]
    assert leftovers(tmp_path) == [] and not (tmp_path / "d.zarr").exists()


@pytest.mark.cluster
def test_15_tune_after_sigterm_runs_again_as_readme_advises(tmp_path):
    y = synthetic_ordinal(150, 90, 5, k=3, density=0.3, seed=0)
    u, i = np.nonzero(y)
    store = ingest_arrays(
        u,
        i,
        y[u, i],
        tmp_path / "val.zarr",
        ratings="integer",
        grid=(2, 2),
        test_fraction=0.2,
        validation_fraction=0.2,
        seed=1,
    )
    out = tmp_path / "tune"
    cmd = [
        *CLI,
        "tune",
        store.path,
        "--out",
        str(out),
        "-k",
        "2,3",
        "--max-iter",
        "9",  # rungs of 1, 3 and 9 iterations (eta 3): every step of a tune, done quickly
        "--workers",
        "1",
    ]
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (out / "tune.json").exists(), job, "tune.json")
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=SAFETY)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 143, err
    assert [line for line in err.splitlines() if " INFO " not in line] == [
        "ordnmf-dask tune: error: terminated (SIGTERM)"
    ], err
    assert "best" not in json.loads((out / "tune.json").read_text())
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=SAFETY * 2)
    assert again.returncode == 0, again.stderr
    assert "best" in json.loads((out / "tune.json").read_text())
    assert (out / "best").is_dir() and leftovers(tmp_path) == [] and leftovers(out) == []
    # a finished tune is still kept unless --overwrite is given
    refused = subprocess.run([*cmd, "-q"], capture_output=True, text=True, timeout=SAFETY)
    assert refused.returncode == 2 and "holds an earlier tune's results" in refused.stderr


# ------------------------------------------------------------------------ 17: process limits


def limited(kind: int, value: int):
    """A ``preexec_fn`` setting the resource limit ``kind`` of the child to ``value``."""
    import resource

    return lambda: resource.setrlimit(kind, (value, value))


def test_17_too_few_open_files_for_a_local_cluster_is_one_line_naming_ulimit(model):
    import resource

    r = subprocess.run(
        [
            *CLI,
            "fit",
            "--n-members",
            "1",
            str(model.parent / "s.zarr"),
            "--out",
            str(model.parent / "x.zarr"),
            "-k",
            "2",
            "--executor",
            "cluster",
            "--workers",
            "1",
            "--max-iter",
            "2",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=SAFETY,  # on main the workers never start: the command hangs
        preexec_fn=limited(resource.RLIMIT_NOFILE, 24),
    )
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.splitlines()
    assert "may open only 24 (ulimit -n" in line and "`ulimit -n 1024`" in line, line
    assert not (model.parent / "x.zarr").exists()


def test_17_the_memory_check_sees_the_address_space_limit(tmp_path):
    import resource

    rng = np.random.default_rng(0)
    u = np.concatenate([np.arange(20000), rng.integers(0, 20000, 40000)])
    i = np.concatenate([np.arange(20000) % 2000, rng.integers(0, 2000, 40000)])
    store = ingest_arrays(
        u,
        i,
        rng.integers(1, 6, len(u)),
        tmp_path / "big.zarr",
        ratings="integer",
        duplicates="last",
    )
    assert (store.n_users, store.n_items) == (20000, 2000)
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
            "500",
            "--max-iter",
            "2",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=SAFETY,
        preexec_fn=limited(resource.RLIMIT_AS, int(1.2 * (1 << 30))),
    )
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.splitlines()
    assert "address-space limit of 1.2 GiB (ulimit -v)" in line, line
    assert not (tmp_path / "m.zarr").exists()


@pytest.mark.parametrize("delay", [0.0, 0.4, 0.8, 1.2, 1.6, 2.0, 2.5, 3.0])
def test_16_sigint_at_any_moment_of_fit_overwrite_leaves_the_old_model_or_the_new(
    model, tmp_path, delay
):
    """SIGINT once the command holds its lock, then ``delay`` seconds later (through the fit,
    the save and the publish): the command ends with 0 or 130, and what is left is a complete
    model (the old one or the new one) and nothing else: no temporary, aside or lock."""
    import shutil

    out = tmp_path / "m.zarr"
    shutil.copytree(model, out)
    job = subprocess.Popen(
        [
            *CLI,
            "fit",
            "--n-members",
            "1",
            str(model.parent / "s.zarr"),
            "--out",
            str(out),
            "-k",
            "2",
            "--executor",
            "inprocess",
            "--max-iter",
            "30",
            "--overwrite",
            "-q",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: (tmp_path / "m.zarr.lock").exists() or job.poll() is not None, job, "the lock"
        )
        time.sleep(delay)
        job.send_signal(signal.SIGINT)
        _, err = job.communicate(timeout=SAFETY)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode in (0, 130), err
    assert sorted(p.name for p in tmp_path.iterdir()) in (
        ["m.zarr"],
        ["m.zarr", "m.zarr.checkpoints"],
    )
    OrdNMF.load(out)  # complete


def test_an_interruption_met_inside_an_eval_still_exits_130(tmp_path):
    """A Ctrl-C that arrives inside an ``eval`` of a string (namedtuple's, while psutil
    imports: found by signalling ``synth`` at random moments) is caught and reported, exit
    130; CPython's mark of an unhandled KeyboardInterrupt made ``python -m ordnmf_dask`` kill
    itself with SIGINT at exit instead (-2). A real process, run as ``python -m``."""
    (tmp_path / "stopped_in_eval.py").write_text(
        "import sys\n"
        "from ordnmf_dask.app import cli, commands\n"
        "def stopped(args):\n"
        "    exec('raise KeyboardInterrupt')\n"
        "commands.COMMANDS['info'] = stopped\n"
        "sys.exit(cli.main())\n"
    )
    import ordnmf_dask

    paths = [str(Path(ordnmf_dask.__file__).parents[1]), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(
        [sys.executable, "-m", "stopped_in_eval", "info", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, done
    assert done.stderr.splitlines() == ["ordnmf-dask info: error: interrupted"]
