"""Block kernels against the dense oracle (tests/oracle.py), without Dask."""

from __future__ import annotations

import numpy as np
import oracle
import pytest
from conftest import synthetic_ordinal
from scipy.special import digamma, gammaln

from ordnmf_dask.model import kernels, metrics, thresholds
from ordnmf_dask.model.gamma import digamma_lgamma
from ordnmf_dask.model.updates import FactorChunk, update_chunk


def _block(y: np.ndarray) -> kernels.CsrBlock:
    rows, cols = np.nonzero(y)
    return kernels.CsrBlock.from_coo(rows, cols, y[rows, cols].astype(np.uint8), y.shape)


@pytest.mark.parametrize("approx", [False, True])
@pytest.mark.parametrize("n_classes", [1, 4])
def test_local_step_matches_oracle(approx, n_classes):
    y = synthetic_ordinal(13, 11, n_classes, seed=n_classes)
    rng = np.random.default_rng(0)
    gw, gh = rng.gamma(1, 1, (13, 3)), rng.gamma(1, 1, (11, 3))
    ew, eh = rng.gamma(1, 1, (13, 3)), rng.gamma(1, 1, (11, 3))
    delta = oracle.init_delta(y, n_classes)
    got = kernels.local_step(_block(y), gw, gh, ew, eh, delta, approx)
    want = oracle.local_step(y, gw, gh, delta, approx)
    np.testing.assert_allclose(got.sw, want["SW"], rtol=1e-12)
    np.testing.assert_allclose(got.sh, want["SH"], rtol=1e-12)
    en_by_class, lam_by_class, elbo, bound = kernels.split_ordinal_small(got.small)
    assert elbo == pytest.approx(want["elbo_local"], rel=1e-12)
    assert bound == pytest.approx(want["bound_local"], rel=1e-12)
    lam = ew @ eh.T
    for v in range(1, n_classes + 1):
        assert en_by_class[v] == pytest.approx(want["En"][y == v].sum(), rel=1e-12)
        assert lam_by_class[v] == pytest.approx(lam[y == v].sum(), rel=1e-12)


def test_rate_corrections_match_dense_rates():
    n_classes = 5
    y = synthetic_ordinal(12, 9, n_classes, seed=2)
    rng = np.random.default_rng(1)
    ew, eh = rng.gamma(1, 1, (12, 3)), rng.gamma(1, 1, (9, 3))
    delta = oracle.init_delta(y, n_classes)
    theta = oracle.thresholds(delta)
    gap = thresholds.gap_from_delta(delta)
    np.testing.assert_allclose(gap, oracle.G_of(theta), atol=1e-15)
    beta_w, beta_h = rng.random((12, 1)), rng.random((9, 1))
    block = _block(y)
    got_w = beta_w + (theta[0] * eh.sum(0) - kernels.row_correction(block, gap, eh))
    got_h = beta_h + (theta[0] * ew.sum(0) - kernels.col_correction(block, gap, ew))
    np.testing.assert_allclose(got_w, oracle.rate_W(y, eh, beta_w[:, 0], theta), rtol=1e-12)
    np.testing.assert_allclose(got_h, oracle.rate_H(y, ew, beta_h[:, 0], theta), rtol=1e-12)


def test_thresholds_and_delta_update_match_oracle():
    n_classes = 6
    y = synthetic_ordinal(15, 14, n_classes, seed=4)
    hist = np.bincount(y[y > 0], minlength=n_classes + 1)
    delta = thresholds.init_delta(hist)
    np.testing.assert_allclose(delta, oracle.init_delta(y, n_classes), rtol=1e-15)
    np.testing.assert_allclose(
        thresholds.theta_from_delta(delta), oracle.thresholds(delta), rtol=1e-14
    )
    rng = np.random.default_rng(5)
    ew, eh = rng.gamma(1, 1, (15, 2)), rng.gamma(1, 1, (14, 2))
    en = np.where(y > 0, 1 + rng.random(y.shape), 0.0)
    lam = ew @ eh.T
    en_c = np.bincount(y.ravel(), en.ravel(), n_classes + 1)
    lam_c = np.bincount(y.ravel(), np.where(y > 0, lam, 0).ravel(), n_classes + 1)
    total = float(ew.sum(0) @ eh.sum(0))
    got = thresholds.update_delta(en_c, lam_c, total)
    np.testing.assert_allclose(got, oracle.update_delta(y, en, lam, n_classes), rtol=1e-12)


@pytest.mark.parametrize("with_correction", [False, True])
def test_gamma_update_matches_oracle(with_correction):
    """The fused update (empirical-Bayes rate, shape, rate, moments, ELBO term) vs numpy/scipy."""
    rng = np.random.default_rng(6)
    alpha, n, k = 0.3, 7, 5
    old = FactorChunk.initial(rng.gamma(1.0, 1.0, (n, k)))
    sw, colsum = rng.gamma(0.5, 4.0, (n, k)), 50.0 + rng.random(k)
    corr = rng.random((n, k)) if with_correction else None
    got = update_chunk(old, alpha, sw, colsum, corr)
    beta = alpha / old.mean.mean(axis=1, keepdims=True)
    a, b = alpha + sw, beta + colsum - (0.0 if corr is None else corr)
    np.testing.assert_allclose(got.prior_rate, beta, rtol=1e-15)
    np.testing.assert_allclose(got.shape, a, rtol=1e-15)
    np.testing.assert_allclose(got.mean, a / b, rtol=1e-15)
    np.testing.assert_allclose(got.rate, b, rtol=1e-14)
    np.testing.assert_allclose(got.log_mean, digamma(a) - np.log(b), rtol=1e-13, atol=1e-14)
    assert got.elbo == pytest.approx(oracle.gamma_elbo_terms(alpha, beta, a, b), rel=1e-13)


