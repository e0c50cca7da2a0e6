"""The other model families on the engine (dcPF, BePoF, PF) against dense oracles.

Real zarr stores. dcPF is checked against ``tests/oracle_dcpf.py`` (which is itself checked
against an independent Poisson-factorization CAVI at its limits p = 0 and p = 1), BePoF and PF
against ``tests/oracle.py`` on the binarized matrix. The engine-vs-oracle fits run in-process
(``executor="inprocess"``: the same tasks, bitwise the cluster's, which ``tests/test_inprocess.py``
checks for dcPF and OrdNMF); persistence and evaluation run on real worker processes (the session
LocalCluster of ``conftest``), fitting all four families there.
"""

from __future__ import annotations

import numpy as np
import oracle
import oracle_dcpf
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal
from scipy import stats
from scipy.special import digamma, gammaln

from ordnmf_dask import OrdNMF, evaluate
from ordnmf_dask.errors import InputError
from ordnmf_dask.estimator import PF, BePoF, DcPF
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.store.blocks import write_store
from ordnmf_dask.store.grid import balanced_bounds, block_sort

K = 3
TOL = 1e-4  # stopping tolerance of the engine-vs-oracle comparisons (keeps the file fast)
MAX_ITER = 25  # the learned-p dcPF fits converge (tol) before it, p = 0 / 1 do not
BIN_MAX_ITER = 12


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------


def dcpf_counts(n_users, n_items, p, scale=1.0, seed=0, cap=255):
    """Counts drawn from dcPF-Log itself: n ~ Poisson(lambda), y = sum of n Log(p) elements
    (p = 0: y = n, Poisson counts).  Capped at ``cap`` (classes are uint8 in a store)."""
    rng = np.random.default_rng(seed)
    lam = rng.gamma(0.5, scale, (n_users, K)) @ rng.gamma(0.5, 1.0, (K, n_items))
    n = rng.poisson(lam)
    y = n.copy()
    if p > 0:
        for u, i in zip(*np.nonzero(n), strict=True):
            y[u, i] = stats.logser.rvs(p, size=n[u, i], random_state=rng).sum()
    return np.minimum(y, cap).astype(np.int64)


def warm_start(n_users, n_items, seed=0):
    rng = np.random.default_rng(seed)
    return rng.gamma(1.0, 1.0, (n_users, K)), rng.gamma(1.0, 1.0, (n_items, K))


def count_store(path, train, test, grid):
    """``store_from_dense`` with V = the largest count: classes ARE the counts (value_kind
    "ratings-integer", raw = class), which is what DcPF reads on a non-count store."""
    return store_from_dense(path, train, test, int(max(train.max(), test.max())), grid)


@pytest.fixture(scope="module")
def overdispersed():
    """Heavy-tailed counts (dcPF with p = 0.85): the learned p should rise from 0.5."""
    y = dcpf_counts(24, 18, 0.85, scale=1.0, seed=2)
    train, test = dense_split(y, seed=3)
    return train, test, *warm_start(24, 18)


# --------------------------------------------------------------------------------------------
# an independent Poisson factorization (explicit multinomial allocations) for the limits
# --------------------------------------------------------------------------------------------


