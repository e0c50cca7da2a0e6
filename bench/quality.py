"""Quality of the optimum: the default fit against the paper's path on stores drawn from the model.

For each synthetic store (``--stores``: U x I x density x K_true, drawn by ``datasets.synth`` with
shape 0.3 and V = 10, 20% test), every configuration (``--configs``) is fitted at ``--k``
components (K unknown to the fit) and printed side by side: its final ELBO, the ELBO gap to a fit
at the same K started from the generating factors (relative; the components beyond K_true start
as draws of 1e-3 of the factors' mean, i.e. switched off), the share of the generating factors'
NDCG@100 on the test split at the relevance levels s = 1, 5, 10, the number of active
components (those carrying more than 0.1% of sum(E[W]) . sum(E[H])), iterations and seconds.
Popularity is the floor. Every score comes from the project's scorer
(``postfit.evaluate.score_split``).

``--real`` then fits the same configurations on ml-latest-small (ingested as README's main
command does: half stars, min_count 20, seed 0; levels 1, 6, 10) from seeds 0..``--seeds``-1
and prints NDCG@100 per level, the paired difference to the first configuration (mean and
standard error over the seeds) and the fit time. ``bench/peers.py`` gives the other
recommenders on the same stores (it needs their packages).

    python bench/quality.py                       # the drawn stores
    python bench/quality.py --real --seeds 3      # and ml-latest-small

A configuration is ``name=optimizer:start:anneal[:alpha]`` (alpha: both prior shapes;
``default`` alone: the table's defaults).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ordnmf_dask import OrdNMF, evaluate, ingest
from ordnmf_dask.datasets.synth import SynthParams, synth, true_factors
from ordnmf_dask.params import DEFAULTS
from ordnmf_dask.postfit.evaluate import score_split
from ordnmf_dask.runtime.inprocess import InProcessClient
from ordnmf_dask.store.blocks import StoreInfo, open_store
from ordnmf_dask.store.csr import load_block

K_NDCG = 100
ACTIVE = 1e-3  # a component is active when it carries more than this share of the rate mass
CONFIGS = ["paper=cavi:random:0", "squarem=squarem:random:0", "default"]


@dataclass(frozen=True)
class Chunk:
    """A factor chunk as ``score_split`` reads it."""

    mean: np.ndarray


def scored(
    info: StoreInfo, w: np.ndarray, h: np.ndarray, levels: list[int], split: str = "test"
) -> dict[int, float]:
    """NDCG@100 of ``split`` per level for the scores ``w @ h.T``."""
    rb, cb = info.row_bounds, info.col_bounds
    wc = [Chunk(np.ascontiguousarray(w[rb[r] : rb[r + 1]])) for r in range(info.grid[0])]
    hc = [Chunk(np.ascontiguousarray(h[cb[c] : cb[c + 1]])) for c in range(info.grid[1])]
    with InProcessClient(2) as cl:
        return score_split(cl, info, split, wc, hc, levels, K_NDCG, None)["ndcg"]


def item_counts(info: StoreInfo) -> np.ndarray:
    """Training interactions per item (popularity's scores)."""
    counts = np.zeros(info.n_items)
    cb = info.col_bounds
    for r in range(info.grid[0]):
        for c in range(info.grid[1]):
            b = load_block(info.path, "train", r, c)
            counts[cb[c] : cb[c + 1]] += np.bincount(b.cols, minlength=cb[c + 1] - cb[c])
    return counts


def parse(config: str) -> tuple[str, dict[str, Any]]:
    """``name=optimizer:start:anneal`` (or ``default``) -> (name, estimator keywords)."""
    if config == "default":
        return "default", {}
    name, spec = config.split("=")
    optimizer, start, n, *alpha = spec.split(":")
    shapes = {"alpha_W": float(alpha[0]), "alpha_H": float(alpha[0])} if alpha else {}
    return name, {"optimizer": optimizer, "start": start, "anneal": int(n), **shapes}


def fit(info: StoreInfo, k: int, seed: int, levels: list[int], **kw: Any) -> dict[str, Any]:
    """One fit and its figures."""
    t0 = time.perf_counter()
    model = OrdNMF(k, seed=seed, **kw, n_members=1).fit(info.path)
    seconds = time.perf_counter() - t0
    w, h = np.asarray(model.W_.compute()), np.asarray(model.H_.compute())
    mass = w.sum(axis=0) * h.sum(axis=0)
    return {
        "elbo": model.elbo_[-1],
        "n_iter": model.n_iter_,
        "seconds": seconds,
        "active": int(np.sum(mass > ACTIVE * mass.sum())),
        **figures(info, model, levels),
    }


def figures(info: StoreInfo, model: OrdNMF, levels: list[int]) -> dict[str, Any]:
    """NDCG@100 per level and the mean test log-likelihood of a fitted model."""
    ev = evaluate(info.path, model, levels=levels)
    return {"ndcg": ev["ndcg"], "loglik": ev["test_loglik_mean"]}


def synthetic(args: argparse.Namespace, work: str) -> None:
    levels = [1, 5, 10]
    head = f"{'store':<22} {'fit':<14} {'ELBO':>13} {'gap':>8} {'share s=1/5/10':>18}"
    print(head + f" {'active':>6} {'iter':>5} {'s':>6}")
    for spec in args.stores:
        u, i, density, k_true = spec.split("x")
        u, i, k_true = int(u), int(i), int(k_true)
        path = os.path.join(work, f"synth-{spec}.zarr")
        info = synth(path, u, i, int(u * i * float(density)), k_true, 10, seed=args.store_seed)
        info = open_store(info.path)
        p = SynthParams.from_attrs(info.attrs)
        w0, h0 = true_factors(p, "users", 0, u), true_factors(p, "items", 0, i)
        truth = scored(info, w0, h0, levels)
        k = args.k
        rng = np.random.default_rng(1)
        off = 1e-3 * w0.mean()
        init = (
            np.hstack([w0, off * rng.gamma(1.0, 1.0, (u, max(k - k_true, 0)))])[:, :k],
            np.hstack([h0, off * rng.gamma(1.0, 1.0, (i, max(k - k_true, 0)))])[:, :k],
        )
        t0 = time.perf_counter()
        ref = OrdNMF(k, optimizer="cavi", anneal=0, n_members=1).fit(info.path, init=init)
        ref_row = {
            "elbo": ref.elbo_[-1],
            "n_iter": ref.n_iter_,
            "seconds": time.perf_counter() - t0,
            "active": k,
            **figures(info, ref, levels),
        }
        pop = scored(info, np.ones((u, 1)), item_counts(info)[:, None], levels)
        label = f"{u}x{i} {float(density):.0%} K*={k_true}"
        rows = [("truth-started", ref_row)]
        rows += [(name, fit(info, k, 0, levels, **kw)) for name, kw in map(parse, args.configs)]
        share = "/".join(f"{pop[s] / truth[s]:.0%}" for s in levels)
        print(f"{label:<22} {'popularity':<14} {'':>13} {'':>8} {share:>18}")
        for name, r in rows:
            gap = (r["elbo"] - ref_row["elbo"]) / abs(ref_row["elbo"])
            share = "/".join(f"{r['ndcg'][s] / truth[s]:.0%}" for s in levels)
            print(
                f"{label:<22} {name:<14} {r['elbo']:>13.6e} {gap:>+8.2%} {share:>18} "
                f"{r['active']:>6} {r['n_iter']:>5} {r['seconds']:>6.1f}",
                flush=True,
            )


def real(args: argparse.Namespace, work: str) -> None:
    levels = [1, 6, 10]
    ratings = os.path.join(args.data, "ml-latest-small", "ratings.csv")
    info = ingest(ratings, os.path.join(work, "ml.zarr"), ratings="halfstar", min_count=20, seed=0)
    configs = list(map(parse, args.configs))
    runs = {
        name: [fit(info, args.k, s, levels, **kw) for s in range(args.seeds)]
        for name, kw in configs
    }
    first = configs[0][0]
    print(f"ml-latest-small, K = {args.k}, seeds 0..{args.seeds - 1}, NDCG@100 at s = 1/6/10")
    print(
        f"{'fit':<14} {'mean NDCG':>24} {'minus ' + first + ' (se)':>40} {'loglik':>8} "
        f"{'ELBO':>12} {'s':>6} {'iter':>6}"
    )
    for name, rs in runs.items():
        nd = np.array([[r["ndcg"][s] for s in levels] for r in rs])
        base = np.array([[r["ndcg"][s] for s in levels] for r in runs[first]])
        d = nd - base
        se = d.std(axis=0, ddof=1) / np.sqrt(len(rs)) if len(rs) > 1 else np.zeros(3)
        print(
            f"{name:<14} {' / '.join(f'{x:.4f}' for x in nd.mean(0)):>24} "
            f"{' / '.join(f'{m:+.4f} ({e:.4f})' for m, e in zip(d.mean(0), se, strict=True)):>40} "
            f"{np.mean([r['loglik'] for r in rs]):>8.4f} "
            f"{np.mean([r['elbo'] for r in rs]):>12.5e} "
            f"{np.mean([r['seconds'] for r in rs]):>6.2f} "
            f"{np.mean([r['n_iter'] for r in rs]):>6.0f}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stores", nargs="+", default=["2000x1000x0.05x10", "2000x1000x0.02x5"])
    ap.add_argument("--store-seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=DEFAULTS["n_components"])
    ap.add_argument("--configs", nargs="+", default=CONFIGS)
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--skip-synthetic", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--data", default=os.environ.get("DATA", "../shared/data"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="quality-") as work:
        if not args.skip_synthetic:
            synthetic(args, work)
        if args.real:
            real(args, work)


if __name__ == "__main__":
    main()
