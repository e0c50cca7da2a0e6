"""Seconds per exact iteration: distributed and in-process fits vs fused kernels vs paper style.

Usage: ``python bench/iteration.py [--users 20000 --items 12000 --nnz 2.5e6 --k 50 --classes 10
--iters 6 --workers 2 --nnz-per-block 2097152 --paper-iters 2 --authors-code PATH
--authors-iters 3]``.

On one synthetic store (``ordnmf_dask.datasets.synth``; ``--nnz`` train nonzeros, kept in
``--work``), in one run:

1. ``OrdNMF(K).fit`` on a LocalCluster of ``--workers`` single-thread worker processes, cached
   blocks, no checkpoints, ``--iters`` iterations; s/iteration = the mean over the iterations
   after the first (steady state; the median of the callback's seconds is printed too);
2. in a fresh process, the same fit with the in-process executor (``runtime/inprocess.py``: one
   thread per core, no scheduler);
3. in a fresh process, the fused kernels over all blocks of the store, one thread: one local
   pass, and the kernel work of one iteration (row + column rate corrections + local pass);
4. in a fresh process, the paper-style numpy/scipy implementation (``bench/paper_style.py``),
   median seconds (wall and CPU) of ``--paper-iters`` full exact iterations;
5. with ``--authors-code PATH``, in a fresh process, the authors' published code
   (``bench/authors_code.py``): after an untimed fit of 1 iteration, fits of 1 and
   1 + ``--authors-iters`` iterations, the difference per iteration.

Prints the ratios, the CPU time the fit's own process (client and scheduler) takes per
iteration, the CPU time per iteration of the in-process fit against the paper-style code's (a
steadier figure than wall time on a shared machine), and the peak RSS of every process (psutil
sampling every 20 ms, and the kernel's high-water mark VmHWM from ``getrusage``).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    RssSampler,
    fmt_table,
    save_training_npz,
    self_peak_mb,
    training_arrays,
)

from ordnmf_dask.store.blocks import open_store  # noqa: E402
from ordnmf_dask.store.grid import DEFAULT_NNZ_PER_BLOCK  # noqa: E402


def store_name(args: argparse.Namespace) -> str:
    """Directory name (under ``--work``) of the synthetic store for these sizes."""
    return (
        f"synth-{args.users}x{args.items}-nnz{int(args.nnz)}-k{args.k}-v{args.classes}"
        f"-b{args.nnz_per_block}"
    )


def ensure_store(args: argparse.Namespace) -> str:
    """The synthetic store for these sizes (made once, then reused from ``--work``)."""
    from ordnmf_dask.datasets.synth import synth

    path = os.path.join(args.work, store_name(args))
    if not os.path.exists(path):
        start = time.perf_counter()
        synth(
            path,
            args.users,
            args.items,
            int(args.nnz / 0.8),
            args.k,
            args.classes,
            seed=0,
            test_fraction=0.2,
            nnz_per_block=args.nnz_per_block,
        )
        print(f"synth {path}: {time.perf_counter() - start:.1f} s")
    return path


def load_all(path: str) -> tuple[Any, list[list[Any]]]:
    """The store's info and all its training blocks (CsrBlock), by grid position."""
    from ordnmf_dask.engine.tasks import load_block

    info = open_store(path)
    n_r, n_c = info.grid
    return info, [[load_block(path, "train", r, c) for c in range(n_c)] for r in range(n_r)]


def fused_job(path: str, k: int) -> dict[str, float]:
    """One thread, all blocks: seconds of one local pass and of one iteration's kernels."""
    from ordnmf_dask.model import kernels
    from ordnmf_dask.model.thresholds import gap_from_delta, init_delta

    info, blocks = load_all(path)
    rng = np.random.default_rng(0)
    rb, cb = np.diff(info.row_bounds), np.diff(info.col_bounds)
    # distinct tables for exp(E[log .]) and E[.], as a fit reads them (one table for both
    # would serve the second dot product of the local step from cache)
    gw, ew = ([rng.gamma(1.0, 0.3, (int(n), k)) for n in rb] for _ in range(2))
    gh, eh = ([rng.gamma(1.0, 0.3, (int(n), k)) for n in cb] for _ in range(2))
    delta = init_delta(np.asarray(info.hist_train))
    gap = gap_from_delta(delta)

    def local() -> None:
        for r, row in enumerate(blocks):
            for c, b in enumerate(row):
                kernels.local_step(b, gw[r], gh[c], ew[r], eh[c], delta, False)

    def corrections() -> None:
        for r, row in enumerate(blocks):
            for c, b in enumerate(row):
                kernels.row_correction(b, gap, eh[c])
                kernels.col_correction(b, gap, ew[r])

    local(), corrections()  # warm-up (numba cache load)
    t_local = min(_timed(local) for _ in range(2))
    t_corr = min(_timed(corrections) for _ in range(2))
    return {"local": t_local, "iteration": t_local + t_corr, "peak_mb": self_peak_mb()}


