"""One documented end-to-end run: synth -> fit -> evaluate, with per-worker peak memory.

Usage: ``python bench/end_to_end.py [--users 1000000 --items 200000 --nnz 1e9 --k 50
--iters 20 --workers 2 --memory-limit 2GB --work /tmp/ordnmf-bench --eval-k 100
--eval-user-fraction 0.02] [--no-evaluate]``.

1. ``ordnmf_dask.datasets.synth`` writes the store (``--nnz`` train nonzeros; reused from ``--work``
   when it is already there, and then its creation time is not part of this run);
2. ``OrdNMF(K).fit`` on a LocalCluster of ``--workers`` single-thread worker processes capped at
   ``--memory-limit`` each, block caching decided by the estimator (``auto``: streamed from
   zarr when the blocks do not fit), checkpoints every 10 iterations, exactly ``--iters``
   iterations; every iteration's seconds and ELBO are printed as they come;
3. ``ordnmf_dask.evaluate`` on the same cluster: NDCG@``--eval-k`` per threshold over all
   items (training items excluded) for a ``--eval-user-fraction`` sample of the users, and the test
   log-likelihood of every test nonzero;
4. the host's speed in the same run, before the cluster starts and after it is closed (this
   shared host's speed drifts by 25% within an hour): one thread reads the blocks of one
   strip as a streamed pass does and runs the local step and both rate corrections on them;
   scaled to the store's nonzeros over the workers, that is what one iteration's reads and
   kernels cost with no Dask at all, and the fit's median iteration is printed over each.

Peak RSS of every process is sampled (psutil, every 200 ms) over the fit and the evaluation,
and the workers' kernel high-water marks (VmHWM) are printed at the end of each step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RssSampler, self_peak_mb  # noqa: E402
from iteration import ensure_store, in_fresh_process, store_name  # noqa: E402


def strip_job(path: str, k: int, r: int, n_blocks: int = 8) -> dict[str, float]:
    """One thread, blocks (r, 0..n_blocks-1) of the store: ns per nonzero of reading a block
    as a streamed pass does, and of the local step and the two rate corrections on it (random
    factors, the store's initial Delta): the host's speed for the kernels, in the same run."""
    import numpy as np

    from ordnmf_dask.engine.tasks import load_block
    from ordnmf_dask.model import kernels
    from ordnmf_dask.model.thresholds import gap_from_delta, init_delta
    from ordnmf_dask.store.blocks import open_store

    info = open_store(path)
    rb, cb = info.row_bounds, info.col_bounds
    cs = range(min(n_blocks, info.grid[1]))
    rng = np.random.default_rng(0)
    # distinct geometric and arithmetic means, as in a fit (two item rows read per nonzero)
    gw, ew = (rng.gamma(1.0, 0.3, (int(rb[r + 1] - rb[r]), k)) for _ in range(2))
    ghs = [rng.gamma(1.0, 0.3, (int(cb[c + 1] - cb[c]), k)) for c in cs]
    ehs = [rng.gamma(1.0, 0.3, g.shape) for g in ghs]
    delta = init_delta(np.asarray(info.hist_train))
    gap = gap_from_delta(delta)
    blocks = [load_block(path, "train", r, c) for c in cs]
    nnz = sum(b.nnz for b in blocks)
    best: dict[str, float] = {}
    for _ in range(3):
        t0 = time.perf_counter()
        for c in cs:  # as a streamed pass reads (into the thread's reused buffers)
            load_block(path, "train", r, c, reuse=True)
        t1 = time.perf_counter()
        kernels.local_step_row(blocks, gw, ghs, ew, ehs, delta, False)
        t2 = time.perf_counter()
        kernels.row_correction_row(blocks, gap, ehs)
        t3 = time.perf_counter()
        for b in blocks:
            kernels.col_correction(b, gap, ew)
        t4 = time.perf_counter()
        for name, sec in (
            ("read", t1 - t0),
            ("local", t2 - t1),
            ("row", t3 - t2),
            ("col", t4 - t3),
        ):
            best[name] = min(best.get(name, np.inf), sec / nnz * 1e9)
    return best


def host_speed(path: str, k: int, workers: int) -> tuple[dict[str, float], float]:
    """:func:`strip_job` on the middle user-block, in a fresh process, and the seconds of one
    iteration's 3 reads and 3 kernels over the store's nonzeros on ``workers`` threads."""
    from ordnmf_dask.store.blocks import open_store

    info = open_store(path)
    ref = in_fresh_process(strip_job, path, k, info.grid[0] // 2)
    per_nnz = 3 * ref["read"] + ref["local"] + ref["row"] + ref["col"]  # 3 passes read blocks
    return ref, per_nnz * 1e-9 * info.nnz_train / workers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--nnz", type=float, default=1e9)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--nnz-per-block", type=int, default=1 << 21)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="2GB")
    ap.add_argument("--work", default="/tmp/ordnmf-bench")
    ap.add_argument("--eval-k", type=int, default=100)
    ap.add_argument("--eval-user-fraction", type=float, default=0.02)
    ap.add_argument("--no-evaluate", action="store_true")
    args = ap.parse_args()

    from ordnmf_dask import OrdNMF
    from ordnmf_dask.engine.cavi import IterationInfo
    from ordnmf_dask.fitting import decide_cache
    from ordnmf_dask.postfit.evaluate import evaluate
    from ordnmf_dask.runtime.cluster import resolve_client
    from ordnmf_dask.store.blocks import open_store

    os.makedirs(args.work, exist_ok=True)
    start = time.perf_counter()
    name = store_name(args)
    existed = os.path.exists(os.path.join(args.work, name))
    path = ensure_store(args)
    print(
        f"store {path}: " + ("reused" if existed else f"synth {time.perf_counter() - start:.0f} s"),
        flush=True,
    )
    before = host_speed(path, args.k, args.workers)
    seconds: list[float] = []

    def record(info: IterationInfo) -> None:
        n, sec, elbo = info.iteration, info.seconds, info.elbo
        seconds.append(sec)
        print(f"iteration {n:3d}  {sec:7.1f} s  ELBO {elbo:.8e}", flush=True)

    with RssSampler([os.getpid()], interval=0.2) as sampler:
        with resolve_client(None, args.workers, memory_limit=args.memory_limit) as client:
            pids = client.run(os.getpid)
            mode = "cached" if decide_cache("auto", client, open_store(path)) else "streamed"
            model = OrdNMF(
                args.k,
                optimizer="cavi",
                tol=1e-12,
                max_iter=args.iters,
                min_iter=args.iters,
                checkpoint_every=10,
                work_dir=os.path.join(args.work, f"work-{name}"),
                n_members=1,
            )
            t0 = time.perf_counter()
            model.fit(
                path,
                client,
                callback=record,
                out=os.path.join(args.work, f"model-{name}"),
                overwrite=True,
            )
            fit_s = time.perf_counter() - t0
            fit_peaks = {p: sampler.peak.get(p, 0.0) for p in pids.values()}
            fit_hwm = client.run(self_peak_mb)
            print(
                f"fit: {fit_s:.0f} s wall for {len(seconds)} iterations "
                f"({fit_s / 60:.1f} min), median {statistics.median(seconds[1:]):.1f} s/iteration "
                f"after the first ({seconds[0]:.1f} s); blocks {mode}",
                flush=True,
            )
            print(
                "fit peak RSS per worker (MB, sampled): "
                + ", ".join(f"{fit_peaks[p]:.0f}" for p in sorted(fit_peaks))
                + "; VmHWM: "
                + ", ".join(f"{fit_hwm[a]:.0f}" for a in sorted(fit_hwm, key=lambda a: pids[a])),
                flush=True,
            )
            if not args.no_evaluate:
                t0 = time.perf_counter()
                res = evaluate(
                    path, model, client, k=args.eval_k, user_fraction=args.eval_user_fraction
                )
                ev_s = time.perf_counter() - t0
                ndcg = " ".join(f"s={s}:{v:.4f}" for s, v in sorted(res["ndcg"].items()))
                print(
                    f"evaluate: {ev_s:.0f} s; NDCG@{args.eval_k} over {res['n_users'][1]} "
                    f"sampled users: {ndcg}",
                    flush=True,
                )
                print(f"test log-likelihood per nonzero {res['test_loglik_mean']:.6f}", flush=True)
    after = host_speed(path, args.k, args.workers)
    median = statistics.median(seconds[1:])
    for when, (ref, ideal) in (("before the fit", before), ("after the run", after)):
        print(
            f"host speed {when}, one thread: read {ref['read']:.1f}, local step "
            f"{ref['local']:.1f}, W-rate {ref['row']:.1f}, H-rate {ref['col']:.1f} ns per "
            f"nonzero; 3 reads + kernels of one iteration on {args.workers} workers: "
            f"{ideal:.1f} s; median iteration / that: {median / ideal:.2f}",
            flush=True,
        )
    peaks = {p: sampler.peak.get(p, 0.0) for p in pids.values()}
    print(
        "peak RSS per worker over the whole run (MB, sampled): "
        + ", ".join(f"{peaks[p]:.0f}" for p in sorted(peaks))
        + f"; client {sampler.peak.get(os.getpid(), 0.0):.0f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
