"""Shared helpers of the benchmark scripts: synthetic blocks, timing, peak RSS of processes."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import psutil

from ordnmf_dask.model.kernels import CsrBlock

MB = 1 << 20


def random_block(
    n_rows: int, n_cols: int, nnz: int, n_classes: int = 10, seed: int = 0
) -> CsrBlock:
    """A CSR block with ~``nnz`` distinct nonzeros, skewed (Zipf-like) item popularity.

    Rows uniform, columns drawn with probability proportional to ``1 / (rank + 10)^0.8``;
    classes uniform in 1..V (uint8). Duplicates are dropped, so nnz is slightly below target.
    """
    rng = np.random.default_rng(seed)
    pop = 1.0 / (np.arange(n_cols) + 10.0) ** 0.8
    pop = rng.permutation(pop / pop.sum())
    target = int(nnz * 1.02)
    keys = np.unique(
        rng.integers(0, n_rows, target).astype(np.int64) * n_cols
        + rng.choice(n_cols, target, p=pop)
    )[:nnz]
    rows, cols = np.divmod(keys, n_cols)
    y = rng.integers(1, n_classes + 1, keys.shape[0]).astype(np.uint8)
    return CsrBlock.from_coo(rows, cols, y, (n_rows, n_cols))


def best_of(
    fn: Callable[[], Any], repeat: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Minimum time of ``repeat`` calls of ``fn`` (seconds) on ``clock``.

    ``time.process_time`` (CPU seconds of this process) is the robust choice for single-threaded
    kernels on a loaded machine; ``time.perf_counter`` is wall time.
    """
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def self_peak_mb() -> float:
    """Peak RSS of this process so far (kernel high-water mark, VmHWM), MB. Read from
    /proc/self/status where there is one: ``ru_maxrss`` keeps the parent's peak across fork
    and exec, so a small child of a big parent would report the parent's."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class RssSampler:
    """Samples the RSS of a process tree with psutil in a thread and keeps each process's peak.

    ``roots``: pids whose descendants are followed too (LocalCluster nannies and workers).
    """

    def __init__(self, roots: Iterable[int] = (), interval: float = 0.02) -> None:
        self.roots = list(roots) or [os.getpid()]
        self.interval = interval
        self.peak: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _procs(self) -> list[psutil.Process]:
        out = []
        for pid in self.roots:
            try:
                root = psutil.Process(pid)
                out += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return out

    def sample(self) -> None:
        for proc in self._procs():
            try:
                rss = proc.memory_info().rss / MB
                if proc.pid not in self.names:
                    self.names[proc.pid] = " ".join(proc.cmdline()[1:3])[-60:]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self.peak[proc.pid] = max(self.peak.get(proc.pid, 0.0), rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def worker_peaks(client: Any) -> dict[str, float]:
    """Kernel high-water RSS (MB) of every worker process of ``client``, keyed by address."""
    return client.run(self_peak_mb)


def fmt_table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain fixed-width table."""
    cells = [header, *[[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]]
    widths = [max(len(r[j]) for r in cells) for j in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def training_arrays(
    store: str, subset: str = "train"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]]:
    """The store's nonzeros of ``subset`` ("train" or "test") as global ``rows``, ``cols``,
    classes ``y``, and (U, I, V): the input of the in-memory reference implementations."""
    from ordnmf_dask.store.blocks import open_store
    from ordnmf_dask.store.csr import load_block

    info = open_store(store)
    parts = [
        (b.rows + info.row_bounds[r], b.cols.astype(np.int64) + info.col_bounds[c], b.y)
        for r in range(info.grid[0])
        for c in range(info.grid[1])
        for b in [load_block(store, subset, r, c)]
    ]
    rows, cols, y = (np.concatenate(a) for a in zip(*parts, strict=True))
    return rows, cols, y, (info.n_users, info.n_items, info.n_classes)


def save_training_npz(store: str, path: str) -> None:
    """:func:`training_arrays` in ``path`` (.npz: ``rows``, ``cols``, ``y``, ``shape``)."""
    rows, cols, y, shape = training_arrays(store)
    np.savez(path, rows=rows, cols=cols, y=y, shape=np.array(shape))
