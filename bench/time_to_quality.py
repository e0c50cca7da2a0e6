"""Time to quality: passes and seconds until the ELBO is near its optimum, per optimizer and start.

Per dataset, a reference fit (plain CAVI from the paper's random start at ``--ref-tol``, 1e-7)
gives the converged ELBO E*. Then each configuration (``--configs``: optimizer:start pairs) is
fitted from the same seed at the default tol (1e-5) and at ``--ref-tol``; for each run the
script records, from the iteration callback, the full passes over the training blocks and the
seconds until the ELBO first came within ``--within`` (relative, 1e-4) of E*, and the run's
final ELBO and NDCG@100 on the test split at a low, middle and top relevance level. All runs of
a dataset happen one after the other in one process, so their seconds compare (this machine is
shared: the passes are the stable figure).

``--seed-ratios N`` then fits plain CAVI at ``--ref-tol`` from each seed 0..N-1 (that seed's
own E*) and every other configuration at ``--ref-tol`` from the same seed, and prints per seed
the passes until each came within ``--within`` of that seed's E* (none: it converged lower) and
their share of CAVI's, with the mean share over the seeds where every configuration got there.

``--paired-seeds N`` then fits every configuration at the default tol from seeds 0..N-1 and
prints, per configuration, the mean and standard error over the seeds of its NDCG@100 minus
plain CAVI's from the same seed, and its passes as a share of CAVI's: how the default optimizer
and start were chosen.

Datasets: ml-latest-small (half-star classes), Last.fm (the paper's count classes), synthetic
stores drawn from the model (``--synthetic 1e6 1e7``), each with a 20% test split.

    python bench/time_to_quality.py --data ../shared/data               # MovieLens, Last.fm
    python bench/time_to_quality.py --data ../shared/data --synthetic 1e6 --datasets synth
    python bench/time_to_quality.py --data ../shared/data --paired-seeds 8
    python bench/time_to_quality.py --data ../shared/data --seed-ratios 6 --configs cavi:random \
        squarem:random --skip-table
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

from ordnmf_dask import OrdNMF, evaluate, ingest
from ordnmf_dask.datasets.synth import synth
from ordnmf_dask.store.blocks import StoreInfo


def stores(data: str, work: str, names: list[str], synthetic: list[float]) -> dict[str, Any]:
    """name -> (store, NDCG levels), made on demand."""
    common = {"min_count": 20, "test_fraction": 0.2, "seed": 0, "overwrite": True}

    def real(relative: str, out: str, **kind: str) -> Any:
        path = os.path.join(data, relative)
        return lambda: ingest(path, os.path.join(work, out), **kind, **common)

    makers = {
        "movielens": (
            real("ml-latest-small/ratings.csv", "ml.zarr", ratings="halfstar"),
            [1, 6, 10],
        ),
        "lastfm": (
            real("hetrec2011-lastfm-2k/user_artists.dat", "fm.zarr", counts="paper"),
            [1, 8, 10],
        ),
    }
    for nnz in synthetic:
        n_users, n_items = max(12_000, int(nnz / 100)), max(6_000, int(nnz / 400))
        makers[f"synth{nnz:.0e}"] = (
            lambda nnz=nnz, u=n_users, i=n_items: synth(
                os.path.join(work, f"synth{nnz:.0e}.zarr"), u, i, int(nnz), 20, seed=0
            ),
            [1, 5, 10],
        )
    wanted = [n for n in makers if n in names or (n.startswith("synth") and "synth" in names)]
    return {n: makers[n] for n in wanted}


_RUNS: dict[tuple, dict[str, Any]] = {}  # one fit per store, settings and seed per script run


def run(
    store: StoreInfo, k: int, optimizer: str, start: str, tol: float, seed: int = 0
) -> dict[str, Any]:
    """One fit; its trajectory (elbo, passes, elapsed seconds per iteration) and final state.
    A fit the script asked for before (the tables share seed 0's) is not run again."""
    key = (store.path, k, optimizer, start, tol, seed)
    if key in _RUNS:
        return _RUNS[key]
    trace: list[tuple[float, int, float]] = []
    model = OrdNMF(
        k, tol=tol, max_iter=20_000, seed=seed, optimizer=optimizer, start=start, n_members=1
    )
    t0 = time.perf_counter()
    model.fit(store.path, callback=lambda i: trace.append((i.elbo, i.passes, i.elapsed)))
    seconds = time.perf_counter() - t0
    _RUNS[key] = {"model": model, "trace": trace, "seconds": seconds}
    return _RUNS[key]


def reached(trace: list[tuple[float, int, float]], target: float, within: float) -> tuple:
    """(passes, seconds) when the ELBO first came within ``within`` of ``target``, or Nones."""
    for elbo, passes, elapsed in trace:
        if elbo >= target - within * abs(target):
            return passes, elapsed
    return None, None


def seed_ratios(
    info: StoreInfo, k: int, configs: list[str], seeds: int, ref_tol: float, within: float
) -> None:
    """Per seed, passes until within ``within`` of that seed's own CAVI optimum, per
    configuration, and their share of CAVI's."""
    others = [c for c in configs if c != "cavi:random"]
    print(f"\nper seed, tol {ref_tol:g}: passes to within {within:g} of the seed's E* (share)\n")
    print(
        "| seed | E* | cavi:random | " + " | ".join(others) + " |\n|" + "---|" * (3 + len(others))
    )
    shares: dict[str, list[float]] = {c: [] for c in others}
    for seed in range(seeds):
        ref = run(info, k, "cavi", "random", ref_tol, seed)["trace"]
        target = ref[-1][0]
        base = reached(ref, target, within)[0]
        got = {}
        for config in others:
            optimizer, start = config.split(":")
            got[config] = reached(
                run(info, k, optimizer, start, ref_tol, seed)["trace"], target, within
            )[0]
        cells = ["none" if got[c] is None else f"{got[c]} ({got[c] / base:.2f})" for c in others]
        print(f"| {seed} | {target:.10e} | {base} | " + " | ".join(cells) + " |")
        if all(got[c] is not None for c in others):
            for c in others:
                shares[c].append(got[c] / base)
    for c in others:
        n = len(shares[c])
        print(f"{c}: mean share {np.mean(shares[c]):.3f} over the {n} seeds where all got there")


def paired(info: StoreInfo, k: int, configs: list[str], levels: list[int], seeds: int) -> None:
    """Per configuration, NDCG@100 minus plain CAVI's from the same seed (mean and standard
    error over the seeds) and passes as a share of CAVI's, at the default tol."""
    ndcg: dict[str, list[np.ndarray]] = {c: [] for c in ["cavi:random", *configs]}
    passes: dict[str, list[int]] = {c: [] for c in ndcg}
    for seed in range(seeds):
        for config in ndcg:
            optimizer, start = config.split(":")
            model = run(info, k, optimizer, start, 1e-5, seed)["model"]
            scores = evaluate(info.path, model, levels=levels)["ndcg"]
            ndcg[config].append(np.array([scores[v] for v in levels]))
            passes[config].append(model.passes_)
    print(f"\npaired, seeds 0..{seeds - 1}, tol 1e-5: NDCG@100 {levels} minus cavi:random's\n")
    print("| config | mean difference | standard error | passes / cavi's |\n|---|---|---|---|")
    base = np.array(ndcg["cavi:random"])
    for config in configs:
        if config == "cavi:random":
            continue
        d = np.array(ndcg[config]) - base
        se = d.std(axis=0, ddof=1) / np.sqrt(seeds) if seeds > 1 else np.full(len(levels), np.nan)
        share = np.mean(np.array(passes[config]) / np.array(passes["cavi:random"]))
        print(
            f"| {config} | "
            + " / ".join(f"{x:+.4f}" for x in d.mean(axis=0))
            + " | "
            + " / ".join(f"{x:.4f}" for x in se)
            + f" | {share:.2f} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.environ.get("DATA", "../shared/data"))
    p.add_argument("--datasets", nargs="+", default=["movielens", "lastfm"])
    p.add_argument("--synthetic", nargs="*", type=float, default=[])
    p.add_argument("-k", type=int, default=50)
    p.add_argument("--ref-tol", type=float, default=1e-7)
    p.add_argument("--within", type=float, default=1e-4)
    p.add_argument("--configs", nargs="+", default=["cavi:random", "squarem:random"])
    p.add_argument("--paired-seeds", type=int, default=0, help="then the paired NDCG table")
    p.add_argument("--seed-ratios", type=int, default=0, help="then the per-seed passes table")
    p.add_argument("--skip-table", action="store_true", help="only the per-seed tables")
    p.add_argument("--json", help="write the rows here too")
    args = p.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} commit {commit} {platform.node()} K={args.k}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ttq-") as work:
        for name, (make, levels) in stores(args.data, work, args.datasets, args.synthetic).items():
            info = make()
            print(f"\n## {name}: {info.n_users} users x {info.n_items} items, {info.nnz_train} nnz")
            if not args.skip_table:
                rows += table(info, args, levels, name)
            if args.seed_ratios:
                seed_ratios(info, args.k, args.configs, args.seed_ratios, args.ref_tol, args.within)
            if args.paired_seeds:
                paired(info, args.k, args.configs, levels, args.paired_seeds)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


def table(info: StoreInfo, args: argparse.Namespace, levels: list[int], name: str) -> list[dict]:
    """Seed 0 of every configuration at the default tol and at ``--ref-tol``: the main table;
    returns its rows."""
    rows = []
    runs = {}
    for config in args.configs:
        optimizer, start = config.split(":")
        for tol in (1e-5, args.ref_tol):
            runs[(config, tol)] = run(info, args.k, optimizer, start, tol)
    ref = runs[("cavi:random", args.ref_tol)]["trace"][-1][0]
    head = "| config | tol | iterations | passes | s | final ELBO - E* (rel) |"
    head += f" passes to {args.within:g} | s to {args.within:g} | NDCG@100 {levels} |"
    print(f"E* = {ref:.10e} (cavi:random at tol {args.ref_tol:g})\n")
    print(head + "\n|" + "---|" * 9)
    for (config, tol), r in runs.items():
        model, trace = r["model"], r["trace"]
        ndcg = evaluate(info.path, model, levels=levels)["ndcg"]
        passes, secs = reached(trace, ref, args.within)
        row = {
            "dataset": name,
            "config": config,
            "tol": tol,
            "iterations": model.n_iter_,
            "passes": model.passes_,
            "seconds": r["seconds"],
            "final_rel": (trace[-1][0] - ref) / abs(ref),
            "passes_to": passes,
            "seconds_to": secs,
            "ndcg": [ndcg[v] for v in levels],
        }
        rows.append(row)
        print(
            f"| {config} | {tol:g} | {row['iterations']} | {row['passes']} | "
            f"{row['seconds']:.1f} | {row['final_rel']:+.2e} | {passes} | "
            f"{'-' if secs is None else f'{secs:.1f}'} | "
            + " / ".join(f"{x:.4f}" for x in row["ndcg"])
            + " |"
        )
    return rows


if __name__ == "__main__":
    main()
