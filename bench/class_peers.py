"""Calibration and rating error of OrdNMF's class law beside two simple laws of the rating given
an interaction, on the same store's test pairs and with the same scorer
(:mod:`ordnmf_dask.model.calibration`; docs/results.md, "Class probabilities beside simple
peers").

- OrdNMF: ``predict_proba(given_interaction=True)`` of a fitted model, Gamma posterior and plug-in.
- Per-item class histogram: the item's training classes, smoothed towards the global histogram
  with the weight of ``--prior`` pairs.
- User + item bias: ``r = mu + b_u + b_i`` on the class scale fitted by ridge-regularized
  alternating least squares (``--reg``, 20 sweeps), and as a law the Normal of the training
  residuals' variance around it, discretized on the classes 1..V (mass at v: the density at v,
  normalized).
- scikit-surprise's SVD (biased matrix factorization ``r = mu + b_u + b_i + p_u . q_i`` by SGD,
  the library's defaults, random_state 0; there is no validation subset here to tune it on) on
  the same training classes, its law the bias row's Normal (:func:`normal_law`) around its
  unclipped prediction with its training residuals' sd. scikit-surprise is not a dependency of
  the project: the row runs where it is importable (install it in ``bench/peers.py``'s
  environment) and a line says so where it is not.
- The global class histogram (every pair the same law).
- hpfrec's HPF (``bench/peers.py``'s :func:`peers.hpf`, the classes of the same training pairs
  taken as counts, k = ``--hpf-k``): for the rate ``lam = E[theta_u] . E[beta_i]``, the Poisson
  mass at 1..V-1 and its tail P(y >= V) at V, renormalized over y >= 1. hpfrec is not a
  dependency of the project: the row runs where it is importable (the separate environment of
  ``bench/peers.py``) and a line says so where it is not. Before the row, the law is checked
  against ``scipy.stats.poisson`` (:func:`check_poisson_law`).

    python bench/class_peers.py STORE MODEL [--prior 5 --reg 10 --hpf-k 25]
"""

from __future__ import annotations

import argparse
import importlib.util

import numpy as np
from common import training_arrays
from scipy.special import gammainc, gammaln

from ordnmf_dask.estimator import OrdNMF
from ordnmf_dask.model import calibration, classlaw
from ordnmf_dask.store.blocks import open_store


def histogram_law(cols, y, n_items, v, test_cols, prior):
    counts = np.zeros((n_items, v + 1))
    np.add.at(counts, (cols, y), 1.0)
    glob = counts.sum(axis=0) / counts.sum()
    law = counts[test_cols] + prior * glob
    return law / law.sum(axis=1, keepdims=True), glob


def bias_law(rows, cols, y, shape, test_rows, test_cols, reg):
    n_users, n_items, v = shape
    y = y.astype(np.float64)
    mu = y.mean()
    bu, bi = np.zeros(n_users), np.zeros(n_items)
    for _ in range(20):
        bu = np.bincount(rows, y - mu - bi[cols], n_users) / (
            np.bincount(rows, None, n_users) + reg
        )
        bi = np.bincount(cols, y - mu - bu[rows], n_items) / (
            np.bincount(cols, None, n_items) + reg
        )
    sigma = np.sqrt(np.mean((y - mu - bu[rows] - bi[cols]) ** 2))
    centre = mu + bu[test_rows] + bi[test_cols]
    return normal_law(centre, sigma, v), centre, sigma


def normal_law(centre: np.ndarray, sigma: float, v: int) -> np.ndarray:
    """(n, V + 1) law of the class given an interaction around a point prediction ``centre`` (n,)
    on the class scale: the Normal(centre, sigma) density at 1..V, normalized; column 0 zero."""
    grid = np.arange(1, v + 1)
    dens = np.exp(-0.5 * ((grid[None, :] - centre[:, None]) / sigma) ** 2)
    law = np.zeros((len(centre), v + 1))
    law[:, 1:] = dens / dens.sum(axis=1, keepdims=True)
    return law


def surprise_svd_law(rows, cols, y, v, test_rows, test_cols):
    """scikit-surprise's SVD (biased matrix factorization, the library's defaults, random_state
    0) fitted to the training classes on the scale 1..V; its unclipped prediction as the centre
    of :func:`normal_law` with the training residuals' sd, as the bias row's."""
    import pandas as pd
    from surprise import SVD, Dataset, Reader  # not a dependency of the project: imported here

    frame = pd.DataFrame({"user": rows, "item": cols, "rating": y.astype(np.float64)})
    data = Dataset.load_from_df(frame, Reader(rating_scale=(1, v)))
    algo = SVD(random_state=0).fit(data.build_full_trainset())

    def estimate(r: np.ndarray, c: np.ndarray) -> np.ndarray:
        pairs = zip(r.tolist(), c.tolist(), strict=True)
        return np.array([algo.predict(u, i, clip=False).est for u, i in pairs])

    sigma = float(np.sqrt(np.mean((y - estimate(rows, cols)) ** 2)))
    centre = estimate(test_rows, test_cols)
    return normal_law(centre, sigma, v), centre, sigma


def poisson_class_law(lam: np.ndarray, v: int) -> np.ndarray:
    """(n, V + 1) law of the class given an interaction under a Poisson rate ``lam`` (n,) on the
    class numbers: mass at 1..V-1, the tail P(y >= V) at V, renormalized over y >= 1; column 0
    (no interaction) is zero. The tail keeps the classes above V (impossible on the store's
    scale, likely under large rates) from being thrown away."""
    lam = np.asarray(lam, dtype=np.float64)[:, None]
    k = np.arange(1, v)
    law = np.zeros((lam.shape[0], v + 1))
    law[:, 1:v] = np.exp(k * np.log(lam) - lam - gammaln(k + 1))
    law[:, v] = gammainc(v, lam[:, 0])  # P(Poisson(lam) >= v), the regularized lower gamma
    return law / law.sum(axis=1, keepdims=True)


