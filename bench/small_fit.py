"""A whole fit as a user runs it, start-up included: ``ordnmf-dask fit`` against the paper-style
numpy code (and the authors' published code, when given), on ml-latest-small, in one run.

Usage: ``python bench/small_fit.py [--ratings ../shared/data/ml-latest-small/ratings.csv --k 50
--tol 1e-5 --rounds 2 --work /tmp/ordnmf-bench/small --no-cluster --authors-code PATH]``.

Once (not timed): ``ordnmf-dask ingest`` of the ratings (half stars -> classes 1..10, items then
users with fewer than 20 ratings dropped, 20% test), the store's training nonzeros written
to ``train.npz`` for the reference, the bytecode of this package and of the reference's
module (as ``pip install`` leaves it: with PYTHONDONTWRITEBYTECODE set, an editable install would
otherwise compile every module of the package from source in every run), and numba's cache of
the kernels (a one-iteration fit: numba compiles once per machine, or after a kernel changed).
Then ``--rounds`` rounds, each running in turn, as new processes:

1. ``ordnmf-dask fit STORE -k K`` (no cluster flags: the executor chosen automatically, so
   in-process for this store), to convergence with the default tol;
2. ``ordnmf-dask fit STORE -k K --executor cluster`` (a LocalCluster of 2 single-thread worker
   processes; left out with ``--no-cluster``);
3. the reference: a Python process that reads ``train.npz`` and runs as many exact iterations
   of ``bench/paper_style.py`` as fit 1 took (it has no stopping rule of its own);
4. with ``--authors-code PATH``: the authors' code (``bench/authors_code.py``) on ``train.npz``,
   fitted to its own stopping rule at the same tol (its iteration count is printed: its random
   start differs from fit 1's).

Each is timed from the process start to its exit (wall time and CPU time of the process and its
children), with the peak RSS of its process tree (psutil, every 20 ms). Ratios are reference /
this within a round, for each reference (its own speed drifts between runs on a shared
machine).
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RssSampler, fmt_table, save_training_npz  # noqa: E402

HERE = Path(__file__).resolve().parent
RATINGS = HERE.parent.parent / "shared" / "data" / "ml-latest-small" / "ratings.csv"


def prepare(ratings: str, work: str, authors_code: str | None = None) -> tuple[str, str]:
    """The store and ``train.npz`` (global rows, cols, classes, shape), made once in ``work``;
    the bytecode of the package and of the references, and numba's cache, brought up to date."""
    store, train = os.path.join(work, "ml.zarr"), os.path.join(work, "train.npz")
    if not os.path.exists(store):
        subprocess.run(
            [
                "ordnmf-dask",
                "ingest",
                ratings,
                "--out",
                store,
                "--ratings",
                "halfstar",
                "--min-count",
                "20",
                "-q",
            ],
            check=True,
        )
    if not os.path.exists(train):
        save_training_npz(store, train)
    import ordnmf_dask

    for where in (
        os.path.dirname(ordnmf_dask.__file__),
        str(HERE / "paper_style.py"),
        str(HERE / "authors_code.py"),
        *([authors_code] if authors_code else []),
    ):
        compile_all = compileall.compile_dir if os.path.isdir(where) else compileall.compile_file
        compile_all(where, quiet=1)
    subprocess.run(
        [
            "ordnmf-dask",
            "fit",
            "--n-members",
            "1",
            store,
            "-k",
            "2",
            "--max-iter",
            "1",
            "--out",
            os.path.join(work, "warm-up.zarr"),
            "--overwrite",
            "-q",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return store, train


# the reference process: only numpy, scipy and bench/paper_style.py are imported
REFERENCE = """
import sys
import numpy as np
sys.path.insert(0, {here!r})
from paper_style import PaperStyle
with np.load({train!r}) as z:
    rows, cols, y, shape = z["rows"], z["cols"], z["y"], z["shape"]
model = PaperStyle(rows, cols, y, (int(shape[0]), int(shape[1])), {k}, int(shape[2]))
for _ in range({iters}):
    elbo = model.iteration()
print(f"{iters} iterations, ELBO {{elbo:.10e}}")
"""


def timed(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd``; wall and CPU seconds (process and children), peak RSS of its tree, output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with RssSampler([proc.pid]) as sampler:
        out, err = proc.communicate()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {err}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall": wall,
        "cpu": cpu,
        "peak_mb": max(sampler.peak.values(), default=0.0),
        "tree_mb": sum(sampler.peak.values()),
        "out": out.strip(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratings", default=str(RATINGS))
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", default="/tmp/ordnmf-bench/small")
    ap.add_argument(
        "--no-cluster",
        action="store_true",
        help="only the in-process fit and the reference (no LocalCluster fit)",
    )
    ap.add_argument(
        "--authors-code",
        metavar="PATH",
        help="also the authors' published code (a checkout, or its OrdNMF.py; "
        "bench/authors_code.py), fitted to its own stopping rule at --tol",
    )
    ap.add_argument("--tol", type=float, default=1e-5, help="the tol of every fit")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    store, train = prepare(args.ratings, args.work, args.authors_code)
    model = os.path.join(args.work, "model.zarr")
    fit = [
        "ordnmf-dask",
        "fit",
        "--n-members",
        "1",
        store,
        "-k",
        str(args.k),
        "--optimizer",
        "cavi",  # the authors' trajectory, iteration for iteration
        "--tol",
        str(args.tol),
        "--out",
        model,
        "--overwrite",
        "-q",
    ]
    print(
        f"ml-latest-small store {store}, K {args.k}; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )
    runs: dict[str, list[dict[str, Any]]] = {"auto": [], "cluster": [], "reference": []}
    if args.no_cluster:
        del runs["cluster"]
    if args.authors_code:
        runs["authors"] = []
    for j in range(args.rounds):
        res = {"auto": timed(fit)}
        iters = int(re.search(r"(\d+) iterations", res["auto"]["out"]).group(1))
        if "cluster" in runs:
            res["cluster"] = timed([*fit, "--executor", "cluster"])
        code = REFERENCE.format(here=str(HERE), train=train, k=args.k, iters=iters)
        res["reference"] = timed([sys.executable, "-c", code])
        if "authors" in runs:
            res["authors"] = timed(
                [
                    sys.executable,
                    str(HERE / "authors_code.py"),
                    args.authors_code,
                    train,
                    "--k",
                    str(args.k),
                    "--tol",
                    str(args.tol),
                ]
            )
        for name, r in res.items():
            for ref in ("reference", "authors"):
                if ref in res:
                    r[f"{ref}_ratio"] = res[ref]["wall"] / r["wall"]
                    r[f"{ref}_cpu_ratio"] = res[ref]["cpu"] / r["cpu"]
            runs[name].append(r)
        print(f"round {j + 1}: " + "; ".join(f"{name} {r['out']!r}" for name, r in res.items()))
    labels = {
        "auto": "ordnmf-dask fit (auto: in-process)",
        "cluster": "ordnmf-dask fit --executor cluster",
        "reference": "paper-style numpy, same iterations",
        "authors": "authors' code, its own stopping rule",
    }
    refs = [ref for ref in ("reference", "authors") if ref in runs]
    keys = [
        "wall",
        *(f"{ref}_ratio" for ref in refs),
        "cpu",
        *(f"{ref}_cpu_ratio" for ref in refs),
        "peak_mb",
        "tree_mb",
    ]
    rows = [
        [labels[name], *(statistics.median(r[key] for r in res) for key in keys)]
        for name, res in runs.items()
    ]
    names = {"reference": "paper-style", "authors": "authors"}
    print(
        fmt_table(
            rows,
            [
                "whole run, process start-up included",
                "wall s",
                *(f"{names[ref]} / this" for ref in refs),
                "CPU s",
                *(f"{names[ref]} / this (CPU)" for ref in refs),
                "peak RSS MB (largest process)",
                "sum of peaks MB",
            ],
        )
    )
    print(
        f"(medians over rounds; ratios taken within each round; load average at the end "
        f"{os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    main()
