"""OrdNMF beside other recommenders on the same splits, every method scored by the project's own
scorer (``postfit.evaluate.score_split``: NDCG@100 at a low, middle and top relevance level).

The peers are ``implicit``'s ALS and BPR, ``hpfrec``'s hierarchical Poisson factorization, EASE
and popularity (the last two written here). They are not dependencies of the project: install
them beside it in a separate virtual environment and run this script there::

    python -m venv /tmp/peers-venv && /tmp/peers-venv/bin/pip install -e . implicit hpfrec pandas
    DATA=../shared/data PYTHONPATH=$PWD /tmp/peers-venv/bin/python bench/peers.py --out out/peers

Per dataset (MovieLens latest-small: half stars -> classes 1..10; Last.fm HetRec 2011: play
counts at the paper's count classes; a small synthetic store drawn from the model), one store is
ingested as ``examples/movielens_small.sh`` does (items then users with >= 20 interactions, 20%
test, seed 0) with 10% of the training nonzeros kept apart for validation. Every method fits the
same ``train`` subset. Each peer's small grid (``GRIDS``) is scored on ``validation`` and the
configuration with the best mean NDCG@100 over the three levels is scored on ``test``; OrdNMF
fits at the paper's settings (alpha = 0.3, tol = 1e-5, seed 0; ``OrdNMF``: the paper's single
fit, ``OrdNMF-default``: the package's default ensemble of ``n_members`` fits) with K in {25,
50} chosen the same way, the validation subset also driving its default early stopping. The
synthetic store has no validation subset: peers use the configuration chosen on MovieLens,
OrdNMF the true K, and the
generating factors and thresholds are scored as the ceiling. Every score matrix is a product of
two factor matrices (EASE: the training rows times its item-item weights; popularity: ones times
the item counts), handed to ``score_split`` as its chunks, so the ranking of every method
excludes the same known pairs and breaks ties the same way. Fit times are of one run each, on
this process's threads.

``--methods`` runs some methods only (peers on the synthetic store take the configurations chosen
on MovieLens in the same run, else their grid's first); ``--report`` prints the tables of saved
results.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln
from threadpoolctl import threadpool_limits

from ordnmf_dask import OrdNMF, evaluate, ingest
from ordnmf_dask.datasets.synth import SynthParams, synth, true_factors
from ordnmf_dask.postfit.evaluate import score_split
from ordnmf_dask.runtime.inprocess import InProcessClient
from ordnmf_dask.store.blocks import StoreInfo, open_store, read_ids
from ordnmf_dask.store.csr import load_block

THREADS = 2
K_NDCG = 100


@dataclass(frozen=True)
class Chunk:
    """A factor chunk as ``score_split`` reads it: the rows of one block in ``mean``."""

    mean: np.ndarray


@dataclass(frozen=True)
class Scores:
    """A fitted method's score matrix ``users @ items.T`` and, for a model of the classes, the
    log-likelihood spec ``score_split`` takes (None otherwise), or a custom per-nonzero one."""

    users: np.ndarray
    items: np.ndarray
    spec: tuple | None = None
    loglik: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None


def subset_matrix(info: StoreInfo, split: str) -> sp.csr_matrix:
    """The nonzeros of ``split`` as one (U x I) CSR matrix of classes."""
    rb, cb = info.row_bounds, info.col_bounds
    rows, cols, ys = [], [], []
    for r in range(info.grid[0]):
        for c in range(info.grid[1]):
            b = load_block(info.path, split, r, c)
            rows.append(b.rows.astype(np.int64) + rb[r])
            cols.append(b.cols.astype(np.int64) + cb[c])
            ys.append(b.y.astype(np.float64))
    shape = (info.n_users, info.n_items)
    return sp.csr_matrix((np.concatenate(ys), (np.concatenate(rows), np.concatenate(cols))), shape)


def score(info: StoreInfo, split: str, s: Scores, levels: list[int]) -> dict[str, Any]:
    """NDCG@100 per level (and the mean log-likelihood of the held-out classes when ``s``
    models them) of ``split`` under the scores ``s``, by the project's scorer."""
    rb, cb = info.row_bounds, info.col_bounds
    w = [
        Chunk(np.ascontiguousarray(s.users[rb[r] : rb[r + 1]], dtype=np.float64))
        for r in range(info.grid[0])
    ]
    h = [
        Chunk(np.ascontiguousarray(s.items[cb[c] : cb[c + 1]], dtype=np.float64))
        for c in range(info.grid[1])
    ]
    with InProcessClient(THREADS) as cl:
        out = score_split(cl, info, split, w, h, levels, K_NDCG, s.spec)
    ll = out["loglik_mean"]
    if s.loglik is not None:
        m = subset_matrix(info, split).tocoo()
        ll = float(s.loglik(m.row, m.col, m.data).mean())
    return {"ndcg": out["ndcg"], "loglik": ll}