def test_gamma_update_over_a_dense_grid_of_shapes():
    """Every digamma shift count (shapes from 2e-3, digamma ~ -500, to 1e8, densely below
    ASYMPTOTIC): the mean, E[log x] and the ELBO term of the vectorized update against scipy."""
    shapes = np.concatenate([np.geomspace(2e-3, 1e8, 2000), np.linspace(2e-3, 12.0, 2000)])
    alpha = 1e-7
    rng = np.random.default_rng(7)
    n, k = 400, 10
    sw = rng.permutation(shapes).reshape(n, k) - alpha
    old = FactorChunk.initial(rng.gamma(1.0, 1.0, (n, k)))
    colsum = rng.uniform(0.5, 2.0, k)
    got = update_chunk(old, alpha, sw, colsum, None)
    beta = alpha / old.mean.mean(axis=1, keepdims=True)
    a, b = alpha + sw, beta + colsum
    np.testing.assert_allclose(got.mean, a / b, rtol=1e-15)
    np.testing.assert_allclose(got.log_mean, digamma(a) - np.log(b), rtol=5e-15, atol=5e-15)
    # the terms of shape 1e8 are ~1e9 and cancel: within an ulp of the terms' magnitudes
    scale = np.sum(np.abs((1.0 - a) * digamma(a)) + np.abs(gammaln(a)) + a)
    assert abs(got.elbo - oracle.gamma_elbo_terms(alpha, beta, a, b)) < 1e-16 * scale


def test_digamma_and_lgamma_match_scipy():
    x = np.concatenate([np.geomspace(1e-4, 1e8, 5000), np.linspace(0.2, 30.0, 5000)])
    got = np.array([digamma_lgamma(v) for v in x])
    np.testing.assert_allclose(got[:, 0], digamma(x), rtol=5e-15, atol=5e-15)
    np.testing.assert_allclose(got[:, 1], gammaln(x), rtol=5e-15, atol=1e-14)  # near its zeros


def test_digamma_lgamma_outside_their_domain_are_nan():
    """x <= 0 or NaN (e.g. a shape from corrupt statistics) gives NaN, which stops the fit as a
    non-finite ELBO, instead of looping for ever (-inf) or for ~1e300 steps (-1e300)."""
    for x in (0.0, -1.0, -1e300, -np.inf, np.nan):
        assert np.isnan(digamma_lgamma(x)).all()


@pytest.mark.parametrize("k", [1, 3, 100])
def test_topk_ndcg_and_loglik_match_oracle(k):
    n_classes = 4
    y = synthetic_ordinal(20, 17, n_classes, seed=7)
    rng = np.random.default_rng(8)
    test = (rng.random(y.shape) < 0.3) & (y > 0)
    train_y, test_y = np.where(test, 0, y), np.where(test, y, 0)
    ew, eh = rng.gamma(1, 1, (20, 3)), rng.gamma(1, 1, (17, 3))
    # two item-blocks merged, as the engine does
    left = metrics.topk_block(ew, eh[:9], _block(train_y[:, :9]), 0, k)
    right = metrics.topk_block(ew, eh[9:], _block(train_y[:, 9:]), 9, k)
    _, items = metrics.merge_topk(left, right, k)
    rows, cols = np.nonzero(test_y)
    levels = [1, 2, 4]
    sums, counts = metrics.ndcg_sums(items, rows, cols, test_y[rows, cols], levels, k)
    for j, s in enumerate(levels):
        assert sums[j] / counts[j] == pytest.approx(
            oracle.ndcg_at_k(ew, eh, train_y, test_y, s, k=k), rel=1e-12
        )
    delta = oracle.init_delta(train_y, n_classes)
    got = metrics.test_loglik(rows, cols, test_y[rows, cols], ew, eh, delta)
    assert got == pytest.approx(oracle.test_loglik(ew, eh, delta, test_y), rel=1e-12)


def test_gamma_update_with_nonpositive_rates_gives_a_nan_elbo():
    """The logs of the rates are taken of their running product per row: two negative rates in
    a row (corrupt corrections) must still make the ELBO term NaN, as log(b) of each would."""
    alpha, n, k = 0.3, 2, 4
    old = FactorChunk.initial(np.ones((n, k)))
    corr = np.zeros((n, k))
    corr[0, :2] = 1e3  # the rates of two entries of row 0 are negative
    got = update_chunk(old, alpha, np.ones((n, k)), np.ones(k), corr)
    assert np.isnan(got.elbo)
    assert np.isfinite(update_chunk(old, alpha, np.ones((n, k)), np.ones(k), None).elbo)
