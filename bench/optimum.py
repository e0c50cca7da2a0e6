"""Levers on the fit's optimum, side by side on one store: estimator settings (annealed or
smaller ensembles, another K, fewer iterations), their mixture, and a single fit started from an
ensemble's consensus.

One store per run: drawn from the model (``--store U x I x density x K_true``, ``datasets.synth``,
shape 0.3, V = 10, 20% test, store seed ``--store-seed``; scored as a share of the generating
factors' NDCG@100 at s = 1 / 5 / 10, with item popularity as the floor), ml-latest-small
(``--real ml``: README's split, half stars, min_count 20, seed 0; NDCG@100 at s = 1 / 6 / 10) or
Last.fm (``--real lastfm``: the paper's count classes, min_count 20, 20% test, 10% validation,
which early-stops the fits; s = 1 / 8 / 10). Each ``--fits`` entry is a JSON object of estimator
keywords; ``--mix [N]`` also scores the equal mixture of the first N entries' rates (all without
N; each entry's rate being its members' mean). ``--stack FRACTION`` chooses the weights of the
entries and of a rank-1 fit (K = 1: popularity times activity) on a validation subset of
FRACTION of the training pairs, from fits of the other pairs (:func:`stacked`: shrinkage toward
the rank-1 fit, its geometric mean with the entries' mixture, greedy ensemble selection over
``--steps`` picks), and scores them as fitted and refitted on all pairs (``--no-refit``: not).
``--hier A2`` fits the entries with hierarchical row rates (bench/hier.py).

``--consensus M`` fits the default ensemble of M members at K = 50, matches every member's
components to the first member's (the Hungarian assignment on the cosine of their
item columns, each column scaled to sum 1), averages the matched pairs, and scores that consensus
as it is and the single fit started from it (``init=``). ``--bag M FRACTION`` fits M single fits
(seeds 0..M-1), each on its own random FRACTION of the training pairs (re-ingested, the test pairs
kept), and scores their mixture (bagging: diversity from the data, not only the start).
Each ``--moves`` entry is a JSON object of ``moves.MoveSettings`` (``burn``, ``sweeps``,
``rounds``, ``pairs``, ``kind``; ``pairs`` 0: the same warm restarts without moves):
``--members`` fits (seeds ``--seed`` .. ``--seed`` + M - 1, K = 50) with merge-and-rebirth moves
(bench/moves.py), scored as their ensemble, with each member's kept moves and ELBO per round::

    python bench/optimum.py --store 2000x1000x0.05x20 --fits '{"n_members": 4, "anneal": 20}'
    python bench/optimum.py --real ml --consensus 4
    python bench/optimum.py --real ml --bag 4 0.8
    python bench/optimum.py --store 2000x1000x0.05x20 --stack 0.1 --fits '{"n_members": 4}'
    python bench/optimum.py --store 2000x1000x0.05x20 --moves '{"rounds": 8, "pairs": 8}'
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable

import numpy as np
from hier import patched
from moves import MoveSettings, fit_with_moves, training_matrix
from quality import item_counts, scored
from scipy.optimize import linear_sum_assignment
from select_k import triples, with_validation

from ordnmf_dask import OrdNMF, ingest
from ordnmf_dask.datasets.synth import SynthParams, synth, true_factors
from ordnmf_dask.sources.ingest import ingest_arrays
from ordnmf_dask.store.blocks import StoreInfo, open_store, read_ids


def consensus(model: OrdNMF) -> tuple[np.ndarray, np.ndarray]:
    """The K components of ``model``'s members matched to its first member's and averaged."""
    k, n = model.n_components, model.n_members_
    w_all, h_all = model.user_factors * n, model.item_factors
    members = []
    for m in range(n):
        w, h = w_all[:, m * k : (m + 1) * k], h_all[:, m * k : (m + 1) * k]
        scale = h.sum(axis=0)
        members.append((w * scale, h / scale))
    acc_w, acc_h = members[0][0].copy(), members[0][1].copy()
    for w, h in members[1:]:
        a = acc_h / np.linalg.norm(acc_h, axis=0)
        rows, cols = linear_sum_assignment(-(a.T @ (h / np.linalg.norm(h, axis=0))))
        acc_w[:, rows] += w[:, cols]
        acc_h[:, rows] += h[:, cols]
    return acc_w / n, acc_h / n


def bagged(info: StoreInfo, n: int, fraction: float, work: str) -> tuple[np.ndarray, np.ndarray]:
    """The mixture of ``n`` single fits, each of a random ``fraction`` of ``info``'s training
    pairs (its rows placed by raw id; a user or item a member never saw scores 0 there)."""
    train, test = triples(info, "train"), triples(info, "test")
    users, items = read_ids(info.path, "users").tolist(), read_ids(info.path, "items").tolist()
    row_of = {x: r for r, x in enumerate(users)}
    col_of = {x: c for c, x in enumerate(items)}
    rng = np.random.default_rng(123)
    k = 50
    w = np.zeros((len(users), n * k))
    h = np.zeros((len(items), n * k))
    for m in range(n):
        keep = rng.random(len(train[0])) < fraction
        sub = ingest_arrays(
            *(a[keep] for a in train),
            os.path.join(work, f"bag-{m}.zarr"),
            test=test,
            ratings="integer",
            scale_max=info.n_classes,
        )
        fit = OrdNMF(k, seed=m, n_members=1).fit(sub.path)
        rows = [row_of[x] for x in read_ids(sub.path, "users").tolist()]
        cols = [col_of[x] for x in read_ids(sub.path, "items").tolist()]
        w[rows, m * k : (m + 1) * k] = fit.user_factors / n
        h[cols, m * k : (m + 1) * k] = fit.item_factors
    return w, h


Rate = tuple[np.ndarray, np.ndarray]


def mixture(rates: list[Rate], weights: np.ndarray) -> Rate:
    """The factors of the mixture ``sum_j weights[j] rates[j]`` (zero weights left out)."""
    keep = [j for j in range(len(rates)) if weights[j] > 0]
    w = np.hstack([rates[j][0] * weights[j] for j in keep])
    return w, np.hstack([rates[j][1] for j in keep])


def greedy_weights(
    n: int, score: Callable[[np.ndarray], float], steps: int, pool: int
) -> np.ndarray:
    """Ensemble selection (Caruana et al. 2004): ``steps`` picks with replacement among the
    first ``pool`` of ``n`` candidates, each the one whose addition scores best; the weights
    are the pick counts over the picks."""
    counts = np.zeros(n)
    for _ in range(steps):
        tries = [score((counts + np.eye(n)[j]) / (counts.sum() + 1)) for j in range(pool)]
        counts[int(np.argmax(tries))] += 1
    return counts / counts.sum()


def dense(rate: Rate) -> np.ndarray:
    """The rate matrix ``w @ h.T`` of a small store."""
    return rate[0] @ rate[1].T


def geometric(rates: list[Rate], a: float) -> Rate:
    """Scores ``R_0^(1 - a) R_1^a`` of two rates (the mean of the entries', the rank-1 fit's), as
    factors a scorer reads (the scores themselves against the identity)."""
    r0, r1 = dense(rates[0]), dense(rates[1])
    return np.exp((1 - a) * np.log(r0) + a * np.log(r1)), np.eye(r0.shape[1])


def stacked(
    info: StoreInfo,
    entries: list[dict],
    full: list[Rate],
    fraction: float,
    levels: list[int],
    work: str,
    steps: int,
) -> tuple[StoreInfo, list[tuple[str, Rate, Rate | None, np.ndarray]]]:
    """Mixture weights of the ``entries``' fits and a rank-1 fit (K = 1: popularity times
    activity) chosen on a validation subset of ``fraction`` of the training pairs (the fits of
    its other pairs, without early stopping; score: the mean over ``levels`` of the validation
    NDCG@100). Returned: that store (the same test pairs), and per scheme its name, the weighted
    mixture of those fits, that of the ``full`` fits refitted on all pairs (None: no refit), and
    the weights. Schemes: the equal mixture of the entries, shrinkage toward the rank-1 fit
    (its weight on a grid, finer near 1), the geometric mean of the two (``geometric``: not a
    mixture, a ranking score; its exponent on a grid), and greedy ensemble selection over all
    candidates and over the entries alone. The validation score per weight is printed."""
    vinfo = with_validation(info, os.path.join(work, "stack.zarr"), fraction, seed=1)
    kept: list[Rate] = []
    for kw in [*entries, {"n_components": 1, "n_members": 1}]:
        model = OrdNMF(**{"validation_every": 0, **kw}).fit(vinfo.path)
        kept.append((model.user_factors, model.item_factors))
    n = len(kept)

    def score(rate: Rate) -> float:
        nd = scored(vinfo, *rate, levels, split="validation")
        return float(np.mean([nd[s] for s in levels]))

    def best(name: str, grid: list[float], rate: Callable[[float], Rate]) -> float:
        curve = [score(rate(a)) for a in grid]
        cells = " ".join(f"{a:g}:{v:.5f}" for a, v in zip(grid, curve, strict=True))
        print(f"  validation score per {name}: {cells}", flush=True)
        return grid[int(np.argmax(curve))]

    equal = np.r_[np.ones(n - 1) / (n - 1), 0.0]
    shrink = lambda a: np.r_[equal[:-1] * (1 - a), a]  # noqa: E731
    grid = [0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 1.0]
    a = best("rank-1 weight", grid, lambda a: mixture(kept, shrink(a)))
    pair = lambda rates: [mixture(rates, equal), rates[-1]]  # noqa: E731
    g = best("rank-1 exponent", [x / 10 for x in range(11)], lambda g: geometric(pair(kept), g))
    out = [
        (name, mixture(kept, x), mixture(full, x) if full else None, x)
        for name, x in [("equal", equal), (f"shrunk to rank 1 ({a:g})", shrink(a))]
    ]
    out.append(
        (
            f"geometric toward rank 1 ({g:g})",
            geometric(pair(kept), g),
            geometric(pair(full), g) if full else None,
            np.r_[1 - g, g],
        )
    )
    for name, m in [("greedy", n), ("greedy, entries only", n - 1)] if steps else []:
        x = greedy_weights(n, lambda x: score(mixture(kept, x)), steps, m)
        out.append((name, mixture(kept, x), mixture(full, x) if full else None, x))
    return vinfo, out


def store(args: argparse.Namespace, work: str) -> tuple[StoreInfo, list[int], dict | None]:
    """The store of this run, its levels, and the generating factors' NDCG (None: real data)."""
    if args.real == "ml":
        ratings = os.path.join(args.data, "ml-latest-small", "ratings.csv")
        out = os.path.join(work, "ml.zarr")
        return ingest(ratings, out, ratings="halfstar", min_count=20, seed=0), [1, 6, 10], None
    if args.real == "lastfm":
        plays = os.path.join(args.data, "hetrec2011-lastfm-2k", "user_artists.dat")
        out = os.path.join(work, "fm.zarr")
        info = ingest(plays, out, counts="paper", min_count=20, seed=0, validation_fraction=0.1)
        return info, [1, 8, 10], None
    u, i, density, k_true = args.store.split("x")
    u, i, k_true = int(u), int(i), int(k_true)
    nnz = int(u * i * float(density))
    info = open_store(
        synth(os.path.join(work, "s.zarr"), u, i, nnz, k_true, 10, seed=args.store_seed).path
    )
    p = SynthParams.from_attrs(info.attrs)
    ru, ri = read_ids(info.path, "users"), read_ids(info.path, "items")
    w0, h0 = true_factors(p, "users", 0, u)[ru], true_factors(p, "items", 0, i)[ri]
    levels = [1, 5, 10]
    return info, levels, scored(info, w0, h0, levels)


