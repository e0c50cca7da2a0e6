"""Scaling of s/iteration and per-worker peak RSS with nnz, workers and block caching.

Usage: ``python bench/scaling.py [--nnz 1e6 1e7] [--workers 1 2] [--iters 4] [--k 50]
[--users U --items I] [--memory-limit 2GB] [--modes cached streaming]`` (add ``1e8`` to ``--nnz``
for the long run); ``--profile [--predict P...] [--predict-shape U I NNZ R C] [--bandwidth B...]
[--one-worker-seconds S] [--hop-ms H] [--sched-ms S] [--variants-at P...]
[--threads-per-worker T...] [--layouts PxT...]`` for the counters and the cost model, and
``--rates LOCAL CORR GAMMA`` with the same options for the model alone. At the issue's scale on a
16-core machine: ``--profile --nnz 1e8 --users 1000000 --items 250000 --workers 1 2 4 8 16``;
processes against threads: ``--profile --layouts 1x1 1x2 2x1`` (P worker processes of T threads).

For each train-nnz target a synthetic store is made once in ``--work`` (users = nnz / 100, items =
nnz / 400, min 12k x 6k: ~100 nonzeros per user; or the fixed ``--users`` x ``--items``, so that
the factors' size stays the same and only the data grows), then for every worker count and mode
(cached or streamed blocks; workers capped at ``--memory-limit`` each when given) the distributed
fit runs ``--iters`` iterations (s/iteration = median after the first). The reference is "two fused
kernel passes on the same cores": 2 x (one thread's time for one fused local pass over all blocks,
measured in a fresh process) / workers; the table prints s/iteration over it. With ``--profile``
(cached blocks), each fit also records, over the iterations after the first: speed-up and
efficiency against the first worker count, bytes moved between workers (the workers'
``transfer_outgoing_bytes_total``), tasks run, the scheduler event-loop thread's CPU
(``client.run_on_scheduler`` with ``time.thread_time``) and the fit process's CPU, each worker's
idle share (wall minus its compute in ``get_task_stream``), and beside each the cost model's
prediction (``bench/cost_model.py``). The model's machine rates come from this run: kernel ns per
nonzero from the fused one-thread passes, Gamma ns per entry timed here, the hop cost from the
smallest worker count's idle time, bandwidth from the transfers' own durations. ``--predict P...``
then prints the model for those worker counts on this store, and ``--predict-shape U I NNZ R C`` on
a balanced grid of that size (``--bandwidth`` values in bytes/s), e.g. the 1M x 250k, 1e8 store of
the issue on 16 or 128 workers.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_table  # noqa: E402
from cost_model import Grid, Rates, predict  # noqa: E402
from iteration import distributed_fit, ensure_store, fused_job, in_fresh_process  # noqa: E402

from ordnmf_dask.store.blocks import open_store  # noqa: E402


def block_nnz(path: str) -> np.ndarray:
    """Training nonzeros of every block of the store, (R, C)."""
    from ordnmf_dask.engine.tasks import load_block

    info = open_store(path)
    n_r, n_c = info.grid
    return np.array(
        [[load_block(path, "train", r, c).nnz for c in range(n_c)] for r in range(n_r)], dtype=float
    )


def gamma_ns(k: int, rows: int = 200_000) -> float:
    """One thread's Gamma update, ns per factor entry (best of 3)."""
    from common import best_of

    from ordnmf_dask.model.updates import FactorChunk, update_chunk

    rng = np.random.default_rng(0)
    old = FactorChunk.initial(rng.gamma(1.0, 1.0, (rows, k)))
    sw, corr = rng.gamma(1.0, 1.0, (rows, k)), rng.gamma(1.0, 1.0, (rows, k))
    colsum = rng.gamma(1.0, 100.0, k)
    update_chunk(old, 0.3, sw, colsum, corr)
    return (
        1e9
        * best_of(lambda: update_chunk(old, 0.3, sw, colsum, corr), 3, time.process_time)
        / (rows * k)
    )


class ChainRecorder(SchedulerPlugin):
    """Scheduler plugin: each finished task's compute start and stop and its dependencies,
    to walk the chain of tasks that gated each other (:func:`critical_path`)."""

    name = "scaling-chain"

    def __init__(self) -> None:
        self.done: dict[Any, tuple[float, float, list[Any]]] = {}
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start != "processing" or finish != "memory":
            return
        ts = self.scheduler.tasks.get(key)
        spans = [x for x in kwargs.get("startstops", ()) if x["action"] == "compute"]
        if ts is not None and spans:
            deps = [d.key for d in ts.dependencies]
            self.done[key] = (spans[0]["start"], spans[-1]["stop"], deps)


