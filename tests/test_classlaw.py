"""The class law (ordnmf_dask/model/classlaw.py) against dense numpy oracles written here from
docs/design.md §1 and "Class probabilities": P(y <= v | lambda) = exp(-lambda theta_v)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from ordnmf_dask.model import classlaw


def _theta(rng: np.random.Generator, v: int) -> np.ndarray:
    delta = rng.gamma(2.0, 0.5, size=v)
    return np.append(np.cumsum(delta[::-1])[::-1], 0.0)  # theta_0 > ... > theta_V = 0


def _gamma(mean: np.ndarray, var: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Hazards of a rate of mean ``mean`` and variance ``var``: one component, h known (= 1)."""
    n = len(mean)
    return classlaw.gamma_hazards(
        np.arange(n),
        np.zeros(n, np.int64),
        mean[:, None],
        var[:, None],
        np.ones((1, 1)),
        np.zeros((1, 1)),
        theta,
    )


def _oracle(lam: np.ndarray, theta: np.ndarray, given: bool) -> np.ndarray:
    """P(y = v) by differences of the cumulative law, one pair at a time."""
    out = np.zeros((len(lam), len(theta)))
    for j, x in enumerate(lam):
        cdf = [np.exp(-x * t) for t in theta]
        for v in range(len(theta)):
            out[j, v] = cdf[v] - (cdf[v - 1] if v else 0.0)
        if given:
            out[j] = [0.0, *(out[j, 1:] / (1.0 - cdf[0]))]
    return out


