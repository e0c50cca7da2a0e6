"""Ingest speed and memory: the ingest in this process and on a cluster next to the core of any
ingest.

Usage: ``python bench/ingest.py --rows 10000000 [--format csv|parquet] [--kinds distributed]
[--check 4]``.

Writes (once, cached in ``--dir``) a synthetic input of distinct (user, item) pairs with
power-law degrees and string ids (``u123``, ``item-45``), half-star ratings, and measures in
one run, each in a fresh process:

- core: ``pyarrow`` reads the file, dictionary-encodes both id columns and argsorts the
  (user, item) codes once -- what any ingest has to do;
- in-process: ``ordnmf_dask.ingest(FILE, OUT, ratings="halfstar")``, the ingest pipeline's
  tasks run in this process;
- distributed: ``ingest_distributed`` on a LocalCluster of ``--workers`` processes of
  ``--threads-per-worker`` threads capped at ``--memory-limit`` each.

It prints seconds per million rows, CPU seconds of all its processes (steadier than wall time
on a shared machine), the kernel high-water RSS of every process (the measuring process and each
worker) and bytes of peak RSS per input row, and the ratio to the core. ``--kinds`` picks the
measurements (e.g. only ``distributed`` at 10^8 rows). For the distributed ingest it also
prints, per task name, the tasks' compute seconds and when they ran. ``--check N``
spot-checks N random blocks of the distributed store against the input file: the block's train
and test nonzeros, decoded to raw (user, item, value), are exactly the input rows whose user
and item fall in the block, and its test pairs hash below its train pairs (the seeded split).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MB, fmt_table, self_peak_mb, worker_peaks  # noqa: E402

_BATCH_ROWS = 1 << 26  # rows of the input written at a time


def write_input(path: Path, n_rows: int, fmt: str, seed: int = 0) -> None:
    """Distinct (user, item) pairs with degrees ~ 1 / (rank + 10)^0.8 on both sides, written
    batch by batch (at most ``_BATCH_ROWS`` rows in memory): batch b holds the users whose
    popularity rank is b modulo the number of batches, so pairs of different batches are
    distinct; rows are shuffled within a batch."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    n_users, n_items = max(n_rows // 20, 10), max(n_rows // 100, 10)
    n_batches = -(-n_rows // _BATCH_ROWS)
    user_of_rank, item_of_rank = rng.permutation(n_users), rng.permutation(n_items)

    def draw(n: int, size: int) -> np.ndarray:
        """Ranks of density ~ (r + 10)^-0.8 (its continuous CDF inverted)."""
        lo, hi = 10.0**0.2, (n + 10.0) ** 0.2
        ranks = ((lo + rng.random(size) * (hi - lo)) ** 5 - 10.0).astype(np.int64)
        return np.minimum(ranks, n - 1)

    def batch(b: int, n: int) -> pa.Table:
        keys = np.zeros(0, np.int64)
        while len(keys) < n:
            more = int((n - len(keys)) * 1.1) + 100
            ranks = draw(n_users, more)
            ranks += b - ranks % n_batches  # the nearest rank of this batch's class
            ranks[ranks >= n_users] -= n_batches
            users = user_of_rank[ranks[ranks >= 0]]
            items = item_of_rank[draw(n_items, len(users))]
            keys = np.unique(np.concatenate([keys, users.astype(np.int64) * n_items + items]))
        keys = rng.permutation(keys)[:n]
        users, items = np.divmod(keys, n_items)
        del keys
        return pa.table(
            {
                "user": pc.binary_join_element_wise("u", pc.cast(pa.array(users), pa.string()), ""),
                "item": pc.binary_join_element_wise(
                    "item-", pc.cast(pa.array(items), pa.string()), ""
                ),
                "rating": pa.array(rng.integers(1, 11, n) / 2.0),
            }
        )

    tmp = path.with_name(path.name + ".part")
    sizes = [n_rows // n_batches + (b < n_rows % n_batches) for b in range(n_batches)]
    writer = None
    try:
        for b, n in enumerate(sizes):
            table = batch(b, n)
            if writer is None:
                writer = (
                    pacsv.CSVWriter(
                        tmp, table.schema, write_options=pacsv.WriteOptions(quoting_style="none")
                    )
                    if fmt == "csv"
                    else pq.ParquetWriter(tmp, table.schema)
                )
            if fmt == "csv":
                writer.write_table(table)
            else:
                writer.write_table(table, row_group_size=1 << 20)
    finally:
        if writer is not None:
            writer.close()
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


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    t = psutil.Process().cpu_times()
    return t.user + t.system


def run_one(
    kind: str, path: str, out: str, workers: int, memory_limit: str, check: int, threads: int = 1
) -> dict:
    """Time one measurement in this (fresh) process; kernel high-water RSS and CPU seconds of
    its processes."""
    peaks: dict[str, float] = {}
    cpu, start = cpu_seconds(), time.perf_counter()
    if kind == "core":
        run_core(path)
    elif kind == "in-process":
        from ordnmf_dask import ingest

        ingest(path, out, ratings="halfstar")
    else:
        from distributed import Client, LocalCluster, get_task_stream

        from ordnmf_dask.sources.ingest import ingest_distributed

        with (
            LocalCluster(
                n_workers=workers,
                threads_per_worker=threads,
                processes=True,
                memory_limit=memory_limit,
                dashboard_address=None,
            ) as cluster,
            Client(cluster) as client,
        ):
            before = client.run(cpu_seconds)
            cpu, start = cpu_seconds(), time.perf_counter()
            with get_task_stream(client) as stream:
                ingest_distributed(path, out, client=client, ratings="halfstar")
            seconds = time.perf_counter() - start
            cpu = cpu_seconds() - cpu
            cpu += sum(v - before[k] for k, v in client.run(cpu_seconds).items())
            peaks.update({f"worker {k}": v for k, v in enumerate(worker_peaks(client).values())})
        peaks["main"] = self_peak_mb()
        result = {"seconds": seconds, "cpu": cpu, "peaks": peaks, "stages": stages(stream.data)}
        if check:
            result["check"] = spot_check(path, out, check)
        return result
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    peaks["main"] = self_peak_mb()
    return {"seconds": seconds, "cpu": cpu, "peaks": peaks}


def stages(records: list[dict]) -> dict[str, list[float]]:
    """Per task name (the function's, see ``Runner``): tasks, compute seconds summed, and the
    first start and last stop in seconds from the first task's start -- where the time goes."""
    spans: dict[str, list[float]] = {}
    first = min((s["start"] for r in records for s in r["startstops"]), default=0.0)
    for r in records:
        name = str(r["key"]).rsplit("-", 1)[0]
        for s in r["startstops"]:
            if s["action"] == "compute":
                n, total, lo, hi = spans.get(name, [0, 0.0, math.inf, 0.0])
                spans[name] = [
                    n + 1,
                    total + s["stop"] - s["start"],
                    min(lo, s["start"] - first),
                    max(hi, s["stop"] - first),
                ]
    return dict(sorted(spans.items(), key=lambda kv: kv[1][2]))


def spot_check(path: str, store: str, n_blocks: int, seed: int = 0) -> dict:
    """Check ``n_blocks`` random blocks of ``store`` against the input (see module docstring);
    raise AssertionError on a difference. Returns the blocks checked and their nonzeros."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from ordnmf_dask.sources.split import id_hashes, pair_hash, split_rule
    from ordnmf_dask.store.blocks import open_store, read_block, read_ids

    info = open_store(store)
    users, items = read_ids(store, "users"), read_ids(store, "items")
    n_r, n_c = len(info.row_bounds) - 1, len(info.col_bounds) - 1
    rng = np.random.default_rng(seed)
    picked = sorted(rng.choice(n_r * n_c, min(n_blocks, n_r * n_c), replace=False).tolist())
    found: dict[int, list] = {b: [] for b in picked}
    sets = {}
    for b in picked:
        r, c = divmod(b, n_c)
        sets[b] = (
            pa.array(users[info.row_bounds[r] : info.row_bounds[r + 1]]),
            pa.array(items[info.col_bounds[c] : info.col_bounds[c + 1]]),
        )
    batches = (
        pq.ParquetFile(path).iter_batches(1 << 20)
        if path.endswith(".parquet")
        else pacsv.open_csv(path)
    )
    for batch in batches:
        for b, (us, its) in sets.items():
            hit = pc.and_(pc.is_in(batch.column(0), us), pc.is_in(batch.column(1), its))
            found[b].append(batch.filter(hit))
    done = {}
    for b in picked:
        r, c = divmod(b, n_c)
        table = pa.Table.from_batches(found[b]) if found[b] else None
        columns = [] if table is None else [table.column(k).to_pylist() for k in range(3)]
        expect = sorted(zip(*columns, strict=True))
        got, hashes = [], {}
        for split in ("train", "test"):
            blk = read_block(store, split, r, c)
            rows = np.repeat(np.arange(len(blk.indptr) - 1), np.diff(blk.indptr))
            u, i = rows + info.row_bounds[r], blk.cols.astype(np.int64) + info.col_bounds[c]
            got += zip(users[u].tolist(), items[i].tolist(), blk.raw.tolist(), strict=True)
            hashes[split] = pair_hash(id_hashes(users[u]), id_hashes(items[i]), info.attrs["seed"])
        got.sort()
        assert got == expect, f"block {b}: {len(got)} nonzeros, {len(expect)} input rows"
        if info.attrs["split"] == "random":  # test: the pairs hashed below f 2^64
            below = np.uint64(split_rule(info.attrs["test_fraction"], 0.0).test_below)
            assert (hashes["test"] < below).all() and (hashes["train"] >= below).all(), (
                f"block {b}: split"
            )
        done[b] = len(got)
    return {
        "blocks": done,
        "grid": [n_r, n_c],
        "n_users": info.n_users,
        "n_items": info.n_items,
        "nnz_train": info.nnz_train,
        "nnz_test": info.nnz_test,
    }


def measure(kind: str, path: Path, args: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp(dir=args.dir)) / "store.zarr"
    try:
        cmd = [
            sys.executable,
            __file__,
            "--run",
            kind,
            str(path),
            str(out),
            "--workers",
            str(args.workers),
            "--threads-per-worker",
            str(args.threads_per_worker),
            "--memory-limit",
            args.memory_limit,
            "--check",
            str(args.check),
        ]
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
    parser.add_argument("--threads-per-worker", type=int, default=1)
    parser.add_argument("--memory-limit", default="2GB")
    parser.add_argument(
        "--kinds",
        default="core,in-process,distributed",
        help="comma-separated measurements among core, in-process, distributed",
    )
    parser.add_argument(
        "--check",
        type=int,
        default=0,
        metavar="N",
        help="spot-check N blocks of the distributed store against the input",
    )
    parser.add_argument("--run", nargs=3, metavar=("KIND", "FILE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        kind, path, out = args.run
        print(
            json.dumps(
                run_one(
                    kind,
                    path,
                    out,
                    args.workers,
                    args.memory_limit,
                    args.check,
                    args.threads_per_worker,
                )
            )
        )
        return
    n = int(args.rows)
    path = Path(args.dir) / f"ingest-bench-{n}.{args.format}"
    if not path.exists():
        start = time.perf_counter()
        write_input(path, n, args.format)
        print(
            f"wrote {path} ({os.path.getsize(path) / MB:.0f} MB) in "
            f"{time.perf_counter() - start:.0f} s"
        )
    kinds = args.kinds.split(",")
    unknown = set(kinds) - {"core", "in-process", "distributed"}
    if unknown:
        parser.error(f"unknown --kinds {sorted(unknown)}")
    results = {kind: measure(kind, path, args) for kind in kinds}
    core = results["core"]["seconds"] if "core" in results else float("nan")
    rows = []
    for kind, res in results.items():
        top = max(res["peaks"].values())
        each = ", ".join(f"{k} {v:.0f}" for k, v in res["peaks"].items())
        rows.append(
            [
                kind,
                res["seconds"],
                res["seconds"] / (n / 1e6),
                res["seconds"] / core,
                res["cpu"],
                top * MB / n,
                each,
            ]
        )
    print(f"{n} rows, {args.format}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(
        fmt_table(
            rows,
            [
                "",
                "seconds",
                "s / M rows",
                "x core",
                "CPU s",
                "peak B / row",
                "peak RSS MB per process",
            ],
        )
    )
    if "stages" in results.get("distributed", {}):
        print("distributed, per task name: tasks, compute seconds, span (s from the start)")
        print(
            fmt_table(
                [
                    [name, int(n), total, f"{lo:.1f}-{hi:.1f}"]
                    for name, (n, total, lo, hi) in results["distributed"]["stages"].items()
                ],
                ["task", "tasks", "compute s", "span s"],
            )
        )
    if "check" in results.get("distributed", {}):
        print("spot check passed:", json.dumps(results["distributed"]["check"]))


if __name__ == "__main__":
    main()