def paper_job(path: str, k: int, iters: int) -> dict[str, float]:
    """Median seconds of ``iters`` paper-style exact iterations on the store's train data."""
    from paper_style import PaperStyle

    rows, cols, y, (n_users, n_items, n_classes) = training_arrays(path)
    model = PaperStyle(rows, cols, y, (n_users, n_items), k, n_classes)
    times, cpus, elbos = [], [], []
    for _ in range(iters):
        start, cpu = time.perf_counter(), time.process_time()
        elbos.append(model.iteration())
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return {
        "s_per_iter": statistics.median(times),
        "cpu_per_iter": statistics.median(cpus),
        "peak_mb": self_peak_mb(),
        "elbo": elbos[-1],
    }


def authors_job(code: str, train: str, k: int, iters: int) -> dict[str, float]:
    """Seconds per iteration of the authors' code
    (:func:`authors_code.seconds_per_iteration`), and this process's peak RSS."""
    import authors_code

    module = authors_code.load(code)
    y, n_classes = authors_code.training_matrix(train)
    per_iter, _ = authors_code.seconds_per_iteration(module, y, n_classes, k, 0.3, iters)
    return {"s_per_iter": per_iter, "peak_mb": self_peak_mb()}


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def in_fresh_process(fn: Any, *args: Any) -> Any:
    """Run ``fn(*args)`` in a new (spawned) process, so that its peak RSS is its own."""
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def timed_fit(path: str, k: int, iters: int, cache: bool, client: Any) -> dict[str, Any]:
    """``OrdNMF(k)`` for exactly ``iters`` iterations on ``client``, no checkpoints: seconds of
    each iteration (from the callback), this process's CPU seconds between the first and the
    last iteration, and the whole fit's wall time."""
    from ordnmf_dask import OrdNMF
    from ordnmf_dask.engine.cavi import IterationInfo

    seconds: list[float] = []
    cpu: list[float] = []  # this process's CPU seconds after iterations 1 and n
    ends: list[float] = []  # wall clock after iterations 1 and n

    def record(info: IterationInfo) -> None:
        seconds.append(info.seconds)
        if info.iteration in (1, iters):
            cpu.append(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]))
            ends.append(time.perf_counter())

    start = time.perf_counter()
    model = OrdNMF(
        k,
        optimizer="cavi",
        tol=1e-12,
        max_iter=iters,
        min_iter=iters,
        cache_blocks=cache,
        checkpoint_every=0,
        n_members=1,
    )
    model.fit(path, client, callback=record)
    steps = max(iters - 1, 1)
    return {
        "s_per_iter": statistics.median(seconds[1:] or seconds),
        "mean_after_first": (ends[-1] - ends[0]) / steps,
        "first_iter": seconds[0],
        "fit_wall": time.perf_counter() - start,
        "cpu_per_iter": (cpu[-1] - cpu[0]) / steps,
    }


def distributed_fit(
    path: str, k: int, iters: int, workers: int, cache: bool, memory_limit: str | None = None
) -> dict[str, Any]:
    """:func:`timed_fit` on a LocalCluster of ``workers`` single-thread worker processes, and
    the peak RSS of client and workers (``client_cpu``: the CPU the fit's own process, client
    and scheduler, takes per iteration after the first).

    ``memory_limit``: per-worker cap given to the LocalCluster (dask's default otherwise).
    """
    from ordnmf_dask.runtime.cluster import resolve_client

    with RssSampler([os.getpid()]) as sampler:
        with resolve_client(None, workers, memory_limit=memory_limit) as client:
            res = timed_fit(path, k, iters, cache, client)
            hwm = client.run(self_peak_mb)
            pids = client.run(os.getpid)
    worker_pids = set(pids.values())
    return {
        **res,
        "client_cpu": res["cpu_per_iter"],
        "client_mb": sampler.peak.get(os.getpid(), 0.0),
        "client_hwm_mb": self_peak_mb(),
        "worker_mb": [sampler.peak.get(p, 0.0) for p in sorted(worker_pids)],
        "worker_hwm_mb": [hwm[a] for a in sorted(hwm, key=lambda a: pids[a])],
        "other_mb": {
            sampler.names.get(p, "?"): mb
            for p, mb in sampler.peak.items()
            if p != os.getpid() and p not in worker_pids
        },
    }


def inprocess_job(path: str, k: int, iters: int) -> dict[str, Any]:
    """:func:`timed_fit` with the in-process executor (one thread per core), cached blocks,
    and this process's peak RSS; run it in a fresh process (:func:`in_fresh_process`)."""
    from ordnmf_dask.runtime.inprocess import InProcessClient

    with InProcessClient() as client:
        res = timed_fit(path, k, iters, True, client)
    return {**res, "peak_mb": self_peak_mb()}


