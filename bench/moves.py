"""Merge-and-rebirth moves for one fit (after memoized VI's birth and merge, Hughes & Sudderth
2013), measured by ``bench/optimum.py --moves``: a research probe, not part of the package.

A move merges the ``pairs`` most similar pairs of components (the cosine of their item columns
times that of their user columns) into the best rank-1 fit of each pair's rate (or, with
``kind = "delete"``, deletes the ``pairs`` components of least rate mass), and re-births each
freed component from the training pairs the fit explains worst (the leading singular pair of the
observed classes damped by the fitted rate). The fit runs ``burn`` iterations, then ``rounds``
times continues ``sweeps`` iterations both from its state and from the moved state (both warm
started from their E[W], E[H] with ``init=``, scaled to the thresholds a warm start begins
with, so both re-learn the thresholds alike), and keeps the one of higher ELBO; it ends with a
plain fit to convergence from the last kept state. So the ELBO of the kept state never falls
below the control's: a move is kept only when it wins (docs/results.md, "Split and merge
moves", has the measurements).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import svds

from ordnmf_dask import OrdNMF
from ordnmf_dask.model.thresholds import init_delta, theta_from_delta
from ordnmf_dask.store.blocks import StoreInfo
from ordnmf_dask.store.csr import load_block


@dataclass
class MoveSettings:
    """The schedule of the moves (iterations of the package's default fit)."""

    burn: int = 20
    sweeps: int = 10
    rounds: int = 4
    pairs: int = 4  # 0: the same schedule of warm restarts without moves (the control)
    kind: str = "merge"  # or "delete": re-birth the ``pairs`` lightest components, no merge


@dataclass
class MoveLog:
    """What a fit with moves did: the ELBO kept after each round and the moves kept."""

    kept: list[bool] = field(default_factory=list)
    elbo: list[float] = field(default_factory=list)
    control: list[float] = field(default_factory=list)


def training_matrix(info: StoreInfo) -> sp.csr_matrix:
    """The training classes as a (U, I) matrix in the factors' row and column order."""
    rb, cb = info.row_bounds, info.col_bounds
    rows, cols, ys = [], [], []
    for r in range(info.grid[0]):
        for c in range(info.grid[1]):
            b = load_block(info.path, "train", r, c)
            rows.append(rb[r] + np.repeat(np.arange(b.shape[0]), np.diff(b.indptr)))
            cols.append(cb[c] + b.cols)
            ys.append(b.y.astype(np.float64))
    shape = (info.n_users, info.n_items)
    return sp.csr_matrix((np.concatenate(ys), (np.concatenate(rows), np.concatenate(cols))), shape)


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.maximum(np.linalg.norm(a, axis=0), 1e-300)


def merge_pairs(w: np.ndarray, h: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The ``n`` most similar disjoint pairs of components, most similar first."""
    sim = (_unit(h).T @ _unit(h)) * (_unit(w).T @ _unit(w))
    np.fill_diagonal(sim, -np.inf)
    taken: set[int] = set()
    out = []
    for flat in np.argsort(-sim, axis=None):
        j, k = divmod(int(flat), sim.shape[0])
        if j < k and j not in taken and k not in taken:
            out.append((j, k))
            taken.update((j, k))
            if len(out) == n:
                break
    return out


def rank_one(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The best rank-1 (w, h) of ``a @ b.T`` (nonnegative: Perron vectors of a nonnegative
    product)."""
    qa, ra = np.linalg.qr(a)
    qb, rb = np.linalg.qr(b)
    u, s, vt = np.linalg.svd(ra @ rb.T)
    w, h = np.abs(qa @ u[:, 0]), np.abs(qb @ vt[0])
    return w * np.sqrt(s[0]), h * np.sqrt(s[0])


def births(y: sp.csr_matrix, w: np.ndarray, h: np.ndarray, n: int) -> list[tuple[np.ndarray, ...]]:
    """``n`` new components from the residual: the observed classes damped by the fitted rate at
    the training pairs (``y / (1 + rate / median rate)``), their leading singular pairs (each
    pair's positive part of the sign with more mass), scaled to the median component's mass."""
    coo = y.tocoo()
    rate = np.einsum("ij,ij->i", w[coo.row], h[coo.col])
    resid = sp.csr_matrix((coo.data / (1.0 + rate / np.median(rate)), (coo.row, coo.col)), y.shape)
    u, _, vt = svds(resid, k=n, random_state=0)
    mass = float(np.median(w.sum(axis=0) * h.sum(axis=0)))
    out = []
    for j in range(n):
        a, b = u[:, j], vt[j]
        if np.clip(a, 0, None).sum() < np.clip(-a, 0, None).sum():
            a, b = -a, -b
        a, b = np.clip(a, 1e-6 * a.max(), None), np.clip(b, 1e-6 * max(b.max(), 1e-12), None)
        scale = np.sqrt(mass / (a.sum() * b.sum()))
        out.append((a * scale, b * scale))
    return out


def move(
    y: sp.csr_matrix, w: np.ndarray, h: np.ndarray, n: int, kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """(W, H) with the ``n`` most similar pairs merged (``kind`` "merge") or the ``n`` lightest
    components deleted ("delete"), and the freed columns re-born."""
    w, h = w.copy(), h.copy()
    if kind == "merge":
        pairs = merge_pairs(w, h, n)
        for j, k in pairs:
            w[:, j], h[:, j] = rank_one(w[:, [j, k]], h[:, [j, k]])
        freed = [k for _, k in pairs]
    else:
        freed = np.argsort(w.sum(axis=0) * h.sum(axis=0))[:n].tolist()
    w[:, freed], h[:, freed] = 0.0, 0.0
    for k, (a, b) in zip(freed, births(y, w, h, len(freed)), strict=True):
        w[:, k], h[:, k] = a, b
    floor = 1e-6 * float(np.median(w)), 1e-6 * float(np.median(h))
    return np.maximum(w, floor[0]), np.maximum(h, floor[1])


def restart_scale(y: sp.csr_matrix, n_classes: int, theta0: float) -> float:
    """The factor of E[W] and E[H] that carries a fit with thresholds ``theta0`` to a warm start:
    the start's thresholds come from the histogram, and the likelihood depends on the rate only
    through the thresholds times it, so both factors are scaled by the root of the two theta_0's
    ratio (without it the first iterations after a restart lose what the fit had gained)."""
    hist = np.bincount(y.data.astype(np.int64), minlength=n_classes + 1)
    return float(np.sqrt(theta0 / theta_from_delta(init_delta(hist))[0]))


def fit_with_moves(
    info: StoreInfo, y: sp.csr_matrix, k: int, seed: int, s: MoveSettings
) -> tuple[np.ndarray, np.ndarray, MoveLog]:
    """One fit of ``seed`` with merge-and-rebirth moves: its E[W], E[H] and the moves' log."""
    log = MoveLog()
    run = OrdNMF(k, seed=seed, n_members=1, max_iter=s.burn, tol=1e-12).fit(info.path)
    w, h, theta0 = run.user_factors, run.item_factors, float(run.theta_[0])
    for _ in range(s.rounds):
        c = restart_scale(y, info.n_classes, theta0)
        w, h = w * c, h * c
        base = OrdNMF(k, seed=seed, n_members=1, max_iter=s.sweeps, tol=1e-12)
        control = base.fit(info.path, init=(w, h))
        keep, best = False, control
        if s.pairs:
            moved = OrdNMF(k, seed=seed, n_members=1, max_iter=s.sweeps, tol=1e-12)
            moved.fit(info.path, init=move(y, w, h, s.pairs, s.kind))
            keep = moved.elbo_[-1] > control.elbo_[-1]
            best = moved if keep else control
        log.kept.append(bool(keep))
        log.elbo.append(best.elbo_[-1])
        log.control.append(control.elbo_[-1])
        w, h, theta0 = best.user_factors, best.item_factors, float(best.theta_[0])
    c = restart_scale(y, info.n_classes, theta0)
    w, h = w * c, h * c
    last = OrdNMF(k, seed=seed, n_members=1).fit(info.path, init=(w, h))
    log.elbo.append(last.elbo_[-1])
    return last.user_factors, last.item_factors, log
