"""The SQUAREM optimizer (model/extrapolation.py, engine/cavi.py): the extrapolation against
its formula, and fits that reach plain CAVI's optimum in fewer passes, never lower the ELBO,
and are bitwise the same on any number of workers, in-process, and after a resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal
from distributed import Client, LocalCluster

from ordnmf_dask import PF, BePoF, DcPF, OrdNMF
from ordnmf_dask.engine.control import mean_gain
from ordnmf_dask.model import extrapolation
from ordnmf_dask.modelstore.model import open_model

K = 3


# --------------------------------------------------------------------------------------------
# the numerics
# --------------------------------------------------------------------------------------------


def test_the_extrapolation_follows_the_s3_formula_per_component():
    """Each column (component) k gets the S3 step of its own norms: a column that bends
    slowly a long step, one that bends fast a short one."""
    rng = np.random.default_rng(0)
    u0, r = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    v = rng.normal(size=(4, 3)) * np.array([0.05, 0.3, 1.0])  # bending per column
    u1 = u0 + r
    u2 = u1 + r + v
    norms = extrapolation.squared_norms(u0, u1, u2)
    np.testing.assert_allclose(norms, [np.sum(r**2, axis=0), np.sum(v**2, axis=0)], rtol=1e-12)
    steps = np.sqrt(norms[0] / norms[1])
    assert steps[0] > 4 * steps[2]
    for limit in (float(np.median(steps)), 2 * float(steps.max())):
        a = extrapolation.step_length(norms, limit)
        np.testing.assert_array_equal(a, np.clip(steps, 1.0, limit))
        np.testing.assert_allclose(
            extrapolation.extrapolate(u0, u1, u2, a), u0 + 2 * a * r + a * a * v, atol=1e-12
        )
    np.testing.assert_allclose(extrapolation.extrapolate(u0, u1, u2, 1.0), u2, atol=1e-12)
    # v_k = 0: no step for that component; a step is never below 1
    assert list(extrapolation.step_length(np.array([[1.0, 1e-6], [0.0, 1.0]]), 8.0)) == [1, 1]


def test_the_largest_step_grows_when_taken_and_shrinks_when_refused():
    grow, shrink = extrapolation.next_step_max, extrapolation.next_step_max
    f = extrapolation.STEP_FACTOR
    assert grow(4.0, np.array([2.0, 4.0]), True) == 4.0 * f  # a component at the limit
    assert shrink(4.0 * f, np.array([4.0 * f, 1.0]), False) == 4.0
    assert shrink(1.0, np.array([1.0]), False) == 1.0
    assert grow(8.0, np.array([3.0, 1.0]), True) == 8.0  # every step inside the limit
    assert shrink(8.0, np.array([3.0, 7.9]), False) == 8.0


def test_the_stopping_rule_averages_the_gain_over_the_window():
    elbo = [-100.0, -50.0, -49.0, -48.99, -48.0]
    assert mean_gain(elbo[:1], 3) == math.inf
    assert mean_gain(elbo, 1) == pytest.approx(0.99 / 48.99)
    assert mean_gain(elbo, 3) == pytest.approx(2.0 / (3 * 50.0))
    assert mean_gain(elbo[:3], 3) == pytest.approx(51.0 / (2 * 100.0))  # fewer at the start
    # a small step between two large ones does not stop a fit with the window
    assert mean_gain(elbo[:4], 1) < 1e-3 < mean_gain(elbo[:4], 3)


# --------------------------------------------------------------------------------------------
# fits
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ordinal_store(tmp_path_factory):
    y = synthetic_ordinal(60, 45, 4, seed=3)
    train, test = dense_split(y)
    return store_from_dense(tmp_path_factory.mktemp("sq") / "s.zarr", train, test, 4, (2, 3))


@pytest.fixture(scope="module")
def count_store(tmp_path_factory):
    rng = np.random.default_rng(4)
    lam = rng.gamma(0.5, 1.0, (50, K)) @ rng.gamma(0.5, 1.0, (K, 40))
    y = np.minimum(rng.poisson(2 * lam), 20)
    train, test = dense_split(y)
    top = int(max(train.max(), test.max()))
    return store_from_dense(tmp_path_factory.mktemp("sq") / "c.zarr", train, test, top, (2, 2))


FAMILIES = [(OrdNMF, {}), (BePoF, {"threshold": 3}), (PF, {"threshold": 3}), (DcPF, {})]


def _passes_to(elbo: list[float], passes: list[int], target: float) -> int:
    """Passes made when the ELBO first came within 1e-4 (relative) of ``target``."""
    return next(p for e, p in zip(elbo, passes, strict=True) if e >= target - 1e-4 * abs(target))


@pytest.mark.parametrize(("klass", "extra"), FAMILIES, ids=lambda x: getattr(x, "__name__", ""))
def test_squarem_reaches_the_cavi_optimum_in_fewer_passes(klass, extra, ordinal_store, count_store):
    """From the same start inside an optimum's basin (the state after 30 CAVI iterations: from
    a random draw an extrapolation may also jump to another local optimum, higher or lower),
    both optimizers reach the same optimum, SQUAREM in fewer passes."""
    store = count_store if klass is DcPF else ordinal_store
    est = {"tol": 1e-9, "max_iter": 3000, "executor": "inprocess", **extra}
    start = klass(K, max_iter=30, executor="inprocess", **extra, n_members=1).fit(store)
    init = (start.W_.compute(), start.H_.compute())
    runs = {}
    for optimizer in ("cavi", "squarem"):
        seen: list[tuple[float, int]] = []
        model = klass(K, optimizer=optimizer, **est, n_members=1).fit(
            store, init=init, callback=lambda info, seen=seen: seen.append((info.elbo, info.passes))
        )
        elbo = np.asarray(model.elbo_)
        if klass is not PF:  # PF reports the approx bound, which may decrease (CaviState)
            assert np.all(np.diff(elbo) >= -1e-10 * np.abs(elbo[1:]))
        assert [e for e, _ in seen] == model.elbo_
        assert seen[-1][1] == model.passes_
        runs[optimizer] = (model, [e for e, _ in seen], [p for _, p in seen])
    cavi, squarem = runs["cavi"][0], runs["squarem"][0]
    target = cavi.elbo_[-1]
    assert squarem.elbo_[-1] == pytest.approx(target, rel=1e-5)
    assert _passes_to(*runs["squarem"][1:], target) < _passes_to(*runs["cavi"][1:], target)
    if klass is PF:  # stops where its reported bound first decreases, not at the optimum
        return
    # the same fit up to the scale of W H^T, along which the ELBO is nearly flat for OrdNMF
    # (the thresholds follow it): that flat direction is where plain CAVI crawls
    mine, theirs = (m.W_.compute() @ m.H_.compute().T for m in (squarem, cavi))
    scale = 1e-3 / mine.size  # 0.1% of the mean entry
    np.testing.assert_allclose(mine / mine.sum(), theirs / theirs.sum(), rtol=1e-3, atol=scale)


def test_squarem_is_bitwise_the_same_on_one_and_two_workers_and_in_process(ordinal_store, client):
    # from 40 plain iterations (in-process, milliseconds) the fit reaches SQUAREM's linear phase
    # within a few iterations and extrapolates by the 12th (from a random draw: the ~30th)
    start = OrdNMF(K, max_iter=40, optimizer="cavi", executor="inprocess", n_members=1).fit(
        ordinal_store
    )
    init = (start.W_.compute(), start.H_.compute())

    def fit(c, **kw):
        return OrdNMF(K, max_iter=12, optimizer="squarem", **kw, n_members=1).fit(
            ordinal_store, c, init=init
        )

    two, in_process = fit(client), fit(None, executor="inprocess")
    assert open_model(two.model_path_).attrs["extrapolations"]["kept"] > 0
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address="127.0.0.1:0") as lc,
        Client(lc) as one_client,
    ):
        one = fit(one_client)
    for other in (one, in_process):
        assert other.elbo_ == two.elbo_ and other.passes_ == two.passes_
        np.testing.assert_array_equal(other.W_.compute(), two.W_.compute())
        np.testing.assert_array_equal(other.H_.compute(), two.H_.compute())


def test_a_squarem_fit_resumes_exactly(ordinal_store, tmp_path):
    def est(max_iter, **kw):
        return OrdNMF(
            K,
            max_iter=max_iter,
            tol=1e-12,
            optimizer="squarem",
            executor="inprocess",
            **kw,
            n_members=1,
        )

    whole = est(40, checkpoint_every=7).fit(ordinal_store)
    ckpt = str(tmp_path / "ckpt")
    est(23, checkpoint_every=7, checkpoint_dir=ckpt).fit(ordinal_store)
    resumed = est(40, checkpoint_every=7, checkpoint_dir=ckpt).fit(ordinal_store, resume=True)
    assert open_model(whole.model_path_).attrs["extrapolations"]["kept"] > 0
    assert resumed.elbo_ == whole.elbo_ and resumed.passes_ == whole.passes_
    np.testing.assert_array_equal(resumed.W_.compute(), whole.W_.compute())