def _chain_records(dask_scheduler: Any) -> dict[Any, tuple[float, float, list[Any]]]:
    return dask_scheduler.plugins[ChainRecorder.name].done


def critical_path(
    done: dict[Any, tuple[float, float, list[Any]]], t0: float, t1: float
) -> tuple[float, float, int]:
    """Walking back from the last task to finish by ``t1``, through the dependency that
    finished last (the one its start waited for), to ``t0``: compute seconds on the chain, the
    seconds between a dependency's end and its dependent's start, and the hops."""
    key = max((k for k, v in done.items() if v[1] <= t1), key=lambda k: done[k][1])
    compute = gaps = 0.0
    hops = 0
    while True:
        start, stop, deps = done[key]
        compute += stop - max(start, t0)
        known = [d for d in deps if d in done]
        if start <= t0 or not known:
            break
        dep = max(known, key=lambda d: done[d][1])
        gaps += max(start - max(done[dep][1], t0), 0.0)
        hops += 1
        if done[dep][1] <= t0:
            break
        key = dep
    return compute, gaps, hops


def _outgoing(dask_worker: Any) -> int:
    return dask_worker.transfer_outgoing_bytes_total


def _loop_cpu() -> float:
    return time.thread_time()


def profiled_fit(
    path: str, k: int, iters: int, workers: int, memory_limit: str | None, threads: int = 1
) -> dict[str, Any]:
    """A cached fit on a LocalCluster of ``workers`` worker processes of ``threads`` threads,
    with the counters of the module's docstring, per iteration after the first."""
    from distributed import get_task_stream

    from ordnmf_dask import OrdNMF
    from ordnmf_dask.runtime.cluster import resolve_client

    marks: list[tuple[float, float, float, dict[str, int]]] = []  # wall, loop, process CPU, out
    seconds: list[float] = []
    with resolve_client(
        None, workers, threads_per_worker=threads, memory_limit=memory_limit
    ) as client:
        client.register_plugin(ChainRecorder())

        def record(info: Any) -> None:
            seconds.append(info.seconds)
            if info.iteration in (1, iters):
                marks.append(
                    (
                        time.time(),
                        client.run_on_scheduler(_loop_cpu),
                        time.process_time(),
                        client.run(_outgoing),
                    )
                )

        model = OrdNMF(
            k,
            optimizer="cavi",
            tol=1e-12,
            max_iter=iters,
            min_iter=iters,
            cache_blocks=True,
            checkpoint_every=0,
            n_members=1,
        )
        with get_task_stream(client) as stream:
            model.fit(path, client, callback=record)
        done = client.run_on_scheduler(_chain_records)
    (t0, loop0, cpu0, out0), (t1, loop1, cpu1, out1) = marks
    n = iters - 1
    busy: dict[str, float] = collections.defaultdict(float)
    transfer_s: dict[str, float] = collections.defaultdict(float)
    tasks = 0
    for task in stream.data:
        for part in task["startstops"]:
            start, stop = max(part["start"], t0), min(part["stop"], t1)
            if stop <= start:
                continue
            if part["action"] == "compute":
                busy[task["worker"]] += stop - start
                tasks += part["start"] >= t0
            elif part["action"] == "transfer":
                transfer_s[task["worker"]] += stop - start
    span = t1 - t0
    moved = sum(out1[a] - out0[a] for a in out1)
    chain_compute, chain_gaps, chain_hops = critical_path(done, t0, t1)
    return {
        "s_per_iter": statistics.median(seconds[1:]),
        "mean": span / n,
        "bytes": moved / n,
        "tasks": tasks / n,
        "loop_cpu": (loop1 - loop0) / n,
        "process_cpu": (cpu1 - cpu0) / n,
        "idle": [1 - busy.get(a, 0.0) / (span * threads) for a in sorted(out1)],
        "busy": sum(busy.values()) / n,
        "transfer_s": sum(transfer_s.values()) / n,
        "chain_compute": chain_compute / n,
        "chain_gaps": chain_gaps / n,
        "chain_hops": chain_hops / n,
    }


