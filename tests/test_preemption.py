"""A fit preempted the way batch schedulers do it (SIGTERM to the job, a grace period, then
SIGKILL) and resubmitted with the identical command ends with the model of an uninterrupted run
(also when warm-started from last period's model); a scheduled job run twice resumes; a job
resubmitted after its configuration changed is refused before any work, losing nothing.

Each preempted job is its own process group with its own LocalCluster, as a batch job is: the
signals go to the whole group, workers included. The uninterrupted references and the jobs that
are not preempted run in-process (``--executor inprocess``): the project promises the same bits
as on a cluster (tests/test_engine.py checks it), and a LocalCluster costs seconds to start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import CLI, dense_split, store_from_dense, synthetic_ordinal

GRACE = 3.0  # seconds between SIGTERM and SIGKILL
# a guard against a hung test only: the waits below end on events (a checkpoint appearing, a
# process exiting), never on a budget tuned to the machine's speed
SAFETY = 900.0


def command(store: str, out: Path, ckpt: Path, cluster: bool = True) -> list[str]:
    """The job: 10 iterations, a checkpoint every 2 (room for the preemptions before the
    last), on a LocalCluster of its own or in-process."""
    return [
        *CLI,
        "fit",
        "--n-members",
        "1",
        store,
        "--out",
        str(out),
        "-k",
        "4",
        "--max-iter",
        "10",
        "--tol",
        "1e-12",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "2",
        "--overwrite",
        *(["--workers", "1"] if cluster else ["--executor", "inprocess"]),
    ]


def checkpoints(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.glob("ckpt-*") if not p.name.endswith(".tmp"))


def preempt(cmd: list[str], ckpt: Path, after: list[str]) -> list[str]:
    """Start ``cmd``; once a checkpoint newer than ``after`` exists, SIGTERM the job's process
    group, wait GRACE seconds, SIGKILL whatever is left; return the checkpoints then."""
    job = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + SAFETY
        while job.poll() is None:
            done = checkpoints(ckpt)
            if done and (not after or done[-1] > after[-1]):
                break
            assert time.monotonic() < deadline, f"no new checkpoint in {SAFETY}s"
            time.sleep(0.05)
        assert job.poll() is None, f"the job ended before it could be preempted: {job.stderr}"
        os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(GRACE)
        except subprocess.TimeoutExpired:
            pass
    finally:
        _kill_group(job)
    return checkpoints(ckpt)


def _kill_group(job: subprocess.Popen) -> None:
    """SIGKILL whatever is left of ``job``'s process group (the scheduler's last word)."""
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait()


def _alive(group: int, within: float) -> bool:
    """Whether a process of ``group`` still exists after waiting up to ``within`` seconds (a
    zombie helper is reaped by init shortly after its parent exits)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.1)
    return True


def factors(model: Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(str(model), mode="r")
    return {
        f"{name}/{j}/{field}": group[f"{name}/{j}/{field}"][...]
        for name in ("W", "H")
        for j in group[name].group_keys()
        for field in ("mean", "geo", "shape", "prior_rate")
    }


@pytest.mark.cluster
def test_preempted_twice_then_resubmitted_ends_with_the_uninterrupted_model(tmp_path):
    """Preempted once before any checkpoint existed, once after resuming from one (a third
    preemption would resume and be preempted exactly as the second), then resubmitted."""
    y = synthetic_ordinal(600, 300, 5, density=0.2, seed=3)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 5, (2, 2)).path

    reference = subprocess.run(
        command(store, tmp_path / "ref.zarr", tmp_path / "ck-ref", cluster=False),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reference.returncode == 0, reference.stderr

    out, ckpt = tmp_path / "m.zarr", tmp_path / "ck"
    seen: list[str] = []
    for _ in range(2):
        seen = preempt(command(store, out, ckpt), ckpt, seen)
        assert seen, "no checkpoint survived the preemption"
    assert not out.exists()

    final = subprocess.run(command(store, out, ckpt), capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    assert "resuming from" in final.stderr
    ref_attrs = dict(zarr.open_group(str(tmp_path / "ref.zarr"), mode="r").attrs)
    attrs = dict(zarr.open_group(str(out), mode="r").attrs)
    assert attrs["elbo"] == ref_attrs["elbo"] and attrs["n_iter"] == 10
    expected, got = factors(tmp_path / "ref.zarr"), factors(out)
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_a_scheduled_job_run_twice_keeps_its_model_and_its_checkpoints(tmp_path):
    """The same command on the same store again: it continues from its own checkpoints (no
    deletion, no cold start) and replaces only its own model, with the same result."""
    y = synthetic_ordinal(200, 120, 4, density=0.25, seed=5)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 4, (1, 2)).path
    out, ckpt = tmp_path / "m.zarr", tmp_path / "ck"
    (tmp_path / "notes.txt").write_text("kept")
    first = subprocess.run(
        command(store, out, ckpt, cluster=False), capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr
    before = factors(out)
    kept = checkpoints(ckpt)
    assert kept
    second = subprocess.run(
        command(store, out, ckpt, cluster=False), capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stderr
    assert "resuming from" in second.stderr
    after = factors(out)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    assert set(kept) <= set(checkpoints(ckpt))
    assert (tmp_path / "notes.txt").read_text() == "kept"


@pytest.mark.cluster
def test_sigterm_ends_the_job_cleanly(tmp_path):
    """SIGTERM to the command alone (not its group): it stops its own LocalCluster, says so in
    one line, exits 143 with no process of its cluster left, and leaves no model behind. (How
    soon is not asserted: on a loaded machine stopping a cluster takes what it takes.)"""
    y = synthetic_ordinal(600, 300, 5, density=0.2, seed=3)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 5, (2, 2)).path
    out, ckpt = tmp_path / "m.zarr", tmp_path / "ck"
    cmd = command(store, out, ckpt)
    cmd[cmd.index("10")] = "200"  # long enough to be running when the signal comes
    job = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + SAFETY
        while not checkpoints(ckpt) and job.poll() is None:
            assert time.monotonic() < deadline, f"no checkpoint in {SAFETY}s"
            time.sleep(0.05)
        assert job.poll() is None, job.stderr.read() if job.stderr else ""
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=SAFETY)
        assert job.returncode == 143, err
        errors = [line for line in err.splitlines() if " INFO " not in line]
        assert errors == ["ordnmf-dask fit: error: terminated (SIGTERM)"], err
        assert not _alive(job.pid, within=SAFETY), "workers of its cluster are still running"
    finally:
        _kill_group(job)
    assert not out.exists() and not list(tmp_path.glob("m.zarr*"))


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " INFO " not in line and line.strip()]