# --------------------------------------------------------------------------- the peers


def popularity(x: sp.csr_matrix) -> Scores:
    """Every user gets the items ranked by their number of training interactions."""
    counts = np.asarray((x > 0).sum(axis=0), dtype=np.float64).ravel()
    return Scores(np.ones((x.shape[0], 1)), counts[:, None])


def ease(x: sp.csr_matrix, lam: float) -> Scores:
    """EASE (Steck 2019) on the binarized training matrix: B = I - P / diag(P), P = (X'X +
    lam I)^-1, zero diagonal; the scores are X B."""
    xb = (x > 0).astype(np.float64)
    g = (xb.T @ xb).toarray()
    g[np.diag_indices_from(g)] += lam
    p = np.linalg.inv(g)
    b = -p / np.diag(p)
    b[np.diag_indices_from(b)] = 0.0
    return Scores(xb.toarray(), b.T)


def als(x: sp.csr_matrix, factors: int, regularization: float, alpha: float) -> Scores:
    """``implicit`` ALS (Hu, Koren, Volinsky 2008) with confidence ``alpha`` x class."""
    from implicit.cpu.als import AlternatingLeastSquares

    m = AlternatingLeastSquares(
        factors=factors,
        regularization=regularization,
        alpha=alpha,
        iterations=15,
        random_state=0,
        num_threads=THREADS,
    )
    with threadpool_limits(1, "blas"):  # implicit's advice: its threads, not BLAS's
        m.fit(x.astype(np.float32), show_progress=False)
    return Scores(m.user_factors, m.item_factors)


def bpr(x: sp.csr_matrix, factors: int, learning_rate: float, regularization: float) -> Scores:
    """``implicit`` BPR (Rendle et al. 2009) on the binarized training matrix (its item bias is
    a factor column against a user column of ones)."""
    from implicit.cpu.bpr import BayesianPersonalizedRanking

    m = BayesianPersonalizedRanking(
        factors=factors,
        learning_rate=learning_rate,
        regularization=regularization,
        iterations=100,
        random_state=0,
        num_threads=THREADS,
    )
    with threadpool_limits(1, "blas"):
        m.fit((x > 0).astype(np.float32), show_progress=False)
    return Scores(m.user_factors, m.item_factors)


def hpf(x: sp.csr_matrix, k: int) -> Scores:
    """``hpfrec`` hierarchical Poisson factorization (Gopalan et al. 2015) of the classes taken
    as counts; its test log-likelihood is the zero-truncated Poisson law of the class."""
    from hpfrec import HPF

    m = HPF(k=k, random_seed=0, ncores=THREADS, verbose=False, produce_dicts=False)
    m.fit(x.tocoo())  # a sparse matrix keeps the indices and the shape
    theta, beta = np.asarray(m.Theta, np.float64), np.asarray(m.Beta, np.float64)

    def loglik(rows: np.ndarray, cols: np.ndarray, y: np.ndarray) -> np.ndarray:
        lam = np.einsum("nk,nk->n", theta[rows], beta[cols])
        return y * np.log(lam) - lam - gammaln(y + 1) - np.log(-np.expm1(-lam))

    return Scores(theta, beta, loglik=loglik)


Fitter = Callable[..., Scores]
GRIDS: dict[str, tuple[Fitter, list[dict[str, Any]]]] = {
    "popularity": (popularity, [{}]),
    "EASE": (ease, [{"lam": v} for v in (50.0, 200.0, 500.0, 1000.0)]),
    "ALS": (
        als,
        [
            {"factors": f, "regularization": r, "alpha": a}
            for f in (10, 25, 50)
            for r in (1.0, 10.0)
            for a in (0.2, 1.0)
        ],
    ),
    "BPR": (
        bpr,
        [
            {"factors": f, "learning_rate": lr, "regularization": 0.01}
            for f in (25, 50)
            for lr in (0.003, 0.01)
        ],
    ),
    "HPF": (hpf, [{"k": k} for k in (25, 50)]),
}


