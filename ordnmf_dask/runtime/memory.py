"""Whether a fit fits the memory it runs in, checked before its first iteration: a fit whose
factors cannot fit would otherwise swap, be killed, or wait forever for workers that Dask has
paused at their memory limit. The process's own limits count as well as the machine's: its
address space (RLIMIT_AS, ``ulimit -v``) bounds what it can allocate, and its open files
(RLIMIT_NOFILE, ``ulimit -n``) whether a LocalCluster can start at all."""

from __future__ import annotations

import logging
import resource
from typing import Any, Protocol

import numpy as np
import psutil

from ordnmf_dask.errors import InputError
from ordnmf_dask.runtime.inprocess import InProcessClient

log = logging.getLogger(__name__)

# What a worker process holds before its first task (the interpreter, numpy, distributed and
# the compiled kernels), rounded up.
WORKER_PROCESS = 320 << 20
# Dask pauses a worker (it runs no task until its memory drops) at this fraction of its memory
# limit (distributed.worker.memory.pause, unchanged by the package).
PAUSE = 0.8
# The smallest worker memory limit accepted: a worker process alone takes most of the paused
# fraction of a smaller limit, and a worker paused before its first task never runs one.
MIN_WORKER_MEMORY = 512 << 20
# (n, K) float64 tables a fit with plain CAVI holds per row of W and of H at its peak: the chunk
# being replaced and its update (mean, geo, shape), the local step's SW / SH and the strip
# partials, the rate corrections, and the next iteration's, submitted while this one runs
# (measured: about 8, in-process and on 2 workers; docs/performance.md,
# "Memory of the factors: CAVI and SQUAREM")
FACTOR_TABLES = 16
# SQUAREM holds besides the three states of its cycle and the extrapolated one: measured about
# twice CAVI's peak, so twice its estimate
SQUAREM_TABLES = 32


def fit_tables(optimizer: str) -> int:
    """(n, K) tables per row of W and of H that a fit with ``optimizer`` is estimated to hold."""
    return SQUAREM_TABLES if optimizer == "squarem" else FACTOR_TABLES


class Sizes(Protocol):
    """What the memory estimates and the executor choice read of a store: its
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


def inprocess_bytes(info: Sizes, k: int, tables: int = FACTOR_TABLES) -> int:
    """Bytes an in-process fit of ``info`` at K = ``k`` is estimated to hold: the cached
    training blocks (:func:`block_bytes`) and ``tables`` (n, K) tables per row of W and H."""
    return block_bytes(info) + factor_bytes(info.n_users, info.n_items, k, tables)


class Grid(Sizes, Protocol):
    """What the check reads of a store: its sizes and the bounds of its block grid."""

    @property
    def row_bounds(self) -> np.ndarray: ...
    @property
    def col_bounds(self) -> np.ndarray: ...


def size_text(n: float) -> str:
    """Bytes as people read them: ``4 bytes``, ``512 MiB``, ``6.5 GiB``."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{int(n)} bytes"


def worker_limit_problem(limit: int) -> str | None:
    """What is wrong with a worker memory limit of ``limit`` bytes (None: nothing)."""
    if limit >= MIN_WORKER_MEMORY:
        return None
    return (
        f"is {size_text(limit)} per worker, below the {size_text(MIN_WORKER_MEMORY)} a "
        f"worker needs (its process holds about {size_text(WORKER_PROCESS)} before any task, "
        f"and Dask pauses it at {PAUSE:.0%} of its limit)"
    )


# Open files a LocalCluster needs in the process that starts it (its scheduler's listeners and
# the connections to each worker and nanny): measured with `ulimit -n`, one worker starts at
# 64 and hangs at 48, four hang at 96 (docs/design.md, "Safety rules")
OPEN_FILES_BASE = 32
OPEN_FILES_PER_WORKER = 32


def check_open_files(n_workers: int) -> None:
    """InputError, before a LocalCluster of ``n_workers`` starts, when this process's limit on
    open files (``ulimit -n``) is below what it needs: its workers would fail to start ("Nanny
    failed to start") or hang."""
    need = OPEN_FILES_BASE + OPEN_FILES_PER_WORKER * n_workers
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    raise InputError(
        f"a LocalCluster of {n_workers} worker{'s' * (n_workers > 1)} needs about {need} open "
        f"files, and this process may open only {soft} (ulimit -n; hard limit {hard_text}): "
        f"raise it with `ulimit -n {max(need, 1024)}`, or run in-process (--executor inprocess)"
    )


def memory_room() -> tuple[int, str]:
    """Bytes this process can still allocate, and how a message names that bound: the memory
    available now, or, when less, what its address-space limit (RLIMIT_AS, ``ulimit -v``)
    leaves beyond what the process already maps."""
    room, what = psutil.virtual_memory().available, "of memory available"
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        left = max(0, soft - psutil.Process().memory_info().vms)
        if left < room:
            room = left
            what = f"left under this process's address-space limit of {size_text(soft)} (ulimit -v)"
    return room, what