def store_arguments(ap: argparse.ArgumentParser) -> None:
    """The options :func:`store` reads: a drawn store or a real dataset, and where data live."""
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="U x I x density x K_true, e.g. 2000x1000x0.05x20")
    where.add_argument("--real", choices=["ml", "lastfm"])
    ap.add_argument("--store-seed", type=int, default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    store_arguments(ap)
    ap.add_argument("--fits", nargs="*", default=[], help="JSON objects of estimator keywords")
    ap.add_argument(
        "--mix",
        type=int,
        nargs="?",
        const=0,
        metavar="N",
        help="also score the equal mixture of the first N fits (no N: all)",
    )
    ap.add_argument(
        "--stack",
        type=float,
        metavar="FRACTION",
        help="mixture weights of the fits and a rank-1 fit chosen on a validation subset",
    )
    ap.add_argument(
        "--hier",
        type=float,
        metavar="A2",
        help="--fits with hierarchical row rates (bench/hier.py)",
    )
    ap.add_argument("--steps", type=int, default=10, help="greedy picks of --stack (0: none)")
    ap.add_argument("--no-refit", action="store_true", help="--stack: skip the refit on all")
    ap.add_argument("--consensus", type=int, metavar="M", help="members of the consensus fit")
    ap.add_argument("--bag", nargs=2, metavar=("M", "FRACTION"), help="bagged single fits")
    ap.add_argument(
        "--moves", nargs="*", metavar="JSON", help="merge-and-rebirth schedules (bench/moves.py)"
    )
    ap.add_argument("--members", type=int, default=4, help="members of each --moves ensemble")
    ap.add_argument("--seed", type=int, default=0, help="first seed of the --moves members")
    ap.add_argument("--data", default=os.environ.get("DATA", "../shared/data"))
    args = ap.parse_args()
    logging.disable(logging.INFO)  # the fits' progress lines; the table is the output
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="optimum-") as work:
        info, levels, truth = store(args, work)
        label = args.store or args.real

        def show(
            name: str, w: np.ndarray, h: np.ndarray, extra: str = "", on: StoreInfo | None = None
        ) -> None:
            nd = scored(on or info, w, h, levels)
            cells = "/".join(f"{nd[s] / truth[s]:.1%}" if truth else f"{nd[s]:.4f}" for s in levels)
            print(f"{label:<20} {name:<48} {cells:>22}  {extra}", flush=True)

        show("popularity", np.ones((info.n_users, 1)), item_counts(info)[:, None])
        rates = []
        for entry in args.fits:
            t0 = time.perf_counter()
            with patched(args.hier):
                model = OrdNMF(**json.loads(entry)).fit(info.path)
            seconds = time.perf_counter() - t0
            show(
                entry,
                model.user_factors,
                model.item_factors,
                f"{seconds:.0f} s, {model.n_iter_} it",
            )
            rates.append((model.user_factors, model.item_factors))
        if args.mix is not None:
            mixed = rates[: args.mix or len(rates)]
            w = np.hstack([w for w, _ in mixed]) / len(mixed)
            show(f"mixture of the first {len(mixed)} fits", w, np.hstack([h for _, h in mixed]))
        if args.stack:
            entries = [json.loads(e) for e in args.fits]
            full = []
            if not args.no_refit:
                one = OrdNMF(1, n_members=1).fit(info.path)
                full = [*rates, (one.user_factors, one.item_factors)]
            t0 = time.perf_counter()
            vinfo, schemes = stacked(info, entries, full, args.stack, levels, work, args.steps)
            print(f"  stacking: {time.perf_counter() - t0:.0f} s", flush=True)
            for name, kept, refit, x in schemes:
                weights = " ".join(f"{v:.2f}" for v in x)
                show(
                    f"{name}, fitted on {1 - args.stack:.0%}", *kept, f"weights {weights}", on=vinfo
                )
                if refit:
                    show(f"{name}, refitted on all", *refit)
        if args.consensus:
            ensemble = OrdNMF(50, n_members=args.consensus).fit(info.path)
            show(f"ensemble of {args.consensus}", ensemble.user_factors, ensemble.item_factors)
            w0, h0 = consensus(ensemble)
            show("its consensus, as it is", w0, h0)
            one = OrdNMF(50, n_members=1).fit(info.path, init=(w0, h0))
            show(
                "one fit started from the consensus",
                one.user_factors,
                one.item_factors,
                f"{one.n_iter_} it",
            )
        if args.bag:
            n, fraction = int(args.bag[0]), float(args.bag[1])
            show(f"{n} fits, each of {fraction:.0%} of the pairs", *bagged(info, n, fraction, work))
        for entry in args.moves or []:
            settings, y = MoveSettings(**json.loads(entry)), training_matrix(info)
            t0, ws, hs, logs = time.perf_counter(), [], [], []
            for m in range(args.seed, args.seed + args.members):
                w, h, log = fit_with_moves(info, y, 50, m, settings)
                ws.append(w / args.members)
                hs.append(h)
                logs.append(f"{sum(log.kept)}/{len(log.kept)}")
                print(
                    f"  member {m}: kept {log.kept}, ELBO {[round(e) for e in log.elbo]}, "
                    f"control {[round(e) for e in log.control]}",
                    flush=True,
                )
            seconds = time.perf_counter() - t0
            name = f"M = {args.members} with moves {entry}"
            show(name, np.hstack(ws), np.hstack(hs), f"{seconds:.0f} s, kept {' '.join(logs)}")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
