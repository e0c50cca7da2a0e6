"""Seconds per CAVI iteration: LocalClusters of several layouts against the in-process
executor, same store, same run, side by side; on each cluster the ways the engine can run an
iteration there (docs/design.md §4): on one worker its graph of tasks and one task per step, on
several the graph with a task per strip at each number of tree levels per combining task, and
with one task per worker per pass.

Usage: ``python bench/executors.py STORE [--k 50 --iters 12 --skip 2 --rounds 1]
[--layouts 1x2 2x1] [--levels 1 3] [--own-cluster]``.

Fits ``OrdNMF(K)`` on ``STORE`` (a zarr store written by ``ingest`` or ``synth``) with a fixed
number of iterations (tol 1e-300, no checkpoints): on ``LocalCluster(n_workers=W,
threads_per_worker=T)`` for each ``--layouts`` WxT, one worker with
``engine.cavi.ONE_TASK_PER_STEP`` off (the graph) and on (the default), several workers with
``engine.cavi.ONE_TASK_PER_WORKER`` off (a task per strip) and ``runtime.reduce.LEVELS`` at each
``--levels`` (1: a task per add, the tree before ``fold_grouped``), then on (the default) at
the last, then in this process (``executor="inprocess"``, one thread per core),
``--rounds`` times alternated, after an untimed warm-up fit on each cluster and here (numba
compiles once per process). Prints the median seconds per iteration after the first
``--skip`` (callback seconds, over the rounds), the ratio to in-process, and, between the
``--skip``-th and the last iteration, the tasks per iteration the scheduler ran, the dependent
task hops per iteration along the chain of Dask tasks that gated each other, and that chain's
task seconds and waits between them (``bench/scaling.py``'s chain recorder: a step run as one
task hands its work to the worker's executor and returns, so its pick's seconds are the
step's); then, for each fit, the CPU per iteration between those two iterations
(``getrusage``: user and system ms, minor page faults) of this process (the client, the
scheduler of a LocalCluster, or the in-process fit) and of the workers, which the load moves
less than the seconds; then the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_table  # noqa: E402
from scaling import ChainRecorder, _chain_records, critical_path  # noqa: E402


def usage() -> tuple[float, float, int]:
    """This process's CPU seconds so far, user and system, and its minor page faults."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def fit(
    store: str, args: argparse.Namespace, client: Any = None
) -> tuple[list[float], list, list[float]]:
    """Seconds of each iteration after ``--skip``, the wall clock at iterations ``--skip`` and
    the last, and between those two, per iteration: this process's CPU ms (user, system) and
    minor page faults, then the workers' (summed over them; none in-process)."""
    from ordnmf_dask import OrdNMF

    seconds: list[float] = []
    marks: list[float] = []
    cpu: list[list[tuple[float, float, int]]] = []

    def record(info: Any) -> None:
        seconds.append(info.seconds)
        if info.iteration in (args.skip, args.iters):
            marks.append(time.time())
            cpu.append([usage(), *(client.run(usage).values() if client is not None else [])])

    model = OrdNMF(
        n_components=args.k,
        tol=1e-300,
        max_iter=args.iters,
        min_iter=args.iters,
        checkpoint_every=0,
        executor="inprocess" if client is None else "cluster",
        n_members=1,
    )
    model.fit(store, client, callback=record)
    n = args.iters - args.skip
    here = [(b - a) / n for a, b in zip(cpu[0][0], cpu[1][0], strict=True)]
    there = [
        sum(w1[i] - w0[i] for w0, w1 in zip(cpu[0][1:], cpu[1][1:], strict=True)) / n
        for i in range(3)
    ]
    ms = [1000 * here[0], 1000 * here[1], here[2], 1000 * there[0], 1000 * there[1], there[2]]
    return seconds[args.skip :], marks, ms


@contextmanager
def _cluster(own: bool, workers: int, threads: int) -> Iterator[Any]:
    """A client of ``workers`` worker processes of ``threads`` threads: the package's
    LocalCluster or a plain one."""
    from distributed import Client, LocalCluster

    from ordnmf_dask.runtime.cluster import resolve_client

    if own:
        with resolve_client(None, workers, threads_per_worker=threads) as client:
            yield client
        return
    with (
        LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True) as lc,
        Client(lc) as c,
    ):
        yield c


def modes(workers: int, levels: list[int]) -> dict[str, tuple[bool, int, bool]]:
    """The ways to run an iteration on ``workers`` workers: name -> (one task per step, levels
    of the reduction tree per combining task, one task per worker per pass). One worker: its
    graph of tasks and one task per step; several: the graph with a task per strip, with each
    of ``levels``, then with one task per worker per pass."""
    last = levels[-1]
    if workers == 1:
        return {"graph of tasks": (False, last, False), "one task per step": (True, last, False)}
    out = {f"graph, task per strip, {2**n} inputs per add": (False, n, False) for n in levels}
    return {**out, f"graph, task per worker, {2**last} inputs per add": (False, last, True)}


