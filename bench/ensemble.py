"""Ensembles of restarts (``n_members``) against one fit, side by side, with popularity as a floor.

One ensemble of ``--members`` members is fitted per store and K (``--k``); its first M members
(seeds seed .. seed + M - 1, the columns of the ensemble's factors) are scored for every M of
``--report`` (M = 1 is the single fit of the paper, bitwise), since a member is the fit of its
seed whatever the ensemble around it (tests/test_ensemble.py). Stores drawn from the model
(``--stores``: U x I x density x K_true, ``datasets.synth``, shape 0.3, V = 10, 20% test) are
scored as a share of the generating factors' NDCG@100 at s = 1 / 5 / 10; ml-latest-small
(``--real``: README's split, half stars, min_count 20, seed 0) as is at s = 1 / 6 / 10, and
Last.fm (``--lastfm``: the paper's count classes, min_count 20, 20% test, 10% validation,
which early-stops the fits) at s = 1 / 8 / 10. The
seconds are the whole ensemble's (this process's threads, or with ``--cluster`` a LocalCluster
of one worker process with 2 threads) and one single fit's (this process), peak RSS this
process's after the fit.

    python bench/ensemble.py --stores 2000x1000x0.05x8 2000x1000x0.05x20 --real --members 8
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import tempfile
import time

import numpy as np
from quality import item_counts, scored

from ordnmf_dask import OrdNMF, ingest
from ordnmf_dask.datasets.synth import SynthParams, synth, true_factors
from ordnmf_dask.store.blocks import StoreInfo, open_store, read_ids


def members_of(model: OrdNMF, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The factors of the ensemble of the first ``m`` members of ``model``."""
    k, n = model.n_components, model.n_members_
    w = model.user_factors[:, : m * k] * (n / m)
    return w, model.item_factors[:, : m * k]


def row(label: str, name: str, nd: dict[int, float], ref: dict[int, float] | None, extra: str):
    levels = sorted(nd)
    cells = "/".join(f"{nd[s] / ref[s]:.1%}" if ref else f"{nd[s]:.4f}" for s in levels)
    print(f"{label:<30} {name:<14} {cells:>24}  {extra}", flush=True)


def compare(info: StoreInfo, label: str, levels: list[int], truth, args) -> None:
    pop = scored(info, np.ones((info.n_users, 1)), item_counts(info)[:, None], levels)
    row(label, "popularity", pop, truth, "")
    for k in args.k:
        t0 = time.perf_counter()
        one = OrdNMF(k, seed=args.seed, n_members=1).fit(info.path)
        single = time.perf_counter() - t0
        t0 = time.perf_counter()
        ens = OrdNMF(k, seed=args.seed, n_members=max(args.report)).fit(info.path, args.client)
        seconds = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        assert np.array_equal(members_of(ens, 1)[1], one.item_factors)  # member 1 is the fit
        for m in args.report:
            nd = scored(info, *members_of(ens, m), levels)
            extra = (
                f"single {single:.1f} s; M = {max(args.report)}: {seconds:.1f} s, "
                f"peak RSS {rss:.0f} MiB"
                if m == max(args.report)
                else ""
            )
            row(label, f"K={k} M={m}", nd, truth, extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stores", nargs="*", default=["2000x1000x0.05x8", "2000x1000x0.05x20"])
    ap.add_argument("--store-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--k", type=int, nargs="+", default=[50])
    ap.add_argument("--report", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--seed", type=int, default=0, help="seed of the first member")
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--lastfm", action="store_true", help="Last.fm at the paper's count classes")
    ap.add_argument("--data", default=os.environ.get("DATA", "../shared/data"))
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="fit the ensembles on a LocalCluster of one worker process with 2 threads",
    )
    args = ap.parse_args()
    args.client = None
    if args.cluster:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=None)
        args.client = Client(cluster)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"{'store':<30} {'fit':<14} {'NDCG@100 per level':>24}")
    with tempfile.TemporaryDirectory(prefix="ensemble-") as work:
        for spec in args.stores:
            u, i, density, k_true = spec.split("x")
            u, i, k_true = int(u), int(i), int(k_true)
            for seed in args.store_seeds:
                path = os.path.join(work, f"{spec}-{seed}.zarr")
                info = synth(path, u, i, int(u * i * float(density)), k_true, 10, seed=seed)
                info = open_store(info.path)
                p = SynthParams.from_attrs(info.attrs)
                ru, ri = read_ids(info.path, "users"), read_ids(info.path, "items")
                w0, h0 = true_factors(p, "users", 0, u)[ru], true_factors(p, "items", 0, i)[ri]
                levels = [1, 5, 10]
                truth = scored(info, w0, h0, levels)
                label = f"{u}x{i} {float(density):.0%} K*={k_true} seed {seed}"
                compare(info, label, levels, truth, args)
        if args.real:
            ratings = os.path.join(args.data, "ml-latest-small", "ratings.csv")
            info = ingest(
                ratings, os.path.join(work, "ml.zarr"), ratings="halfstar", min_count=20, seed=0
            )
            compare(info, "ml-latest-small s=1/6/10", [1, 6, 10], None, args)
        if args.lastfm:
            plays = os.path.join(args.data, "hetrec2011-lastfm-2k", "user_artists.dat")
            info = ingest(
                plays,
                os.path.join(work, "fm.zarr"),
                counts="paper",
                min_count=20,
                seed=0,
                validation_fraction=0.1,
            )
            compare(info, "Last.fm s=1/8/10", [1, 8, 10], None, args)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