def check_local_cluster(memory_limit: str | int | None, n_workers: int, threads: int) -> None:
    """InputError, before a LocalCluster of ``n_workers`` x ``threads`` starts, when the memory
    limit it would give each worker (``memory_limit`` as Dask reads it; "auto" or None: the
    machine's memory shared by the workers) is below :data:`MIN_WORKER_MEMORY`."""
    from distributed.worker_memory import parse_memory_limit

    given = "auto" if memory_limit is None else memory_limit
    limit = parse_memory_limit(given, threads, n_workers * threads, logger=log)
    wrong = None if limit is None else worker_limit_problem(limit)
    if wrong is not None:
        raise InputError(
            f"the memory limit of a LocalCluster of {n_workers} workers (memory "
            f"limit {given}) {wrong}: use fewer workers or a larger memory limit"
        )


def factor_bytes(n_users: int, n_items: int, k: int, tables: int = FACTOR_TABLES) -> int:
    """Bytes the variational parameters of W and H take at a fit's peak: ``tables`` (n, K)
    float64 tables per row of W and of H."""
    return tables * 8 * k * (n_users + n_items)


def _spills(dask_worker: Any) -> bool:
    """Whether a worker moves its data to disk near its memory limit (Dask's
    ``distributed.worker.memory.spill``); on the worker."""
    return bool(dask_worker.memory_manager.memory_spill_fraction)


def check_fit_memory(
    client: Any, info: Grid, k: int, cache: bool, tables: int = FACTOR_TABLES
) -> bool:
    """InputError when a fit of ``info`` at K = ``k`` (an ensemble: K times its members) holding
    ``tables`` (n, K) tables per row of W and H (:func:`fit_tables`) cannot fit where it runs:
    in-process,
    :func:`~.cluster.inprocess_bytes` over the memory available now; on a cluster, the factors
    (and the training blocks when ``cache``) over what the workers' memory limits leave below
    Dask's pause threshold, in all (only a warning where the workers spill to disk: the chunks
    they do not use move there), or on one worker for the largest chunks of W and H, which a
    task holds at once. Workers without a memory limit are not checked. Returns whether the
    factors fit the memory (False: the workers will spill them)."""
    need_text = f"K = {k} on {info.n_users} users x {info.n_items} items needs about"
    what = f"(W and H: {tables} tables of K numbers per user and item"
    advice = "lower K (n_components) or the ensemble's n_members"
    if isinstance(client, InProcessClient):
        need = inprocess_bytes(info, k, tables)
        room, bound = memory_room()
        if need > room:
            raise InputError(
                f"{need_text} {size_text(need)} in this process {what}, and the training "
                f"blocks), more than the {size_text(room)} {bound}: {advice}, "
                f"{'raise that limit, ' if 'ulimit' in bound else ''}or run on a cluster"
            )
        return True
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    limits = [int(w.get("memory_limit") or 0) for w in workers]
    if not limits or min(limits) == 0:
        return True
    room = [max(0, int(PAUSE * limit) - WORKER_PROCESS) for limit in limits]
    below = (
        f"below Dask's pause threshold ({PAUSE:.0%} of the limit, less about "
        f"{size_text(WORKER_PROCESS)} for the worker process): {advice}, or give the "
        "workers more memory"
    )
    need = factor_bytes(info.n_users, info.n_items, k, tables)
    need += block_bytes(info) if cache else 0
    fits = need <= sum(room)
    if not fits and all(client.run(_spills).values()):
        log.warning(
            "%s %s %s), more than the %s the workers' memory limits leave: they will spill "
            "factor chunks to disk, which is slower (docs/performance.md, '10^9 nonzeros end "
            "to end')",
            need_text,
            size_text(need),
            what,
            size_text(sum(room)),
        )
    elif not fits:
        n = len(limits)
        each = (
            f"{size_text(limits[0])} each"
            if len(set(limits)) == 1
            else f"up to {size_text(max(limits))}"
        )
        cached = ", and the cached training blocks" if cache else ""
        raise InputError(
            f"{need_text} {size_text(need)} {what}{cached}), more than the "
            f"{size_text(sum(room))} left by {n} worker{'s' * (n > 1)} with a "
            f"memory limit of {each}, which do not spill to disk "
            f"(distributed.worker.memory.spill is off), {below}"
        )
    rows, cols = int(np.diff(info.row_bounds).max()), int(np.diff(info.col_bounds).max())
    need = factor_bytes(rows, cols, k, tables)
    if need > max(room):
        raise InputError(
            f"{need_text} {size_text(need)} on one worker for its largest chunks "
            f"of W ({rows} users) and H ({cols} items) {what}), more than the "
            f"{size_text(max(room))} left by a worker with a memory limit of "
            f"{size_text(max(limits))} {below}"
        )
    return fits
