"""Scaling of s/iteration and per-worker peak RSS with nnz, workers and block caching.

Usage: ``python bench/scaling.py [--nnz 1e6 1e7] [--workers 1 2] [--iters 4] [--k 50]
[--users U --items I] [--memory-limit 2GB] [--modes cached streaming]`` (add ``1e8`` to ``--nnz``
for the long run). For each train-nnz target a synthetic store is made once in ``--work``
(users = nnz / 100, items = nnz / 400, min 12k x 6k: ~100 nonzeros per user; or the fixed
``--users`` x ``--items``, so that the factors' size stays the same and only the data grows),
then for every worker count and mode (cached or streamed blocks; workers capped at
``--memory-limit`` each when given) the distributed fit runs
``--iters`` iterations (s/iteration = median after the first). The reference is "two fused
kernel passes on the same cores": 2 x (one thread's time for one fused local pass over all
blocks, measured in a fresh process) / workers; the table prints s/iteration over it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_table  # noqa: E402
from iteration import distributed_fit, ensure_store, fused_job, in_fresh_process  # noqa: E402

from ordnmf_dask.store.blocks import open_store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nnz", type=float, nargs="+", default=[1e6, 1e7])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--nnz-per-block", type=int, default=1 << 21)
    ap.add_argument("--work", default="/tmp/ordnmf-bench")
    ap.add_argument("--users", type=int, help="fixed number of users (default: nnz / 100)")
    ap.add_argument("--items", type=int, help="fixed number of items (default: nnz / 400)")
    ap.add_argument("--memory-limit", help="per-worker memory cap, e.g. 2GB (default: dask's)")
    ap.add_argument("--modes", nargs="+", choices=["cached", "streaming"],
                    default=["cached", "streaming"])
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rows = []
    for nnz in args.nnz:
        store_args = argparse.Namespace(
            users=args.users or max(12_000, int(nnz / 100)),
            items=args.items or max(6_000, int(nnz / 400)), nnz=nnz,
            k=args.k, classes=args.classes, nnz_per_block=args.nnz_per_block, work=args.work,
        )  # fmt: skip
        path = ensure_store(store_args)
        info = open_store(path)
        one_pass = in_fresh_process(fused_job, path, args.k)["local"]
        for workers in args.workers:
            for mode in args.modes:
                cache = mode == "cached"
                d = distributed_fit(path, args.k, args.iters, workers, cache, args.memory_limit)
                ref = 2 * one_pass / workers
                rows.append([
                    info.nnz_train, f"{info.grid[0]}x{info.grid[1]}", workers,
                    "cached" if cache else "streaming", d["s_per_iter"], ref,
                    d["s_per_iter"] / ref, max(d["worker_mb"]), max(d["worker_hwm_mb"]),
                    d["client_mb"],
                ])  # fmt: skip
                print(fmt_table(rows[-1:], HEADER).splitlines()[-1], flush=True)
    print(fmt_table(rows, HEADER))


HEADER = [
    "train nnz", "grid", "workers", "blocks", "s/iter", "2 fused passes", "ratio",
    "max worker RSS MB", "max worker VmHWM MB", "client RSS MB",
]  # fmt: skip


if __name__ == "__main__":
    main()