def add_store_args(ap: argparse.ArgumentParser) -> None:
    """The options that name the synthetic store of :func:`ensure_store` (defaults: the 2.5M
    benchmark's), and ``--work`` where it is kept."""
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--items", type=int, default=12_000)
    ap.add_argument("--nnz", type=float, default=2.5e6, help="train nonzeros (target)")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--nnz-per-block", type=int, default=DEFAULT_NNZ_PER_BLOCK)
    ap.add_argument("--work", default="/tmp/ordnmf-bench")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_store_args(ap)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--paper-iters", type=int, default=2)
    ap.add_argument(
        "--authors-code",
        metavar="PATH",
        help="also the authors' published code (a checkout, or its OrdNMF.py; "
        "bench/authors_code.py)",
    )
    ap.add_argument("--authors-iters", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    path = ensure_store(args)
    info = open_store(path)
    print(
        f"store: {info.n_users} x {info.n_items}, train nnz {info.nnz_train}, V {info.n_classes},"
        f" grid {info.grid}, K {args.k}, load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )
    dist = distributed_fit(path, args.k, args.iters, args.workers, cache=True)
    inproc = in_fresh_process(inprocess_job, path, args.k, args.iters)
    fused = in_fresh_process(fused_job, path, args.k)
    paper = in_fresh_process(paper_job, path, args.k, args.paper_iters)
    authors = None
    if args.authors_code:
        train = os.path.join(args.work, store_name(args) + "-train.npz")
        if not os.path.exists(train):
            save_training_npz(path, train)
        authors = in_fresh_process(
            authors_job, args.authors_code, train, args.k, args.authors_iters
        )
    t, p = dist["mean_after_first"], paper["s_per_iter"]
    refs = [p] + ([authors["s_per_iter"]] if authors else [])
    rows = [
        [f"distributed fit ({args.workers} workers x 1 thread)", t],
        [f"in-process fit ({os.cpu_count()} threads)", inproc["mean_after_first"]],
        ["fused local pass, 1 process 1 thread", fused["local"]],
        ["fused kernels of 1 iteration, 1 thread", fused["iteration"]],
        ["paper-style numpy/scipy, 1 process", p],
        *([["authors' code, 1 process", authors["s_per_iter"]]] if authors else []),
    ]
    rows = [[name, x, t / x, *(ref / x for ref in refs)] for name, x in rows]
    print(
        fmt_table(
            rows,
            [
                "implementation",
                "s/iter",
                "dist / this",
                "paper / this",
                *(["authors / this"] if authors else []),
            ],
        )
    )
    print(
        "fits: s/iter is the mean over the iterations after the first (the next iteration is "
        f"submitted while one runs); medians of the callback's seconds: distributed "
        f"{dist['s_per_iter']:.3f}, in-process {inproc['s_per_iter']:.3f}"
    )
    print(
        f"distributed: first iteration {dist['first_iter']:.3f} s, whole fit (incl. init, "
        f"save) {dist['fit_wall']:.1f} s; {args.workers} workers -> ideal kernel time per "
        f"iteration {fused['iteration'] / args.workers:.3f} s, overhead ratio "
        f"{t / (fused['iteration'] / args.workers):.2f}; the fit's process (client, scheduler "
        f"and this script's memory sampler, on the same cores) used "
        f"{dist['client_cpu'] * 1e3:.0f} ms of CPU per iteration after the first"
    )
    print(
        f"in-process: first iteration {inproc['first_iter']:.3f} s, whole fit "
        f"{inproc['fit_wall']:.1f} s, CPU {inproc['cpu_per_iter']:.3f} s per iteration after "
        f"the first (both cores: ideal {fused['iteration'] / 2:.3f} s per iteration); "
        f"paper-style CPU {paper['cpu_per_iter']:.3f} s per iteration: "
        f"{paper['cpu_per_iter'] / inproc['cpu_per_iter']:.1f}x the in-process fit's CPU"
    )
    mem = [
        ["client (fit driver)", dist["client_mb"], dist["client_hwm_mb"]],
        *[
            [f"worker {j}", s, h]
            for j, (s, h) in enumerate(zip(dist["worker_mb"], dist["worker_hwm_mb"], strict=True))
        ],
        *[[f"other: {name}", mb, ""] for name, mb in dist["other_mb"].items()],
        ["in-process fit", "", inproc["peak_mb"]],
        ["fused-kernel process", "", fused["peak_mb"]],
        ["paper-style process", "", paper["peak_mb"]],
        *([["authors' code process", "", authors["peak_mb"]]] if authors else []),
    ]
    print(fmt_table(mem, ["process", "peak RSS MB (psutil)", "VmHWM MB"]))
    print(
        f"paper-style ELBO after {args.paper_iters} iterations: {paper['elbo']:.6e}; load "
        f"average at the end {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