def timed(fit: Fitter, x: sp.csr_matrix, config: dict[str, Any]) -> tuple[Scores, float]:
    start = time.perf_counter()
    s = fit(x, **config)
    return s, time.perf_counter() - start


def mean_ndcg(result: dict[str, Any]) -> float:
    return float(np.mean(list(result["ndcg"].values())))


# --------------------------------------------------------------------------- the runs


@dataclass(frozen=True)
class Dataset:
    name: str
    levels: list[int]
    make: Callable[[str], StoreInfo]  # store path -> the store


def datasets(data: str) -> dict[str, Dataset]:
    common = {
        "min_count": 20,
        "test_fraction": 0.2,
        "validation_fraction": 0.1,
        "seed": 0,
        "overwrite": True,
    }
    ml = os.path.join(data, "ml-latest-small", "ratings.csv")
    fm = os.path.join(data, "hetrec2011-lastfm-2k", "user_artists.dat")
    return {
        "movielens": Dataset(
            "movielens", [1, 6, 10], lambda out: ingest(ml, out, ratings="halfstar", **common)
        ),
        "lastfm": Dataset(
            "lastfm", [1, 8, 10], lambda out: ingest(fm, out, counts="paper", **common)
        ),
        "synth": Dataset(
            "synth",
            [1, 5, 10],
            lambda out: synth(out, 1000, 1000, 60000, 10, seed=0, overwrite=True),
        ),
    }


def run_ordnmf(
    info: StoreInfo, ks: tuple[int, ...], levels: list[int], method: str
) -> dict[str, Any]:
    """OrdNMF, K chosen on validation among ``ks`` as the peers' grids are (the only K without
    a validation subset), scored on test by ``evaluate``: ``OrdNMF`` is the paper's single fit
    (alpha = 0.3, tol = 1e-5, seed 0), ``OrdNMF-default`` the package's defaults (an ensemble of
    ``n_members`` fits)."""
    single = {"n_members": 1} if method == "OrdNMF" else {}
    fits, tried = [], []
    for k in ks:
        start = time.perf_counter()
        model = OrdNMF(n_components=k, alpha_W=0.3, alpha_H=0.3, tol=1e-5, seed=0, **single).fit(
            info.path
        )
        fits.append((model, time.perf_counter() - start))
        if len(ks) > 1:
            s = Scores(np.asarray(model.W_.compute()), np.asarray(model.H_.compute()))
            tried.append((mean_ndcg(score(info, "validation", s, levels)), {"K": k}))
    best = int(np.argmax([v for v, _ in tried])) if tried else 0
    model, seconds = fits[best]
    ev = evaluate(info.path, model, levels=levels)
    return {
        "method": method,
        "config": {"K": ks[best], "members": model.n_members_, "n_iter": int(model.n_iter_)},
        "ndcg": ev["ndcg"],
        "loglik": ev["test_loglik_mean"],
        "fit_s": seconds,
        "validation": [{"mean_ndcg": v, **c} for v, c in tried],
    }


def run_peer(
    info: StoreInfo, name: str, levels: list[int], chosen: dict[str, Any] | None
) -> dict[str, Any]:
    """The peer ``name`` at ``chosen``, or tuned on validation when ``chosen`` is None, scored
    on test."""
    fit, grid = GRIDS[name]
    x = subset_matrix(info, "train")
    tried = []
    if chosen is None and len(grid) > 1:
        for config in grid:
            s, _ = timed(fit, x, config)
            tried.append((mean_ndcg(score(info, "validation", s, levels)), config))
        chosen = max(tried, key=lambda t: t[0])[1]
    config = grid[0] if chosen is None else chosen
    s, seconds = timed(fit, x, config)
    out = score(info, "test", s, levels)
    return {
        "method": name,
        "config": config,
        "ndcg": out["ndcg"],
        "loglik": out["loglik"],
        "fit_s": seconds,
        "validation": [{"mean_ndcg": v, **c} for v, c in tried],
    }