def pf_fit(Y, W0, H0, t=1.0, alpha=0.3, tol=1e-5, max_iter=1000):
    """Plain PF CAVI on counts Y with E[n] = y, written with the (U, I, K) allocation tensor
    phi_uik = GW_uk GH_ik / sum_k GW_uk GH_ik and E[c_uik] = y_ui phi_uik.  Same schedule as
    dcPF (empirical Bayes, W, H with the new E[W], local step, ELBO)."""
    Y = np.asarray(Y, dtype=np.float64)
    EW, EH = np.array(W0, dtype=float), np.array(H0, dtype=float)

    def allocate(GW, GH):
        num = GW[:, None, :] * GH[None, :, :]
        phi = num / num.sum(axis=2, keepdims=True)
        Ec = Y[:, :, None] * phi
        logs = np.log(t) + np.log(GW)[:, None, :] + np.log(GH)[None, :, :] - np.log(phi)
        return Ec.sum(axis=1), Ec.sum(axis=0), float((Ec * logs).sum() - gammaln(Y + 1).sum())

    SW, SH, _ = allocate(EW, EH)
    elbo = []
    for n in range(max_iter):
        bw, bh = alpha / EW.mean(axis=1), alpha / EH.mean(axis=1)
        aW, rW = alpha + SW, bw[:, None] + t * EH.sum(axis=0)
        EW, GW = aW / rW, np.exp(digamma(aW) - np.log(rW))
        aH, rH = alpha + SH, bh[:, None] + t * EW.sum(axis=0)
        EH, GH = aH / rH, np.exp(digamma(aH) - np.log(rH))
        SW, SH, local = allocate(GW, GH)
        elbo.append(
            local
            - t * (EW @ EH.T).sum()
            + oracle.gamma_elbo_terms(alpha, bw[:, None], aW, rW)
            + oracle.gamma_elbo_terms(alpha, bh[:, None], aH, rH)
        )
        if n > 0 and (elbo[n] - elbo[n - 1]) / abs(elbo[n - 1]) < tol:
            break
    return {"elbo": elbo, "EW": EW, "EH": EH, "n_iter": len(elbo)}


# --------------------------------------------------------------------------------------------
# the dcPF oracle on its own (no cluster)
# --------------------------------------------------------------------------------------------


def test_oracle_limits_are_poisson_factorization():
    """p = 0 is PF on the raw counts (E[n] = y), p = 1 is PF on the binarized data (E[n] = 1)."""
    y = dcpf_counts(14, 11, 0.6, seed=5)
    w0, h0 = warm_start(14, 11, seed=5)
    binary = (y > 0).astype(np.int64)
    for p, data in [(0.0, y), (1.0, binary)]:
        ref = pf_fit(data, w0, h0, tol=1e-7)
        got = oracle_dcpf.fit(y, w0, h0, p=p, update_p_=False, tol=1e-7)
        assert got["n_iter"] == ref["n_iter"]
        np.testing.assert_allclose(got["elbo"], ref["elbo"], rtol=1e-11)
        np.testing.assert_allclose(got["EW"], ref["EW"], rtol=1e-10)
        np.testing.assert_allclose(got["EH"], ref["EH"], rtol=1e-10)
        np.testing.assert_array_equal(got["En"], data.astype(float))
    # p -> 0 is continuous (r -> inf, E[n] -> y, local bound -> sum y log s - log y!)
    zero = oracle_dcpf.fit(y, w0, h0, p=0.0, update_p_=False, max_iter=15, min_iter=15)
    tiny = oracle_dcpf.fit(y, w0, h0, p=1e-8, update_p_=False, max_iter=15, min_iter=15)
    # (lgamma(y + r) - lgamma(r) with r ~ 1e8 s loses ~1e-8 relative per entry to round-off)
    np.testing.assert_allclose(tiny["elbo"], zero["elbo"], rtol=2e-5)
    np.testing.assert_allclose(tiny["EW"], zero["EW"], rtol=2e-5)
    assert np.abs(np.asarray(tiny["elbo"]) - zero["elbo"]).max() < 1e-3 * np.ptp(zero["elbo"])


def test_oracle_p_update_is_newton_on_the_stationarity_condition():
    s_en, s_y = 130.0, 200.0
    p = oracle_dcpf.update_p(0.5, s_en, s_y)
    assert 0.5 < p < 1  # E[n] / y well below 1: heavy-tailed elements
    assert (1 - p) / p * -np.log1p(-p) == pytest.approx(s_en / s_y, rel=1e-12)
    grid = np.linspace(0.01, 0.99, 981)
    assert oracle_dcpf.p_objective(p, s_en, s_y) >= oracle_dcpf.p_objective(grid, s_en, s_y).max()
    # ratio 1 (every nonzero explained by exactly one element, E[n] = y): the objective rises
    # all the way to p -> 0, so the update goes to the Poisson limit p = 0 (where E[n] = y again)
    assert oracle_dcpf.update_p(0.5, 50.0, 50.0) == 0.0
    assert oracle_dcpf.p_objective(1e-9, 50.0, 50.0) > oracle_dcpf.p_objective(0.5, 50.0, 50.0)


