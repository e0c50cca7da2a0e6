"""A fit survives what clusters do: real processes, real stores, disturbed mid-fit.

- a worker killed (its nanny starts a replacement) and another lost for good: the fit goes on
  and ends with exactly the undisturbed result;
- the whole job killed (SIGKILL to its process group) and resumed from its checkpoints, the
  newest of them truncated on purpose (skipped): same final ELBO trace and factors;
- the scheduler killed: exit code 3 and one line, then a new cluster resumes the fit;
- SIGINT: exit code 130 and one line.

Every fit runs the same problem (60 users x 50 items, V = 4, K = 3, grid 2 x 2, 20 iterations at
tol 1e-12: room for the disturbances at iterations 3 to 10 and a checkpoint every 4 or 5),
compared bitwise with one undisturbed fit in-process: results do not depend on the executor nor
on the number of workers (fixed-order tree reductions) nor on checkpointing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import CLI, dense_split, store_from_dense, synthetic_ordinal
from distributed import Client

from ordnmf_dask import OrdNMF

pytestmark = pytest.mark.cluster

K, MAX_ITER, SEED = 3, 20, 3
FIT = ["-k", str(K), "--max-iter", str(MAX_ITER), "--tol", "1e-12", "--seed", str(SEED)]
ENV = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
ITER = re.compile(r" iter +(\d+)/")  # "iter   13/40 ..." (the fit log line)
# a guard against a hung test only: every wait ends on an event (a log line, a process exit, a
# worker registering), never on a budget tuned to the machine's speed
SAFETY = 900.0


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    """The store and the undisturbed result (ELBO trace, W, H) of the fit every test runs
    (in-process, no client: quick, and the result is the same bits)."""
    d = tmp_path_factory.mktemp("resilience")
    y = synthetic_ordinal(60, 50, 4, seed=7)
    store = store_from_dense(d / "s.zarr", *dense_split(y), 4, (2, 2))
    ref = OrdNMF(K, max_iter=MAX_ITER, tol=1e-12, seed=SEED, executor="inprocess", n_members=1).fit(
        store
    )
    assert ref.n_iter_ == MAX_ITER  # the fit runs to max_iter: long enough to disturb
    return store.path, ref.elbo_, ref.W_.compute(), ref.H_.compute()


def assert_same_result(model: Path, problem) -> None:
    _, elbo, w, h = problem
    fitted = OrdNMF.load(model)
    assert fitted.elbo_ == elbo
    np.testing.assert_array_equal(fitted.W_.compute(), w)
    np.testing.assert_array_equal(fitted.H_.compute(), h)


def not_info(log: str) -> list[str]:
    """The lines of a fit's stderr that are not its INFO log lines."""
    return [line for line in log.splitlines() if " INFO " not in line]