def layout(text: str) -> tuple[int, int]:
    """``PxT`` of ``--layouts``: P worker processes of T threads each."""
    try:
        p, t = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want PxT, e.g. 1x2") from None
    if p < 1 or t < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: P and T must be >= 1")
    return p, t


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
    ap.add_argument(
        "--modes", nargs="+", choices=["cached", "streaming"], default=["cached", "streaming"]
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cached fits with counters and the cost model's predictions",
    )
    ap.add_argument(
        "--predict",
        type=int,
        nargs="*",
        default=[],
        help="with --profile: worker counts to predict on this store",
    )
    ap.add_argument(
        "--predict-shape",
        type=float,
        nargs=5,
        metavar=("U", "I", "NNZ", "R", "C"),
        action="append",
        default=[],
        help="with --profile: also predict a balanced store of this shape and grid (repeatable)",
    )
    ap.add_argument(
        "--bandwidth",
        type=float,
        nargs="*",
        default=[],
        help="bytes/s into a worker for the predictions (default: the measured)",
    )
    ap.add_argument(
        "--one-worker-seconds",
        type=float,
        help="scale the kernel rates so that the model's 1-worker s/iteration of "
        "--predict-shape is this (a reported figure of another machine)",
    )
    ap.add_argument("--hop-ms", type=float, help="hop cost for the predictions")
    ap.add_argument(
        "--variants-at",
        type=int,
        nargs="*",
        default=[16],
        help="worker counts of the design-variant tables (--predict-shape)",
    )
    ap.add_argument(
        "--rates",
        type=float,
        nargs=3,
        metavar=("LOCAL", "CORR", "GAMMA"),
        help="model only, no fits: one thread's local and correction ns per "
        "nonzero and Gamma ns per entry (e.g. from an earlier --profile run)",
    )
    ap.add_argument(
        "--threads-per-worker",
        type=int,
        nargs="+",
        default=[1],
        help="predictions for workers of this many threads sharing their factor chunks (the "
        "kernels assumed to keep their one-thread speed on every thread)",
    )
    ap.add_argument(
        "--layouts",
        type=layout,
        nargs="+",
        metavar="PxT",
        help="with --profile: measured LocalClusters of P worker processes of T threads each, "
        "in this order, the first the reference (e.g. 1x1 1x2 2x1; default: --workers x 1)",
    )
    ap.add_argument("--sched-ms", type=float, help="scheduler CPU per task for the predictions")
    args = ap.parse_args()
    if args.rates:
        return predictions(
            args, None, Rates(*args.rates), args.bandwidth[0] if args.bandwidth else 1e9
        )
    if args.profile:
        return profile_main(args)
    os.makedirs(args.work, exist_ok=True)
    rows = []
    for nnz in args.nnz:
        store_args = argparse.Namespace(
            users=args.users or max(12_000, int(nnz / 100)),
            items=args.items or max(6_000, int(nnz / 400)),
            nnz=nnz,
            k=args.k,
            classes=args.classes,
            nnz_per_block=args.nnz_per_block,
            work=args.work,
        )
        path = ensure_store(store_args)
        info = open_store(path)
        one_pass = in_fresh_process(fused_job, path, args.k)["local"]
        for workers in args.workers:
            for mode in args.modes:
                cache = mode == "cached"
                d = distributed_fit(path, args.k, args.iters, workers, cache, args.memory_limit)
                ref = 2 * one_pass / workers
                rows.append(
                    [
                        info.nnz_train,
                        f"{info.grid[0]}x{info.grid[1]}",
                        workers,
                        "cached" if cache else "streaming",
                        d["s_per_iter"],
                        ref,
                        d["s_per_iter"] / ref,
                        max(d["worker_mb"]),
                        max(d["worker_hwm_mb"]),
                        d["client_mb"],
                    ]
                )
                print(fmt_table(rows[-1:], HEADER).splitlines()[-1], flush=True)
    print(fmt_table(rows, HEADER))


