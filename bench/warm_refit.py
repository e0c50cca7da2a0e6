"""Scheduled retraining: a warm refit from last period's model against a cold fit, side by side.

MovieLens (ml-latest-small, ratings with timestamps): a common held-out set is drawn from all
ratings (``--test-fraction``, seeded); the other ratings before the 90th percentile of the
timestamps make last period's store, all of them this period's (neither fit trains on a held-out
rating). The script fits last period cold, then this period twice with the same settings, tol
and seed (in this process: the executor a fit chooses for a store this small): warm-started
from last period's model (``init_model``), and cold. It prints iterations, seconds and NDCG@k
of both on the common held-out set, at every relevance level.
The iteration count is where the relative ELBO gain first drops below tol, which varies with
the seed (the warm / cold ratio more so): ``--seeds`` repeats the three fits per seed and ends
with the ratio at each. ``--last-tol`` fits last period to another tol (default ``--tol``): a
warm refit also finishes what last period's fit left of its own convergence.

``--synthetic NNZ``: the same on a synthetic IG-OrdNMF store of NNZ nonzeros (``synth``); last
period's store holds the first 1 / (1 + grow) of its users and items (``--grow``, 5% new users
and new items by default), with their ratings, and the common held-out set is the full store's
test split (nnz / 100 users x nnz / 400 items, at least 12k x 6k; true K = ``-k``).

    python bench/warm_refit.py                         # MovieLens, K = 50
    python bench/warm_refit.py --seeds 0 1 2 3         # the ratio at four seeds
    python bench/warm_refit.py --synthetic 1e7 -k 20 --user-fraction 0.1   # minutes
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from distributed import Client, LocalCluster

from ordnmf_dask import evaluate, ingest_arrays
from ordnmf_dask.datasets.synth import synth
from ordnmf_dask.estimator import ESTIMATORS
from ordnmf_dask.store.blocks import StoreInfo, read_block, read_ids

ML = Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-latest-small" / "ratings.csv"


def movielens(
    path: Path, work: Path, test_fraction: float, quantile: float, min_count: int
) -> tuple[StoreInfo, StoreInfo]:
    """(last period's store, this period's store) with the same held-out ratings."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))[1:]
    user = np.array([int(r[0]) for r in rows])
    item = np.array([int(r[1]) for r in rows])
    rating = np.array([float(r[2]) for r in rows])
    stamp = np.array([int(r[3]) for r in rows])
    held = np.random.default_rng(0).random(len(rows)) < test_fraction
    cut = np.quantile(stamp, quantile)
    early = stamp < cut
    print(
        f"{len(rows)} ratings; cut at the {quantile:.0%} timestamp quantile: "
        f"{int(early.sum())} before it; {int(held.sum())} held out"
    )

    def store(name: str, keep: np.ndarray) -> StoreInfo:
        tr, te = keep & ~held, keep & held
        return ingest_arrays(
            user[tr],
            item[tr],
            rating[tr],
            work / name,
            ratings="halfstar",
            min_count=min_count,
            test=(user[te], item[te], rating[te]),
        )

    return store("early.zarr", early), store("all.zarr", np.ones(len(rows), dtype=bool))


def synthetic(
    nnz: float, work: Path, grow: float, k: int, client: Client
) -> tuple[StoreInfo, StoreInfo]:
    """(last period's store, this period's store): the synthetic store and its first rows."""
    n_users, n_items = max(12_000, int(nnz / 100)), max(6_000, int(nnz / 400))
    t = time.perf_counter()
    full = synth(work / "all.zarr", n_users, n_items, int(nnz), k, client=client)
    print(
        f"synth {full.n_users} x {full.n_items}, {full.nnz_train} training nonzeros: "
        f"{time.perf_counter() - t:.0f}s"
    )
    keep_u, keep_i = int(n_users / (1 + grow)), int(n_items / (1 + grow))
    users, items = read_ids(full.path, "users"), read_ids(full.path, "items")
    parts: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for split in parts:
        for r in range(full.grid[0]):
            for c in range(full.grid[1]):
                b = read_block(full.path, split, r, c, values=("y",))
                u, i = b.rows + full.row_bounds[r], b.cols + full.col_bounds[c]
                keep = (u < keep_u) & (i < keep_i)
                parts[split].append(np.stack([users[u[keep]], items[i[keep]], b.y[keep]]))
    train, test = (np.concatenate(parts[s], axis=1) for s in ("train", "test"))
    early = ingest_arrays(
        *train, work / "early.zarr", ratings="integer", scale_max=full.n_classes, test=tuple(test)
    )
    print(f"last period: {early.n_users} x {early.n_items}, {early.nnz_train} training nonzeros")
    return early, full