def alive(pids: list[int]) -> list[int]:
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal the process group (= session) ``proc`` leads, if any of it is left."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Fit:
    """``ordnmf-dask fit ARGS`` in a session of its own, its log (stderr) in a file; its
    temporary files (scratch, worker spill) go beside the log: a job these tests kill cannot
    remove them itself."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        env = {**(env or ENV), "TMPDIR": str(log.parent)}
        with open(log, "w") as err, open(log.with_suffix(".out"), "w") as out:
            self.proc = subprocess.Popen(
                [*CLI, "fit", "--n-members", "1", *args],
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text()

    def iteration(self) -> int:
        found = ITER.findall(self.text())
        return int(found[-1]) if found else 0

    def wait_iteration(self, n: int) -> int:
        """Poll the log until iteration ``n`` is done; fail if the fit ends before."""
        deadline = time.monotonic() + SAFETY
        while (seen := self.iteration()) < n:
            assert self.proc.poll() is None, f"fit ended before iteration {n}:\n{self.text()}"
            assert time.monotonic() < deadline, f"no iteration {n} in {SAFETY}s:\n{self.text()}"
            time.sleep(0.05)
        return seen

    def finish(self, timeout: float = SAFETY) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            pytest.fail(f"fit still running after {timeout}s:\n{self.text()}")
        return code, self.text()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        kill_group(self.proc, sig)
        self.proc.wait(timeout=SAFETY)


class DaskProcesses:
    """`dask scheduler` and `dask worker` processes (each worker under its nanny) on loopback,
    each in a session of its own so that it can be killed with everything it started."""

    def __init__(self, directory: Path, n_workers: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.scheduler_file = directory / "scheduler.json"
        self.scheduler_file.unlink(missing_ok=True)
        self.nannies: list[subprocess.Popen] = []
        self.scheduler = self._start(
            "dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--dashboard-address",
            "127.0.0.1:0",
            "--scheduler-file",
            str(self.scheduler_file),
        )
        try:
            deadline = time.monotonic() + SAFETY
            while not self.scheduler_file.exists():
                assert time.monotonic() < deadline, "the scheduler did not start"
                time.sleep(0.1)
            for _ in range(n_workers):
                self.nannies.append(
                    self._start(
                        "dask_worker",
                        "--scheduler-file",
                        str(self.scheduler_file),
                        "--nthreads",
                        "1",
                        "--nworkers",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--no-dashboard",
                    )
                )
            with self.client() as c:
                c.wait_for_workers(n_workers, timeout=SAFETY)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _start(command: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", f"distributed.cli.{command}", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=ENV,
            start_new_session=True,
        )

    def client(self) -> Client:
        return Client(scheduler_file=str(self.scheduler_file), timeout="60s")

    def addresses(self) -> set[str]:
        """The addresses of the workers connected to the scheduler."""
        with self.client() as c:
            return set(c.scheduler_info(n_workers=-1)["workers"])

    def worker_process(self, j: int, other_than: int | None = None) -> psutil.Process:
        """The worker process that nanny ``j`` runs (not its resource tracker), once there is
        one whose pid is not ``other_than``."""
        deadline = time.monotonic() + SAFETY
        while True:
            for child in psutil.Process(self.nannies[j].pid).children():
                try:
                    if (
                        child.pid != other_than
                        and child.status() != psutil.STATUS_ZOMBIE
                        and any("spawn_main" in part for part in child.cmdline())
                    ):
                        return child
                except psutil.NoSuchProcess:
                    pass
            assert time.monotonic() < deadline, f"nanny {j} runs no worker"
            time.sleep(0.1)

    def close(self) -> None:
        for p in [*self.nannies, self.scheduler]:
            kill_group(p)
        for p in [*self.nannies, self.scheduler]:
            p.wait(timeout=SAFETY)


def test_fit_survives_a_replaced_worker_and_a_lost_one(tmp_path, problem):
    """Kill one worker (its nanny starts a replacement), then lose the other for good (nanny
    and all): the fit goes on, on the replacement alone, and ends exactly as an undisturbed fit
    on a LocalCluster. The fit's process is stopped (SIGSTOP) from the first kill until the
    replacement has joined, so that the fit is still running at the second kill however fast
    it is, and a worker is left to it (with none, tasks placed on a lost worker wait for ever:
    distributed does not reschedule ``allow_other_workers`` tasks on a worker that joins)."""
    store = problem[0]
    procs = DaskProcesses(tmp_path / "cluster", 2)
    fit = None
    try:
        args = [
            store,
            "--out",
            str(tmp_path / "m.zarr"),
            *FIT,
            "--scheduler-file",
            str(procs.scheduler_file),
            "--checkpoint-every",
            "5",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
        ]
        fit = Fit(args, tmp_path / "fit.log")
        fit.wait_iteration(3)
        os.kill(fit.proc.pid, signal.SIGSTOP)
        try:
            assert fit.iteration() < MAX_ITER, "the fit ended before the first kill"
            victim = procs.worker_process(0)
            before = procs.addresses()
            victim.kill()  # SIGKILL the worker; nanny 0 restarts it
            replacement = procs.worker_process(0, other_than=victim.pid)
            deadline = time.monotonic() + SAFETY
            while not procs.addresses() - before:  # until the replacement has joined
                assert time.monotonic() < deadline, "the replacement worker did not join"
                time.sleep(0.1)
            kill_group(procs.nannies[1])  # the other worker is lost for good, nanny and all
        finally:
            os.kill(fit.proc.pid, signal.SIGCONT)
        code, log = fit.finish()
        assert code == 0, log
        assert_same_result(tmp_path / "m.zarr", problem)
        # the last iterations ran on the replacement worker alone
        assert procs.worker_process(0).pid == replacement.pid != victim.pid
        with procs.client() as c:
            assert len(c.scheduler_info(n_workers=-1)["workers"]) == 1
    finally:
        if fit is not None:
            kill_group(fit.proc)
        procs.close()


def test_a_fit_on_one_worker_survives_its_loss(tmp_path, problem):
    """On one worker each step of the fit is one task whose state stays on that worker
    (docs/design.md §4, "One task per step"). The worker killed mid-fit (its nanny starts a
    replacement; the fit's process stopped meanwhile, as above), the lost steps are recomputed
    from their lineage on the replacement and the fit ends exactly as an undisturbed one."""
    store = problem[0]
    procs = DaskProcesses(tmp_path / "cluster", 1)
    fit = None
    try:
        args = [
            store,
            "--out",
            str(tmp_path / "m.zarr"),
            *FIT,
            "--scheduler-file",
            str(procs.scheduler_file),
            "--checkpoint-every",
            "5",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
        ]
        fit = Fit(args, tmp_path / "fit.log")
        fit.wait_iteration(3)
        os.kill(fit.proc.pid, signal.SIGSTOP)
        try:
            assert fit.iteration() < MAX_ITER, "the fit ended before the kill"
            victim = procs.worker_process(0)
            before = procs.addresses()
            victim.kill()  # SIGKILL the worker and the steps it held; the nanny restarts it
            replacement = procs.worker_process(0, other_than=victim.pid)
            deadline = time.monotonic() + SAFETY
            while not procs.addresses() - before:  # until the replacement has joined
                assert time.monotonic() < deadline, "the replacement worker did not join"
                time.sleep(0.1)
        finally:
            os.kill(fit.proc.pid, signal.SIGCONT)
        code, log = fit.finish()
        assert code == 0, log
        assert_same_result(tmp_path / "m.zarr", problem)
        assert procs.worker_process(0).pid == replacement.pid != victim.pid
    finally:
        if fit is not None:
            kill_group(fit.proc)
        procs.close()


def checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def complete_checkpoints(directory: Path) -> list[str]:
    return [n for n in checkpoints(directory) if re.fullmatch(r"ckpt-\d{8}", n)]


def test_killed_job_resumes_to_the_same_result_skipping_a_truncated_checkpoint(tmp_path, problem):
    """SIGKILL the whole job (CLI and its LocalCluster) mid-fit, truncate a chunk of its newest
    checkpoint, and resume: the truncated checkpoint is skipped with a warning, a ``.tmp`` one
    is ignored, and the fit resumes from the older one to exactly the uninterrupted result."""
    store, ckpt, model = problem[0], tmp_path / "ckpt", tmp_path / "m.zarr"
    args = [
        store,
        "--out",
        str(model),
        *FIT,
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "4",
    ]
    fits: list[Fit] = []
    try:
        fits.append(Fit(args, tmp_path / "fit-1.log"))
        fits[-1].wait_iteration(10)
        fits[-1].kill()
        # checkpoint n is complete after iteration n's log line and before n + 1's: the newest
        # is within one interval of the last iteration logged, however far the fit got
        last = fits[-1].iteration()
        complete = complete_checkpoints(ckpt)
        assert len(complete) >= 2, checkpoints(ckpt)
        newest, older = complete[-1], complete[-2]
        assert last - 4 <= int(newest[5:]) <= last, (last, checkpoints(ckpt))
        # a checkpoint being written when the job died (or anything named like one) is ignored
        shutil.copytree(ckpt / newest, ckpt / "ckpt-00000099.tmp")
        chunk = ckpt / newest / "H" / "1" / "mean" / "c" / "0" / "0"
        chunk.write_bytes(chunk.read_bytes()[:10])

        fits.append(Fit([*args, "--resume"], tmp_path / "fit-2.log"))
        code, log = fits[-1].finish()
        assert code == 0, log
        # one warning, no worker error: a damaged checkpoint is expected, not a failure
        [warning] = not_info(log)
        assert (
            f"WARNING ordnmf_dask.engine.checkpoint: skipping checkpoint: {ckpt / newest}/"
            in warning
        ), log
        assert f"resuming from {ckpt / older} (iteration {int(older[5:])})" in log, log
        assert ".tmp" not in log
        assert_same_result(model, problem)
    finally:
        for fit in fits:
            kill_group(fit.proc)


def test_lost_cluster_exits_3_and_resumes_on_a_new_one(tmp_path, problem):
    """Kill the scheduler mid-fit: exit code 3 and one line; a new scheduler and workers then
    resume from the checkpoints to the undisturbed result."""
    store, ckpt, model = problem[0], tmp_path / "ckpt", tmp_path / "m.zarr"
    # the client gives up reconnecting after the connect timeout (30 s by default)
    env = {**ENV, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "5s"}
    fit = None
    procs = DaskProcesses(tmp_path / "cluster-1", 1)
    try:
        args = [
            store,
            "--out",
            str(model),
            *FIT,
            "--checkpoint-dir",
            str(ckpt),
            "--checkpoint-every",
            "4",
        ]
        fit = Fit(
            [*args, "--scheduler-file", str(procs.scheduler_file)], tmp_path / "fit-1.log", env
        )
        fit.wait_iteration(9)
        kill_group(procs.scheduler)
        code, log = fit.finish()
        assert code == 3, log
        [error] = not_info(log)
        assert error.startswith("ordnmf-dask fit: error: cluster failure: "), log
        assert not model.exists()
    finally:
        if fit is not None:
            kill_group(fit.proc)
        procs.close()
    newest = complete_checkpoints(ckpt)[-1]

    procs = DaskProcesses(tmp_path / "cluster-2", 1)
    try:
        fit = Fit(
            [*args, "--scheduler-file", str(procs.scheduler_file), "--resume"],
            tmp_path / "fit-2.log",
            env,
        )
        code, log = fit.finish()
        assert code == 0, log
        assert f"resuming from {ckpt / newest} (iteration {int(newest[5:])})" in log, log
        assert_same_result(model, problem)
    finally:
        kill_group(fit.proc)
        procs.close()


def test_sigint_exits_130_with_one_line(tmp_path, problem):
    """Ctrl-C (SIGINT to the job's process group) mid-fit: exit code 130, one line, no
    traceback, and no process of the job left behind."""
    fit = Fit(
        [problem[0], "--out", str(tmp_path / "m.zarr"), *FIT, "--workers", "1"],
        tmp_path / "fit.log",
    )
    try:
        fit.wait_iteration(3)
        group = [fit.proc.pid] + [p.pid for p in psutil.Process(fit.proc.pid).children(True)]
        kill_group(fit.proc, signal.SIGINT)
        code, log = fit.finish()
        assert code == 130, log
        assert not_info(log) == ["ordnmf-dask fit: error: interrupted"], log
        assert not (tmp_path / "m.zarr").exists()
        deadline = time.monotonic() + SAFETY
        while left := alive(group):
            assert time.monotonic() < deadline, f"processes left: {left}"
            time.sleep(0.2)
    finally:
        kill_group(fit.proc)
