"""Worker malloc settings: the package's (no trimming) against Dask's, and kept decode buffers.

Usage: ``python bench/memory_settings.py [--shapes small fixed] [--repeats 2] [--configs a b c
d]``.

Dask's nanny starts each worker with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``), so glibc hands freed memory back to the OS and the
next large array is faulted in again page by page; the LocalCluster a fit starts sets
``ordnmf_dask.runtime.cluster.WORKER_MALLOC`` instead. This script fits the same synthetic store
under these configurations, interleaved (each repeat runs every configuration once, in a rotated
order, on a fresh LocalCluster of 2 single-thread worker processes, as ``resolve_client``
starts):

- a: the package as it is (``WORKER_MALLOC``, decode buffers kept per thread);
- b: Dask's worker environment (``MALLOC_TRIM_THRESHOLD_=65536``; glibc's mmap threshold then
  stays at its default, 128 KiB), given as ``WORKER_MALLOC`` for the run;
- c, d: as b and a with the streamed blocks decoded into fresh arrays instead of the buffers
  each worker thread keeps (``store.decode.thread_buffer``); streamed shapes only.

Shapes: ``small`` is the 2.5M-nonzero benchmark of ``bench/iteration.py`` (20k x 12k, 2 x 2
blocks, cached); ``fixed`` is 1e7 nonzeros at 1M users x 200k items (8 x 2 blocks, streamed,
workers capped at 2 GB, as ``bench/scaling.py``'s fixed-shape row). K = 50, V = 10.

Per run it prints the median seconds per iteration over the iterations after ``--skip``, the
workers' CPU time, system time and minor page faults per steady iteration (``getrusage`` on each
worker, summed over the workers), the largest worker's peak RSS (VmHWM) over the whole fit, and
the final ELBO (which must be bitwise the same under every configuration: they change only where
memory comes from). Then a summary per shape and configuration: the range over repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_table, worker_peaks  # noqa: E402
from iteration import ensure_store  # noqa: E402
from task_profile import worker_usage  # noqa: E402

DASK_MALLOC = {"MALLOC_TRIM_THRESHOLD_": 65536, "MALLOC_MMAP_THRESHOLD_": 128 << 10}

CONFIGS = {  # name: (decode buffers kept, Dask's malloc env, description)
    "a": (True, False, "package env"),
    "b": (True, True, "Dask env"),
    "c": (False, True, "Dask env, fresh decode arrays"),
    "d": (False, False, "package env, fresh decode arrays"),
}

SHAPES = {  # name: (store options, stream, memory limit, iterations)
    "small": (dict(users=20_000, items=12_000, nnz=2.5e6, nnz_per_block=1 << 19), False, None, 10),
    "fixed": (dict(users=1_000_000, items=200_000, nnz=1e7, nnz_per_block=1 << 21), True, "2GB", 5),
}


def _set_memory(buffers_on: bool) -> dict[str, str]:
    """On a worker: decode streamed blocks into kept or fresh buffers; returns the worker's
    malloc environment (to show what it runs with)."""
    from ordnmf_dask.store import blocks, decode

    blocks.thread_buffer = decode.thread_buffer if buffers_on else _fresh_buffer
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


def _fresh_buffer(name: str, n: int, dtype: np.dtype) -> np.ndarray:
    """A new array each time, in place of a kept per-thread buffer."""
    return np.empty(n, dtype)


def run(path: str, args: argparse.Namespace, shape: str, config: str) -> dict[str, Any]:
    """One fit of the store at ``path`` under ``config`` on a fresh LocalCluster."""
    from ordnmf_dask import OrdNMF
    from ordnmf_dask.engine.cavi import IterationInfo
    from ordnmf_dask.runtime.cluster import WORKER_MALLOC, resolve_client

    _, stream, memory_limit, iters = SHAPES[shape]
    iters = args.iters or iters
    buffers_on, dask_env, _ = CONFIGS[config]
    seconds: list[float] = []
    elbos: list[float] = []
    usage: list[dict[str, tuple[float, float, int]]] = []

    with (
        mock.patch.dict(WORKER_MALLOC, DASK_MALLOC if dask_env else {}),
        resolve_client(None, 2, memory_limit=memory_limit) as client,
    ):

        def record(info: IterationInfo) -> None:
            n = info.iteration
            seconds.append(info.seconds)
            elbos.append(info.elbo)
            if n in (args.skip, iters):
                usage.append(client.run(worker_usage))

        malloc_env = client.run(_set_memory, buffers_on)
        model = OrdNMF(
            args.k,
            optimizer="cavi",
            tol=1e-12,
            max_iter=iters,
            min_iter=iters,
            cache_blocks=not stream,
            checkpoint_every=0,
            n_members=1,
        )
        model.fit(path, client, callback=record)
        peaks = worker_peaks(client)
    steady = iters - args.skip
    faults = sum(usage[1][w][2] - usage[0][w][2] for w in usage[1]) / steady
    system = sum(usage[1][w][1] - usage[0][w][1] for w in usage[1]) / steady
    user = sum(usage[1][w][0] - usage[0][w][0] for w in usage[1]) / steady
    return {
        "s_per_iter": statistics.median(seconds[args.skip :]),
        "faults": faults,
        "system": system,
        "cpu": user + system,
        "peak_mb": max(peaks.values()),
        "elbo": elbos[-1],
        "env": sorted({str(sorted(e.items())) for e in malloc_env.values()}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iters", type=int, help="iterations per fit (default: 10 small, 5 fixed)")
    ap.add_argument("--skip", type=int, default=2, help="warm-up iterations left out")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--work", default="/tmp/ordnmf-bench")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    header = [
        "shape",
        "config",
        "s/iter",
        "worker CPU s/iter",
        "sys s/iter",
        "faults/iter",
        "peak RSS MB",
    ]
    summary = []
    for shape in args.shapes:
        store, stream, _, _ = SHAPES[shape]
        path = ensure_store(argparse.Namespace(k=args.k, classes=10, work=args.work, **store))
        configs = [c for c in args.configs if stream or CONFIGS[c][0]]
        results: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
        for rep in range(args.repeats):
            order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
            for config in order:
                r = run(path, args, shape, config)
                results[config].append(r)
                print(
                    f"{shape} repeat {rep} {config} ({CONFIGS[config][2]}): "
                    f"{r['s_per_iter']:.3f} s/iter, worker CPU {r['cpu']:.3f} s/iter (system "
                    f"{r['system']:.3f}), {r['faults']:.0f} faults/iter, peak "
                    f"{r['peak_mb']:.0f} MB, ELBO "
                    f"{r['elbo']!r}, load {os.getloadavg()[0]:.1f}, worker env {r['env']}",
                    flush=True,
                )
        elbos = {r["elbo"] for rs in results.values() for r in rs}
        if len(elbos) != 1:
            raise SystemExit(f"{shape}: final ELBO differs between configurations: {elbos}")
        for config, rs in results.items():
            summary.append(
                [
                    shape,
                    f"{config}: {CONFIGS[config][2]}",
                    *(
                        _span([r[key] for r in rs], fmt)
                        for key, fmt in (
                            ("s_per_iter", "{:.3f}"),
                            ("cpu", "{:.3f}"),
                            ("system", "{:.3f}"),
                            ("faults", "{:.0f}"),
                            ("peak_mb", "{:.0f}"),
                        )
                    ),
                ]
            )
    print(fmt_table(summary, header))


def _span(values: list[float], fmt: str) -> str:
    """``min-max`` of ``values`` (one value when they agree to the format)."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


if __name__ == "__main__":
    main()
