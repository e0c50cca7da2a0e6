"""Write a synthetic IG-OrdNMF dataset of any size straight into a block store.

Generative model (docs/design.md §1, with fixed prior rates)::

    w_uk ~ Gamma(a, rate b_w)      h_ik ~ Gamma(a, rate b_h)      lambda_ui = sum_k w_uk h_ik
    P(y_ui <= v | lambda) = exp(-lambda theta_v),    theta_0 > ... > theta_{V-1} > theta_V = 0

Sparse sampling, never touching all U x I pairs. With ``n_ui ~ Poisson(lambda_ui theta_0)`` we
have ``P(n_ui = 0) = exp(-lambda_ui theta_0) = P(y_ui = 0)``, so "y_ui > 0" is exactly "n_ui > 0".
By Poisson superposition ``n_ui = sum_k n_uik`` with independent
``n_uik ~ Poisson(theta_0 w_uk h_ik)``, and for a fixed (u, k) the hits over the items of a
block are ``N_uk ~ Poisson(theta_0 w_uk s_k)``, ``s_k = sum_i h_ik``, placed on items
independently with probabilities ``h_ik / s_k``. So per block, user by user (one compiled pass,
``sample_block``):

1. hits: over the components with ``E[N_uk] <= n_items`` of the block, draw the user's total
   ``N_u ~ Poisson(sum_k E[N_uk])``, give each hit a component k with probability proportional
   to ``E[N_uk]`` (the same law as independent ``N_uk``) and an item with probability
   ``h_ik / s_k`` (Walker alias tables, O(1) per hit); for very active (u, k)
   (``E[N_uk] > n_items``) draw instead, for every item,
   ``1[n_uik > 0] ~ Bernoulli(1 - exp(-theta_0 w_uk h_ik))`` -- the same law, cheaper there;
2. the nonzero pairs of the user are its distinct hit items (a per-item marker, then a sort of
   the user's few items); the work is ``sum_uk min(E[N_uk], n_items)``, about nnz when the data
   are sparse;
3. the class, given y > 0, by thinning with the exact conditional law, computing lambda only at
   the nonzero pairs: ``P(y <= v | y > 0) = (exp(-lambda theta_v) - exp(-lambda theta_0)) /
   (1 - exp(-lambda theta_0))``. Inverting with ``u ~ U(0, 1)``:
   ``t = -log1p(-(1 - u) (1 - exp(-lambda theta_0))) / lambda``, ``y = min{v >= 1 : theta_v <= t}``;
   then the split (test with probability ``test_fraction``).

Pairs are independent given the factors, so the whole matrix has the model's law. Memory per
block task is O((n_users + n_items) K) for the factor rows and tables plus 9 bytes per nonzero of
output; no array scales with the hits times K or with the whole matrix.

Target size: the expected number of nonzeros under the prior is exact and one-dimensional:
``E[nnz] = U I (1 - m^K)``, ``m = E_w[(1 + theta_0 w / b_h)^(-a)]`` (Laplace transform of the
Gamma law of h, then independence over k); ``theta_0`` is solved for so that ``E[nnz] = nnz``
(relative thresholds ``theta_v / theta_0`` are fixed).

Determinism and parallelism: the true factors are generated in fixed chunks of ``FACTOR_ROWS``
rows from ``SeedSequence(seed, spawn_key=(axis, chunk))``, so any rows can be regenerated alone
(``true_factors``). A first round of tasks writes the rows of each block row / column once to
``.npy`` files in the staging directory (so that the n_r x n_c block tasks do not each redraw
their factors: Gamma draws with shape < 1 are slow enough to dominate small grids); block
(r, c) reads its user rows ``USERS_PER_PASS`` at a time and its item rows whole, and samples
from ``SeedSequence(seed, spawn_key=(2, r, c))``. The grid is
regular, with about ``nnz_per_block`` expected train nonzeros per block; block tasks stage their
arrays and ``ordnmf_dask.store.staged`` writes the store chunk by chunk. Results do not depend on
the cluster (in-process or any number of workers). ``GENERATOR`` names the sampling scheme: the
same seed gives a different (equally distributed) sample under v1, which drew ``N_uk`` per
(u, k) with numpy and placed hits by binary search.
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

from ordnmf_dask.errors import InputError, shown
from ordnmf_dask.model import compiling
from ordnmf_dask.model.kernels import jit, row_dot
from ordnmf_dask.params import rows_doc, validate_call
from ordnmf_dask.runtime.runner import Runner
from ordnmf_dask.store import locations
from ordnmf_dask.store.blocks import FORMAT_VERSION, StoreInfo, check_target
from ordnmf_dask.store.grid import DEFAULT_NNZ_PER_BLOCK, auto_grid
from ordnmf_dask.store.header import StoreHeader
from ordnmf_dask.store.staged import (
    STAGING,
    NpyRows,
    Segment,
    assemble_store,
    finish_store,
    save_segment,
    staging_dir,
    temporary_store,
)

FACTOR_ROWS = 4096
USERS_PER_PASS = 2**14  # users of a block per compiled pass (bounds the user-side memory)
GENERATOR = "ordnmf-dask synth v2 (IG-OrdNMF, Poisson superposition + thinning, alias tables)"
_AXES = {"users": 0, "items": 1}
_SAMPLE_TAG = 2


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
        return cls(
            **{k: s[k] for k in cls.__dataclass_fields__ if k != "theta"}, theta=tuple(s["theta"])
        )


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


_jit = jit(error_model="numpy")


def sample_block(
    rng: np.random.Generator,
    w: Any,
    h: np.ndarray,
    theta: np.ndarray,
    test_fraction: float,
    capacity: int | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Sample the nonzeros of one block and split them (steps 1-3 of the module docstring).

    Compiled passes over the users of the block, ``USERS_PER_PASS`` users at a time (the result
    does not depend on it): memory O(n_i K) for the item side (factors, alias tables) plus
    O(USERS_PER_PASS K) for the user side, plus the output (9 bytes per nonzero); no hits x K or
    sort-all arrays.

    Parameters
    ----------
    rng : np.random.Generator
        The block's stream; the result depends on nothing else.
    w : array-like of float64, shape (n_u, K)
        True W rows of the block: an array, or anything with ``shape`` whose row slices are
        arrays (``NpyRows`` reads them from a file).
    h : np.ndarray of float64, shape (n_i, K)
        True H rows of the block.
    theta : np.ndarray of float64, shape (V + 1,)
    test_fraction : float
    capacity : int, optional
        Initial size of the output buffers of a pass (they grow as needed; the result does not
        depend on it). Default: a little over the expected number of hits.

    Returns
    -------
    (train, test), each ``(rows int32, cols int32, y uint8)`` of local indices, sorted by
    (rows, cols) without duplicates.
    """
    n_u, n_k = w.shape
    h = np.ascontiguousarray(h, dtype=np.float64)
    theta = np.asarray(theta, dtype=np.float64)
    h_t = np.ascontiguousarray(h.T)  # (K, n_i)
    totals = h_t.sum(axis=1) if len(h) else np.zeros(n_k)  # s_k
    prob, alias = _alias_tables(h_t, totals)
    cap = -1 if capacity is None else int(capacity)
    parts: list[tuple[np.ndarray, ...]] = []
    for u0 in range(0, n_u, USERS_PER_PASS):
        w_part = np.ascontiguousarray(w[u0 : u0 + USERS_PER_PASS], dtype=np.float64)
        out = _sample_block_kernel(
            rng, w_part, h, h_t, totals, prob, alias, theta, float(test_fraction), cap
        )
        n_train, n_test = int(out[6]), int(out[7])
        out[0][:n_train] += u0
        out[3][:n_test] += u0
        parts.append(
            (
                out[0][:n_train],
                out[1][:n_train],
                out[2][:n_train],
                out[3][:n_test],
                out[4][:n_test],
                out[5][:n_test],
            )
        )
    if len(parts) != 1:  # several passes, or no user at all
        empty = (np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.uint8)) * 2
        parts = [tuple(np.concatenate([p[j] for p in [empty, *parts]]) for j in range(6))]
    train_u, train_i, train_y, test_u, test_i, test_y = parts[0]
    return (train_u, train_i, train_y), (test_u, test_i, test_y)


