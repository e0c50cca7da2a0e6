"""Seconds per CAVI iteration: one LocalCluster worker process of 2 threads against the
in-process executor, same store, same run, side by side.

Usage: ``python bench/executors.py STORE [--k 50 --iters 12 --skip 2]``.

Fits ``OrdNMF(K)`` on ``STORE`` (a zarr store written by ``ingest`` or ``synth``) twice, with a
fixed number of iterations (tol 1e-300, no checkpoints): on ``LocalCluster(n_workers=1,
threads_per_worker=2)`` and in this process (``executor="inprocess"``, one thread per core).
Prints the median seconds per iteration after the first ``--skip`` (callback seconds), their
ratio, the tasks per iteration the scheduler ran and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics


def fit(store: str, args: argparse.Namespace, client: object = None) -> list[float]:
    from ordnmf_dask import OrdNMF

    seconds: list[float] = []
    model = OrdNMF(
        n_components=args.k,
        tol=1e-300,
        max_iter=args.iters,
        min_iter=args.iters,
        checkpoint_every=0,
        executor="inprocess" if client is None else "cluster",
        n_members=1,
    )
    model.fit(store, client, callback=lambda info: seconds.append(info.seconds))
    return seconds[args.skip :]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2)
    args = ap.parse_args()
    from distributed import Client, LocalCluster, get_task_stream

    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=True) as cluster,
        Client(cluster) as client,
    ):
        fit(args.store, args, client)  # warm-up: numba compiles on the worker
        with get_task_stream(client) as stream:
            dist = fit(args.store, args, client)
    done = len(stream.data)
    fit(args.store, args)  # warm-up
    local = fit(args.store, args)
    d, p = statistics.median(dist), statistics.median(local)
    print(f"store {args.store}  K {args.k}  iterations {args.iters} (median after {args.skip})")
    print(f"1 worker x 2 threads  {1000 * d:8.1f} ms/iteration")
    print(f"in-process            {1000 * p:8.1f} ms/iteration")
    print(f"ratio                 {d / p:8.2f}x")
    print(f"tasks/iteration       {done / args.iters:8.1f} (start, model write too)")
    print("per iteration, cluster ms:", " ".join(f"{1000 * x:.0f}" for x in dist))
    print("per iteration, in-process ms:", " ".join(f"{1000 * x:.0f}" for x in local))
    print(f"load average          {os.getloadavg()}")


if __name__ == "__main__":
    main()