def test_learned_p_direction_in_the_oracle():
    """Expected directions, from the stationarity condition (1 - p)/p (-log(1 - p)) = s_en / s_y,
    whose left side falls from 1 (p -> 0) to 0 (p -> 1), and E[n_ui] <= y_ui:

    * overdispersed, heavy-tailed counts: few elements explain large counts, s_en / s_y is well
      below 1, p rises toward 1 (the NB variance / mean is 1 / (1 - p));
    * equidispersed (Poisson) counts and binary-like counts (mostly 1s): E[n] ~ y, s_en / s_y
      near 1, p falls toward 0 -- the PF-on-counts limit, NOT the p = 1 limit: that limit
      (E[n] = 1 whatever y) discards the count values, it does not describe data made of 1s.
    """
    w0, h0 = warm_start(24, 18)
    heavy = dcpf_counts(24, 18, 0.85, seed=2)
    poisson = dcpf_counts(24, 18, 0.0, scale=3.0, seed=1)
    mostly_ones = np.minimum(dcpf_counts(24, 18, 0.0, scale=0.3, seed=1), 2)
    assert 1 < mostly_ones.sum() - (mostly_ones > 0).sum() < 0.2 * (mostly_ones > 0).sum()

    fits = {
        name: oracle_dcpf.fit(y, w0, h0, p=0.5)
        for name, y in [("heavy", heavy), ("poisson", poisson), ("mostly_ones", mostly_ones)]
    }
    assert fits["heavy"]["p"] > 0.8
    # (on the Poisson counts p first rises a little while the factors are still poor)
    assert fits["poisson"]["p"] < 0.1
    assert fits["mostly_ones"]["p"] < 1e-3
    assert max(fits["mostly_ones"]["p_trace"]) < 0.5


# --------------------------------------------------------------------------------------------
# dcPF engine vs oracle
# --------------------------------------------------------------------------------------------


