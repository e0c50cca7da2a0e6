"""Early stopping on a validation metric against the ELBO rule, and the synthetic-data figure.

Usage: ``python bench/early_stopping.py [--work DIR] [-k 50] [--every 5] [--patience 8]
[--s 8] [--validation-fraction 0.1] [--split-seed 0] [--tol 1e-5] [--history FILE] [--synthetic]
[--synth-shape U,I,NNZ,K]``.

1. ml-latest-small (halfstar ratings, classes 1..10) is ingested with a 20% random test split
   and ``--validation-fraction`` of the training nonzeros kept apart for validation;
2. the trajectory: one OrdNMF run on a LocalCluster of 2 workers, stopped by the ELBO rule
   (``--tol``) only, whose state is scored every ``--every`` iterations (and at the last) on the
   validation subset and on the test split, from the factor chunks on the workers: what the
   ELBO rule keeps (the last state) and the best test NDCG@100 anywhere along the trajectory;
3. the early-stopped fit: ``OrdNMF(validation_every=--every, validation_patience=--patience,
   validation_s=--s)`` (validation NDCG@100 at s), the best scored state saved, then evaluated
   on the test split. Same seed, so its states are the trajectory's.

Printed side by side: iterations and test NDCG@100 at s = 1 and s = ``--s`` of the ELBO-rule
fit, the early-stopped fit and the trajectory's best.

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


def _row(label: str, iters: str, ndcg: dict[int, float], levels: list[int]) -> str:
    return f"{label:<44} {iters:>16} " + " ".join(f"{ndcg[s]:>10.4f}" for s in levels)


def movielens(args: argparse.Namespace, client: Any) -> None:
    from ordnmf_dask import OrdNMF
    from ordnmf_dask.engine.cavi import CaviConfig, CaviRunner, Validation
    from ordnmf_dask.model.families import OrdinalFamily
    from ordnmf_dask.modelstore.model import open_model
    from ordnmf_dask.postfit.evaluate import evaluate, score_split
    from ordnmf_dask.sources.inmemory import ingest

    store = ingest(ML, os.path.join(args.work, "ml.zarr"), ratings="halfstar", test_fraction=0.2,
                   validation_fraction=args.validation_fraction, seed=args.split_seed,
                   overwrite=True)
    print(f"ml-latest-small: {store.nnz_train} train, {store.nnz_validation} validation, "
          f"{store.nnz_test} test nonzeros (split seed {args.split_seed}); K = {args.k}, "
          f"tol = {args.tol:g}", flush=True)
    levels = sorted({1, args.s})

    # the trajectory: the ELBO rule only, every scored state's validation and test figures
    family = OrdinalFamily(tuple(int(n) for n in store.hist_train))
    runner = CaviRunner(client, store, family, CaviConfig(args.k, tol=args.tol,
                        max_iter=args.max_iter), os.path.join(args.work, "ckpt"), True,
                        checkpoint_every=0)  # fmt: skip

    def score(w: list[Any], h: list[Any], params: Any) -> dict[str, Any]:
        val = score_split(client, store, "validation", w, h, levels, 100, None)
        test = score_split(client, store, "test", w, h, levels, 100, None)
        return {"metric": val["ndcg"][args.s], "val": val["ndcg"], "test": test["ndcg"]}

    start = time.perf_counter()
    run = runner.run(runner.random_init, validation=Validation(score, args.every, 0))
    trajectory_seconds = time.perf_counter() - start
    hist = run.validation
    last = hist[-1]
    best_test = max(hist, key=lambda v: v["test"][args.s])

    # the early-stopped fit, through the estimator
    start = time.perf_counter()
    est = OrdNMF(args.k, tol=args.tol, max_iter=args.max_iter, validation_every=args.every,
                 validation_patience=args.patience, validation_s=args.s, validation_k=100)
    est.fit(store, client)
    early_seconds = time.perf_counter() - start
    res = evaluate(store, est, client, levels=levels)
    attrs = open_model(est.model_path_).attrs
    b = attrs["best_iteration"]
    same = next((v for v in hist if v["iteration"] == b), None)

    print(f"\n{'':<44} {'iterations':>16} " + " ".join(f"{f'NDCG s={s}':>10}" for s in levels))
    print(_row(f"ELBO rule (tol {args.tol:g})", f"{run.n_iter}", last["test"], levels))
    print(_row(f"early stopped (val NDCG@100 s={args.s}, every {args.every}, "
               f"patience {args.patience})", f"{est.n_iter_} (kept {b})", res["ndcg"], levels))
    print(_row(f"best test NDCG@100 s={args.s} on the trajectory", f"at {best_test['iteration']}",
               best_test["test"], levels))
    gap = best_test["test"][args.s] - res["ndcg"][args.s]
    print(f"\nearly stopped vs trajectory best at s={args.s}: {gap:+.4f} below; "
          f"{run.n_iter - est.n_iter_} fewer iterations than the ELBO rule "
          f"({est.n_iter_} vs {run.n_iter}); stop reason: {attrs['stop_reason']}")
    if same is not None:
        print(f"consistency: the trajectory's test NDCG at iteration {b}: "
              + ", ".join(f"s={s} {same['test'][s]:.4f}" for s in levels))
    print(f"wall time: trajectory (scored every {args.every}) {trajectory_seconds:.1f} s, "
          f"early-stopped fit {early_seconds:.1f} s")
    print(f"validation NDCG@100 s={args.s} / test NDCG@100 s={args.s} along the trajectory:")
    print("  " + "  ".join(f"{v['iteration']}:{v['val'][args.s]:.3f}/{v['test'][args.s]:.3f}"
                           for v in hist))
    print(f"the same rule with other patience values, on the trajectory (every {args.every}):")
    for patience in (2, 3, 4, 6, 8, 10):
        stop, kept = patience_rule(hist, patience)
        x = next(v for v in hist if v["iteration"] == kept)["test"]
        print(f"  patience {patience:2d}: stops at {stop:4d}, keeps {kept:4d}: test NDCG@100 "
              + ", ".join(f"s={s} {x[s]:.4f}" for s in levels)
              + f"  ({best_test['test'][args.s] - x[args.s]:+.4f} below the best at s={args.s})")
    if args.history:
        with open(args.history, "w") as fh:
            json.dump({"n_iter": run.n_iter, "history": hist}, fh)


def patience_rule(hist: list[dict[str, Any]], patience: int) -> tuple[int, int]:
    """(the iteration the estimator's rule stops at, the iteration it keeps) on a trajectory's
    scores: stop after ``patience`` scores in a row without a strict improvement."""
    best, since = hist[0], 0
    for v in hist[1:]:
        if v["metric"] > best["metric"]:
            best, since = v, 0
        else:
            since += 1
            if since >= patience:
                return v["iteration"], best["iteration"]
    return hist[-1]["iteration"], best["iteration"]


def synthetic(args: argparse.Namespace, client: Any) -> None:
    from ordnmf_dask import OrdNMF
    from ordnmf_dask.model.updates import FactorChunk
    from ordnmf_dask.postfit.evaluate import evaluate, score_split
    from ordnmf_dask.sources.synth import SynthParams, synth, true_factors

    u, i, nnz, k = args.synth_shape
    store = synth(os.path.join(args.work, "synth.zarr"), n_users=u, n_items=i, nnz=nnz,
                  n_components=k, seed=0, client=client, overwrite=True)
    params = SynthParams.from_attrs(store.attrs)
    w0, h0 = true_factors(params, "users", 0, u), true_factors(params, "items", 0, i)
    rb, cb = store.row_bounds, store.col_bounds
    w = [FactorChunk.initial(w0[rb[r]:rb[r + 1]]) for r in range(len(rb) - 1)]
    h = [FactorChunk.initial(h0[cb[c]:cb[c + 1]]) for c in range(len(cb) - 1)]
    truth = score_split(client, store, "test", w, h, [1], 100, None)["ndcg"][1]
    print(f"\nsynthetic from the model: {u} x {i}, {store.nnz_train} train nonzeros, K = {k}",
          flush=True)
    rows = []
    for label, init in (("random start", None), ("started from the generating factors",
                                                  (w0 + 1e-12, h0 + 1e-12))):
        est = OrdNMF(k, tol=args.tol, max_iter=args.max_iter).fit(store, client, init=init)
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
    p.add_argument("--patience", type=int, default=8)
    p.add_argument("--s", type=int, default=8)
    p.add_argument("--validation-fraction", type=float, default=0.1)
    p.add_argument("--split-seed", type=int, default=0, help="seed of the test/validation split")
    p.add_argument("--tol", type=float, default=1e-5)
    p.add_argument("--max-iter", type=int, default=1000)
    p.add_argument("--history", help="write the trajectory's scores to this JSON file")
    p.add_argument("--synthetic", action="store_true", help="also the synthetic-data figure")
    p.add_argument("--synth-shape", default="5000,2000,300000,20",
                   help="users,items,nonzeros,K (the issue's: 20000,8000,2000000,20)")
    args = p.parse_args()
    args.synth_shape = [int(float(x)) for x in args.synth_shape.split(",")]
    from ordnmf_dask.dist.cluster import resolve_client

    with tempfile.TemporaryDirectory(prefix="ordnmf-early-") as tmp:
        args.work = args.work or tmp
        with resolve_client(None, 2) as client:
            movielens(args, client)
            if args.synthetic:
                synthetic(args, client)
    return 0


if __name__ == "__main__":
    sys.exit(main())