def fit(
    name: str,
    store: StoreInfo,
    client: Client | None,
    out: Path,
    k: int,
    tol: float,
    seed: int,
    init_model: Path | None = None,
    optimizer: str | None = None,
) -> tuple[object, float]:
    t = time.perf_counter()
    extra = {} if optimizer is None else {"optimizer": optimizer}
    est = ESTIMATORS[name](k, tol=tol, max_iter=2000, seed=seed, **extra)
    est.fit(store.path, client, out=out, init_model=init_model)
    return est, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ratings", type=Path, default=ML)
    p.add_argument("--synthetic", type=float, metavar="NNZ", help="a synthetic store instead")
    p.add_argument("--grow", type=float, default=0.05, help="synthetic: new users / items")
    p.add_argument("-k", type=int, default=50)
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--last-tol", type=float, help="tol of last period's fit (default --tol)")
    p.add_argument("--model", default="OrdNMF", choices=sorted(ESTIMATORS))
    p.add_argument("--optimizer", choices=["cavi", "squarem"], help="default: the estimator's")
    p.add_argument("--min-count", type=int, default=20)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--quantile", type=float, default=0.9)
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="seeds of the three fits (last period, warm, cold), one run per seed",
    )
    p.add_argument("--workers", type=int, default=2, help="synthetic: LocalCluster workers")
    p.add_argument(
        "--user-fraction",
        type=float,
        default=1.0,
        help="NDCG over this random fraction of the users (the same for both fits)",
    )
    p.add_argument("--work", type=Path, help="directory for the stores and models (default tmp)")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="warm-refit-"))
    os.makedirs(work, exist_ok=True)
    # ml-latest-small fits in-process (the executor a fit chooses for a small store; bitwise a
    # cluster's result); the synthetic stores run on a LocalCluster
    cluster = (
        LocalCluster(n_workers=args.workers, threads_per_worker=1)
        if args.synthetic
        else contextlib.nullcontext()
    )
    with cluster as lc, Client(lc) if lc is not None else contextlib.nullcontext() as client:
        if args.synthetic:
            early, full = synthetic(args.synthetic, work, args.grow, args.k, client)
        else:
            early, full = movielens(
                args.ratings, work, args.test_fraction, args.quantile, args.min_count
            )
        print(
            f"this period: {full.n_users} x {full.n_items}, {full.nnz_train} training nonzeros"
            f" ({full.n_users - early.n_users} more users, {full.n_items - early.n_items} "
            "more items)"
        )
        ratios = {seed: compare(args, early, full, client, work, seed) for seed in args.seeds}
    if len(ratios) > 1:
        text = ", ".join(f"seed {s}: {r:.1%}" for s, r in ratios.items())
        print(f"\nwarm / cold passes: {text}; median {np.median(list(ratios.values())):.1%}")


def compare(
    args: argparse.Namespace,
    early: StoreInfo,
    full: StoreInfo,
    client: Client | None,
    work: Path,
    seed: int,
) -> float:
    """Last period's fit, then this period's warm refit and cold fit from ``seed``, printed
    side by side; the warm / cold ratio of full passes over the data."""
    tag = f"-{seed}" if len(args.seeds) > 1 else ""
    last = work / f"last{tag}.zarr"
    last_tol = args.tol if args.last_tol is None else args.last_tol
    opt = args.optimizer
    old, t_old = fit(args.model, early, client, last, args.k, last_tol, seed, optimizer=opt)
    print(
        f"\nseed {seed}: last period, cold (tol {last_tol:g}): {old.n_iter_} iterations, "
        f"{t_old:.1f}s"
    )
    warm, t_warm = fit(
        args.model,
        full,
        client,
        work / f"warm{tag}.zarr",
        args.k,
        args.tol,
        seed,
        init_model=last,
        optimizer=opt,
    )
    cold, t_cold = fit(
        args.model, full, client, work / f"cold{tag}.zarr", args.k, args.tol, seed, optimizer=opt
    )
    scores = {
        name: evaluate(full, est, client, k=100, user_fraction=args.user_fraction)
        for name, est in (("warm", warm), ("cold", cold))
    }
    print(f"{'':>22} {'warm refit':>12} {'cold fit':>12}")
    print(
        f"{'iterations':>22} {warm.n_iter_:>12d} {cold.n_iter_:>12d}   "
        f"(warm / cold = {warm.n_iter_ / cold.n_iter_:.1%})"
    )
    print(
        f"{'passes':>22} {warm.passes_:>12d} {cold.passes_:>12d}   "
        f"(warm / cold = {warm.passes_ / cold.passes_:.1%})"
    )
    print(f"{'seconds':>22} {t_warm:>12.1f} {t_cold:>12.1f}")
    reached = np.flatnonzero(np.asarray(warm.elbo_) >= cold.elbo_[-1])
    print(
        f"{'warm reaches the cold':>22} {'never' if reached.size == 0 else reached[0] + 1:>12}"
        "   (iterations until the warm ELBO is at the cold fit's final ELBO)"
    )
    print(f"{'final ELBO':>22} {warm.elbo_[-1]:>12.6g} {cold.elbo_[-1]:>12.6g}")
    for s in scores["cold"]["ndcg"]:
        a, b = scores["warm"]["ndcg"][s], scores["cold"]["ndcg"][s]
        print(f"{f'NDCG@100 s={s}':>22} {a:>12.4f} {b:>12.4f}   (warm - cold {a - b:+.4f})")
    print(
        f"{'test loglik / nnz':>22} {scores['warm']['test_loglik_mean']:>12.4f} "
        f"{scores['cold']['test_loglik_mean']:>12.4f}"
    )
    return warm.passes_ / cold.passes_


if __name__ == "__main__":
    main()
