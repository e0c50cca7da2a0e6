"""Early stopping on a validation metric against the ELBO rule, and the synthetic-data figure.

Usage: ``python bench/early_stopping.py [--work DIR] [-k 50] [--every 5] [--patience 4]
[--window 10] [--s 8] [--validation-fraction 0.25] [--split-seeds 0,1,2] [--tol 1e-5]
[--history FILE] [--synthetic] [--synth-shape U,I,NNZ,K]``.

For each split seed:

1. ml-latest-small is ingested as examples/movielens_small.sh does (halfstar ratings -> classes
   1..10, items then users with >= 20 ratings, 20% random test split), with
   ``--validation-fraction`` of the training pairs kept apart for validation;
2. the trajectory: one OrdNMF run on a LocalCluster of 2 workers, stopped by the ELBO rule
   (``--tol``) only, whose state is scored every ``--every`` iterations (and at the last) on the
   validation subset and on the test split, from the factor chunks on the workers: what the
   ELBO rule keeps (the last state) and the best test NDCG@100 at s = ``--s`` anywhere along it;
3. the early-stopped fit: ``OrdNMF(validation_every=--every, validation_patience=--patience,
   validation_window=--window, validation_s=--s,
        n_members=1,)`` (validation NDCG@100 at s), the kept state
   saved, then evaluated on the test split. Same seed, so its states are the trajectory's: the
   check column says whether it kept the state ``early_stopping`` picks on the trajectory's
   validation scores.

Printed side by side per seed: iterations and test NDCG@100 at s = 1 and s = ``--s`` of the
ELBO-rule fit, of the early-stopped fit and of the trajectory's best, and PASS when the
early-stopped fit ran fewer iterations than the ELBO rule and its test NDCG at s = ``--s`` is
within ``--margin`` (0.003) of the trajectory's best.

``--synthetic`` adds the issue's second figure: data sampled from the model (``synth``), test
NDCG@100 at s = 1 of a fit from the usual random start, of the generating factors themselves
and of a fit started from them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ML = ROOT.parent / "shared" / "data" / "ml-latest-small" / "ratings.csv"


def movielens(args: argparse.Namespace, client: Any, seed: int) -> dict[str, Any]:
    """One split seed's trajectory and early-stopped fit: the row of the table."""
    from ordnmf_dask import OrdNMF
    from ordnmf_dask.engine.cavi import CaviConfig, CaviRunner
    from ordnmf_dask.engine.control import Validation, early_stopping
    from ordnmf_dask.model.families import OrdinalFamily
    from ordnmf_dask.modelstore.model import open_model
    from ordnmf_dask.postfit.evaluate import evaluate, score_split
    from ordnmf_dask.sources.ingest import ingest

    work = os.path.join(args.work, f"seed{seed}")
    os.makedirs(work, exist_ok=True)
    store = ingest(
        ML,
        os.path.join(work, "ml.zarr"),
        ratings="halfstar",
        min_count=20,
        test_fraction=0.2,
        validation_fraction=args.validation_fraction,
        seed=seed,
        overwrite=True,
    )
    print(
        f"split seed {seed}: {store.n_users} users x {store.n_items} items; "
        f"{store.nnz_train} train, {store.nnz_validation} validation, {store.nnz_test} test "
        f"nonzeros",
        flush=True,
    )
    levels = sorted({1, args.s})

    # the trajectory: the ELBO rule only, every scored state's validation and test figures
    family = OrdinalFamily(tuple(int(n) for n in store.hist_train))
    runner = CaviRunner(
        client,
        store,
        family,
        CaviConfig(args.k, tol=args.tol, max_iter=args.max_iter),
        os.path.join(work, "ckpt"),
        True,
        checkpoint_every=0,
    )

    def score(w: list[Any], h: list[Any], params: Any) -> dict[str, Any]:
        val = score_split(client, store, "validation", w, h, levels, 100, None)
        test = score_split(client, store, "test", w, h, levels, 100, None)
        return {"metric": val["ndcg"][args.s], "val": val["ndcg"], "test": test["ndcg"]}

    run = runner.run(runner.random_init, validation=Validation(score, args.every, 0))
    hist = run.validation
    best = max(hist, key=lambda v: v["test"][args.s])
    # the rule on the trajectory's validation scores, evaluation by evaluation
    scores = [v["metric"] for v in hist]
    j = next(
        (
            j
            for j in range(1, len(scores) + 1)
            if early_stopping(scores[:j], args.patience, args.window)[1]
        ),
        len(scores),
    )
    expected = hist[early_stopping(scores[:j], args.patience, args.window)[0]]["iteration"]

    # the early-stopped fit, through the estimator
    start = time.perf_counter()
    est = OrdNMF(
        args.k,
        optimizer="cavi",
        tol=args.tol,
        max_iter=args.max_iter,
        validation_every=args.every,
        validation_patience=args.patience,
        validation_window=args.window,
        validation_s=args.s,
        validation_k=100,
        work_dir=work,
        n_members=1,
    )
    est.fit(store, client)
    seconds = time.perf_counter() - start
    res = evaluate(store, est, client, levels=levels)
    kept = int(open_model(est.model_path_).attrs["best_iteration"])
    gap = best["test"][args.s] - res["ndcg"][args.s]
    return {
        "seed": seed,
        "elbo_iter": run.n_iter,
        "elbo_test": hist[-1]["test"],
        "early_iter": est.n_iter_,
        "early_kept": kept,
        "early_test": res["ndcg"],
        "early_seconds": seconds,
        "best_iter": best["iteration"],
        "best_test": best["test"],
        "gap": gap,
        "check": kept == expected and est.n_iter_ == hist[j - 1]["iteration"],
        "pass": est.n_iter_ < run.n_iter and gap <= args.margin,
        "history": [
            {"iteration": v["iteration"], "val": v["val"], "test": v["test"]} for v in hist
        ],
    }


