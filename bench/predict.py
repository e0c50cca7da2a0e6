"""Class probabilities: the in-memory API's latency and ``predict_pairs`` at scale.

1. In memory, a loaded model (``--model``, e.g. the ml-latest-small model of
   examples/movielens_small.sh): ``predict_proba`` of 1000 random pairs given as numpy arrays
   of raw ids, with the Gamma posterior and the plug-in law, beside ``score`` of the same
   pairs (the dot product alone) and ``predict_proba`` given Python lists; median and least of
   ``--repeat`` calls.
2. At scale: ``predict_pairs`` of ``--pairs`` random pairs of that model written to one Parquet
   file (row groups of 2^20 pairs), on a LocalCluster of 2 worker processes of 1 thread each:
   wall time and the workers' peak RSS (kernel high-water mark).

    python bench/predict.py --model MODEL [--repeat 200] [--pairs 10000000] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from common import worker_peaks

from ordnmf_dask import predict_pairs
from ordnmf_dask.estimator import OrdNMF


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=10_000_000)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    model = OrdNMF.load(args.model)
    srv = model._server()
    rng = np.random.default_rng(0)
    users = srv.users.ids[rng.integers(0, len(srv.users.ids), 1000)]
    items = srv.items.ids[rng.integers(0, len(srv.items.ids), 1000)]
    model.predict_proba(users, items)  # reads the factors, shapes and ids; compiles
    model.predict_proba(users, items, posterior="mean")
    print(f"1. in memory, 1000 pairs, {args.repeat} calls (load average {os.getloadavg()[0]:.1f})")
    rows = {
        "score (E[w].E[h])": lambda: model.score(users, items),
        "predict_proba gamma": lambda: model.predict_proba(users, items),
        "predict_proba mean": lambda: model.predict_proba(users, items, posterior="mean"),
        "predict_proba gamma, lists": lambda: model.predict_proba(list(users), list(items)),
    }
    for name, fn in rows.items():
        med, low = timed(fn, args.repeat)
        print(f"   {name:<28} median {med:7.3f} ms  least {low:7.3f} ms")

    if args.pairs <= 0:
        return
    from distributed import Client, LocalCluster

    work = args.work or tempfile.mkdtemp(prefix="ordnmf-predict-")
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "pairs.parquet")
    n = args.pairs
    table = pa.table(
        {
            "user": srv.users.ids[rng.integers(0, len(srv.users.ids), n)],
            "item": srv.items.ids[rng.integers(0, len(srv.items.ids), n)],
        }
    )
    pq.write_table(table, src, row_group_size=1 << 20)
    del table
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        base = max(worker_peaks(client).values())
        t = time.perf_counter()
        predict_pairs(args.model, src, out, client=client)
        wall = time.perf_counter() - t
        peaks = worker_peaks(client)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs) / 2**20
    print(
        f"2. predict_pairs, {n} pairs ({os.path.getsize(src) / 2**20:.0f} MiB in, {size:.0f} MiB "
        f"out), 2 workers x 1 thread: {wall:.1f} s ({n / wall / 1e6:.2f} M pairs/s); worker peak "
        f"RSS {', '.join(f'{p:.0f}' for p in peaks.values())} MiB (idle worker {base:.0f} MiB)"
    )
    if args.work is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
