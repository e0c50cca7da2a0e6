"""How the posterior enters the class law: error of the plug-in law (lambda = E[w] . E[h]) and of
the moment-matched Gamma law against a Monte-Carlo reference of E_q[exp(-lambda theta_v)], on a
fitted model (docs/design.md, "Class probabilities").

Usage: ``python bench/classlaw_error.py MODEL STORE [--pairs 300 --samples 4000 --seed 0]``.

Pairs: ``--pairs`` test pairs of the store and as many uniformly random (user, item) pairs. The
reference integrates w exactly, E_w[exp(-theta w h)] = (1 + theta h / b)^(-a) per component for
q(w_k) = Gamma(a, b), and averages that product over ``--samples`` draws of h from q(h) (a
Rao-Blackwellized estimate: its own standard error is printed beside the errors). Printed: the
largest and mean absolute error of P(y = v) (v = 0..V) and of P(y >= s | y > 0) (s = 2..V),
and the mean log-loss of the test pairs' classes under each law.
"""

from __future__ import annotations

import argparse

import numpy as np

from ordnmf_dask.model import classlaw
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import open_model
from ordnmf_dask.store.blocks import open_store, read_block


def factor(model: str, name: str, n: int, field: str) -> np.ndarray:
    return np.concatenate([chunkstore.read_field(model, name, j, field) for j in range(n)])


def test_pairs(store: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    info = open_store(store)
    rows, cols, ys = [], [], []
    for r in range(info.grid[0]):
        for c in range(info.grid[1]):
            b = read_block(store, "test", r, c, values=("y",))
            rows.append(np.repeat(np.arange(b.shape[0]), np.diff(b.indptr)) + info.row_bounds[r])
            cols.append(b.cols.astype(np.int64) + info.col_bounds[c])
            ys.append(b.y.astype(np.int64))
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(ys)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("store")
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    m = open_model(args.model)
    nr, nc = m.n_blocks
    mw, aw = factor(m.path, "W", nr, "mean"), factor(m.path, "W", nr, "shape")
    mh, ah = factor(m.path, "H", nc, "mean"), factor(m.path, "H", nc, "shape")
    theta = np.asarray(m.attrs["theta"])
    rng = np.random.default_rng(args.seed)
    tu, ti, ty = test_pairs(args.store)
    pick = rng.choice(len(tu), args.pairs, replace=False)
    users = np.concatenate([tu[pick], rng.integers(0, len(mw), args.pairs)])
    items = np.concatenate([ti[pick], rng.integers(0, len(mh), args.pairs)])
    y = ty[pick]
    limit = classlaw.ordinal_limit(theta)

    ref = np.empty((len(users), len(theta)))
    se = np.empty_like(ref)
    for j, (u, i) in enumerate(zip(users, items, strict=True)):
        hs = rng.gamma(ah[i], mh[i] / ah[i], size=(args.samples, len(ah[i])))
        log_cdf = -(aw[u] * np.log1p(theta[:, None, None] * hs * (mw[u] / aw[u])[None])).sum(-1)
        draws = np.exp(log_cdf)  # (V + 1, samples)
        ref[j] = draws.mean(axis=1)
        se[j] = draws.std(axis=1) / np.sqrt(args.samples)
    ref_h = -np.log(ref)
    laws = {"reference": ref_h}
    lam = (mw[users] * mh[items]).sum(axis=1)
    laws["plug-in E[lambda]"] = classlaw.plugin_hazards(lam, theta)
    laws["Gamma (moments)"] = classlaw.gamma_hazards(
        users, items, mw, mw**2 / aw, mh, mh**2 / ah, theta
    )
    p_ref = classlaw.class_law(ref_h, limit)
    levels = range(2, len(theta))
    up_ref = np.stack([classlaw.at_least(ref_h, s, limit) for s in levels], axis=1)
    n = args.pairs
    print(
        f"model {args.model}: K {mw.shape[1]}, V {len(theta) - 1}; {n} test + {n} random "
        f"pairs, {args.samples} draws of h each; reference std. error of P(y <= v): max "
        f"{se.max():.2e}, mean {se.mean():.2e}"
    )
    print(
        f"{'law':<20}{'max|dP(y=v)|':>14}{'mean|dP|':>11}{'max|dP(>=s|>0)|':>17}"
        f"{'mean':>9}{'log-loss (test)':>17}"
    )
    for name, h in laws.items():
        p = classlaw.class_law(h, limit)
        up = np.stack([classlaw.at_least(h, s, limit) for s in levels], axis=1)
        ll = -classlaw.log_class_prob(h[:n], y).mean()
        print(
            f"{name:<20}{np.abs(p - p_ref).max():>14.4f}{np.abs(p - p_ref).mean():>11.5f}"
            f"{np.abs(up - up_ref).max():>17.4f}{np.abs(up - up_ref).mean():>9.5f}{ll:>17.4f}"
        )


if __name__ == "__main__":
    main()