@pytest.mark.parametrize("given", [False, True])
def test_plugin_law_matches_dense_oracle(given: bool) -> None:
    rng = np.random.default_rng(0)
    theta = _theta(rng, 10)
    lam = rng.gamma(0.7, 1.0, size=200) + 1e-3
    p = classlaw.class_law(
        classlaw.plugin_hazards(lam, theta), classlaw.ordinal_limit(theta), given
    )
    np.testing.assert_allclose(p, _oracle(lam, theta, given), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    assert p.min() >= 0


def test_law_is_monotone_in_the_rate() -> None:
    """P(y = 0) falls and every P(y >= s | y > 0) rises with lambda, for both posteriors."""
    rng = np.random.default_rng(1)
    theta = _theta(rng, 6)
    lam = np.geomspace(1e-6, 50.0, 400)
    limit = classlaw.ordinal_limit(theta)
    for h in (classlaw.plugin_hazards(lam, theta), _gamma(lam, 0.3 * lam**2, theta)):
        p = classlaw.class_law(h, limit)
        assert np.all(np.diff(p[:, 0]) < 0)
        for s in range(1, len(theta)):
            up = classlaw.at_least(h, s, limit)
            given = classlaw.class_law(h, limit, True)
            np.testing.assert_allclose(up, given[:, s:].sum(axis=1), rtol=1e-10)
            assert np.all(np.diff(up) >= -1e-12)


def test_zero_rate_has_the_limit_law_given_an_interaction() -> None:
    rng = np.random.default_rng(2)
    theta = _theta(rng, 5)
    limit = classlaw.ordinal_limit(theta)
    h = classlaw.plugin_hazards(np.array([0.0, 1e-9]), theta)
    p = classlaw.class_law(h, limit, True)
    np.testing.assert_allclose(p[0], p[1], rtol=1e-6)
    np.testing.assert_allclose(p[0, 1:], -np.diff(theta) / theta[0])
    assert classlaw.at_least(h, 3, limit)[0] == pytest.approx(theta[2] / theta[0])


def test_gamma_mixture_is_the_integral_over_its_gamma() -> None:
    """E[exp(-lambda theta_v)] for lambda ~ Gamma(mean^2/var, mean/var), by quadrature."""
    rng = np.random.default_rng(3)
    theta = _theta(rng, 4)
    mean, var = np.array([0.2, 1.5, 4.0]), np.array([0.5, 0.4, 40.0])
    h = _gamma(mean, var, theta)
    for j in range(3):
        a, b = mean[j] ** 2 / var[j], mean[j] / var[j]
        for v, t in enumerate(theta):
            value, _ = integrate.quad(
                lambda x, t=t, a=a, b=b: np.exp(-x * t) * stats.gamma.pdf(x, a, scale=1 / b),
                0,
                np.inf,
            )
            assert np.exp(-h[j, v]) == pytest.approx(value, rel=1e-7)
    tiny = _gamma(mean, 1e-14 * mean, theta)
    np.testing.assert_allclose(tiny, classlaw.plugin_hazards(mean, theta), rtol=1e-9)
    zero = _gamma(mean, 0 * mean, theta)
    np.testing.assert_array_equal(zero, classlaw.plugin_hazards(mean, theta))


def test_gamma_hazards_use_the_posterior_moments_of_the_rate() -> None:
    """Var[sum_k w_k h_k] = sum_k (E[w^2] E[h^2] - E[w]^2 E[h]^2) for independent Gammas, and
    H_v = (E^2 / Var) log(1 + theta_v Var / E)."""
    rng = np.random.default_rng(4)
    n, k = 7, 5
    theta = _theta(rng, 3)
    aw, ah = rng.gamma(1.0, 2.0, (n, k)) + 0.1, rng.gamma(1.0, 2.0, (n + 2, k)) + 0.1
    mw, mh = rng.gamma(1.0, 1.0, (n, k)), rng.gamma(1.0, 1.0, (n + 2, k))
    users, items = rng.integers(0, n, 11), rng.integers(0, n + 2, 11)
    h = classlaw.gamma_hazards(users, items, mw, mw**2 / aw, mh, mh**2 / ah, theta)
    sw, sh = mw**2 * (aw + 1) / aw, mh**2 * (ah + 1) / ah  # E[w^2] = a (a + 1) / b^2
    for j, (u, i) in enumerate(zip(users, items, strict=True)):
        mean = sum(mw[u] * mh[i])
        var = sum(sw[u] * sh[i] - (mw[u] * mh[i]) ** 2)
        want = [mean**2 / var * np.log(1 + t * var / mean) for t in theta]
        np.testing.assert_allclose(h[j], want, rtol=1e-10)


def test_gamma_law_is_closer_to_monte_carlo_than_the_plugin() -> None:
    """Against the law E_q[exp(-theta sum_k w_k h_k)] estimated with w integrated exactly and
    h sampled, on posterior shapes 5..50 (rows with a few dozen observations; with shapes under
    1 the Gamma law is a rougher approximation: docs/design.md, "Class probabilities")."""
    rng = np.random.default_rng(5)
    n, k, s = 40, 4, 20000
    theta = _theta(rng, 5)
    aw, ah = rng.uniform(5.0, 50.0, (n, k)), rng.uniform(5.0, 50.0, (n, k))
    mw, mh = rng.gamma(1.0, 0.7, (n, k)), rng.gamma(1.0, 0.7, (n, k))
    bw = aw / mw
    hs = rng.gamma(ah[None], (mh / ah)[None], size=(s, n, k))  # samples of h
    cdf = np.exp(-(aw[None, None] * np.log1p(theta[:, None, None, None] * hs / bw)).sum(-1))
    mc = cdf.mean(axis=1).T  # (n, V + 1)
    limit = classlaw.ordinal_limit(theta)
    law_mc = classlaw.class_law(-np.log(mc), limit)
    pairs = np.arange(n)
    gamma = classlaw.class_law(
        classlaw.gamma_hazards(pairs, pairs, mw, mw**2 / aw, mh, mh**2 / ah, theta), limit
    )
    plug = classlaw.class_law(classlaw.plugin_hazards((mw * mh).sum(axis=1), theta), limit)
    err_gamma, err_plug = np.abs(gamma - law_mc).max(), np.abs(plug - law_mc).max()
    assert err_gamma < err_plug / 3


def test_ratings_of_a_law() -> None:
    law = np.array(
        [[0.0, 0.2, 0.3, 0.3, 0.2], [0.0, 0.5, 0.0, 0.0, 0.5], [0.0, 0.1, 0.1, 0.1, 0.7]]
    )
    assert classlaw.class_rating(law, "expected").tolist() == pytest.approx([2.5, 2.5, 3.4])
    assert classlaw.class_rating(law, "mode").tolist() == [2, 1, 4]
    assert classlaw.class_rating(law, "median").tolist() == [2, 1, 4]
    assert classlaw.class_values("ratings-halfstar", 10)[7] == 3.5
    assert classlaw.class_values("ratings-integer", 5)[4] == 4.0
    with pytest.raises(ValueError):
        classlaw.class_values("counts", 10)
    edges = np.array([0, 1, 2, 5, 10.5])
    assert classlaw.count_range(np.array([1, 3, 5]), edges).tolist() == [
        [1, 1],
        [3, 5],
        [11, np.inf],
    ]


@pytest.mark.parametrize("p", [0.0, 0.4])
def test_count_classes_against_summed_pmf(p: float) -> None:
    """dcPF's class law: the count pmf summed over each class's range of counts."""
    edges = np.array([0.0, 1, 2, 5, 10, 20])
    lam, t = np.array([0.05, 0.9, 3.0, 12.0]), 1.3
    rate = t * lam
    dist = (
        stats.poisson(rate[:, None])
        if p == 0
        else stats.nbinom(rate[:, None] / -np.log1p(-p), 1 - p)
    )
    counts = np.arange(0, 4000)
    pmf = dist.pmf(counts[None, :])
    cls = np.searchsorted(edges, counts, side="left")
    oracle = np.stack([pmf[:, cls == v].sum(axis=1) for v in range(len(edges) + 1)], axis=1)
    h = classlaw.count_hazards(lam, p, t, edges)
    limit = classlaw.count_limit(p, edges)
    np.testing.assert_allclose(classlaw.class_law(h, limit), oracle, rtol=1e-9, atol=1e-15)
    tiny = classlaw.class_law(classlaw.count_hazards(np.array([1e-9]), p, t, edges), limit, True)
    np.testing.assert_allclose(tiny[0], limit, atol=1e-6)
