"""Ingest speed and memory: in-memory and distributed ingest next to the core of any ingest.

Usage: ``python bench/ingest.py --rows 10000000 [--format csv|parquet] [--no-distributed]``.

Writes (once, cached in ``--dir``) a synthetic input of distinct (user, item) pairs with
power-law degrees and string ids (``u123``, ``item-45``), half-star ratings, and measures in
one run, each in a fresh process:

- core: ``pyarrow`` reads the file, dictionary-encodes both id columns and argsorts the
  (user, item) codes once -- what any ingest has to do;
- in-memory: ``ordnmf_dask.ingest(FILE, OUT, ratings="halfstar")``;
- distributed: ``ingest_distributed`` on a LocalCluster of ``--workers`` processes capped at
  ``--memory-limit`` each.

It prints seconds per million rows, the kernel high-water RSS of every process (the measuring
process and each worker) and bytes of peak RSS per input row, and the ratio to the core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MB, fmt_table, self_peak_mb, worker_peaks  # noqa: E402


def write_input(path: Path, n_rows: int, fmt: str, seed: int = 0) -> None:
    """Distinct (user, item) pairs, shuffled; degrees ~ 1 / (rank + 10)^0.8 on both sides."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    n_users, n_items = max(n_rows // 20, 10), max(n_rows // 100, 10)

    def draw(n: int, size: int) -> np.ndarray:
        cdf = np.cumsum(1.0 / (np.arange(n) + 10.0) ** 0.8)
        picks = np.searchsorted(cdf, rng.random(size) * cdf[-1])
        return rng.permutation(n)[np.minimum(picks, n - 1)]

    keys = np.zeros(0, np.int64)
    while len(keys) < n_rows:
        more = int((n_rows - len(keys)) * 1.1) + 100
        keys = np.unique(np.concatenate([keys, draw(n_users, more).astype(np.int64) * n_items
                                         + draw(n_items, more)]))  # fmt: skip
    keys = rng.permutation(rng.choice(keys, n_rows, replace=False))
    users, items = np.divmod(keys, n_items)
    del keys
    table = pa.table({
        "user": pc.binary_join_element_wise("u", pc.cast(pa.array(users), pa.string()), ""),
        "item": pc.binary_join_element_wise("item-", pc.cast(pa.array(items), pa.string()), ""),
        "rating": pa.array(rng.integers(1, 11, n_rows) / 2.0),
    })  # fmt: skip
    tmp = path.with_name(path.name + ".part")
    if fmt == "csv":
        pacsv.write_csv(table, tmp, pacsv.WriteOptions(quoting_style="none"))
    else:
        pq.write_table(table, tmp, row_group_size=1 << 20)
    tmp.rename(path)


def run_core(path: str) -> None:
    """pyarrow read, dictionary-encode both id columns, one argsort of the pair codes."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pq.read_table(path) if path.endswith(".parquet") else pacsv.read_csv(path)
    u = table.column(0).dictionary_encode().combine_chunks()
    i = table.column(1).dictionary_encode().combine_chunks()
    key = u.indices.to_numpy().astype(np.int64) * len(i.dictionary) + i.indices.to_numpy()
    np.argsort(key)


def run_one(kind: str, path: str, out: str, workers: int, memory_limit: str) -> dict:
    """Time one measurement in this (fresh) process; kernel high-water RSS of its processes."""
    peaks: dict[str, float] = {}
    start = time.perf_counter()
    if kind == "core":
        run_core(path)
    elif kind == "in-memory":
        from ordnmf_dask import ingest

        ingest(path, out, ratings="halfstar")
    else:
        from distributed import Client, LocalCluster

        from ordnmf_dask.sources.distributed import ingest_distributed

        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          memory_limit=memory_limit, dashboard_address=None) as cluster, \
                Client(cluster) as client:  # fmt: skip
            start = time.perf_counter()
            ingest_distributed(path, out, client=client, ratings="halfstar")
            seconds = time.perf_counter() - start
            peaks.update({f"worker {k}": v for k, v in enumerate(worker_peaks(client).values())})
        peaks["main"] = self_peak_mb()
        return {"seconds": seconds, "peaks": peaks}
    seconds = time.perf_counter() - start
    peaks["main"] = self_peak_mb()
    return {"seconds": seconds, "peaks": peaks}


def measure(kind: str, path: Path, args: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp(dir=args.dir)) / "store.zarr"
    try:
        cmd = [sys.executable, __file__, "--run", kind, str(path), str(out), "--workers",
               str(args.workers), "--memory-limit", args.memory_limit]  # fmt: skip
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=float, default=1e7)
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory-limit", default="2GB")
    parser.add_argument("--no-distributed", action="store_true")
    parser.add_argument("--run", nargs=3, metavar=("KIND", "FILE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        kind, path, out = args.run
        print(json.dumps(run_one(kind, path, out, args.workers, args.memory_limit)))
        return
    n = int(args.rows)
    path = Path(args.dir) / f"ingest-bench-{n}.{args.format}"
    if not path.exists():
        start = time.perf_counter()
        write_input(path, n, args.format)
        print(f"wrote {path} ({os.path.getsize(path) / MB:.0f} MB) in "
              f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    kinds = ["core", "in-memory"] + ([] if args.no_distributed else ["distributed"])
    results = {kind: measure(kind, path, args) for kind in kinds}
    core = results["core"]["seconds"]
    rows = []
    for kind, res in results.items():
        top = max(res["peaks"].values())
        each = ", ".join(f"{k} {v:.0f}" for k, v in res["peaks"].items())
        rows.append([kind, res["seconds"], res["seconds"] / (n / 1e6), res["seconds"] / core,
                     top * MB / n, each])  # fmt: skip
    print(f"{n} rows, {args.format}, {os.cpu_count()} cores")
    print(fmt_table(rows, ["", "seconds", "s / M rows", "x core", "peak B / row",
                           "peak RSS MB per process"]))  # fmt: skip


if __name__ == "__main__":
    main()