def check_poisson_law() -> None:
    """:func:`poisson_class_law` against ``scipy.stats.poisson``'s pmf and survival function,
    term by term, from small to large rates."""
    from scipy.stats import poisson

    v, lam = 10, np.array([1e-3, 0.5, 3.0, 7.2, 40.0])
    dense = np.zeros((len(lam), v + 1))
    for n, r in enumerate(lam):
        dense[n, 1:v] = [poisson.pmf(k, r) for k in range(1, v)]
        dense[n, v] = poisson.sf(v - 1, r)
        dense[n] /= 1.0 - poisson.pmf(0, r)
    law = poisson_class_law(lam, v)
    assert np.allclose(law, dense, rtol=1e-10, atol=1e-300), np.abs(law - dense).max()
    assert np.allclose(law.sum(axis=1), 1.0, rtol=1e-12)


def hpf_law(store: str, k: int, test_rows: np.ndarray, test_cols: np.ndarray, v: int):
    """hpfrec's HPF at ``k`` fitted to the store's training pairs as ``bench/peers.py`` fits it,
    and its :func:`poisson_class_law` on the test pairs."""
    from peers import hpf, subset_matrix  # imports hpfrec (and peers' own deps) only here

    x = subset_matrix(open_store(store), "train")
    s = hpf(x, k)
    if s.users.shape[0] != x.shape[0] or s.items.shape[0] != x.shape[1]:
        raise RuntimeError(f"hpfrec re-indexed the matrix: {s.users.shape}, {s.items.shape}")
    lam = np.einsum("nk,nk->n", s.users[test_rows], s.items[test_cols])
    return poisson_class_law(lam, v)


def log_prob(law, y):
    with np.errstate(divide="ignore"):
        return np.log(law[np.arange(len(y)), y])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("model")
    ap.add_argument("--prior", type=float, default=5.0)
    ap.add_argument("--reg", type=float, default=10.0)
    ap.add_argument(
        "--hpf-k", type=int, default=25, help="HPF's k (25: chosen on MovieLens by bench/peers.py)"
    )
    args = ap.parse_args()
    info = open_store(args.store)
    rows, cols, y, shape = training_arrays(args.store)
    trow, tcol, ty, _ = training_arrays(args.store, "test")
    ty = ty.astype(np.int64)
    v = shape[2]
    values = classlaw.class_values(info.attrs["value_kind"], v)
    levels = list(range(2, v + 1))
    model = OrdNMF.load(args.model)
    users, items = model._server().users.ids[trow], model._server().items.ids[tcol]
    laws = {
        "OrdNMF (Gamma posterior)": model.predict_proba(
            users, items, given_interaction=True, posterior="gamma"
        ),
        "OrdNMF (plug-in E[lambda])": model.predict_proba(
            users, items, given_interaction=True, posterior="mean"
        ),
    }
    laws["per-item class histogram"], glob = histogram_law(cols, y, shape[1], v, tcol, args.prior)
    bias, centre, sigma = bias_law(rows, cols, y, shape, trow, tcol, args.reg)
    laws["user + item bias, Normal"] = bias
    points = {"user + item bias": (centre, sigma)}  # point prediction, residual sd (classes)
    if importlib.util.find_spec("surprise") is None:
        print("surprise SVD (biased MF), Normal law: not run, scikit-surprise is not importable")
    else:
        law, *points["surprise SVD"] = surprise_svd_law(rows, cols, y, v, trow, tcol)
        laws["surprise SVD (biased MF), Normal law"] = law
    if importlib.util.find_spec("hpfrec") is None:
        print("hpfrec (HPF), Poisson law: not run, hpfrec is not importable here (bench/peers.py)")
    else:
        check_poisson_law()
        laws["hpfrec (HPF), Poisson law"] = hpf_law(args.store, args.hpf_k, trow, tcol, v)
    laws["global class histogram"] = np.broadcast_to(glob, (len(ty), v + 1)).copy()
    print(
        f"{info.path}: {len(ty)} test ratings, V = {v}; ECE over 10 bins of P(y >= s | y > 0); "
        "RMSE, MAE of the expected rating in stars (residual sd in classes: "
        + ", ".join(f"{name} {sd:.2f}" for name, (_, sd) in points.items())
        + ")"
    )
    head = ["law", "log-loss", "Brier", "ECE s=6", "ECE s=8", "ECE s=10", "mean ECE", "RMSE", "MAE"]
    print(" | ".join(head))
    for name, law in laws.items():
        s = calibration.summary(
            calibration.sums(law, log_prob(law, ty), ty, values, levels), levels
        )
        ece = s["ece"]
        row = [s["log_loss"], s["brier"], ece[6], ece[8], ece[10], np.mean(list(ece.values()))]
        print(name, "|", " | ".join(f"{x:.4f}" for x in [*row, s["rmse"], s["mae"]]))
    scale = values[1]  # stars per class
    for name, (c, _) in points.items():
        err = np.clip(c, 1, v) * scale - values[ty]
        print(
            f"{name}, point prediction (clipped): RMSE {np.sqrt(np.mean(err**2)):.4f} "
            f"MAE {np.mean(np.abs(err)):.4f}"
        )


if __name__ == "__main__":
    main()
