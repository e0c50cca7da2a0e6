"""What the model's exact posterior ranks, on a store drawn from the model: a Gibbs sampler.

Usage: ``python bench/gibbs.py --store U x I x density x K_true [--store-seed 0] [-k K]
[--chains 4] [--burn 500] [--kept 500] [--thin 2] [--start random|truth] [--learn]
[--validation FRACTION]`` (or ``--real ml|lastfm``, which learns; stores as in
``bench/optimum.py``).

Every variational lever of docs/results.md ("Where the optimum stands") stays below item
popularity on the stores drawn with K_true = 20 and 40. This probe asks whether the model's
exact posterior ranks above it: a Gibbs sampler with the generating hyperparameters (the
store's shape, prior rates and thresholds, K = K_true unless ``-k``), so that what it ranks is
the Bayes predictor of the very model the data came from, the best any inference of IG-OrdNMF
can do in expectation. The augmentation is the model's own (docs/design.md §1): for an observed
pair of class v, ``n ~ Poisson(lambda Delta_v)`` truncated to n >= 1 and its split over the
components ``c ~ Multinomial(n, w_uk h_ik / lambda)``; given them the factors are conjugate,

    w_uk ~ Gamma(a + sum_i c_uik, b_w + theta_0 sum_i h_ik - sum_{i: y_ui > 0} G_y h_ik)

and the same for h. The truncated Poisson is drawn exactly through its first arrival: the first
event time ``t`` of a rate-x process on [0, 1], given that one falls there, then
``n = 1 + Poisson(x (1 - t))``. The predictive P(y >= s | data) is the average over the kept
sweeps of ``1 - exp(-theta_{s-1} w_u . h_i)``, the chains pooled; scored as the share of the
generating factors' NDCG@100 at s = 1 / 5 / 10, beside item popularity and, per chain, the mean
rate of its kept sweeps, every tenth of them. ``--start truth`` starts every chain at the
generating factors (how the posterior ranks around the truth); ``random``: from the prior.
``--learn`` learns the thresholds and prior rates as the package's fit does (:func:`chain`),
from the fit's own start; ``--validation`` also scores a validation subset carved from the
training pairs (the sampler then sees the rest).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from moves import training_matrix  # noqa: E402
from optimum import store as make_store  # noqa: E402
from optimum import store_arguments  # noqa: E402
from quality import item_counts, scored  # noqa: E402
from select_k import with_validation  # noqa: E402

from ordnmf_dask.datasets.synth import SynthParams, true_factors  # noqa: E402
from ordnmf_dask.store.blocks import read_ids  # noqa: E402


def truncated_poisson(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """Draws of Poisson(x) given >= 1: the first arrival on [0, 1], then the rest of [0, 1]."""
    t = -np.log1p(rng.random(x.shape) * np.expm1(-x)) / x
    return 1 + rng.poisson(x * (1.0 - t))


def split_counts(
    rng: np.random.Generator, n: np.ndarray, parts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's n events given a component with probability ``parts / parts.sum(1)``.

    Returns the pair and the component of every event."""
    pair = np.repeat(np.arange(n.size), n)
    cum = np.cumsum(parts[pair], axis=1)
    u = rng.random(pair.size) * cum[:, -1]
    comp = np.minimum((cum < u[:, None]).sum(axis=1), parts.shape[1] - 1)
    return pair, comp


@dataclass
class Prior:
    """The sampler's hyperparameters: fixed (the generating ones) or learned as the fit does."""

    shape: float
    theta: np.ndarray  # theta_0 > ... > theta_V = 0
    rate_w: np.ndarray  # (U,) prior rate per user
    rate_h: np.ndarray  # (I,)
    learn: bool