def run_truth(info: StoreInfo, levels: list[int]) -> dict[str, Any]:
    """The generating factors and thresholds of a synthetic store, scored as a model."""
    p = SynthParams.from_attrs(info.attrs)
    for axis in ("users", "items"):  # factor rows are indexed by the raw ids
        ids = read_ids(info.path, axis)
        if not np.array_equal(ids, np.arange(len(ids))):
            raise RuntimeError(f"{info.path}: {axis} ids are not 0..n-1")
    theta = np.asarray(p.theta)
    delta = np.concatenate([[0.0], theta[:-1] - theta[1:]])
    s = Scores(
        true_factors(p, "users", 0, p.n_users),
        true_factors(p, "items", 0, p.n_items),
        ("ordinal", delta),
    )
    out = score(info, "test", s, levels)
    return {
        "method": "truth",
        "config": {"K": p.n_components},
        "ndcg": out["ndcg"],
        "loglik": out["loglik"],
        "fit_s": None,
    }


def run(
    d: Dataset, work: str, chosen: dict[str, dict[str, Any]], methods: list[str]
) -> Iterator[dict[str, Any]]:
    info = d.make(os.path.join(work, f"{d.name}.zarr"))
    info = open_store(info.path)
    has_validation = "validation" in info.splits
    synthetic = "synth" in info.attrs
    ks = (SynthParams.from_attrs(info.attrs).n_components,) if synthetic else (25, 50)
    yield {
        "store": {
            "users": info.n_users,
            "items": info.n_items,
            "nnz_train": info.nnz_train,
            "nnz_validation": info.nnz_validation,
            "nnz_test": info.nnz_test,
            "hist_test": info.hist_test.tolist(),
        }
    }
    if synthetic:
        yield run_truth(info, d.levels)
    for method in ("OrdNMF", "OrdNMF-default"):
        if method in methods:
            yield run_ordnmf(info, ks, d.levels, method)
    for name in (m for m in GRIDS if m in methods):
        fixed = None if has_validation else chosen.get(name, GRIDS[name][1][0])
        row = run_peer(info, name, d.levels, fixed)
        chosen.setdefault(name, row["config"])
        yield row


def report(results: dict[str, list[dict[str, Any]]]) -> str:
    """The rows of ``results`` (per dataset, as ``results.json`` holds them) as markdown tables:
    NDCG@100 per level, mean test log-likelihood, configuration and fit time."""
    out = []
    for name, rows in results.items():
        store = next(r["store"] for r in rows if "store" in r)
        methods = [r for r in rows if "method" in r]
        levels = list(methods[0]["ndcg"])
        out += [
            f"{name}: {store['users']} users x {store['items']} items, {store['nnz_train']} "
            f"train / {store['nnz_validation']} validation / {store['nnz_test']} test "
            "nonzeros",
            "",
            "| method | "
            + " | ".join(f"s={s}" for s in levels)
            + " | test loglik | configuration | fit (s) |",
            "|---" * (len(levels) + 4) + "|",
        ]
        for r in methods:
            ll = "–" if r["loglik"] is None else f"{r['loglik']:.3f}"
            fit = "–" if r["fit_s"] is None else f"{r['fit_s']:.1f}"
            config = ", ".join(f"{k} {v:g}" for k, v in r["config"].items()) or "–"
            out.append(
                f"| {r['method']} | "
                + " | ".join(f"{r['ndcg'][s]:.3f}" for s in levels)
                + f" | {ll} | {config} | {fit} |"
            )
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("DATA", "../shared/data"))
    ap.add_argument("--out", default="out/peers", help="results.json goes here")
    ap.add_argument("--datasets", default="movielens,lastfm,synth")
    ap.add_argument("--methods", default=",".join(["OrdNMF", "OrdNMF-default", *GRIDS]))
    ap.add_argument(
        "--report",
        nargs="+",
        metavar="JSON",
        help="print the tables of these results.json files (later rows of a method "
        "replace earlier ones) and exit",
    )
    args = ap.parse_args()
    if args.report:
        merged: dict[str, dict[str, dict[str, Any]]] = {}
        for path in args.report:
            with open(path) as f:
                for name, rows in json.load(f).items():
                    for r in rows:
                        merged.setdefault(name, {})[r.get("method", "store")] = r
        print(report({name: list(rows.values()) for name, rows in merged.items()}))
        return
    os.makedirs(args.out, exist_ok=True)
    every = datasets(args.data)
    chosen: dict[str, dict[str, Any]] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="peers-") as work:
        for name in args.datasets.split(","):
            results[name] = []
            for row in run(every[name], work, chosen, args.methods.split(",")):
                results[name].append(row)
                print(name, json.dumps(row), flush=True)
                with open(os.path.join(args.out, "results.json"), "w") as f:
                    json.dump(results, f, indent=1)
    print(report(results))


if __name__ == "__main__":
    main()
