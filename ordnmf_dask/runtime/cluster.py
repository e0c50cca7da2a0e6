"""Which client a fit runs on: the given one, the current one, a LocalCluster we own, or the
in-process executor (:mod:`.inprocess`) for data that fit in memory."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from ordnmf_dask.errors import InputError
from ordnmf_dask.runtime.inprocess import InProcessClient, physical_memory

if TYPE_CHECKING:  # dask and distributed are imported where a cluster is used
    from distributed import Client
    from distributed.security import Security

log = logging.getLogger(__name__)

# "auto" runs in-process up to this many training nonzeros (about where a LocalCluster of two
# workers has caught up per iteration: bench/iteration.py) when the estimate of
# :func:`inprocess_bytes` is within INPROCESS_MEMORY of the machine's memory
INPROCESS_MAX_NNZ = 1 << 24
INPROCESS_MEMORY = 0.25
# (n, K) float64 tables an in-process fit holds per row of W and of H at its peak: the chunk
# being replaced and its update (mean, geo, shape), the local step's SW / SH and the strip
# partials, the rate corrections, and the next iteration's, submitted while this one runs
FACTOR_TABLES = 16

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


@contextmanager
def resolve_client(
    client: Client | None = None,
    n_workers: int = 2,
    *,
    threads_per_worker: int = 1,
    memory_limit: str | int | None = "auto",
    security: Security | None = None,
    host: str = "127.0.0.1",
    dashboard_address: str = "127.0.0.1:0",
) -> Iterator[Client]:
    """Yield ``client``; else the current client; else a LocalCluster of worker processes.

    A LocalCluster started here (``n_workers`` processes of ``threads_per_worker`` threads,
    scheduler and dashboard bound to ``host`` / ``dashboard_address``, loopback by default;
    TLS when ``security`` requires encryption) is closed on exit; a given or current client is
    left running; InputError before it starts when its workers' memory limit is too small to
    run a task (:func:`.memory.check_local_cluster`). Its workers spill to disk on process
    memory only (:data:`WORKER_MEMORY`), keep freed memory (:data:`WORKER_MALLOC`) and log at
    this process's ``distributed`` level; ``os.environ`` is left as it was found.
    """
    if client is None:
        client = _current_client()
    if client is not None:
        yield client
        return
    import dask
    from distributed import Client, LocalCluster

    from ordnmf_dask.runtime.memory import check_local_cluster

    check_local_cluster(memory_limit, n_workers, threads_per_worker)  # paused workers never run
    with _environ_kept():
        # the nanny takes a variable of os.environ over its config, and an earlier nanny in this
        # process may have left Dask's MALLOC_TRIM_THRESHOLD_ there
        os.environ.update({name: str(value) for name, value in WORKER_MALLOC.items()})
        # all three reach the worker processes
        with _sigint_ignored(), dask.config.set(WORKER_MEMORY), dask.config.set(_worker_logging()):
            cluster = LocalCluster(
                n_workers=n_workers,
                threads_per_worker=threads_per_worker,
                memory_limit="auto" if memory_limit is None else memory_limit,
                processes=True,
                host=host,
                dashboard_address=dashboard_address,
                security=security,
            )
        with cluster, Client(cluster, security=security) as own:
            log.info(
                "started LocalCluster: %d workers x %d threads, scheduler %s, dashboard %s",
                n_workers, threads_per_worker, cluster.scheduler_address, own.dashboard_link,
            )
            yield own


class Sizes(Protocol):
    """What the executor choice reads of a store: its
    :class:`~ordnmf_dask.store.blocks.StoreInfo` (dist does not import the store layer)."""

    @property
    def nnz_train(self) -> int: ...
    @property
    def n_users(self) -> int: ...
    @property
    def n_items(self) -> int: ...
    @property
    def grid(self) -> tuple[int, int]: ...


def block_bytes(info: Sizes) -> int:
    """Bytes the training blocks of ``info`` take when cached in memory: 9 per nonzero and a
    row pointer per user and block column."""
    return info.nnz_train * (4 + 4 + 1) + 8 * info.n_users * info.grid[1]


def inprocess_bytes(info: Sizes, k: int) -> int:
    """Bytes an in-process fit of ``info`` at K = ``k`` is estimated to hold: the cached
    training blocks (:func:`block_bytes`) and FACTOR_TABLES (n, K) tables per row of W and H."""
    return block_bytes(info) + FACTOR_TABLES * 8 * k * (info.n_users + info.n_items)


def runs_inprocess(info: Sizes, k: int, memory: int | None = None) -> bool:
    """Whether "auto" runs a fit of ``info`` at K = ``k`` in-process: at most
    INPROCESS_MAX_NNZ training nonzeros and :func:`inprocess_bytes` within INPROCESS_MEMORY of
    ``memory`` (default: the machine's)."""
    memory = physical_memory() if memory is None else memory
    return (info.nnz_train <= INPROCESS_MAX_NNZ
            and inprocess_bytes(info, k) <= INPROCESS_MEMORY * memory)  # fmt: skip


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
    client: Any, info: Sizes, k: int, executor: str = "auto", n_workers: int = 2, jobs: int = 1
) -> Iterator[Any]:
    """The client a fit (or evaluation) of ``info`` at K = ``k`` runs on.

    ``client`` (a ``distributed.Client``) if given; else with ``executor`` "inprocess" an
    :class:`~.inprocess.InProcessClient` (one thread per core; on a one-block grid, or when
    ``jobs`` > 1 fits share the client from threads of their own, the tasks run in the calling
    thread as they are submitted: the fits are then the parallelism), with "cluster" the current
    client or a LocalCluster of ``n_workers`` (:func:`resolve_client`), and with "auto" the
    current client if there is one, else in-process when :func:`runs_inprocess`, else a
    LocalCluster. Both executors give bitwise the same results.
    """
    if client is not None and executor == "inprocess":
        raise InputError("executor='inprocess' runs without a cluster: pass no client")
    if client is None and executor == "inprocess" or (
        executor == "auto" and client is None and _current_client() is None
        and runs_inprocess(info, k)
    ):  # fmt: skip
        # one block: each task needs the one before it, so threads would only add hand-overs;
        # several fits at once: a shared pool would interleave their chains of tasks
        threads = 0 if info.grid == (1, 1) or jobs > 1 else None
        log.info("running in-process (%d nonzeros, K = %d)", info.nnz_train, k)
        with InProcessClient(threads) as own:
            yield own
        return
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
