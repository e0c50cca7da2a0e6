"""Posterior predictive sampling and the figures."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal
from scipy.stats import nbinom

from ordnmf_dask import OrdNMF
from ordnmf_dask.model import simulate
from ordnmf_dask.postfit.ppc import posterior_predictive


def test_sample_ordinal_follows_the_model_cdf():
    theta = np.array([2.0, 1.2, 0.5, 0.0])  # V = 3
    lam = np.full(200_000, 0.7)
    y = simulate.sample_ordinal(lam, theta, np.random.default_rng(0))
    cdf = np.exp(-0.7 * theta)  # P(y <= v)
    expected = np.diff(np.concatenate([[0.0], cdf]))
    freq = np.bincount(y, minlength=4) / y.size
    se = np.sqrt(expected * (1 - expected) / y.size)
    assert np.all(np.abs(freq - expected) < 5 * se)


@pytest.mark.parametrize("p", [0.0, 0.4, 1.0])
def test_sample_dcpf_limits_and_law(p):
    lam = np.full(100_000, 1.3)
    y = simulate.sample_dcpf(lam, p, 1.0, np.random.default_rng(1), None)
    if p == 0.0:
        assert abs(y.mean() - 1.3) < 5 * np.sqrt(1.3 / y.size)
    elif p == 1.0:
        assert set(np.unique(y)) <= {0, 1}
        assert abs(y.mean() - (1 - np.exp(-1.3))) < 0.01
    else:
        dist = nbinom(1.3 / -np.log1p(-p), 1 - p)
        assert abs(y.mean() - dist.mean()) < 5 * np.sqrt(dist.var() / y.size)
    classes = simulate.sample_dcpf(lam, 0.4, 1.0, np.random.default_rng(1), np.array([0, 1, 3]))
    assert classes.max() <= 3


def test_sample_pairs_is_exact_on_small_blocks():
    rows, cols, w = simulate.sample_pairs(3, 4, 100, np.random.default_rng(0))
    assert w == 1.0 and sorted(zip(rows, cols, strict=True)) == [
        (r, c) for r in range(3) for c in range(4)
    ]
    rows, cols, w = simulate.sample_pairs(300, 400, 1000, np.random.default_rng(0))
    assert len(rows) == 1000 and w == 120.0


def test_ppc_histogram_covers_all_pairs_and_tracks_the_data(tmp_path, client):
    y = synthetic_ordinal(40, 30, 3, density=0.4, seed=5)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (2, 2))
    # fitted in-process (milliseconds; the model does not depend on the executor,
    # tests/test_inprocess.py): the sampling on the cluster is what is tested here
    model = OrdNMF(3, max_iter=200, executor="inprocess", n_members=1).fit(store)
    exact = posterior_predictive(store, model, client, n_pairs=10**6)
    assert sum(exact["model"]) == pytest.approx(40 * 30)
    assert sum(exact["train"]) == 40 * 30
    ratio = np.array(exact["model"][1:]) / np.array(exact["train"][1:])
    assert np.all((ratio > 0.6) & (ratio < 1.6)), ratio
    sampled = posterior_predictive(store, model, client, n_pairs=200, seed=3)
    assert sum(sampled["model"]) == pytest.approx(40 * 30)


def test_figures_are_written(tmp_path):
    from ordnmf_dask.app import plots

    files = [
        plots.plot_elbo({"a": [-3.0, -2.0, -1.5]}, tmp_path / "elbo.png"),
        plots.plot_ppc([10, 5, 3], {"m": [9, 6, 2]}, tmp_path / "ppc.png"),
        plots.plot_thresholds([2.0, 1.0, 0.0], tmp_path / "t.png"),
    ]
    for f in files:
        assert open(f, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
