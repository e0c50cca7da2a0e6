"""Which client a fit runs on: the given one, the current one, a LocalCluster we own, or the
in-process executor (:mod:`.inprocess`) for data that fit in memory."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ordnmf_dask.errors import InputError
from ordnmf_dask.runtime.abandoned import sweep_abandoned
from ordnmf_dask.runtime.inprocess import InProcessClient, physical_memory
from ordnmf_dask.runtime.memory import (
    FACTOR_TABLES,
    Sizes,
    check_local_cluster,
    check_open_files,
    inprocess_bytes,
)

if TYPE_CHECKING:  # dask and distributed are imported where a cluster is used
    from distributed import Client
    from distributed.security import Security

log = logging.getLogger(__name__)

# "auto" runs in-process up to this many training nonzeros (about where a LocalCluster of two
# workers catches up per iteration: docs/performance.md, "In-process or a cluster") when the
# estimate of :func:`~.memory.inprocess_bytes` is within INPROCESS_MEMORY of the machine's memory
INPROCESS_MAX_NNZ = 1 << 24
INPROCESS_MEMORY = 0.25

# Dask's workers spill results to disk from 60% of their memory limit by their own count of
# managed memory. A fit's results are factor chunks that every iteration reads again, and
# results share arrays (a picked field with the strip result it came from, an initial chunk's
# mean and geo), so that count overstates what spilling would free: the workers of a
# LocalCluster started for a fit spill only when the process memory passes 70% (Dask's spill
# threshold, unchanged), and pause and restart as usual.
WORKER_MEMORY = {"distributed.worker.memory.target": False}

# glibc malloc settings of the workers of a LocalCluster started for a fit. Dask's nanny sets
# MALLOC_TRIM_THRESHOLD_=65536, so a worker returns freed memory to the OS at once and faults
# every page of its next large array in again; a fit makes its (n, K) arrays anew each
# iteration. Freed memory is kept for reuse instead: no trimming, and allocations up to glibc's
# largest mmap threshold (32 MiB) come from the heap (docs/performance.md, "Worker memory").
WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": 1 << 62, "MALLOC_MMAP_THRESHOLD_": 32 << 20}
DASK_TRIM = "65536"  # the MALLOC_TRIM_THRESHOLD_ Dask's nanny gives a worker it starts
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


# glibc's settings with which a worker returns freed memory at once (Dask's trimming, and large
# arrays mapped apart so that freeing one unmaps it): for a fit that spills, whose worker's
# memory must fall when Dask moves data to disk
RETURN_MALLOC = {"MALLOC_TRIM_THRESHOLD_": int(DASK_TRIM), "MALLOC_MMAP_THRESHOLD_": 128 << 10}


def worker_malloc(keep: bool) -> bool:
    """In a worker process started with Dask's malloc setting or this package's, glibc's
    settings changed now (``mallopt``) to :data:`WORKER_MALLOC`'s when ``keep`` (freed memory
    kept: a fit's steps do not fault their fresh (n, K) arrays in again each iteration;
    docs/performance.md, "Where a 1 x 2 iteration's time goes"), else to
    :data:`RETURN_MALLOC`'s (freed memory returned at once: a fit whose factors exceed the
    workers' memory spills, and Dask sees the process's memory). A process configured
    otherwise, or not on glibc, is left as it is; True when changed."""
    ours = str(WORKER_MALLOC["MALLOC_TRIM_THRESHOLD_"])
    if os.environ.get("MALLOC_TRIM_THRESHOLD_") not in (DASK_TRIM, ours):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to ask, or not glibc's
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    values = WORKER_MALLOC if keep else RETURN_MALLOC
    trim = min(values["MALLOC_TRIM_THRESHOLD_"], 2**31 - 1)  # an int, in mallopt
    kept = mallopt(_M_TRIM_THRESHOLD, trim)
    return bool(kept and mallopt(_M_MMAP_THRESHOLD, values["MALLOC_MMAP_THRESHOLD_"]))


def local_layout(
    n_workers: int | None = None, threads_per_worker: int | None = None, cores: int | None = None
) -> tuple[int, int]:
    """Worker processes and threads per process of a LocalCluster we start on a machine of
    ``cores`` cores (default: Dask's count for this process): by default one process with a
    thread per core, whose threads share the factor chunks (nothing moves between them, and the
    numba kernels release the GIL); given processes and no threads, the cores shared among
    them (at least one thread each)."""
    if cores is None:
        from dask.system import CPU_COUNT

        cores = CPU_COUNT
    workers = 1 if n_workers is None else n_workers
    threads = max(1, cores // workers) if threads_per_worker is None else threads_per_worker
    return workers, threads


@contextmanager
def resolve_client(
    client: Client | None = None,
    n_workers: int | None = None,
    *,
    threads_per_worker: int | None = None,
    memory_limit: str | int | None = "auto",
    security: Security | None = None,
    host: str = "127.0.0.1",
    dashboard_address: str = "127.0.0.1:0",
) -> Iterator[Client]:
    """Yield ``client``; else the current client; else a LocalCluster of worker processes.

    A LocalCluster started here (``n_workers`` processes of ``threads_per_worker`` threads, by
    default one process with a thread per core: :func:`local_layout`; scheduler and dashboard
    bound to ``host`` / ``dashboard_address``, loopback by default; TLS when ``security``
    requires encryption) is closed on exit; a given or current client is left running;
    InputError before it starts when its workers' memory limit is too small to run a task
    (:func:`~.memory.check_local_cluster`). Its workers spill to disk on process memory only
    (:data:`WORKER_MEMORY`), keep freed memory (:data:`WORKER_MALLOC`) and log at this
    process's ``distributed`` level; ``os.environ`` is left as it was found.
    """
    if client is None:
        client = _current_client()
    if client is not None:
        yield client
        return
    import dask
    from distributed import Client, LocalCluster

    n_workers, threads_per_worker = local_layout(n_workers, threads_per_worker)
    check_local_cluster(memory_limit, n_workers, threads_per_worker)  # paused workers never run
    check_open_files(n_workers)  # workers that cannot open their connections never start
    with _environ_kept():
        # the nanny takes a variable of os.environ over its config, and an earlier nanny in this
        # process may have left Dask's MALLOC_TRIM_THRESHOLD_ there
        os.environ.update({name: str(value) for name, value in WORKER_MALLOC.items()})
        # all three reach the worker processes
        with _sigint_ignored(), dask.config.set(WORKER_MEMORY), dask.config.set(_worker_logging()):
            cluster = _start_cluster(
                LocalCluster,
                n_workers=n_workers,
                threads_per_worker=threads_per_worker,
                memory_limit="auto" if memory_limit is None else memory_limit,
                processes=True,
                host=host,
                dashboard_address=dashboard_address,
                security=security,
            )
        workers: list[Any] = []
        try:
            with cluster, Client(cluster, security=security) as own:
                log.info(
                    "started LocalCluster: %d workers x %d threads, scheduler %s, dashboard %s",
                    n_workers,
                    threads_per_worker,
                    cluster.scheduler_address,
                    own.dashboard_link,
                )
                try:
                    yield own
                finally:
                    workers = _worker_processes(cluster)
        finally:
            _wait_gone(workers)
            sweep_abandoned()  # its workers are gone: no task of theirs can write any more


def _worker_processes(cluster: Any) -> list[Any]:
    """The worker processes of a LocalCluster now (psutil handles, which know a reused pid
    from the process they were made for)."""
    import psutil

    found = []
    for nanny in list(cluster.workers.values()):
        pid = getattr(nanny, "pid", None)
        if pid:
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(pid))
    return found


def _wait_gone(processes: list[Any], timeout: float = 10.0) -> None:
    """Wait for a closed LocalCluster's worker processes to exit, and kill those that have not
    after ``timeout`` s (under heavy load a nanny's close can return first): a task still
    running in one could otherwise write into a temporary directory after it was swept."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=timeout)


def _start_cluster(make: Any, **kwargs: Any) -> Any:
    """``make(**kwargs)`` (a LocalCluster). Stopped half way (a signal while its workers
    start), the cluster it had begun is closed here, quietly, and forgotten by distributed:
    its exit hook would otherwise close it again at the interpreter's exit and print the
    traceback of a worker still starting."""
    from distributed.deploy.spec import SpecCluster

    before = set(SpecCluster._instances)
    try:
        return make(**kwargs)
    except BaseException:
        for begun in set(SpecCluster._instances) - before:
            with contextlib.suppress(Exception):
                begun.close(timeout=10)
            SpecCluster._instances.discard(begun)
        raise


def runs_inprocess(
    info: Sizes, k: int, memory: int | None = None, tables: int = FACTOR_TABLES
) -> bool:
    """Whether "auto" runs a fit of ``info`` at K = ``k`` in-process: at most
    INPROCESS_MAX_NNZ training nonzeros and :func:`inprocess_bytes` (with ``tables`` (n, K)
    tables per row) within INPROCESS_MEMORY of ``memory`` (default: the machine's)."""
    memory = physical_memory() if memory is None else memory
    return (
        info.nnz_train <= INPROCESS_MAX_NNZ
        and inprocess_bytes(info, k, tables) <= INPROCESS_MEMORY * memory
    )


def _current_client() -> Client | None:
    """The current ``distributed`` client, or None (always while distributed is not imported:
    there is none then, and importing it costs a command its start-up)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import Client

    try:
        return Client.current()
    except ValueError:
        return None


@contextmanager
def choose_client(
    client: Any,
    info: Sizes,
    k: int,
    executor: str = "auto",
    n_workers: int | None = None,
    jobs: int = 1,
    tables: int = FACTOR_TABLES,
) -> Iterator[Any]:
    """The client a fit (or evaluation) of ``info`` at K = ``k``, holding ``tables`` (n, K)
    tables per row of W and H (:func:`~.memory.fit_tables`), runs on.

    ``client`` (a ``distributed.Client``) if given; else with ``executor`` "inprocess" an
    :class:`~.inprocess.InProcessClient` (one thread per core; on a one-block grid, or when
    ``jobs`` > 1 fits share the client from threads of their own, the tasks run in the calling
    thread as they are submitted: the fits are then the parallelism), with "cluster" the current
    client or a LocalCluster of ``n_workers`` processes (default one, a thread per core:
    :func:`resolve_client`), and with "auto" the
    current client if there is one, else in-process when :func:`runs_inprocess`, else a
    LocalCluster. Both executors give bitwise the same results.
    """
    if client is not None and executor == "inprocess":
        raise InputError("executor='inprocess' runs without a cluster: pass no client")
    if (
        client is None
        and executor == "inprocess"
        or (
            executor == "auto"
            and client is None
            and _current_client() is None
            and runs_inprocess(info, k, tables=tables)
        )
    ):
        # one block: each task needs the one before it, so threads would only add hand-overs;
        # several fits at once: a shared pool would interleave their chains of tasks
        threads = 0 if info.grid == (1, 1) or jobs > 1 else None
        log.info("running in-process (%d nonzeros, K = %d)", info.nnz_train, k)
        try:
            with InProcessClient(threads) as own:
                yield own
        finally:
            sweep_abandoned()  # its threads are stopped
        return
    if executor == "auto" and runs_inprocess(info, k, tables=tables):
        log.info(
            "running on the %s client: %d nonzeros at K = %d would fit in this process, "
            "where nothing is sent between processes (on ml-latest-small one worker of 2 "
            "threads took 1.06-1.41x the in-process time per iteration on an idle machine: "
            "docs/performance.md); fit it here with no client (or "
            "executor='inprocess', --executor inprocess), or pass executor='cluster' to "
            "choose the cluster",
            "given" if client is not None else "current",
            info.nnz_train,
            k,
        )
    with resolve_client(client, n_workers) as cl:
        yield cl


def checkpoint_schedule(client: Any, values: dict[str, Any]) -> tuple[int, float | None]:
    """``(checkpoint_every, checkpoint_minutes)`` of a fit on ``client`` with the validated
    parameters ``values``: none for an in-process fit whose checkpoints would go to its own
    temporary directory (no later fit can find them, and there is no task graph to cut), else
    the settings."""
    temporary = values["checkpoint_dir"] is None and values["work_dir"] is None
    if temporary and isinstance(client, InProcessClient):
        return 0, None
    return values["checkpoint_every"], values["checkpoint_minutes"]


def _worker_logging() -> dict[str, dict[str, str]]:
    """Dask config that starts the worker processes with their ``distributed`` loggers at this
    process's level: the CLI silences them unless --debug, so that a failing task's worker
    traceback stays off stderr (the exception reaches the client, which reports it in one line).

    Workers configure logging when they import distributed, before any config we pass them
    applies, so the level travels as an environment variable set for the spawn.
    """
    import dask

    effective = logging.getLogger("distributed").getEffectiveLevel()
    level = logging.getLevelName(min(effective, logging.CRITICAL))  # a name Dask's config reads
    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    env["DASK_DISTRIBUTED__LOGGING__DISTRIBUTED"] = str(level).lower()
    return {"distributed.nanny.pre-spawn-environ": env}


@contextmanager
def _environ_kept() -> Iterator[None]:
    """Restore ``os.environ`` on exit: the nannies export their spawn environment (thread
    counts, PYTHONHASHSEED, the workers' log level) into this process."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        os.environ.update(saved)


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT while worker processes are spawned, so that they inherit SIG_IGN.

    Ctrl-C goes to the whole foreground process group: without this, every worker of our
    LocalCluster also gets it and prints a KeyboardInterrupt traceback, while only this process
    needs it (KeyboardInterrupt here closes the cluster, which stops the workers).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
