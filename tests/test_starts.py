"""The SVD start (``start="svd"``): NNDSVDa from a randomized SVD computed on the block store;
the subsample start (``start="subsample"``): a fit of a subsample extended by fold-in."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal
from distributed import Client, LocalCluster

from ordnmf_dask import BePoF, OrdNMF
from ordnmf_dask.engine.cavi import CaviConfig, CaviRunner
from ordnmf_dask.engine.substart import subsample_start
from ordnmf_dask.engine.svdstart import svd_start
from ordnmf_dask.errors import InputError
from ordnmf_dask.fitting import plan_fit
from ordnmf_dask.model import subsample
from ordnmf_dask.model.families import DcPFFamily, OrdinalFamily
from ordnmf_dask.modelstore.model import open_model
from ordnmf_dask.runtime.inprocess import InProcessClient

K = 3


def oracle_nndsvda(a: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """NNDSVDa as Boutsidis & Gallopoulos (2008) state it, on the dense matrix: the first
    component from |u_1|, |v_1|; each other from the positive or the negative parts of u_j, v_j
    (the pair with the larger product of norms); zeros filled with the mean of ``a``; both
    factors then scaled so that sum(W H^T) = sum(a)."""
    u, s, vt = np.linalg.svd(a, full_matrices=False)
    u[~a.any(axis=1)], vt[:, ~a.any(axis=0)] = 0, 0  # exact zeros (u = A v / s), not round-off
    w, h = np.zeros((a.shape[0], k)), np.zeros((a.shape[1], k))
    w[:, 0], h[:, 0] = np.sqrt(s[0]) * np.abs(u[:, 0]), np.sqrt(s[0]) * np.abs(vt[0])
    for j in range(1, k):
        x, y = u[:, j], vt[j]
        xp, xn, yp, yn = (np.maximum(z, 0) for z in (x, -x, y, -y))
        mp = np.linalg.norm(xp) * np.linalg.norm(yp)
        mn = np.linalg.norm(xn) * np.linalg.norm(yn)
        p, q, sigma = (xp, yp, mp) if mp > mn else (xn, yn, mn)
        w[:, j] = np.sqrt(s[j] * sigma) * p / np.linalg.norm(p)
        h[:, j] = np.sqrt(s[j] * sigma) * q / np.linalg.norm(q)
    w[w == 0], h[h == 0] = a.mean(), a.mean()
    factor = np.sqrt(a.sum() / (w.sum(axis=0) @ h.sum(axis=0)))
    return w * factor, h * factor


def start_of(
    store, seed: int = 0, binarize_at: int | None = None, cache: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """The SVD start of an OrdNMF fit on ``store`` (of BePoF with ``binarize_at``: the values
    are then 1 for classes >= binarize_at), gathered (in-process)."""
    client = InProcessClient()
    try:
        family = OrdinalFamily(tuple(store.hist_train.tolist()))
        if binarize_at is not None:
            family = OrdinalFamily((0, 1), binarize_at=binarize_at)
        runner = CaviRunner(client, store, family, CaviConfig(K, seed=seed), "unused", cache)
        w, h = svd_start(runner)
        return tuple(np.concatenate([c.mean for c in client.gather(x)]) for x in (w, h))
    finally:
        client.close()


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    """12 items: the sketch's K + 10 columns span the whole row space, so the randomized SVD
    is the exact one up to rounding."""
    train, test = dense_split(synthetic_ordinal(40, 12, 4, seed=7))
    path = tmp_path_factory.mktemp("s") / "narrow.zarr"
    return train, store_from_dense(path, train, test, 4, (2, 2))


def grouped(n_users: int, n_items: int, seed: int = 0) -> np.ndarray:
    """Classes set by a user group and an item group (3 each), so that the matrix has three
    leading singular values well above the rest once its test split is drawn."""
    rng = np.random.default_rng(seed)
    table = np.array([[4, 1, 0], [1, 4, 1], [0, 2, 4]])
    y = table[rng.integers(0, 3, n_users)][:, rng.integers(0, 3, n_items)]
    y[0, :4] = [1, 2, 3, 4]  # every class present
    return y


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    train, test = dense_split(grouped(50, 40))
    path = tmp_path_factory.mktemp("s") / "wide.zarr"
    return train, test, store_from_dense(path, train, test, 4, (2, 3))


def test_the_svd_start_is_the_dense_nndsvda(narrow):
    train, store = narrow
    w, h = start_of(store)
    assert np.all(np.isfinite(w)) and np.all(np.isfinite(h))
    assert w.min() > 0 and h.min() > 0
    ow, oh = oracle_nndsvda(train.astype(np.float64), K)
    np.testing.assert_allclose(w, ow, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(h, oh, rtol=1e-8, atol=1e-12)
    # the family's values: BePoF's blocks hold 1 for classes >= 3, streamed from the store
    # (14 users and 1 item without any: their rows get the fill)
    w, h = start_of(store, binarize_at=3, cache=False)
    ow, oh = oracle_nndsvda((train >= 3).astype(np.float64), K)
    np.testing.assert_allclose(w, ow, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(h, oh, rtol=1e-8, atol=1e-12)


def test_the_svd_start_depends_on_the_seed_not_on_the_grid(tmp_path, wide):
    train, test, store = wide
    one_block = store_from_dense(tmp_path / "one.zarr", train, test, 4, (1, 1))
    w, h = start_of(store, seed=5)
    w1, h1 = start_of(one_block, seed=5, cache=False)
    np.testing.assert_allclose(w1, w, rtol=1e-10)
    np.testing.assert_allclose(h1, h, rtol=1e-10)
    assert w.min() > 0 and h.min() > 0
    np.testing.assert_allclose(w.sum(axis=0) @ h.sum(axis=0), train.sum(), rtol=1e-12)
    other, _ = start_of(store, seed=6)
    assert not np.array_equal(other, w)
    # the truncated SVD it approximates (50 x 40 data, rank 3 + 10 sketched, 2 power steps)
    ow, oh = oracle_nndsvda(train.astype(np.float64), K)
    rel = np.linalg.norm(w @ h.T - ow @ oh.T) / np.linalg.norm(ow @ oh.T)
    assert rel < 1e-3


@pytest.fixture(scope="module")
def one_worker(cluster):
    """A client of a LocalCluster of one worker process (two threads), started once for both
    starts (not the default client: the session's cluster stays the current one)."""
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address="127.0.0.1:0"
        ) as lc,
        Client(lc, set_as_default=False) as one_client,
    ):
        yield one_client


