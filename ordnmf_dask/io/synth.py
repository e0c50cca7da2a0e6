"""Write a synthetic IG-OrdNMF dataset of any size straight into a block store.

Generative model (``DESIGN.md`` section 1, with fixed prior rates)::

    w_uk ~ Gamma(a, rate b_w)      h_ik ~ Gamma(a, rate b_h)      lambda_ui = sum_k w_uk h_ik
    P(y_ui <= v | lambda) = exp(-lambda theta_v),    theta_0 > ... > theta_{V-1} > theta_V = 0

Sparse sampling, never touching all U x I pairs. With ``n_ui ~ Poisson(lambda_ui theta_0)`` we
have ``P(n_ui = 0) = exp(-lambda_ui theta_0) = P(y_ui = 0)``, so "y_ui > 0" is exactly "n_ui > 0".
By Poisson superposition ``n_ui = sum_k n_uik`` with independent
``n_uik ~ Poisson(theta_0 w_uk h_ik)``, and for a fixed (u, k) the hits over the items of a
block are ``N_uk ~ Poisson(theta_0 w_uk s_k)``, ``s_k = sum_i h_ik``, placed on items
independently with probabilities ``h_ik / s_k``. So per block:

1. draw ``N_uk`` for every (u, k) and place the hits (inverse CDF on ``cumsum_i h_ik``); when
   ``E[N_uk] > n_items`` of the block (very active (u, k)) draw instead, for every item,
   ``1[n_uik > 0] ~ Bernoulli(1 - exp(-theta_0 w_uk h_ik))`` -- the same law, cheaper there;
2. the nonzero pairs are the union (dedupe) of the hit pairs; the work is
   ``sum_uk min(E[N_uk], n_items)``, about nnz when the data are sparse;
3. the class, given y > 0, by thinning with the exact conditional law, computing lambda only at
   the nonzero pairs: ``P(y <= v | y > 0) = (exp(-lambda theta_v) - exp(-lambda theta_0)) /
   (1 - exp(-lambda theta_0))``. Inverting with ``u ~ U(0, 1)``:
   ``t = -log1p(-(1 - u) (1 - exp(-lambda theta_0))) / lambda``, ``y = min{v >= 1 : theta_v <= t}``.

Pairs are independent given the factors, so the whole matrix has the model's law.

Target size: the expected number of nonzeros under the prior is exact and one-dimensional:
``E[nnz] = U I (1 - m^K)``, ``m = E_w[(1 + theta_0 w / b_h)^(-a)]`` (Laplace transform of the
Gamma law of h, then independence over k); ``theta_0`` is solved for so that ``E[nnz] = nnz``
(relative thresholds ``theta_v / theta_0`` are fixed).

Determinism and parallelism: the true factors are generated in fixed chunks of ``FACTOR_ROWS``
rows from ``SeedSequence(seed, spawn_key=(axis, chunk))``, so any task regenerates just the rows it
needs (``true_factors``); block (r, c) samples from ``SeedSequence(seed, spawn_key=(2, r, c))``.
The grid is regular, with about ``nnz_per_block`` expected train nonzeros per block; block tasks
stage their arrays and ``ordnmf_dask.io.assemble`` writes the store chunk by chunk. Each nonzero
is a test pair with probability ``test_fraction`` (Bernoulli, from the block's stream). Results
do not depend on the cluster (in-process or any number of workers).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import integrate, optimize, special

from .assemble import (
    Segment,
    assemble_store,
    finish_store,
    save_segment,
    staging_dir,
    temporary_store,
)
from .blocking import DEFAULT_NNZ_PER_BLOCK, auto_grid
from .errors import InputError
from .parallel import Runner
from .split import check_test_fraction
from .store import StoreInfo
from .values import MAX_CLASSES

FACTOR_ROWS = 4096
GENERATOR = "ordnmf-dask synth v1 (IG-OrdNMF, Poisson superposition + thinning)"
_AXES = {"users": 0, "items": 1}
_SAMPLE_TAG = 2
_HIT_BATCH = 2**20  # work units (hits or Bernoulli draws) per batch of users
_LAMBDA_BATCH = 2**12  # pairs per lambda batch


@dataclass(frozen=True)
class SynthParams:
    """Generator parameters (recorded in the store attribute ``synth``).

    Attributes
    ----------
    n_users, n_items, n_components, n_classes : int
        U, I, K, V.
    shape, rate_w, rate_h : float
        a, b_w, b_h of the Gamma priors.
    theta : tuple of float, length V + 1
        theta_0 > ... > theta_{V-1} > theta_V = 0.
    seed : int
    test_fraction : float
    nnz_target : int
        The requested expected number of nonzeros.
    """

    n_users: int
    n_items: int
    n_components: int
    n_classes: int
    shape: float
    rate_w: float
    rate_h: float
    theta: tuple[float, ...]
    seed: int
    test_fraction: float
    nnz_target: int

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> SynthParams:
        """Parameters of a synthetic store, from its attributes."""
        s = dict(attrs["synth"])
        return cls(**{k: s[k] for k in cls.__dataclass_fields__ if k != "theta"},
                   theta=tuple(s["theta"]))  # fmt: skip


def expected_density(theta0: float, shape: float, rate_w: float, rate_h: float, k: int) -> float:
    """P(y_ui > 0) under the prior: ``1 - m^K``, ``m = E_w[(1 + theta0 w / b_h)^(-a)]``."""
    c = theta0 / rate_h
    log_norm = shape * math.log(rate_w) - special.gammaln(shape)

    def integrand(x: float) -> float:
        if x <= 0.0:
            return 0.0
        pdf = math.exp((shape - 1.0) * math.log(x) - rate_w * x + log_norm)
        return -math.expm1(-shape * math.log1p(c * x)) * pdf

    edges = (0.0, shape / rate_w, (shape + 50.0) / rate_w, math.inf)
    with warnings.catch_warnings():  # round-off limited at tiny theta0: accurate enough
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        eps = sum(
            integrate.quad(integrand, lo, hi, limit=200, epsabs=0.0, epsrel=1e-10)[0]
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)
        )
    eps = min(max(eps, 0.0), 1.0)
    return -math.expm1(k * math.log1p(-eps)) if eps < 1.0 else 1.0


def calibrate_theta0(
    nnz: float, n_users: int, n_items: int, k: int, shape: float, rate_w: float, rate_h: float
) -> float:
    """theta_0 such that the prior expectation of the number of nonzeros is ``nnz``."""
    target = nnz / (float(n_users) * float(n_items))
    if not 0.0 < target < 1.0:
        raise InputError(f"nnz must be in (0, U * I) = (0, {n_users * n_items}), got {nnz}")

    def gap(log_theta: float) -> float:
        return math.log(expected_density(math.exp(log_theta), shape, rate_w, rate_h, k)) - (
            math.log(target)
        )

    return math.exp(optimize.brentq(gap, -80.0, 80.0, xtol=1e-12, rtol=1e-12))


def true_factors(params: SynthParams, axis: str, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of the true W (``axis="users"``) or H (``"items"``).

    Returns
    -------
    np.ndarray of float64, shape (hi - lo, K)
    """
    n = params.n_users if axis == "users" else params.n_items
    if not 0 <= lo <= hi <= n:
        raise IndexError(f"rows [{lo}, {hi}) outside [0, {n})")
    rate = params.rate_w if axis == "users" else params.rate_h
    k = params.n_components
    out = np.empty((hi - lo, k), dtype=np.float64)
    for j in range(lo // FACTOR_ROWS, (hi - 1) // FACTOR_ROWS + 1 if hi > lo else 0):
        seq = np.random.SeedSequence(params.seed, spawn_key=(_AXES[axis], j))
        chunk = np.random.Generator(np.random.PCG64(seq)).gamma(
            params.shape, 1.0 / rate, (FACTOR_ROWS, k)
        )
        a, b = max(lo, j * FACTOR_ROWS), min(hi, (j + 1) * FACTOR_ROWS)
        out[a - lo : b - lo] = chunk[a - j * FACTOR_ROWS : b - j * FACTOR_ROWS]
    return out


def class_probabilities(lam: np.ndarray, theta: Sequence[float]) -> np.ndarray:
    """P(y = v | lambda) for v = 0..V: ``exp(-lam theta_v) - exp(-lam theta_{v-1})``.

    Parameters
    ----------
    lam : np.ndarray of float64, shape (...)
    theta : sequence of float, length V + 1 (theta_V = 0)

    Returns
    -------
    np.ndarray of float64, shape (..., V + 1)
    """
    th = np.asarray(theta, dtype=np.float64)
    cdf = np.exp(-lam[..., None] * th)  # P(y <= v), v = 0..V
    return np.concatenate([cdf[..., :1], np.diff(cdf, axis=-1)], axis=-1)


def sample_classes(rng: np.random.Generator, lam: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Classes y in 1..V given y > 0 and lambda (float64 (n,)) by exact inversion; uint8 (n,)."""
    n_classes = len(theta) - 1
    u = rng.random(len(lam))
    lam = np.maximum(lam, np.finfo(np.float64).tiny)
    t = -np.log1p((1.0 - u) * np.expm1(-lam * theta[0])) / lam
    ascending = theta[:n_classes][::-1]  # theta_{V-1} < ... < theta_0
    y = n_classes - np.searchsorted(ascending, t, side="right")
    return np.clip(y, 1, n_classes).astype(np.uint8)


def sample_block_pairs(
    rng: np.random.Generator, w: np.ndarray, h: np.ndarray, theta0: float
) -> np.ndarray:
    """Sorted distinct keys ``u * n_i + i`` (int64) of the nonzero pairs of one block.

    Parameters
    ----------
    rng : np.random.Generator
    w : np.ndarray of float64, shape (n_u, K)
        True W rows of the block.
    h : np.ndarray of float64, shape (n_i, K)
        True H rows of the block.
    theta0 : float
    """
    n_i = len(h)
    cum = np.ascontiguousarray(np.cumsum(h, axis=0).T)  # (K, n_i): one row per component
    mean = theta0 * w * cum[:, -1] if n_i else np.zeros_like(w)  # E[N_uk], (n_u, K)
    dense = mean > n_i
    cost = np.where(dense, float(n_i), mean).sum(axis=1)
    cuts = _batch_cuts(cost, _HIT_BATCH)
    keys: list[np.ndarray] = []
    for u0, u1 in zip(cuts[:-1], cuts[1:], strict=True):
        part = [_poisson_hits(rng, mean[u0:u1], dense[u0:u1], cum, u0, n_i)]
        part.append(_bernoulli_hits(rng, w[u0:u1], h, dense[u0:u1], theta0, u0))
        merged = np.sort(np.concatenate(part))
        if merged.size:  # dedupe; batches hold disjoint, increasing users
            keys.append(merged[np.concatenate([[True], merged[1:] != merged[:-1]])])
    return np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)


def _batch_cuts(cost: np.ndarray, budget: float) -> list[int]:
    """Cut users into consecutive non-empty batches of about ``budget`` total cost."""
    before = np.cumsum(cost) - cost  # cost of the users before each user
    batch = np.floor(before / budget).astype(np.int64)
    starts = np.flatnonzero(np.diff(batch)) + 1
    return [0, *(int(x) for x in starts), len(cost)]


def _poisson_hits(
    rng: np.random.Generator, mean: np.ndarray, dense: np.ndarray, cum: np.ndarray, u0: int,
    n_i: int,
) -> np.ndarray:  # fmt: skip
    counts = rng.poisson(np.where(dense, 0.0, mean))  # (n_b, K)
    users = np.arange(u0, u0 + len(mean), dtype=np.int64)
    out = []
    for k in range(mean.shape[1]):
        total = int(counts[:, k].sum())
        if total == 0:
            continue
        uu = np.repeat(users, counts[:, k])
        ii = np.searchsorted(cum[k], rng.random(total) * cum[k, -1], side="right")
        out.append(uu * n_i + np.minimum(ii, n_i - 1))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _bernoulli_hits(
    rng: np.random.Generator, w: np.ndarray, h: np.ndarray, dense: np.ndarray, theta0: float,
    u0: int,
) -> np.ndarray:  # fmt: skip
    du, dk = np.nonzero(dense)
    n_i = len(h)
    if du.size == 0:
        return np.zeros(0, dtype=np.int64)
    step = max(1, _HIT_BATCH // max(n_i, 1))
    out = []
    for s in range(0, len(du), step):
        bu, bk = du[s : s + step], dk[s : s + step]
        p = -np.expm1(-theta0 * w[bu, bk][:, None] * h[:, bk].T)  # (batch, n_i)
        r, i = np.nonzero(rng.random(p.shape) < p)
        out.append((bu[r].astype(np.int64) + u0) * n_i + i)
    return np.concatenate(out)


def pair_rates(w: np.ndarray, h: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """lambda = sum_k w[rows, k] h[cols, k] for each pair, float64 (n,).

    Batches of ``_LAMBDA_BATCH`` pairs keep the (batch, K) gathers in cache; no (n, K) array.
    """
    lam = np.empty(len(rows), dtype=np.float64)
    for s in range(0, len(rows), _LAMBDA_BATCH):
        sl = slice(s, s + _LAMBDA_BATCH)
        lam[sl] = np.einsum("pk,pk->p", w.take(rows[sl], axis=0), h.take(cols[sl], axis=0))
    return lam


@dataclass(frozen=True)
class _BlockJob:
    r: int
    c: int
    rows: tuple[int, int]
    cols: tuple[int, int]


def _sample_block(job: _BlockJob, params: SynthParams, tmp: str) -> dict[str, Any]:
    """Sample block (r, c), stage its train/test arrays; returns counts and histograms."""
    seq = np.random.SeedSequence(params.seed, spawn_key=(_SAMPLE_TAG, job.r, job.c))
    rng = np.random.Generator(np.random.PCG64(seq))
    w = true_factors(params, "users", *job.rows)
    h = true_factors(params, "items", *job.cols)
    theta = np.asarray(params.theta, dtype=np.float64)
    n_i = len(h)
    keys = sample_block_pairs(rng, w, h, theta[0])
    rows, cols = keys // n_i, keys % n_i
    y = sample_classes(rng, pair_rates(w, h, rows, cols), theta)
    is_test = rng.random(len(y)) < params.test_fraction
    out: dict[str, Any] = {}
    for split, sel in (("train", ~is_test), ("test", is_test)):
        prefix = os.path.join(staging_dir(tmp, split), f"{job.r:06d}-{job.c:06d}")
        arrays = {"rows": rows[sel], "cols": cols[sel], "y": y[sel], "raw": y[sel]}
        seg = save_segment(prefix, arrays) if sel.any() else Segment(prefix, 0)
        hist = np.bincount(y[sel], minlength=params.n_classes + 1)
        out[split] = (seg, hist.astype(np.int64))
    return out


def regular_bounds(n: int, parts: int) -> np.ndarray:
    """``parts + 1`` int64 boundaries cutting [0, n) into near-equal ranges."""
    return np.round(np.linspace(0, n, parts + 1)).astype(np.int64)


def default_thresholds(n_classes: int, ratio: float = 0.7) -> tuple[float, ...]:
    """Relative thresholds ``theta_v / theta_0 = ratio^v`` (v < V), then 0."""
    return (*(ratio**v for v in range(n_classes)), 0.0)


def synth(
    out: str | os.PathLike,
    n_users: int,
    n_items: int,
    nnz: int,
    n_components: int,
    n_classes: int = 10,
    *,
    seed: int = 0,
    shape: float = 0.3,
    rate_w: float = 1.0,
    rate_h: float = 1.0,
    thresholds: Sequence[float] | None = None,
    test_fraction: float = 0.2,
    nnz_per_block: int = DEFAULT_NNZ_PER_BLOCK,
    client: Any = None,
    overwrite: bool = False,
) -> StoreInfo:
    """Sample a synthetic IG-OrdNMF dataset into a new store at ``out`` (see module docstring).

    Parameters
    ----------
    out : path
        Store directory to create (complete or absent, like ``ingest``).
    n_users, n_items, n_components, n_classes : int
        U, I, K and V (1 <= V <= 255).
    nnz : int
        Expected number of nonzeros (train + test) under the prior; theta_0 is calibrated to it.
    seed : int
        Seeds the factors, the sampling and the split.
    shape, rate_w, rate_h : float
        Gamma priors: w ~ Gamma(shape, rate_w), h ~ Gamma(shape, rate_h).
    thresholds : sequence of float, optional
        Relative thresholds theta_v / theta_0, v = 0..V-1 (decreasing, first 1; a trailing 0
        for theta_V may be included). Default ``0.7 ** v``.
    test_fraction : float
        Probability that a nonzero goes to the test split.
    nnz_per_block : int
        Target expected train nonzeros per block (regular grid).
    client : distributed.Client, optional
        Run the block tasks on this cluster (every worker must see ``out``'s directory); None
        runs them in this process.
    overwrite : bool

    Returns
    -------
    StoreInfo
        ``value_kind = "synthetic"``, attribute ``synth`` holds ``SynthParams`` plus the
        generator name and ``expected_nnz``; ``true_factors`` regenerates W and H from it.
    """
    params, n_r, n_c = _params(
        n_users, n_items, nnz, n_components, n_classes, seed, shape, rate_w, rate_h, thresholds,
        test_fraction, nnz_per_block,
    )  # fmt: skip
    rb, cb = regular_bounds(n_users, n_r), regular_bounds(n_items, n_c)
    runner = Runner(client, "synth")
    with temporary_store(out, overwrite) as (path, tmp):
        staging_dir(tmp)
        jobs = [
            _BlockJob(r, c, (int(rb[r]), int(rb[r + 1])), (int(cb[c]), int(cb[c + 1])))
            for r in range(n_r)
            for c in range(n_c)
        ]
        results = runner.map(_sample_block, jobs, runner.share(params), tmp)
        blocks = {s: [[res[s][0]] for res in results] for s in ("train", "test")}
        hists = {s: np.sum([res[s][1] for res in results], axis=0) for s in ("train", "test")}
        attrs = _attrs(params, hists, (n_r, n_c), nnz_per_block)
        ids = (np.arange(n_users, dtype=np.int64), np.arange(n_items, dtype=np.int64))
        assemble_store(tmp, runner, attrs, rb, cb, blocks, *ids)
        return finish_store(tmp, path, overwrite)


def _params(
    n_users: int, n_items: int, nnz: int, k: int, n_classes: int, seed: int, shape: float,
    rate_w: float, rate_h: float, thresholds: Sequence[float] | None, test_fraction: float,
    nnz_per_block: int,
) -> tuple[SynthParams, int, int]:  # fmt: skip
    for name, val in (("n_users", n_users), ("n_items", n_items), ("n_components", k)):
        if isinstance(val, bool) or int(val) != val or val < 1:
            raise InputError(f"{name} must be a positive integer, got {val!r}")
    if not 1 <= n_classes <= MAX_CLASSES:
        raise InputError(f"n_classes must be in 1..{MAX_CLASSES}, got {n_classes}")
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    if min(shape, rate_w, rate_h) <= 0:
        raise InputError("shape, rate_w and rate_h must be > 0")
    check_test_fraction(test_fraction)
    rel = _relative_thresholds(n_classes, thresholds)
    theta0 = calibrate_theta0(nnz, n_users, n_items, k, shape, rate_w, rate_h)
    params = SynthParams(
        int(n_users), int(n_items), int(k), int(n_classes), float(shape), float(rate_w),
        float(rate_h), tuple(float(theta0 * t) for t in rel), int(seed), float(test_fraction),
        int(nnz),
    )  # fmt: skip
    n_r, n_c = auto_grid(int((1.0 - test_fraction) * nnz), n_users, n_items, nnz_per_block)
    return params, n_r, n_c


def _relative_thresholds(n_classes: int, thresholds: Sequence[float] | None) -> np.ndarray:
    if thresholds is None:
        return np.asarray(default_thresholds(n_classes))
    t = np.asarray(thresholds, dtype=np.float64).ravel()
    if len(t) == n_classes + 1 and t[-1] == 0:
        t = t[:-1]
    if len(t) != n_classes or not np.all(np.isfinite(t)) or t[0] <= 0:
        raise InputError(f"thresholds: need V = {n_classes} finite values > 0, got {list(t)}")
    if np.any(np.diff(t) >= 0) or t[-1] <= 0:
        raise InputError(f"thresholds must be strictly decreasing and > 0, got {list(t)}")
    return np.append(t / t[0], 0.0)


def _attrs(
    params: SynthParams, hists: dict[str, np.ndarray], grid: tuple[int, int], nnz_per_block: int
) -> dict[str, Any]:
    hist = {s: [0, *(int(x) for x in h[1:])] for s, h in hists.items()}
    expected = params.n_users * params.n_items * expected_density(
        params.theta[0], params.shape, params.rate_w, params.rate_h, params.n_components
    )
    return {
        "complete": False,
        "n_users": params.n_users,
        "n_items": params.n_items,
        "n_classes": params.n_classes,
        "value_kind": "synthetic",
        "thresholds": None,
        "binarize": None,
        "binarize_on": None,
        "min_count": 0,
        "filter_mode": None,
        "duplicates": None,
        "split": "random",
        "test_fraction": params.test_fraction,
        "seed": params.seed,
        "nnz_train": sum(hist["train"]),
        "nnz_test": sum(hist["test"]),
        "hist_train": hist["train"],
        "hist_test": hist["test"],
        "grid": list(grid),
        "nnz_per_block": int(nnz_per_block),
        "source": [],
        "test_source": None,
        "id_kind": {"users": "int", "items": "int"},
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "synth": {**asdict(params), "theta": list(params.theta), "generator": GENERATOR,
                  "factor_rows": FACTOR_ROWS, "expected_nnz": expected},
    }  # fmt: skip