def table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """The side-by-side table, a line per split seed, and the trajectories' scores."""
    lv = sorted({1, args.s})
    ndcg = lambda x: " ".join(f"{x[s]:>7.4f}" for s in lv)  # noqa: E731
    cols = " ".join(f"{f's={s}':>7}" for s in lv)
    print(
        f"\nK = {args.k}, tol = {args.tol:g}; early stopping on validation NDCG@100 s={args.s} "
        f"every {args.every}, window {args.window}, patience {args.patience}; validation "
        f"fraction {args.validation_fraction:g}; test NDCG@100 at s = {lv}"
    )
    print(
        f"{'seed':>4} | {'ELBO rule':>9} {cols} | {'early (kept)':>12} {cols} | "
        f"{'best at':>7} {cols} | {'gap s=' + str(args.s):>9} {'check':>5} {'claim':>5}"
    )
    for r in rows:
        print(
            f"{r['seed']:>4} | {r['elbo_iter']:>9} {ndcg(r['elbo_test'])} | "
            f"{r['early_iter']:>5} ({r['early_kept']:>4}) {ndcg(r['early_test'])} | "
            f"{r['best_iter']:>7} {ndcg(r['best_test'])} | {r['gap']:>+9.4f} "
            f"{'ok' if r['check'] else 'NO':>5} {'PASS' if r['pass'] else 'FAIL':>5}"
        )
    print(
        f"claim (fewer iterations than the ELBO rule, test NDCG s={args.s} within "
        f"{args.margin:g} of the trajectory's best): {sum(r['pass'] for r in rows)}/{len(rows)}"
    )
    for r in rows:
        print(f"seed {r['seed']}: validation / test NDCG@100 s={args.s} along the trajectory:")
        print(
            "  "
            + "  ".join(
                f"{v['iteration']}:{v['val'][args.s]:.3f}/{v['test'][args.s]:.3f}"
                for v in r["history"]
            )
        )


def synthetic(args: argparse.Namespace, client: Any) -> None:
    from ordnmf_dask import OrdNMF
    from ordnmf_dask.datasets.synth import SynthParams, synth, true_factors
    from ordnmf_dask.model.updates import FactorChunk
    from ordnmf_dask.postfit.evaluate import evaluate, score_split

    u, i, nnz, k = args.synth_shape
    store = synth(
        os.path.join(args.work, "synth.zarr"),
        n_users=u,
        n_items=i,
        nnz=nnz,
        n_components=k,
        seed=0,
        client=client,
        overwrite=True,
    )
    params = SynthParams.from_attrs(store.attrs)
    w0, h0 = true_factors(params, "users", 0, u), true_factors(params, "items", 0, i)
    rb, cb = store.row_bounds, store.col_bounds
    w = [FactorChunk.initial(w0[rb[r] : rb[r + 1]]) for r in range(len(rb) - 1)]
    h = [FactorChunk.initial(h0[cb[c] : cb[c + 1]]) for c in range(len(cb) - 1)]
    truth = score_split(client, store, "test", w, h, [1], 100, None)["ndcg"][1]
    print(
        f"\nsynthetic from the model: {u} x {i}, {store.nnz_train} train nonzeros, K = {k}",
        flush=True,
    )
    rows = []
    for label, init in (
        ("random start", None),
        ("started from the generating factors", (w0 + 1e-12, h0 + 1e-12)),
    ):
        est = OrdNMF(k, optimizer="cavi", tol=args.tol, max_iter=args.max_iter, n_members=1).fit(
            store, client, init=init
        )
        rows.append((label, est.n_iter_, evaluate(store, est, client, levels=[1])["ndcg"][1]))
    print(f"{'':<44} {'iterations':>16} {'NDCG s=1':>10}")
    for label, n, x in rows:
        print(f"{label:<44} {n:>16} {x:>10.4f}")
    print(f"{'generating factors':<44} {'-':>16} {truth:>10.4f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    p.add_argument("-k", type=int, default=50)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--patience", type=int, default=4)
    p.add_argument("--window", type=int, default=10, help="validation_window")
    p.add_argument("--s", type=int, default=8)
    p.add_argument("--validation-fraction", type=float, default=0.25)
    p.add_argument("--split-seeds", default="0,1,2", help="seeds of the test/validation split")
    p.add_argument("--margin", type=float, default=0.003)
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--max-iter", type=int, default=1000)
    p.add_argument("--history", help="write the rows and trajectories to this JSON file")
    p.add_argument("--synthetic", action="store_true", help="also the synthetic-data figure")
    p.add_argument(
        "--synth-shape",
        default="5000,2000,300000,20",
        help="users,items,nonzeros,K (the issue's: 20000,8000,2000000,20)",
    )
    args = p.parse_args()
    args.synth_shape = [int(float(x)) for x in args.synth_shape.split(",")]
    from ordnmf_dask.runtime.cluster import resolve_client

    with tempfile.TemporaryDirectory(prefix="ordnmf-early-") as tmp:
        args.work = args.work or tmp
        with resolve_client(None, 2) as client:
            rows = [movielens(args, client, int(x)) for x in args.split_seeds.split(",")]
            table(args, rows)
            if args.history:
                with open(args.history, "w") as fh:
                    json.dump(rows, fh)
            if args.synthetic:
                synthetic(args, client)
    return 0


if __name__ == "__main__":
    sys.exit(main())