def profile_main(args: argparse.Namespace) -> None:
    """``--profile``: measured counters and the model's predictions, per worker count."""
    for nnz in args.nnz:
        store_args = argparse.Namespace(
            users=args.users or max(12_000, int(nnz / 100)),
            items=args.items or max(6_000, int(nnz / 400)),
            nnz=nnz,
            k=args.k,
            classes=args.classes,
            nnz_per_block=args.nnz_per_block,
            work=args.work,
        )
        path = ensure_store(store_args)
        info = open_store(path)
        grid = Grid(info.row_bounds, info.col_bounds, block_nnz(path), args.k)
        fused = in_fresh_process(fused_job, path, args.k)
        local_ns = 1e9 * fused["local"] / info.nnz_train
        corr_ns = 1e9 * (fused["iteration"] - fused["local"]) / info.nnz_train
        rates = Rates(local_ns, corr_ns, gamma_ns(args.k), hop_s=0.0, sched_s=0.0)
        print(
            f"store {info.n_users} x {info.n_items}, train nnz {info.nnz_train}, grid "
            f"{info.grid}, K {args.k}; load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores; one thread: local {local_ns:.1f} ns/nnz, corrections "
            f"{corr_ns:.1f} ns/nnz, Gamma {rates.gamma_ns:.1f} ns/entry",
            flush=True,
        )
        layouts = args.layouts or [(p, 1) for p in args.workers]
        meas = {}
        for p, t in layouts:  # a line per layout as it ends, so a run cut short keeps its figures
            start = time.perf_counter()
            meas[p, t] = profiled_fit(path, args.k, args.iters, p, args.memory_limit, t)
            print(
                f"{p} x {t}: {meas[p, t]['mean']:.3f} s/iteration, busy "
                f"{meas[p, t]['busy']:.3f} s; fit {time.perf_counter() - start:.0f} s",
                flush=True,
            )
        # calibration: the hop cost from the first layout (its workers' idle time over the
        # model's hops: with one single-thread worker, it idles only while a dependency's result
        # goes through the scheduler), the scheduler's CPU per task, the bandwidth from the
        # transfers' durations on more than one worker
        p0, t0 = layouts[0]
        m0 = meas[layouts[0]]
        hop_s = max(m0["mean"] - m0["busy"] / (p0 * t0), 0.0) / predict(grid, p0, rates).hops
        moved = [(m["bytes"], m["transfer_s"]) for (p, _), m in meas.items() if p > 1]
        bw = sum(b for b, _ in moved) / max(sum(t for _, t in moved), 1e-9) if moved else 1e9
        rates = Rates(
            rates.local_ns,
            rates.corr_ns,
            rates.gamma_ns,
            bw,
            hop_s,
            m0["loop_cpu"] / max(m0["tasks"], 1),
        )
        print(
            f"calibrated: hop {rates.hop_s * 1e3:.2f} ms (idle time of {p0} x {t0}),"
            f" scheduler loop {rates.sched_s * 1e3:.2f} ms CPU per task, bandwidth "
            f"{bw / 1e6:.0f} MB/s (bytes over transfer seconds)"
        )
        rows = []
        for (p, t), m in meas.items():
            pr = predict(grid, p, rates, threads=t)
            rows.append(
                [
                    f"{p} x {t}",
                    m["mean"],
                    pr.seconds,
                    m0["mean"] / m["mean"] * p0 * t0,
                    m0["mean"] * p0 * t0 / (m["mean"] * p * t),
                    m["bytes"] / 1e6,
                    pr.bytes_moved / 1e6,
                    m["tasks"],
                    pr.n_tasks,
                    m["loop_cpu"] * 1e3,
                    m["process_cpu"] * 1e3,
                    m["busy"],
                    pr.kernel_total,
                    " ".join(f"{x:.0%}" for x in m["idle"]),
                ]
            )
        print(fmt_table(rows, PROFILE_HEADER))
        print(
            "(measured unless marked 'model'; speed-up and efficiency against "
            f"{p0} x {t0}, per thread; busy = workers' compute seconds per iteration, summed "
            f"over threads; load average {os.getloadavg()[0]:.1f} after the fits)"
        )
        serial = [
            [
                f"{p} x {t}",
                m["chain_compute"] + m["chain_gaps"],
                m["chain_compute"],
                m["chain_gaps"],
                m["chain_hops"],
                1e3 * m["chain_gaps"] / max(m["chain_hops"], 1),
                predict(grid, p, rates, threads=t).hops,
                m["loop_cpu"],
                m["process_cpu"],
            ]
            for (p, t), m in meas.items()
        ]
        print(fmt_table(serial, SERIAL_HEADER))
        print(
            "(critical path: from the last task to finish back through the dependency each "
            "task waited for, per iteration; its waits include waiting for a busy worker)"
        )
        predictions(args, grid, rates, bw)


