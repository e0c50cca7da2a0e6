"""Worker memory over a long fit: does peak RSS grow with the number of iterations?

Writes a synthetic store (``ordnmf_dask.datasets.synth``), fits it on a LocalCluster of 2
single-threaded worker processes and samples every worker's RSS after each iteration (through the
fit callback). Prints RSS at a few iterations, the peak per window of iterations and the
scheduler's task count (bounded by the checkpoints' lineage cuts).

    python bench/memory_iterations.py [--nnz 2000000] [--iters 80] [-k 50]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import psutil

from ordnmf_dask import OrdNMF
from ordnmf_dask.datasets.synth import synth
from ordnmf_dask.runtime.cluster import resolve_client


def _rss(dask_worker=None) -> int:  # runs on each worker
    return psutil.Process(os.getpid()).memory_info().rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nnz", type=int, default=2_000_000)
    ap.add_argument("--users", type=int, default=40_000)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--iters", type=int, default=80)
    ap.add_argument("-k", type=int, default=50)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ordnmf-bench-")
    with resolve_client(None, 2) as client:
        store = synth(
            f"{tmp}/s.zarr",
            n_users=args.users,
            n_items=args.items,
            nnz=args.nnz,
            n_components=args.k,
            client=client,
            nnz_per_block=args.nnz // 4,
        )
        samples: dict[int, tuple[list[int], int]] = {}

        def record(info):
            n = info.iteration
            rss = list(client.run(_rss).values())
            tasks = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
            samples[n] = (rss, tasks)

        OrdNMF(
            args.k,
            optimizer="cavi",
            max_iter=args.iters,
            tol=1e-300,
            checkpoint_every=10,
            n_members=1,
        ).fit(store, client, callback=record)
    print(
        f"store: {store.n_users} x {store.n_items}, {store.nnz_train} train nnz, "
        f"grid {store.grid}, K = {args.k}"
    )
    print(" iter   worker RSS (MB)      scheduler tasks")
    marks = sorted({1, 5, 10, args.iters // 4, args.iters // 2, args.iters})
    for n in marks:
        rss, tasks = samples[n]
        print(f"{n:5d}   " + "  ".join(f"{r / 2**20:7.1f}" for r in rss) + f"   {tasks:8d}")
    step = max(1, args.iters // 6)
    windows = [range(a, min(a + step, args.iters + 1)) for a in range(1, args.iters + 1, step)]
    peaks = [max(max(samples[n][0]) for n in w) for w in windows]
    print(
        "max worker RSS per window of iterations (MB): "
        + ", ".join(
            f"{w.start}-{w.stop - 1}: {p / 2**20:.0f}" for w, p in zip(windows, peaks, strict=True)
        )
    )
    print(f"last window / second window (after warm-up): {peaks[-1] / peaks[1]:.3f}")


if __name__ == "__main__":
    main()