def _cpu_text(ms: list[float]) -> list[str]:
    """CPU ms per iteration (user / system) and minor faults, here and on the workers."""
    return [f"{ms[0]:.0f} / {ms[1]:.0f}, {ms[2]:.0f}", f"{ms[3]:.0f} / {ms[4]:.0f}, {ms[5]:.0f}"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="fits of each, alternated")
    ap.add_argument(
        "--layouts",
        nargs="+",
        default=["1x2"],
        help="clusters as WORKERSxTHREADS, e.g. 2x1 1x2 (default 1x2)",
    )
    ap.add_argument(
        "--levels",
        type=int,
        nargs="+",
        default=[1, 3],
        help="on several workers, levels of the reduction tree per combining task "
        "(runtime.reduce.LEVELS) to compare; the last also on one worker",
    )
    ap.add_argument(
        "--own-cluster",
        action="store_true",
        help="the LocalCluster a fit starts (runtime.cluster.resolve_client: its workers keep "
        "freed memory) instead of a plain one (Dask's settings)",
    )
    args = ap.parse_args()
    if not 1 <= args.skip < args.iters:
        raise SystemExit("--skip must be at least 1 and below --iters")
    from distributed import get_task_stream

    from ordnmf_dask.engine import cavi
    from ordnmf_dask.runtime import reduce

    layouts = [tuple(int(x) for x in name.split("x")) for name in args.layouts]
    rows: dict[str, list] = {}
    local: list[float] = []
    local_cpu: list[list[float]] = []
    fit(args.store, args)  # warm-up: numba compiles here
    n = args.iters - args.skip
    for _ in range(args.rounds):  # alternated, so that a change of load hits all of them
        for workers, threads in layouts:
            with _cluster(args.own_cluster, workers, threads) as client:
                client.register_plugin(ChainRecorder())
                fit(args.store, args, client)  # warm-up: numba compiles on the workers
                for name, (fused, levels, batched) in modes(workers, args.levels).items():
                    cavi.ONE_TASK_PER_STEP, reduce.LEVELS = fused, levels
                    cavi.ONE_TASK_PER_WORKER = batched
                    with get_task_stream(client) as stream:
                        seconds, (t0, t1), cpu = fit(args.store, args, client)
                    tasks = sum(
                        part["action"] == "compute" and t0 <= part["start"] and part["stop"] <= t1
                        for task in stream.data
                        for part in task["startstops"]
                    )
                    compute, waits, hops = critical_path(
                        client.run_on_scheduler(_chain_records), t0, t1
                    )
                    row = rows.setdefault(f"{workers} x {threads}, {name}", [[], 0, 0, 0, 0, []])
                    row[0] += seconds  # the counts of the last round (they do not depend on load)
                    row[1:5] = [tasks / n, hops / n, 1000 * compute / n, 1000 * waits / n]
                    row[5].append(cpu)
                cavi.ONE_TASK_PER_STEP, reduce.LEVELS = True, args.levels[-1]
                cavi.ONE_TASK_PER_WORKER = True
            done = fit(args.store, args)
            local += done[0]
            local_cpu.append(done[2])
    p = statistics.median(local)
    print(
        f"store {args.store}  K {args.k}  iterations {args.iters} (median after {args.skip}, "
        f"{args.rounds} round(s))"
    )
    table = [
        [
            name,
            f"{1000 * statistics.median(s):.1f}",
            f"{statistics.median(s) / p:.2f}x",
            f"{tasks:.1f}",
            f"{hops:.1f}",
            f"{compute:.1f} / {waits:.1f}",
        ]
        for name, (s, tasks, hops, compute, waits, _) in rows.items()
    ]
    table.append(["in-process", f"{1000 * p:.1f}", "1", "", "", ""])
    head = [
        "workers x threads, executor",
        "ms/iteration",
        "ratio",
        "tasks/iter",
        "hops/iter",
        "path ms tasks / waits",
    ]
    print(fmt_table(table, head))
    for name, (s, *_) in rows.items():
        print(f"per iteration, {name} ms:", " ".join(f"{1000 * x:.0f}" for x in s))
    print("per iteration, in-process ms:", " ".join(f"{1000 * x:.0f}" for x in local))
    cpu_head = ["CPU per iteration, each round", "here: user / system ms, faults", "workers: same"]
    cpu_rows = [[name, *_cpu_text(c)] for name, (*_, cpus) in rows.items() for c in cpus] + [
        ["in-process", *_cpu_text(c)[:1], ""] for c in local_cpu
    ]
    print(fmt_table(cpu_rows, cpu_head))
    print(f"load average          {os.getloadavg()}")


if __name__ == "__main__":
    main()