@_jit
def _alias_tables(h_t: np.ndarray, totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias tables of the item laws ``h_ik / s_k``, one row per component k.

    Item i is drawn in O(1) from one uniform ``x`` in [0, n_i): ``j = floor(x)``, kept if
    ``x - j < prob[k, j]``, else ``alias[k, j]`` (the fraction has >= 53 - log2(n_i) bits).
    """
    n_k, n_i = h_t.shape
    prob = np.ones((n_k, n_i), np.float64)
    alias = np.empty((n_k, n_i), np.int32)
    scaled = np.empty(n_i, np.float64)
    small = np.empty(n_i, np.int64)
    large = np.empty(n_i, np.int64)
    for k in range(n_k):
        for i in range(n_i):
            alias[k, i] = i
        if not totals[k] > 0.0:
            continue
        ns = 0
        nl = 0
        for i in range(n_i):
            scaled[i] = h_t[k, i] * n_i / totals[k]
            if scaled[i] < 1.0:
                small[ns] = i
                ns += 1
            else:
                large[nl] = i
                nl += 1
        while ns > 0 and nl > 0:
            ns -= 1
            s = small[ns]
            g = large[nl - 1]
            prob[k, s] = scaled[s]
            alias[k, s] = g
            scaled[g] = (scaled[g] + scaled[s]) - 1.0
            if scaled[g] < 1.0:
                nl -= 1
                small[ns] = g
                ns += 1
        # leftovers (round-off) keep prob 1 and alias to themselves
    return prob, alias


@_jit
def _grow(a: np.ndarray, need: int) -> np.ndarray:
    if need <= len(a):
        return a
    b = np.empty(max(need, len(a) + len(a) // 2 + 16), dtype=a.dtype)
    b[: len(a)] = a
    return b


@_jit
def _sample_block_kernel(rng, w, h, h_t, totals, prob, alias, theta, test_fraction, capacity):
    """One pass over the users of a block; see ``sample_block``.

    For user u, the components with E[N_uk] = theta_0 w_uk s_k <= n_i contribute
    N_u = sum_k N_uk ~ Poisson(sum_k E[N_uk]) hits, each given to component k with probability
    proportional to E[N_uk] (Poisson superposition, then multinomial thinning) and placed on
    item i with probability h_ik / s_k (alias table); the other components draw
    1[n_uik > 0] ~ Bernoulli(1 - exp(-theta_0 w_uk h_ik)) item by item. Distinct items are kept
    with a per-item marker, sorted, and each pair gets lambda (a K-dot), its class by inversion
    and its split. Buffers are filled in (row, col) order.
    """
    n_u, n_k = w.shape
    n_i = h.shape[0]
    n_classes = len(theta) - 1
    theta0 = theta[0]
    tiny = 2.2250738585072014e-308
    if capacity < 0:  # expected number of hits: sum_uk min(E[N_uk], n_i)
        work = 0.0
        for u in range(n_u):
            for k in range(n_k):
                work += min(theta0 * w[u, k] * totals[k], float(n_i))
        capacity = int(work * 1.02) + 1024
    cap_test = int(capacity * test_fraction) + 1024
    cap_train = capacity - int(capacity * test_fraction) + 1024
    tr_r = np.empty(cap_train, np.int32)
    tr_c = np.empty(cap_train, np.int32)
    tr_y = np.empty(cap_train, np.uint8)
    te_r = np.empty(cap_test, np.int32)
    te_c = np.empty(cap_test, np.int32)
    te_y = np.empty(cap_test, np.uint8)
    n_tr = 0
    n_te = 0
    mark = np.full(n_i, -1, np.int64)
    items = np.empty(n_i, np.int64)
    cmean = np.empty(n_k, np.float64)  # cumulative E[N_uk] over the sparse components
    comp = np.empty(n_k, np.int64)
    for u in range(n_u):
        m = 0
        n_sparse = 0
        acc = 0.0
        for k in range(n_k):
            rate = theta0 * w[u, k]
            mean = rate * totals[k]
            if mean > n_i:  # very active (u, k): 1[n_uik > 0] ~ Bernoulli, item by item
                for i in range(n_i):
                    if rng.random() < -math.expm1(-rate * h_t[k, i]):
                        if mark[i] != u:
                            mark[i] = u
                            items[m] = i
                            m += 1
            elif mean > 0.0:
                acc += mean
                cmean[n_sparse] = acc
                comp[n_sparse] = k
                n_sparse += 1
        if n_sparse > 0:
            for _ in range(rng.poisson(acc)):
                x = rng.random() * acc
                lo = 0
                hi = n_sparse - 1
                while lo < hi:  # first sparse component with cmean > x
                    mid = (lo + hi) >> 1
                    if cmean[mid] <= x:
                        lo = mid + 1
                    else:
                        hi = mid
                k = comp[lo]
                x = rng.random() * n_i
                i = min(int(x), n_i - 1)
                if x - i >= prob[k, i]:
                    i = alias[k, i]
                if mark[i] != u:
                    mark[i] = u
                    items[m] = i
                    m += 1
        if m == 0:
            continue
        mine = items[:m]
        mine.sort()
        for j in range(m):
            i = mine[j]
            lam = max(row_dot(w, u, h, i), tiny)
            t = -math.log1p((1.0 - rng.random()) * math.expm1(-lam * theta0)) / lam
            v = 1
            while v < n_classes and theta[v] > t:  # y = min{v >= 1 : theta_v <= t}
                v += 1
            if rng.random() < test_fraction:
                if n_te == len(te_y):
                    te_r = _grow(te_r, n_te + 1)
                    te_c = _grow(te_c, n_te + 1)
                    te_y = _grow(te_y, n_te + 1)
                te_r[n_te] = u
                te_c[n_te] = i
                te_y[n_te] = v
                n_te += 1
            else:
                if n_tr == len(tr_y):
                    tr_r = _grow(tr_r, n_tr + 1)
                    tr_c = _grow(tr_c, n_tr + 1)
                    tr_y = _grow(tr_y, n_tr + 1)
                tr_r[n_tr] = u
                tr_c[n_tr] = i
                tr_y[n_tr] = v
                n_tr += 1
    return tr_r, tr_c, tr_y, te_r, te_c, te_y, n_tr, n_te


@dataclass(frozen=True)
class _BlockJob:
    r: int
    c: int
    rows: tuple[int, int]
    cols: tuple[int, int]


@dataclass(frozen=True)
class _FactorJob:
    axis: str
    part: int
    lo: int
    hi: int


def _factor_path(tmp: str, axis: str, part: int) -> str:
    return locations.join(tmp, STAGING, "factors", f"{axis}-{part:06d}.npy")


def _write_factors(job: _FactorJob, params: SynthParams, tmp: str) -> int:
    """Write true factor rows [lo, hi) of one block row / column as a .npy, chunk by chunk."""
    shape = (job.hi - job.lo, params.n_components)
    with locations.open_file(_factor_path(tmp, job.axis, job.part), "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f8", "fortran_order": False, "shape": shape}
        )
        a = job.lo
        while a < job.hi:  # one generator chunk at a time: memory O(FACTOR_ROWS K)
            b = min(job.hi, (a // FACTOR_ROWS + 1) * FACTOR_ROWS)
            f.write(true_factors(params, job.axis, a, b).tobytes())
            a = b
    return job.hi - job.lo


def _sample_block(job: _BlockJob, params: SynthParams, tmp: str) -> dict[str, Any]:
    """Sample block (r, c), stage its train/test arrays; returns segments and histograms."""
    seq = np.random.SeedSequence(params.seed, spawn_key=(_SAMPLE_TAG, job.r, job.c))
    rng = np.random.Generator(np.random.PCG64(seq))
    w = NpyRows(_factor_path(tmp, "users", job.r))
    h = NpyRows(_factor_path(tmp, "items", job.c))[:]
    theta = np.asarray(params.theta, dtype=np.float64)
    with compiling.announced_as("synth"):
        splits = sample_block(rng, w, h, theta, params.test_fraction)
    out: dict[str, Any] = {}
    for split, (rows, cols, y) in zip(("train", "test"), splits, strict=True):
        prefix = locations.join(staging_dir(tmp, split), f"{job.r:06d}-{job.c:06d}")
        arrays = {"rows": rows, "cols": cols, "y": y, "raw": y}
        seg = save_segment(prefix, arrays) if len(y) else Segment(prefix, 0)
        hist = np.bincount(y, minlength=params.n_classes + 1)
        out[split] = (seg, hist.astype(np.int64))
    return out


def regular_bounds(n: int, parts: int) -> np.ndarray:
    """``parts + 1`` int64 boundaries cutting [0, n) into near-equal ranges."""
    return np.round(np.linspace(0, n, parts + 1)).astype(np.int64)


def default_thresholds(n_classes: int, ratio: float = 0.7) -> tuple[float, ...]:
    """Relative thresholds ``theta_v / theta_0 = ratio^v`` (v < V), then 0."""
    return (*(ratio**v for v in range(n_classes)), 0.0)


@rows_doc("synth")
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
    """Sample a synthetic IG-OrdNMF dataset into a new store at ``out`` (see module docstring):
    :func:`plan_synth`, then :func:`write_synth`.

    Parameters
    ----------
    out : path
        Store directory to create (complete or absent, like ``ingest``).
    <the rows of params.COMMAND_PARAMS["synth"]>
    thresholds : sequence of float, optional
        Relative thresholds theta_v / theta_0, v = 0..V-1 (decreasing, first 1; a trailing 0
        for theta_V may be included). Default ``0.7 ** v``.
    client : distributed.Client, optional
        Run the block tasks on this cluster (every worker must see ``out``'s directory); None
        runs them in this process.

    Returns
    -------
    StoreInfo
        ``value_kind = "synthetic"``, attribute ``synth`` holds ``SynthParams`` plus the
        generator name and ``expected_nnz``; ``true_factors`` regenerates W and H from it.
    """
    plan = plan_synth(
        out,
        n_users,
        n_items,
        nnz,
        n_components,
        n_classes,
        seed=seed,
        shape=shape,
        rate_w=rate_w,
        rate_h=rate_h,
        thresholds=thresholds,
        test_fraction=test_fraction,
        nnz_per_block=nnz_per_block,
        overwrite=overwrite,
    )
    return write_synth(plan, client)


@dataclass(frozen=True)
class SynthPlan:
    """A synthetic store checked by :func:`plan_synth`: where it goes, the generator's
    parameters and the block grid."""

    out: str | os.PathLike
    overwrite: bool
    params: SynthParams
    grid: tuple[int, int]
    nnz_per_block: int


def plan_synth(
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
    overwrite: bool = False,
) -> SynthPlan:
    """Check the parameters of :func:`synth` (each by its row of
    :data:`ordnmf_dask.params.COMMAND_PARAMS` ``["synth"]``) and its target ``out`` without
    writing anything (a command runs it before it starts its cluster)."""
    v = validate_call(
        "synth",
        {
            "n_users": n_users,
            "n_items": n_items,
            "nnz": nnz,
            "n_components": n_components,
            "n_classes": n_classes,
            "seed": seed,
            "shape": shape,
            "rate_w": rate_w,
            "rate_h": rate_h,
            "test_fraction": test_fraction,
            "nnz_per_block": nnz_per_block,
            "overwrite": overwrite,
        },
    )
    n_users, n_items, k, n_classes = v["n_users"], v["n_items"], v["n_components"], v["n_classes"]
    rel = _relative_thresholds(n_classes, thresholds)
    theta0 = calibrate_theta0(nnz, n_users, n_items, k, v["shape"], v["rate_w"], v["rate_h"])
    params = SynthParams(
        n_users,
        n_items,
        k,
        n_classes,
        v["shape"],
        v["rate_w"],
        v["rate_h"],
        tuple(float(theta0 * t) for t in rel),
        v["seed"],
        v["test_fraction"],
        int(nnz),
    )
    n_r, n_c = auto_grid(
        int((1.0 - v["test_fraction"]) * nnz), n_users, n_items, v["nnz_per_block"]
    )
    check_target(out, overwrite)
    return SynthPlan(out, overwrite, params, (n_r, n_c), v["nnz_per_block"])


def write_synth(plan: SynthPlan, client: Any = None) -> StoreInfo:
    """Sample a planned store on ``client``'s workers (None: in this process), complete or not
    at all."""
    params, (n_r, n_c), overwrite = plan.params, plan.grid, plan.overwrite
    n_users, n_items = params.n_users, params.n_items
    rb, cb = regular_bounds(n_users, n_r), regular_bounds(n_items, n_c)
    runner = Runner(client, "synth")
    with temporary_store(plan.out, overwrite, runner) as (path, tmp):
        staging_dir(tmp, "factors")
        shared = runner.share(params)
        runner.map(
            _write_factors,
            [
                *(_FactorJob("users", r, int(rb[r]), int(rb[r + 1])) for r in range(n_r)),
                *(_FactorJob("items", c, int(cb[c]), int(cb[c + 1])) for c in range(n_c)),
            ],
            shared,
            tmp,
        )
        jobs = [
            _BlockJob(r, c, (int(rb[r]), int(rb[r + 1])), (int(cb[c]), int(cb[c + 1])))
            for r in range(n_r)
            for c in range(n_c)
        ]
        results = runner.map(_sample_block, jobs, shared, tmp)
        blocks = {s: [[res[s][0]] for res in results] for s in ("train", "test")}
        hists = {s: np.sum([res[s][1] for res in results], axis=0) for s in ("train", "test")}
        attrs = _attrs(params, hists, (n_r, n_c), plan.nnz_per_block)
        ids = (np.arange(n_users, dtype=np.int64), np.arange(n_items, dtype=np.int64))
        assemble_store(tmp, runner, attrs, rb, cb, blocks, *ids)
        return finish_store(tmp, path, overwrite)


def _relative_thresholds(n_classes: int, thresholds: Sequence[float] | None) -> np.ndarray:
    if thresholds is None:
        return np.asarray(default_thresholds(n_classes))
    t = np.asarray(thresholds, dtype=np.float64).ravel()
    if len(t) == n_classes + 1 and t[-1] == 0:
        t = t[:-1]
    if len(t) != n_classes or not np.all(np.isfinite(t)) or t[0] <= 0:
        raise InputError(
            f"thresholds: need V = {n_classes} finite values > 0, got {shown(list(t))}"
        )
    if np.any(np.diff(t) >= 0) or t[-1] <= 0:
        raise InputError(f"thresholds must be strictly decreasing and > 0, got {shown(list(t))}")
    return np.append(t / t[0], 0.0)


def _attrs(
    params: SynthParams, hists: dict[str, np.ndarray], grid: tuple[int, int], nnz_per_block: int
) -> dict[str, Any]:
    hist = {s: [0, *(int(x) for x in h[1:])] for s, h in hists.items()}
    expected = (
        params.n_users
        * params.n_items
        * expected_density(
            params.theta[0], params.shape, params.rate_w, params.rate_h, params.n_components
        )
    )
    header = StoreHeader(
        format_version=FORMAT_VERSION,
        complete=False,
        n_users=params.n_users,
        n_items=params.n_items,
        n_classes=params.n_classes,
        value_kind="synthetic",
        nnz_train=sum(hist["train"]),
        nnz_test=sum(hist["test"]),
        hist_train=tuple(hist["train"]),
        hist_test=tuple(hist["test"]),
        grid=grid,
        nnz_per_block=int(nnz_per_block),
        record={
            "binarize": None,
            "binarize_on": None,
            "min_count": 0,
            "filter_mode": None,
            "duplicates": None,
            "split": "random",
            "test_fraction": params.test_fraction,
            "seed": params.seed,
            "source": [],
            "test_source": None,
            "id_kind": {"users": "int", "items": "int"},
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "synth": {
                **asdict(params),
                "theta": list(params.theta),
                "generator": GENERATOR,
                "factor_rows": FACTOR_ROWS,
                "expected_nnz": expected,
            },
        },
    )
    return header.to_attrs()