def predictions(args: argparse.Namespace, grid: Grid | None, rates: Rates, bw: float) -> None:
    """The model's tables: ``--predict`` on ``grid`` (the measured store, when there is one)
    and on each ``--predict-shape``, per ``--bandwidth``, and the design variants."""
    rates = Rates(
        rates.local_ns,
        rates.corr_ns,
        rates.gamma_ns,
        rates.bandwidth,
        rates.hop_s if args.hop_ms is None else args.hop_ms / 1e3,
        rates.sched_s if args.sched_ms is None else args.sched_ms / 1e3,
    )
    shapes = [("this store", grid, args.predict)] if grid is not None else []
    for u, i, nz, r, c in args.predict_shape:
        shapes.append(
            (
                f"balanced {int(u)} x {int(i)}, {nz:.0e} nnz, {int(r)}x{int(c)}",
                Grid.balanced(int(u), int(i), nz, int(r), int(c), args.k),
                args.predict or args.workers,
            )
        )
    # the shape --one-worker-seconds is of: the first --predict-shape
    ref = shapes[-len(args.predict_shape)][1] if args.predict_shape else grid
    for name, g, counts in shapes:
        for b in args.bandwidth or [bw]:
            r_b = Rates(
                rates.local_ns, rates.corr_ns, rates.gamma_ns, b, rates.hop_s, rates.sched_s
            )
            if args.one_worker_seconds and g is not grid:
                r_b = scaled_to(ref, r_b, args.one_worker_seconds)
            one = predict(g, 1, r_b).seconds  # one single-thread worker
            out = []
            for t in args.threads_per_worker:
                for p in counts:
                    pr = predict(g, p, r_b, threads=t)
                    out.append(
                        [
                            f"{p} x {t}",
                            pr.seconds,
                            one / pr.seconds,
                            pr.transfer_s,
                            pr.hops * pr.hop_s,
                            pr.sched_s,
                            pr.bytes_moved / 1e6,
                            " ".join(
                                f"{k} {v:.2f}/{pr.workers_used[k]}" for k, v in pr.kernel.items()
                            ),
                        ]
                    )
            print(
                f"model, {name}, bandwidth {b / 1e6:.0f} MB/s "
                "(speed-up against one single-thread worker):"
            )
            print(fmt_table(out, MODEL_HEADER))
            if g is not grid:
                for p in args.variants_at:
                    print_variants(g, p, r_b, one)


def print_variants(grid: Grid, p: int, rates: Rates, one: float) -> None:
    """The model for design changes on ``p`` workers (see :func:`cost_model.predict`):
    chunks sent whole (no views), the H-rate pass on the row strips, one Dask worker process
    of ``p`` threads (nothing moves between its threads; the scheduler's hops and per-task cost
    stay), and one in-process executor of ``p`` threads (hops of 0.1 ms and 0.05 ms per task)."""
    threads = Rates(rates.local_ns, rates.corr_ns, rates.gamma_ns, math.inf, 1e-4, 5e-5)
    out = []
    for name, r, kw in [
        ("as the engine places tasks", rates, {}),
        ("chunks sent whole (no views)", rates, {"views": False}),
        ("H-rate pass on the row strips (no W moves)", rates, {"h_rate_by_rows": True}),
        (f"1 worker process x {p} threads", rates, {"threads": p}),
        (f"in-process, {p} threads", threads, {"threads": p}),
    ]:
        pr = predict(grid, 1 if "threads" in kw else p, r, **kw)
        out.append([name, pr.seconds, one / pr.seconds, pr.transfer_s, sum(pr.kernel.values())])
    print(
        fmt_table(
            out,
            [
                f"variant, {p} workers",
                "s/iter",
                "speed-up",
                "transfer s",
                "kernel s (busiest per pass)",
            ],
        )
    )


def scaled_to(grid: Grid, rates: Rates, seconds: float) -> Rates:
    """``rates`` with the kernel costs scaled so that the model's 1-worker time is ``seconds``."""
    one = predict(grid, 1, rates)
    f = (seconds - (one.seconds - one.kernel_total)) / one.kernel_total
    return Rates(
        rates.local_ns * f,
        rates.corr_ns * f,
        rates.gamma_ns * f,
        rates.bandwidth,
        rates.hop_s,
        rates.sched_s,
    )


PROFILE_HEADER = [
    "processes x threads",
    "s/iter",
    "model s/iter",
    "speed-up",
    "efficiency",
    "MB moved",
    "model MB",
    "tasks",
    "model tasks",
    "sched loop CPU ms",
    "fit process CPU ms",
    "busy s",
    "model kernel s",
    "idle per worker",
]
SERIAL_HEADER = [
    "processes x threads",
    "critical path s",
    "its compute s",
    "its waits s",
    "hops",
    "ms per hop",
    "model hops",
    "sched loop CPU s",
    "fit process CPU s",
]
MODEL_HEADER = [
    "processes x threads",
    "s/iter",
    "speed-up",
    "transfer s",
    "hops s",
    "scheduler s",
    "MB moved",
    "busiest worker's kernel s / workers used, per pass",
]


HEADER = [
    "train nnz",
    "grid",
    "workers",
    "blocks",
    "s/iter",
    "2 fused passes",
    "ratio",
    "max worker RSS MB",
    "max worker VmHWM MB",
    "client RSS MB",
]


if __name__ == "__main__":
    main()