@pytest.mark.parametrize("start", ["svd", "subsample"])
def test_the_fit_is_bitwise_the_same_on_one_or_two_workers_and_in_process(
    tmp_path, wide, client, one_worker, start
):
    """The start and the iterations from it (3: the start decides them all)."""
    _, _, store = wide

    def fit(where, name, **kw):
        est = OrdNMF(K, start=start, max_iter=3, tol=1e-12, **kw, n_members=1)
        model = est.fit(store, where, out=tmp_path / name)
        return model.elbo_, open_model(model.model_path_).factor("H", "mean").compute()

    two = fit(client, "two")
    one = fit(one_worker, "one")
    here = fit(None, "here", executor="inprocess")
    for other in (one, here):
        assert other[0] == two[0]
        np.testing.assert_array_equal(other[1], two[1])
    elbo = np.asarray(two[0])
    assert len(elbo) == 3 and np.all(np.diff(elbo) >= -1e-10 * np.abs(elbo[1:]))


def test_svd_restarts_differ_by_their_projection(wide):
    _, _, store = wide
    model = OrdNMF(K, start="svd", n_init=2, max_iter=3, executor="inprocess", n_members=1).fit(
        store
    )
    assert [r["seed"] for r in model.runs_] == [0, 1]
    assert model.runs_[0]["elbo"] != model.runs_[1]["elbo"]
    assert model.get_params()["start"] == "svd"
    assert open_model(model.model_path_).attrs["params"]["start"] == "svd"
    random = OrdNMF(K, max_iter=3, executor="inprocess", n_members=1).fit(store)
    assert random.runs_[0]["elbo"] != model.runs_[0]["elbo"]  # the start is used


