"""Start `dask scheduler` / `dask worker` processes on loopback for tests, and stop them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}


def _tls_args(tls: dict[str, str] | None) -> list[str]:
    if not tls:
        return []
    return ["--tls-ca-file", tls["ca"], "--tls-cert", tls["cert"], "--tls-key", tls["key"]]


@contextmanager
def dask_processes(
    sched_file: Path,
    n_workers: int,
    scheduler_tls: dict[str, str] | None = None,
    worker_tls: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Iterator[str]:
    """A scheduler writing ``sched_file`` and ``n_workers`` single-threaded workers; yields the
    scheduler address. Stops every process (SIGINT, then SIGKILL) on exit."""
    proto = "tls" if scheduler_tls else "tcp"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                f"{proto}://127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                "127.0.0.1:0",
                "--scheduler-file",
                str(sched_file),
                *_tls_args(scheduler_tls),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=ENV,
        )
    ]
    try:
        deadline = time.time() + timeout
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        for _ in range(n_workers):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "distributed.cli.dask_worker",
                        "--scheduler-file",
                        str(sched_file),
                        "--nthreads",
                        "1",
                        "--nworkers",
                        "1",
                        "--host",
                        f"{proto}://127.0.0.1",
                        "--no-dashboard",
                        *_tls_args(worker_tls),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=ENV,
                )
            )
        yield address
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
