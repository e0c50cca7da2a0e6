"""Where a distributed fit's time goes: Dask's task stream, per task kind, per iteration.

Usage: ``python bench/task_profile.py [--users 20000 --items 12000 --nnz 2.5e6 --k 50
--classes 10 --nnz-per-block 2097152 --iters 14 --skip 3 --workers 2] [--memory-limit 2GB]
[--stream]``.

Runs ``OrdNMF(K).fit`` on the synthetic store of these sizes (the same store as
``bench/iteration.py``, made once in ``--work``) on a LocalCluster of ``--workers``
single-thread worker processes (``resolve_client``, as a fit without a client starts), with
no checkpoints, and records the task stream. Over the iterations after the first ``--skip``
(steady state), it prints per task kind (the key's prefix) and action (compute, transfer,
disk-read, disk-write) the milliseconds per iteration summed over the workers, with the
number of tasks per iteration, and the share of the wall time each worker spends computing
(transfers run beside computations, on the worker's event loop). Sums over workers: on 2
workers, 2 x wall is available. Then each worker process's CPU time over the whole fit (from
``getrusage``: user, system, minor page faults), per iteration: system time is mostly the
kernel faulting in and zeroing fresh memory.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_table  # noqa: E402
from iteration import add_store_args, ensure_store  # noqa: E402


def profile(path: str, args: argparse.Namespace) -> None:
    from distributed import get_task_stream

    from ordnmf_dask import OrdNMF
    from ordnmf_dask.engine.cavi import IterationInfo
    from ordnmf_dask.runtime.cluster import resolve_client

    ends: list[float] = []  # wall clock when the client saw each iteration's result
    seconds: list[float] = []

    def record(info: IterationInfo) -> None:
        ends.append(time.time())
        seconds.append(info.seconds)

    with resolve_client(None, args.workers, memory_limit=args.memory_limit) as client:
        before = client.run(worker_usage)
        model = OrdNMF(
            args.k,
            optimizer="cavi",
            tol=1e-12,
            max_iter=args.iters,
            min_iter=args.iters,
            cache_blocks=not args.stream,
            checkpoint_every=0,
            n_members=1,
        )
        with get_task_stream(client) as stream:
            model.fit(path, client, callback=record)
        after = client.run(worker_usage)
    if len(ends) <= args.skip + 1:
        raise SystemExit(f"--iters {args.iters} leaves nothing after --skip {args.skip}")
    t0, t1 = ends[args.skip - 1] if args.skip else ends[0], ends[-1]
    n_iter = len(ends) - max(args.skip, 1)
    span = t1 - t0
    ms: dict[tuple[str, str], float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    busy: dict[str, float] = collections.defaultdict(float)
    for task in stream.data:
        key = task["key"] if isinstance(task["key"], str) else task["key"][0]
        prefix = key.rsplit("-", 1)[0]
        for part in task["startstops"]:
            start, stop = max(part["start"], t0), min(part["stop"], t1)
            if stop <= start:
                continue
            ms[(prefix, part["action"])] += 1000 * (stop - start) / n_iter
            if part["action"] == "compute":
                busy[task["worker"]] += stop - start
                count[prefix] += part["start"] >= t0
    rows = [
        [prefix, action, value, count[prefix] / n_iter if action == "compute" else ""]
        for (prefix, action), value in sorted(ms.items(), key=lambda kv: -kv[1])
    ]
    print(
        f"{n_iter} iterations after the first {max(args.skip, 1)}: mean {span / n_iter:.4f} s, "
        f"median {statistics.median(seconds[max(args.skip, 1) :]):.4f} s"
    )
    print(fmt_table(rows, ["task kind", "action", "ms/iteration", "tasks/iteration"]))
    for worker in sorted(busy):
        print(f"worker {worker}: computing {busy[worker] / span:.0%} of the wall time")
    for worker in sorted(after):
        user, system, faults = (b - a for a, b in zip(before[worker], after[worker], strict=True))
        print(
            f"worker {worker}, whole fit ({len(ends)} iterations and the initial step), per "
            f"iteration: CPU user {user / len(ends):.3f} s, system {system / len(ends):.3f} s, "
            f"{faults / len(ends):.0f} minor page faults"
        )


def worker_usage() -> tuple[float, float, int]:
    """This process's CPU seconds (user, system) and minor page faults so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_minflt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_store_args(ap)
    ap.add_argument("--iters", type=int, default=14)
    ap.add_argument("--skip", type=int, default=3, help="iterations left out (warm-up)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default=None, help="per worker, e.g. 2GB")
    ap.add_argument("--stream", action="store_true", help="stream blocks instead of caching")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    profile(ensure_store(args), args)


if __name__ == "__main__":
    main()