def chain(
    y: sp.coo_matrix,
    prior: Prior,
    k: int,
    start: tuple[np.ndarray, np.ndarray],
    rng: np.random.Generator,
    burn: int,
    kept: int,
    thin: int,
    levels: list[int],
    report: Callable[[int, dict[int, np.ndarray], np.ndarray], None],
) -> None:
    """One chain; ``report(sweep, summed P(y >= s) per level, summed rate)`` over the kept sweeps,
    after every tenth of them.

    With ``prior.learn`` the thresholds are drawn from their conditional under the scale-free
    prior 1 / Delta (``Delta_l ~ Gamma(sum_{y = l} n, sum_{y <= l} lambda)``, the Gibbs analogue
    of the fit's closed form, docs/design.md §2 step 2) and the prior rates follow the fit's
    empirical-Bayes rule ``beta = a / mean_k x`` from the current draw (a stochastic EM step).
    """
    theta = prior.theta.copy()
    r, c, v = y.row, y.col, y.data.astype(np.int64)
    n_classes = theta.size - 1
    w, h = (a.copy() for a in start)
    rate_w, rate_h = prior.rate_w.copy(), prior.rate_h.copy()
    prob = {s: np.zeros(y.shape) for s in levels}
    rate = np.zeros(y.shape)
    n_kept = 0
    for sweep in range(burn + kept * thin):
        delta = theta[:-1] - theta[1:]  # Delta_l, l = 1..V at index l - 1
        parts = w[r] * h[c]
        lam = parts.sum(axis=1)
        n = truncated_poisson(rng, lam * delta[v - 1])
        if prior.learn:
            per_class = np.bincount(v, weights=n, minlength=n_classes + 1)[1:]
            above = np.bincount(v, weights=lam, minlength=n_classes + 1)[1:]
            total = w.sum(axis=0) @ h.sum(axis=0)
            below = total - (above.sum() - np.cumsum(above))  # sum over y <= l of lambda
            delta = rng.gamma(per_class) / below
            theta = np.concatenate([np.cumsum(delta[::-1])[::-1], [0.0]])
            rate_w = prior.shape / w.mean(axis=1)
            rate_h = prior.shape / h.mean(axis=1)
        g = theta[0] - theta[v - 1]  # G_y = theta_0 - theta_{y-1}
        gmat = sp.csr_matrix((g, (r, c)), shape=y.shape)
        pair, comp = split_counts(rng, n, parts)
        sw = np.zeros((y.shape[0], k))
        np.add.at(sw, (r[pair], comp), 1.0)
        sh = np.zeros((y.shape[1], k))
        np.add.at(sh, (c[pair], comp), 1.0)
        w = rng.gamma(prior.shape + sw) / (rate_w[:, None] + theta[0] * h.sum(axis=0) - gmat @ h)
        h = rng.gamma(prior.shape + sh) / (rate_h[:, None] + theta[0] * w.sum(axis=0) - gmat.T @ w)
        if sweep >= burn and (sweep - burn) % thin == thin - 1:
            lam_all = w @ h.T
            rate += lam_all
            for s in levels:
                prob[s] -= np.expm1(-theta[s - 1] * lam_all)
            n_kept += 1
            if n_kept % max(1, kept // 10) == 0 or n_kept == kept:
                report(sweep + 1, prob, rate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    store_arguments(ap)
    ap.add_argument("-k", type=int, help="components (default: K_true; 50 on real data)")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--burn", type=int, default=500)
    ap.add_argument("--kept", type=int, default=500, help="kept sweeps per chain")
    ap.add_argument("--thin", type=int, default=2)
    ap.add_argument("--start", choices=["random", "truth"], default="random")
    ap.add_argument("--learn", action="store_true", help="learn thresholds and prior rates")
    ap.add_argument("--shape", type=float, default=0.3, help="prior shape where learned")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--validation", type=float, help="carve a validation subset, score it too")
    args = ap.parse_args()
    work = tempfile.mkdtemp()
    info, levels, truth = make_store(args, work)
    if truth is not None:  # the generating parameters, from the drawn store
        p = SynthParams.from_attrs(info.attrs)
    if args.validation:  # the seeded hash of ingest needs another seed (bench/select_k.py)
        info = with_validation(info, os.path.join(work, "v.zarr"), args.validation, seed=1)
        if truth is not None:
            ru, ri = read_ids(info.path, "users"), read_ids(info.path, "items")
            w0 = true_factors(p, "users", 0, p.n_users)[ru]
            truth = scored(info, w0, true_factors(p, "items", 0, p.n_items)[ri], levels)
    y = training_matrix(info).tocoo()
    n_classes = int(y.data.max())
    learn = args.learn or truth is None
    if truth is None:
        k = args.k or 50
    else:
        k = args.k or p.n_components
    eye = np.eye(info.n_items)

    def shown(nd: dict[int, float]) -> str:
        if truth is None:
            return " / ".join(f"{nd[s]:.4f}" for s in levels)
        return " / ".join(f"{100 * nd[s] / truth[s]:.1f}%" for s in levels)

    def shown_raw(nd: dict[int, float]) -> str:
        return " / ".join(f"{nd[s]:.4f}" for s in levels)

    pop = item_counts(info)[:, None]
    print("popularity            ", shown(scored(info, np.ones((info.n_users, 1)), pop, levels)))
    pooled = {s: np.zeros(y.shape) for s in levels}
    for j in range(args.chains):
        rng = np.random.default_rng([args.seed, j])
        if learn:  # the fit's start: Gamma(1, 1) draws, thresholds from the histogram
            counts = np.bincount(y.data.astype(np.int64), minlength=n_classes + 1)[1:]
            delta = counts / (y.nnz + np.cumsum(counts))
            theta = np.concatenate([np.cumsum(delta[::-1])[::-1], [0.0]])
            w0 = rng.gamma(1.0, 1.0, (info.n_users, k))
            h0 = rng.gamma(1.0, 1.0, (info.n_items, k))
            prior = Prior(args.shape, theta, args.shape / w0.mean(1), args.shape / h0.mean(1), True)
        else:
            prior = Prior(
                p.shape,
                np.asarray(p.theta),
                np.full(info.n_users, p.rate_w),
                np.full(info.n_items, p.rate_h),
                False,
            )
            if args.start == "truth":
                if k != p.n_components:
                    raise SystemExit("--start truth needs K = K_true")
                ru, ri = read_ids(info.path, "users"), read_ids(info.path, "items")
                w0 = true_factors(p, "users", 0, info.n_users)[ru]
                h0 = true_factors(p, "items", 0, info.n_items)[ri]
            else:
                w0 = rng.gamma(p.shape, 1.0 / p.rate_w, (info.n_users, k))
                h0 = rng.gamma(p.shape, 1.0 / p.rate_h, (info.n_items, k))
        t0 = time.perf_counter()

        def report(
            sweep: int, prob: dict[int, np.ndarray], rate: np.ndarray, j: int = j, t0: float = t0
        ) -> None:
            together = {s: pooled[s] + prob[s] for s in levels}
            found = {s: scored(info, together[s], eye, [s])[s] for s in levels}
            if args.validation:
                held = scored(info, rate, eye, levels, split="validation")
                print(f"chain {j} sweep {sweep:5d}: validation, mean rate", shown_raw(held))
            print(
                f"chain {j} sweep {sweep:5d}: mean rate {shown(scored(info, rate, eye, levels))},"
                f" chains 0..{j} P(y >= s) {shown(found)} ({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
            if sweep == args.burn + args.kept * args.thin:
                for s in levels:
                    pooled[s] += prob[s]

        chain(y, prior, k, (w0, h0), rng, args.burn, args.kept, args.thin, levels, report)


if __name__ == "__main__":
    main()