def test_the_svd_start_refuses_other_starts_in_one_line(tmp_path, narrow):
    train, store = narrow
    w0, h0 = np.ones((store.n_users, K)), np.ones((store.n_items, K))
    with pytest.raises(InputError) as exc:
        plan_fit(
            store, "OrdNMF", {"n_components": K, "n_members": 1, "start": "svd"}, init=(w0, h0)
        )
    assert str(exc.value) == "start='svd' is a start of its own: no init= or init_model= with it"
    old = OrdNMF(K, max_iter=1, executor="inprocess", n_members=1).fit(store, out=tmp_path / "old")
    with pytest.raises(InputError, match=r"^start='svd' .* init_model= with it$"):
        plan_fit(
            store, "OrdNMF", {"n_components": K, "n_members": 1, "start": "svd"}, init_model=old
        )
    with pytest.raises(InputError) as exc:
        plan_fit(
            store,
            "OrdNMF",
            {"n_components": K, "n_members": 1, "start": "subsample"},
            init=(w0, h0),
        )
    assert str(exc.value) == (
        "start='subsample' is a start of its own: no init= or init_model= with it"
    )
    with pytest.raises(InputError) as exc:
        plan_fit(store, "OrdNMF", {"n_components": K, "n_members": 1, "start": "nndsvd"})
    assert str(exc.value) == "start must be 'random', 'svd' or 'subsample', got 'nndsvd'"


def subsample_of(store, family, seed: int = 0, cache: bool = True):
    """The subsample start of a fit of ``family`` on ``store``: W, H gathered, and the global
    parameters it starts from (in-process)."""
    with InProcessClient() as client:
        runner = CaviRunner(client, store, family, CaviConfig(K, seed=seed), "unused", cache)
        w, h, params = subsample_start(runner)
        w, h = (np.concatenate([c.mean for c in client.gather(x)]) for x in (w, h))
        return w, h, params


def test_the_subsample_start_is_positive_everywhere_and_grid_free(tmp_path, narrow, wide):
    train, test, store = wide
    family = OrdinalFamily(tuple(store.hist_train.tolist()))
    w, h, delta = subsample_of(store, family, seed=5)
    assert w.shape == (store.n_users, K) and h.shape == (store.n_items, K)
    assert np.all(np.isfinite(w)) and np.all(np.isfinite(h)) and w.min() > 0 and h.min() > 0
    assert not np.allclose(delta, family.init_params())  # the sub-fit's Delta, not the first
    one_block = store_from_dense(tmp_path / "one.zarr", train, test, 4, (1, 1))
    w1, h1, delta1 = subsample_of(one_block, family, seed=5, cache=False)
    np.testing.assert_array_equal(w1, w)
    np.testing.assert_array_equal(h1, h)
    np.testing.assert_array_equal(delta1, delta)
    assert not np.array_equal(subsample_of(store, family, seed=6)[0], w)
    # BePoF on classes >= 3 (14 users and 1 item without any: folded in from nothing), dcPF
    _, narrow_store = narrow
    for fam in (OrdinalFamily((0, 1), binarize_at=3), DcPFFamily("class")):
        w, h, _ = subsample_of(narrow_store, fam)
        assert np.all(np.isfinite(w)) and np.all(np.isfinite(h))
        assert w.min() > 0 and h.min() > 0


def test_the_subsample_is_bounded():
    assert subsample.fractions(50, 40, 500, 3) == (0.6, 0.75)  # 10 K rows of each side
    assert subsample.fractions(20, 10, 100, 3) == (1.0, 1.0)  # every row of a tiny store
    assert subsample.fractions(10**6, 10**5, 10**7, 3) == (0.1, 0.1)
    p_u, p_i = subsample.fractions(10**8, 10**7, 10**10, 50)
    assert p_u * 10**8 <= subsample.MAX_ROWS and p_i * 10**7 <= subsample.MAX_ROWS
    assert p_u * p_i * 10**10 <= subsample.MAX_NNZ * (1 + 1e-12)


def test_the_subsample_start_beats_random_draws_on_data_from_the_model(tmp_path):
    train, test = dense_split(synthetic_ordinal(80, 60, 4, seed=3))
    store = store_from_dense(tmp_path / "model.zarr", train, test, 4, (2, 2))

    def first(start: str, seed: int) -> float:
        est = OrdNMF(K, start=start, seed=seed, max_iter=1, executor="inprocess", n_members=1)
        return est.fit(store).elbo_[0]

    assert first("subsample", 0) > max(first("random", s) for s in range(3))


def test_a_subsample_too_small_for_k_is_refused_in_one_line(narrow):
    _, store = narrow  # 11 of its 12 items have a class >= 3
    est = BePoF(12, threshold=3, start="subsample", max_iter=2, executor="inprocess", n_members=1)
    with pytest.raises(InputError) as exc:
        est.fit(store)
    assert str(exc.value) == (
        f"start='subsample': the subsample of {store.path} has 26 users and 11 items with a "
        "nonzero between them, fewer than K = 12: use start='random' or 'svd'"
    )
