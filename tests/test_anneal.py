"""The annealing schedule of the prior shapes (model/anneal.py, engine/cavi.py): the schedule's
numbers, fits whose bound never decreases once it has ended, that are bitwise the same on a
cluster and in-process and after a resume from inside the schedule, that leave the paper's path
as it was, and that end at a higher bound than it on a store drawn from the model."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import OrdNMF, ingest_arrays
from ordnmf_dask.datasets.synth import synth
from ordnmf_dask.model import anneal
from ordnmf_dask.modelstore.model import open_model
from ordnmf_dask.store.blocks import open_store

K = 3
N = 12  # iterations of the schedule in the fits below


def test_the_schedule_falls_geometrically_to_exactly_one():
    scales = [anneal.scale(m, N) for m in range(1, N + 3)]
    assert scales[0] == anneal.START
    assert all(a > b for a, b in zip(scales[:N], scales[1 : N + 1], strict=True))
    assert scales[N] == scales[N + 1] == 1.0  # iteration N + 1 on: the model's own shapes
    np.testing.assert_allclose(np.diff(np.log(scales[: N + 1])), -np.log(anneal.START) / N)
    assert anneal.scale(1, 0) == 1.0 and anneal.exact_from(0) == 1  # no schedule
    assert anneal.exact_from(N) == N + 1


@pytest.fixture(scope="module")
def ordinal_store(tmp_path_factory):
    y = synthetic_ordinal(60, 45, 4, seed=3)
    train, test = dense_split(y)
    return store_from_dense(tmp_path_factory.mktemp("an") / "s.zarr", train, test, 4, (2, 3))


@pytest.mark.parametrize("optimizer", ["cavi", "squarem"])
def test_the_bound_never_decreases_once_the_schedule_has_ended(ordinal_store, optimizer):
    model = OrdNMF(
        K,
        anneal=N,
        optimizer=optimizer,
        tol=1e-12,
        max_iter=150,
        executor="inprocess",
        n_members=1,
    ).fit(ordinal_store)
    elbo = np.asarray(model.elbo_)
    assert model.n_iter_ > N + 100  # well past the schedule
    after = elbo[anneal.exact_from(N) - 1 :]  # the bounds of iterations N + 1, N + 2, ...
    assert np.all(np.diff(after) >= -1e-10 * np.abs(after[1:]))


def test_the_stopping_rule_waits_for_the_end_of_the_schedule(ordinal_store):
    """A tol no iteration of the schedule could miss stops the fit just after it."""
    model = OrdNMF(K, anneal=N, optimizer="cavi", tol=1e3, executor="inprocess", n_members=1)
    model.fit(ordinal_store)
    assert model.n_iter_ == anneal.exact_from(N) + 1


def test_an_annealed_fit_is_the_same_on_a_cluster_and_in_process(ordinal_store, client):
    """The schedule and 4 iterations after it (40 added nothing the other tests check: SQUAREM
    on a cluster is tests/test_squarem.py's)."""

    def fit(c, **kw):
        return OrdNMF(K, anneal=N, max_iter=N + 4, tol=1e-9, **kw, n_members=1).fit(
            ordinal_store, c
        )

    two, here = fit(client), fit(None, executor="inprocess")
    assert two.elbo_ == here.elbo_ and two.passes_ == here.passes_
    np.testing.assert_array_equal(two.W_.compute(), here.W_.compute())
    np.testing.assert_array_equal(two.H_.compute(), here.H_.compute())


@pytest.mark.parametrize("optimizer", ["cavi", "squarem"])
def test_a_fit_resumed_inside_the_schedule_continues_exactly(ordinal_store, tmp_path, optimizer):
    def est(max_iter, **kw):
        return OrdNMF(
            K,
            anneal=N,
            optimizer=optimizer,
            max_iter=max_iter,
            tol=1e-12,
            checkpoint_every=4,
            executor="inprocess",
            **kw,
            n_members=1,
        )

    whole = est(40).fit(ordinal_store)
    ckpt = str(tmp_path / "ckpt")
    est(9, checkpoint_dir=ckpt).fit(ordinal_store)  # its last checkpoint: iteration 8 < N
    resumed = est(40, checkpoint_dir=ckpt).fit(ordinal_store, resume=True)
    assert resumed.elbo_ == whole.elbo_ and resumed.passes_ == whole.passes_
    np.testing.assert_array_equal(resumed.W_.compute(), whole.W_.compute())


def test_validation_scores_only_states_after_the_schedule(tmp_path):
    """A state of the schedule is one of other shapes: it is never scored, so early stopping
    cannot keep it."""
    rng = np.random.default_rng(0)
    u, i = rng.integers(0, 120, 5000), rng.integers(0, 80, 5000)
    keys = np.unique(u * 1000 + i)
    u, i = np.divmod(keys, 1000)
    v = 1 + rng.integers(0, 5, len(u))
    store = ingest_arrays(
        u, i, v, tmp_path / "v.zarr", ratings="integer", scale_max=5, validation_fraction=0.2
    )
    est = OrdNMF(
        K,
        anneal=N,
        tol=1e-12,
        max_iter=N + 8,
        validation_every=2,
        executor="inprocess",
        n_members=1,
    ).fit(store)
    history = open_model(est.model_path_).attrs["validation"]["history"]
    assert [h["iteration"] for h in history] == list(range(N + 2, N + 9, 2))


def test_anneal_zero_is_the_paper_path_and_a_schedule_changes_it(ordinal_store):
    def fit(**kw):
        return OrdNMF(
            K, optimizer="cavi", max_iter=25, executor="inprocess", **kw, n_members=1
        ).fit(ordinal_store)

    paper, zero, annealed = fit(), fit(anneal=0), fit(anneal=N)
    assert zero.elbo_ == paper.elbo_
    np.testing.assert_array_equal(zero.W_.compute(), paper.W_.compute())
    assert annealed.elbo_[-1] != paper.elbo_[-1]


def test_annealing_finds_a_higher_optimum_on_a_store_drawn_from_the_model(tmp_path):
    """With more components than the store was drawn with (K = 20, K_true = 4), the annealed
    fit ends at a bound above the paper's random start's, in fewer iterations. Measured on the
    stores of seeds 0, 1, 2 (600 x 400, 12,000 nonzeros): +1.5%, +2.2% and +1.9%, in 136 / 162
    / 92 iterations against 272 / 205 / 183; the test asks for 0.5%. (A higher bound is not a
    better ranking there: docs/design.md, "Better optima".)"""
    info = open_store(synth(tmp_path / "s.zarr", 600, 400, 12000, 4, 10, seed=0).path)

    def fit(n: int) -> OrdNMF:
        return OrdNMF(20, optimizer="cavi", anneal=n, executor="inprocess", n_members=1).fit(
            info.path
        )

    paper, annealed = fit(0), fit(30)
    assert annealed.elbo_[-1] > paper.elbo_[-1] + 0.005 * abs(paper.elbo_[-1])
    assert annealed.n_iter_ < paper.n_iter_