def test_a_job_resubmitted_after_its_config_changed_is_refused_and_loses_nothing(tmp_path):
    """The job file changed between two submissions (here the seed): the resubmitted job stops
    before any iteration with exit 2 and one line naming --restart, keeping the checkpoints and
    the model of the last run; with --restart it discards only its checkpoints and runs."""
    y = synthetic_ordinal(200, 120, 4, density=0.25, seed=5)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 4, (1, 2)).path
    out, ckpt = tmp_path / "m.zarr", tmp_path / "ck"
    first = subprocess.run(
        command(store, out, ckpt, cluster=False), capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr
    before, kept = factors(out), checkpoints(ckpt)
    changed = [*command(store, out, ckpt, cluster=False), "--seed", "1"]
    refused = subprocess.run(changed, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr
    [line] = _error_lines(refused.stderr)
    assert "holds checkpoints of another store or configuration" in line and "--restart" in line
    assert " iter " not in refused.stderr  # refused before the first iteration
    assert checkpoints(ckpt) == kept
    for key, value in before.items():
        np.testing.assert_array_equal(factors(out)[key], value, err_msg=key)
    again = subprocess.run([*changed, "--restart"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resuming from" not in again.stderr
    assert any(not np.array_equal(factors(out)[k], v) for k, v in before.items())


@pytest.mark.cluster
def test_a_warm_started_job_preempted_and_resubmitted_ends_with_the_uninterrupted_model(
    tmp_path,
):
    """Scheduled retraining: last period's model warm-starts this period's job on a store with
    new users and items; preempted and resubmitted, it resumes (the warm start is in the
    checkpoints' fingerprint) and ends with the uninterrupted warm run's model, bitwise."""
    y = synthetic_ordinal(600, 300, 5, density=0.2, seed=3)
    train, test = dense_split(y)
    old = store_from_dense(
        tmp_path / "old.zarr", train[:540, :270], test[:540, :270], 5, (1, 2)
    ).path
    new = store_from_dense(tmp_path / "new.zarr", train, test, 5, (2, 2)).path
    last = tmp_path / "last.zarr"
    r = subprocess.run(
        command(old, last, tmp_path / "ck-last", cluster=False),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    warm = ["--init-model", str(last)]
    reference = subprocess.run(
        [*command(new, tmp_path / "ref.zarr", tmp_path / "ck-ref", cluster=False), *warm],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reference.returncode == 0, reference.stderr
    out, ckpt = tmp_path / "m.zarr", tmp_path / "ck"
    assert preempt([*command(new, out, ckpt), *warm], ckpt, []), "no checkpoint survived"
    final = subprocess.run(
        [*command(new, out, ckpt), *warm], capture_output=True, text=True, timeout=300
    )
    assert final.returncode == 0, final.stderr
    assert "resuming from" in final.stderr
    expected, got = factors(tmp_path / "ref.zarr"), factors(out)
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