def _assert_same_dcpf_fit(model, ref, max_iter, p_rtol=1e-12):
    assert model.n_iter_ == ref["n_iter"]
    np.testing.assert_allclose(model.elbo_, ref["elbo"], rtol=1e-9)
    np.testing.assert_allclose(model.W_.compute(), ref["EW"], rtol=1e-6)
    np.testing.assert_allclose(model.H_.compute(), ref["EH"], rtol=1e-6)
    np.testing.assert_allclose(model.log_W_.compute(), ref["ElogW"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(model.log_H_.compute(), ref["ElogH"], rtol=1e-6, atol=1e-9)
    # p is the same up to round-off: s_en, s_y are summed in a different order on the workers
    assert model.p_ == pytest.approx(ref["p"], rel=p_rtol, abs=0)
    elbo = ref["elbo"]
    stopped_by_tol = len(elbo) > 1 and (elbo[-1] - elbo[-2]) / abs(elbo[-2]) < TOL
    assert model.converged_ == stopped_by_tol
    assert stopped_by_tol or ref["n_iter"] == max_iter


@pytest.mark.parametrize("grid", [(1, 1), (2, 3)])
@pytest.mark.parametrize("p, update_p", [(0.5, True), (0.0, False), (1.0, False)])
def test_dcpf_matches_oracle(tmp_path, overdispersed, grid, p, update_p):
    train, test, w0, h0 = overdispersed
    store = count_store(tmp_path / "c.zarr", train, test, grid)
    ref = oracle_dcpf.fit(train, w0, h0, p=p, update_p_=update_p, tol=TOL, max_iter=MAX_ITER)
    model = DcPF(
        K,
        p=p,
        update_p=update_p,
        tol=TOL,
        max_iter=MAX_ITER,
        checkpoint_every=7,
        optimizer="cavi",
        executor="inprocess",
        n_members=1,
    )
    model.fit(store, init=(w0, h0))
    _assert_same_dcpf_fit(model, ref, MAX_ITER)
    if update_p:
        assert model.converged_  # the stopping rule is exercised too
        assert model.p_ > 0.7  # heavy-tailed counts: p rises from 0.5 toward 1
    else:
        assert model.p_ == p


def test_dcpf_limits_on_the_engine(tmp_path):
    """Binary-like counts: the learned p falls toward 0 (see the oracle test for why), and on
    exactly-binary data p = 1 (E[n] = 1) and p = 0 (E[n] = y = 1) are the same fit.

    Only 10 iterations on the binary-like data: once p < ~1e-7, r = s / -log(1 - p) > ~1e7 and
    E[n] = r (digamma(y + r) - digamma(r)) cancels catastrophically, s_en / s_y = 1 - O(p) is
    then known only to round-off and the p trajectory depends on the summation order (engine
    and oracle part ways after ~13 iterations here; see the report).
    """
    y = np.minimum(dcpf_counts(24, 18, 0.0, scale=0.3, seed=1), 2)
    train, test = dense_split(y, seed=4)
    w0, h0 = warm_start(24, 18, seed=1)
    store = count_store(tmp_path / "m.zarr", train, test, (2, 2))
    ref = oracle_dcpf.fit(train, w0, h0, p=0.5, tol=TOL, max_iter=10)
    model = DcPF(K, p=0.5, tol=TOL, max_iter=10, executor="inprocess", n_members=1).fit(
        store, init=(w0, h0)
    )
    # p* ~ 2 (1 - s_en / s_y): its relative round-off grows like 1 / p (here p ~ 1e-5)
    _assert_same_dcpf_fit(model, ref, 10, p_rtol=1e-5)
    assert model.p_ < 1e-4
    assert np.all(np.diff(ref["p_trace"]) < 0)

    tr, te = (train > 0).astype(np.int64), (test > 0).astype(np.int64)
    binary = store_from_dense(tmp_path / "b.zarr", tr, te, 1, (2, 2))
    one = DcPF(K, p=1.0, max_iter=12, executor="inprocess", n_members=1).fit(binary, init=(w0, h0))
    zero = DcPF(K, p=0.0, max_iter=12, executor="inprocess", n_members=1).fit(binary, init=(w0, h0))
    np.testing.assert_allclose(one.elbo_, zero.elbo_, rtol=1e-12)
    np.testing.assert_allclose(one.W_.compute(), zero.W_.compute(), rtol=1e-12)
    ref = pf_fit(tr, w0, h0, max_iter=12, tol=-np.inf)
    np.testing.assert_allclose(one.elbo_, ref["elbo"], rtol=1e-9)
    np.testing.assert_allclose(one.H_.compute(), ref["EH"], rtol=1e-6)


def _write_count_store(path, train_raw, test_raw, thresholds, grid):
    """A store with value_kind "counts": raw = the counts, classes quantized at ``thresholds``
    (class = number of thresholds strictly below the count, as the ingest does)."""
    edges = np.asarray(thresholds, dtype=float)
    u, i = np.nonzero(train_raw)
    rb = balanced_bounds(np.bincount(u, minlength=train_raw.shape[0]), grid[0])
    cb = balanced_bounds(np.bincount(i, minlength=train_raw.shape[1]), grid[1])

    def blocked(m):
        uu, ii = np.nonzero(m)
        raw = m[uu, ii].astype(float)
        return block_sort(uu, ii, np.searchsorted(edges, raw, side="left"), raw, rb, cb)

    def hist(m):
        return np.bincount(
            np.searchsorted(edges, m[m > 0], side="left"), minlength=len(edges) + 1
        ).tolist()

    attrs = {
        "n_users": train_raw.shape[0],
        "n_items": train_raw.shape[1],
        "n_classes": len(edges),
        "value_kind": "counts",
        "thresholds": edges.tolist(),
        "binarize": None,
        "nnz_train": int((train_raw > 0).sum()),
        "nnz_test": int((test_raw > 0).sum()),
        "hist_train": hist(train_raw),
        "hist_test": hist(test_raw),
        "grid": list(grid),
        "split": "file",
        "seed": None,
    }
    return write_store(
        path,
        attrs,
        rb,
        cb,
        blocked(train_raw),
        blocked(test_raw),
        np.arange(train_raw.shape[0]),
        np.arange(train_raw.shape[1]),
    )


def _nb_logpmf_given_positive(y, lam, p, t):
    r = t * lam / -np.log(1.0 - p)
    return stats.nbinom.logpmf(y, r, 1.0 - p) - np.log1p(-np.exp(-t * lam))


def test_dcpf_on_a_count_store_uses_the_raw_counts(tmp_path):
    """value_kind "counts": DcPF fits the raw counts (here up to ~1000, beyond uint8), and the
    test log-likelihood is that of the count range of each test class."""
    y = dcpf_counts(20, 16, 0.99, seed=7, cap=10**6)
    assert y.max() > 255
    train, test = dense_split(y, seed=8)
    w0, h0 = warm_start(20, 16, seed=7)
    edges = [0, 1, 2, 5, 10, 50]
    store = _write_count_store(tmp_path / "raw.zarr", train, test, edges, (2, 2))
    ref = oracle_dcpf.fit(train, w0, h0, p=0.5, tol=TOL, max_iter=MAX_ITER)
    model = DcPF(K, tol=TOL, max_iter=MAX_ITER, optimizer="cavi", executor="inprocess", n_members=1)
    model.fit(store, init=(w0, h0))
    _assert_same_dcpf_fit(model, ref, MAX_ITER)

    result = evaluate(store, model)  # a small model: evaluated in-process
    lam = (ref["EW"] @ ref["EH"].T)[test > 0]
    counts = test[test > 0]
    cls = np.searchsorted(edges, counts, side="left")
    bounds = np.append(edges, np.inf)
    r = lam / -np.log(1.0 - model.p_)
    dist = stats.nbinom(r, 1.0 - model.p_)
    mass = dist.cdf(bounds[cls]) - dist.cdf(bounds[cls - 1])
    expected = np.sum(np.log(mass) - np.log1p(-np.exp(-lam)))
    assert np.isfinite(result["test_loglik"])
    assert result["test_loglik"] == pytest.approx(expected, rel=1e-7)


# --------------------------------------------------------------------------------------------
# BePoF and PF at a threshold vs the ordinal oracle on the binarized matrix
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ordinal_problem():
    n_classes = 4
    y = synthetic_ordinal(30, 25, n_classes, seed=0)
    train, test = dense_split(y)
    return n_classes, train, test, *warm_start(30, 25)


@pytest.mark.parametrize("threshold", [1, 3])
@pytest.mark.parametrize("klass", [BePoF, PF])
def test_binarized_models_match_oracle(tmp_path, ordinal_problem, klass, threshold):
    n_classes, train, test, w0, h0 = ordinal_problem
    store = store_from_dense(tmp_path / "o.zarr", train, test, n_classes, (2, 2))
    binary = (train >= threshold).astype(np.int64)
    approx = klass is PF
    ref = oracle.fit(binary, 1, w0, h0, tol=TOL, max_iter=BIN_MAX_ITER, approx=approx)
    model = klass(
        K, threshold=threshold, tol=TOL, max_iter=BIN_MAX_ITER, executor="inprocess", n_members=1
    )
    model.fit(store, init=(w0, h0))
    assert model.approx is approx
    assert model.n_iter_ == ref["n_iter"]
    np.testing.assert_allclose(model.elbo_, ref["elbo"], rtol=1e-9)
    np.testing.assert_allclose(model.W_.compute(), ref["EW"], rtol=1e-6)
    np.testing.assert_allclose(model.H_.compute(), ref["EH"], rtol=1e-6)
    np.testing.assert_allclose(model.delta_, ref["delta"], rtol=1e-6)
    assert len(model.delta_) == 2


def test_bepof_with_theta0_fixed_at_one_matches_oracle(tmp_path, ordinal_problem):
    n_classes, train, test, w0, h0 = ordinal_problem
    store = store_from_dense(tmp_path / "o.zarr", train, test, n_classes, (2, 2))
    binary = (train >= 2).astype(np.int64)
    ref = oracle.fit(binary, 1, w0, h0, tol=TOL, max_iter=BIN_MAX_ITER, fixed_delta=[0.0, 1.0])
    model = BePoF(
        K,
        threshold=2,
        learn_threshold=False,
        tol=TOL,
        max_iter=BIN_MAX_ITER,
        executor="inprocess",
        n_members=1,
    )
    model.fit(store, init=(w0, h0))
    assert model.delta_.tolist() == [0.0, 1.0] and model.theta_.tolist() == [1.0, 0.0]
    assert model.n_iter_ == ref["n_iter"]
    np.testing.assert_allclose(model.elbo_, ref["elbo"], rtol=1e-9)
    np.testing.assert_allclose(model.W_.compute(), ref["EW"], rtol=1e-6)


# --------------------------------------------------------------------------------------------
# persistence and evaluation
# --------------------------------------------------------------------------------------------


def test_dcpf_save_load_and_evaluate(tmp_path, client, overdispersed, ordinal_problem):
    """On the session's worker processes: save / load, evaluation of each family, and the
    binarized families' fits bitwise their in-process fits (which the oracle tests check)."""
    train, test, w0, h0 = overdispersed
    store = count_store(tmp_path / "c.zarr", train, test, (2, 2))
    model = DcPF(K, max_iter=4, p=0.5, n_members=1).fit(
        store, client, init=(w0, h0), out=tmp_path / "m"
    )
    model.save(tmp_path / "copy")
    loaded = DcPF.load(tmp_path / "copy")
    assert type(loaded) is DcPF
    assert loaded.get_params() == model.get_params()
    assert loaded.p_ == model.p_ and loaded.elbo_ == model.elbo_
    np.testing.assert_array_equal(loaded.H_.compute(), model.H_.compute())
    for other in (OrdNMF, BePoF, PF):
        with pytest.raises(InputError, match="'DcPF' model, not a " + other.__name__):
            other.load(tmp_path / "copy")

    result = evaluate(store, loaded, client)
    W, H = loaded.W_.compute(), loaded.H_.compute()
    mask = test > 0
    expected = _nb_logpmf_given_positive(test[mask], (W @ H.T)[mask], loaded.p_, 1.0).sum()
    assert np.isfinite(result["test_loglik"])
    assert result["test_loglik"] == pytest.approx(expected, rel=1e-9)
    assert result["nnz_test"] == int(mask.sum())

    n_classes, otrain, otest, ow0, oh0 = ordinal_problem
    ostore = store_from_dense(tmp_path / "o.zarr", otrain, otest, n_classes, (2, 2))
    ord_model = OrdNMF(K, max_iter=4, n_members=1).fit(ostore, client, init=(ow0, oh0))
    with pytest.raises(InputError, match="'OrdNMF' model, not a DcPF"):
        DcPF.load(ord_model.model_path_)
    ord_result = evaluate(ostore, ord_model, client)
    expected = oracle.test_loglik(
        ord_model.W_.compute(), ord_model.H_.compute(), ord_model.delta_, otest
    )
    assert ord_result["test_loglik"] == pytest.approx(expected, rel=1e-9)

    bepof = BePoF(K, threshold=2, max_iter=4, n_members=1).fit(ostore, client, init=(ow0, oh0))
    bepof_result = evaluate(ostore, bepof, client)
    assert bepof_result["test_loglik"] is None
    assert bepof_result["test_loglik_mean"] is None
    assert set(bepof_result["ndcg"]) == {1, 2, 3, 4}

    pf = PF(K, threshold=2, max_iter=4, n_members=1).fit(ostore, client, init=(ow0, oh0))
    for on_cluster in (bepof, pf):
        alone = type(on_cluster)(K, threshold=2, max_iter=4, executor="inprocess", n_members=1)
        alone.fit(ostore, init=(ow0, oh0))
        # every iteration's bound, a function of that iteration's factors, compared exactly
        assert alone.elbo_ == on_cluster.elbo_
        np.testing.assert_array_equal(alone.delta_, on_cluster.delta_)


def test_dcpf_count_loglik_at_p0_is_poisson_and_p_update_terminates():
    from scipy.stats import poisson

    from ordnmf_dask.model import dcpf

    y, lam = np.array([1.0, 2.0, 7.0]), np.array([0.5, 1.0, 3.0])
    want = poisson(2.0 * lam).logpmf(y) - np.log(-np.expm1(-2.0 * lam))
    np.testing.assert_allclose(dcpf.count_loglik(y, lam, 0.0, 2.0), want, rtol=1e-12)
    p = dcpf.update_p(0.5, 0.9999999999999998, 1.0)  # gradient cancels near p = 0
    assert 0.0 < p < 1.0
    assert dcpf.update_p(0.5, 50.0, 50.0) == oracle_dcpf.update_p(0.5, 50.0, 50.0) == 0.0
    assert dcpf.update_p(0.3, 50.0 + 1e-12, 50.0) == 0.0  # E[n] above y by round-off


@pytest.mark.parametrize("scale", [1e-3, 0.7, 9.99, 10.0, 40.0, 1e4, 1e9, 1e13, 1e17])
def test_dcpf_rising_terms_are_the_finite_sums_at_any_r(scale):
    """lgamma(r + y) - lgamma(r) = sum_{j<y} log(r + j) and digamma(r + y) - digamma(r) =
    sum_{j<y} 1 / (r + j) for integer y, to round-off, also where r ~ 1 / p is huge."""
    from ordnmf_dask.model import dcpf

    rng = np.random.default_rng(int(np.log10(scale) * 10) + 40)
    y = rng.integers(1, 40, 500).astype(np.float64)
    r = scale * rng.uniform(0.5, 1.5, 500)
    d_lgamma, d_digamma = dcpf.rising_log_terms(y, r)
    j = np.arange(40.0)
    terms = j[None, :] < y[:, None]
    want_lgamma = np.where(terms, np.log(r[:, None] + j), 0.0).sum(axis=1)
    want_digamma = np.where(terms, 1.0 / (r[:, None] + j), 0.0).sum(axis=1)
    np.testing.assert_allclose(d_lgamma, want_lgamma, rtol=1e-13)
    np.testing.assert_allclose(d_digamma, want_digamma, rtol=1e-13)


@pytest.mark.parametrize("p", [1e-6, 1e-12])
def test_dcpf_local_step_near_the_poisson_limit_matches_the_oracle(p):
    """At small p (r = t Lambda / -log(1 - p) ~ 1e6 .. 1e12) E[n] and the bound still match the
    oracle's finite sums to round-off, and E[n] <= y."""
    from ordnmf_dask.model import dcpf

    y = dcpf_counts(12, 9, 0.0, scale=3.0, seed=3)
    w0, h0 = warm_start(12, 9)
    rows, cols = np.nonzero(y)
    block = CsrBlock.from_coo(rows, cols, y[rows, cols].astype(np.float64), y.shape)
    got = dcpf.local_step(block, w0, h0, w0, h0, p, 1.0)
    ref = oracle_dcpf.local_step(y, w0, h0, p)
    s_en, s_y, bound = got.small
    assert s_en == pytest.approx(ref["s_en"], rel=1e-13)
    assert s_y == ref["s_y"]
    assert bound == pytest.approx(ref["local"], rel=1e-12)
    assert s_en <= s_y * (1 + 1e-15)
    np.testing.assert_allclose(got.sw, ref["SW"], rtol=1e-12)
