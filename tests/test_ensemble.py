"""Ensembles (``n_members``): a member is the single fit of its seed, bitwise, whatever the
ensemble around it; the model's rate is the mean of the members' rates, its class law the
mixture of their laws, its fold-in each member's against its own columns."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import poisson_class_store

from ordnmf_dask import DcPF, OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.modelstore.model import MODEL_FORMAT, open_model
from ordnmf_dask.store.blocks import read_ids

K, M, ITERS = 3, 3, 25


def _store(path, validation_fraction: float = 0.0):
    return poisson_class_store(path, 150, 90, validation_fraction)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A store, an ensemble of M members from seed 4 and the single fits of seeds 4 .. 4 + M - 1."""
    root = tmp_path_factory.mktemp("ensemble")
    info = _store(str(root / "s.zarr"))
    ens = OrdNMF(K, n_members=M, max_iter=ITERS, seed=4).fit(info.path, out=str(root / "e.zarr"))
    singles = [OrdNMF(K, max_iter=ITERS, seed=4 + j, n_members=1).fit(info.path) for j in range(M)]
    return info, ens, singles


def test_members_are_the_single_fits_side_by_side(fitted):
    _, ens, singles = fitted
    w = np.concatenate([s.user_factors for s in singles], axis=1) / M
    h = np.concatenate([s.item_factors for s in singles], axis=1)
    assert np.array_equal(ens.user_factors, w)
    assert np.array_equal(ens.item_factors, h)
    assert ens.n_members_ == M and ens.elbo_ == []
    assert [r["seed"] for r in ens.runs_] == [4, 5, 6]
    assert [r["n_iter"] for r in ens.runs_] == [s.n_iter_ for s in singles]
    assert np.array_equal(ens.delta_, np.array([s.delta_ for s in singles]))
    assert np.array_equal(ens.theta_, np.array([s.theta_ for s in singles]))


def test_scores_and_recommendations_are_the_mean_rate(fitted):
    info, ens, singles = fitted
    users, items = [0, 3, 7, 7], [1, 2, 2, 40]
    mean = np.mean([s.score(users, items) for s in singles], axis=0)
    np.testing.assert_allclose(ens.score(users, items), mean, rtol=1e-13)
    items = read_ids(info.path, "items").tolist()  # in the model's row order
    recs = ens.recommend([0, 5], n=5, filter_already_seen=False)
    for user, listed in recs.items():
        rate = np.mean([s.score([user] * len(items), items) for s in singles], axis=0)
        top = np.argsort(-rate, kind="stable")[:5]
        assert [i for i, _ in listed] == [items[j] for j in top]
        np.testing.assert_allclose([x for _, x in listed], rate[top], rtol=1e-13)


def test_class_law_is_the_mixture_of_the_members_laws(fitted):
    _, ens, singles = fitted
    users, items = [0, 3, 7, 12, 12], [1, 2, 2, 40, 41]
    for posterior in ("mean", "gamma"):
        each = np.array([s.predict_proba(users, items, posterior=posterior) for s in singles])
        got = ens.predict_proba(users, items, posterior=posterior)
        np.testing.assert_allclose(got, each.mean(axis=0), rtol=1e-12, atol=1e-15)
        given = ens.predict_proba(users, items, given_interaction=True, posterior=posterior)
        reach = 1.0 - each[:, :, 0]
        want = each[:, :, 1:].sum(axis=0) / reach.sum(axis=0)[:, None]
        np.testing.assert_allclose(given[:, 1:], want, rtol=1e-10)
        assert np.all(given[:, 0] == 0)
    expected = ens.predict(users, items, kind="expected", posterior="gamma", scale="class")
    np.testing.assert_allclose(expected, given @ np.arange(given.shape[1]), rtol=1e-12)
    with_proba = ens.recommend([3], n=4, proba_at=4)[3]
    p = ens.predict_proba([3] * 4, [i for i, _, _ in with_proba], given_interaction=True)
    np.testing.assert_allclose([x for _, _, x in with_proba], p[:, 4:].sum(axis=1), rtol=1e-10)


def test_evaluate_scores_the_mixture(fitted):
    from ordnmf_dask import evaluate
    from ordnmf_dask.store.blocks import read_block

    info, ens, _ = fitted
    users, items = read_ids(info.path, "users"), read_ids(info.path, "items")
    rb, cb = info.row_bounds, info.col_bounds
    logs = []
    for r in range(info.grid[0]):
        for c in range(info.grid[1]):
            b = read_block(info.path, "test", r, c)
            u, i = users[rb[r] + b.rows], items[cb[c] + b.cols]
            p = ens.predict_proba(u.tolist(), i.tolist(), given_interaction=True, posterior="mean")
            logs.append(np.log(p[np.arange(len(b.y)), b.y.astype(np.int64)]))
    got = evaluate(info.path, ens)["test_loglik_mean"]
    np.testing.assert_allclose(got, np.concatenate(logs).mean(), rtol=1e-10)


def test_the_posterior_predictive_check_draws_from_the_mixture(fitted):
    from ordnmf_dask.postfit.ppc import posterior_predictive

    info, ens, singles = fitted
    every = info.n_users * info.n_items  # every pair simulated once
    got = np.array(posterior_predictive(info.path, ens, n_pairs=every)["model"])
    each = [posterior_predictive(info.path, s, n_pairs=every, seed=1)["model"] for s in singles]
    want = np.mean(each, axis=0)
    assert got.sum() == pytest.approx(every) and len(got) == info.n_classes + 1
    big = want > 300  # classes whose simulated counts are well above their noise
    assert big.sum() >= 3
    np.testing.assert_allclose(got[big], want[big], rtol=0.15)


def test_fold_in_is_each_member_against_its_own_columns(fitted):
    _, ens, singles = fitted
    items, values = [[1, 2, 5], [40]], [[5, 3, 1], [2]]
    users = np.concatenate([s.fold_in_users(items, values) for s in singles], axis=1) / M
    np.testing.assert_array_equal(ens.fold_in_users(items, values), users)
    new = np.concatenate([s.fold_in_items([[0, 3]], [[4, 4]]) for s in singles], axis=1)
    # against W, which the ensemble holds divided by M and multiplies back: to rounding
    np.testing.assert_allclose(ens.fold_in_items([[0, 3]], [[4, 4]]), new, rtol=1e-13)


def test_the_saved_model_holds_its_members_and_is_checked(fitted, tmp_path):
    _, ens, _ = fitted
    m = open_model(ens.model_path_)
    assert m.attrs["format_version"] == MODEL_FORMAT == 3
    assert m.header.n_members == M and len(m.header.laws) == M and m.header.width == M * K
    assert m.header.delta is None
    loaded = OrdNMF.load(ens.model_path_)
    assert np.array_equal(loaded.user_factors, ens.user_factors)
    np.testing.assert_array_equal(loaded.delta_, ens.delta_)
    from ordnmf_dask.modelstore.modelheader import ModelHeader

    for change, field in (
        ({"members": m.attrs["members"][:2]}, "members"),
        ({"n_members": 5000}, "n_members"),
        ({"members": [*m.attrs["members"][:2], {"delta": [0.0, -1.0, 1, 1, 1, 1]}]}, "delta"),
    ):
        with pytest.raises(StoreError, match=field):
            ModelHeader.from_attrs({**m.attrs, **change}, "M")


def test_ensembles_are_refused_where_one_fit_is_meant(fitted, tmp_path):
    info, ens, singles = fitted
    w0 = np.ones((info.n_users, K))
    h0 = np.ones((info.n_items, K))
    with pytest.raises(InputError, match="n_members > 1"):
        OrdNMF(K, n_members=2).fit(info.path, init=(w0, h0), check=True)
    with pytest.raises(InputError, match="holds 1 member\\(s\\) and this fit 2"):
        OrdNMF(K, n_members=2).fit(info.path, init_model=singles[0].model_path_, check=True)
    with pytest.raises(InputError, match="n_init"):
        OrdNMF(K, n_members=2, n_init=2).fit(info.path, check=True)
    with pytest.raises(InputError, match="holds 3 member\\(s\\) and this fit 1"):
        OrdNMF(K, n_members=1).fit(info.path, init_model=ens.model_path_, check=True)


def test_each_member_continues_its_own_member_of_a_saved_ensemble(tmp_path):
    info = _store(str(tmp_path / "s.zarr"))
    old = OrdNMF(K, n_members=2, max_iter=6, seed=3).fit(info.path)
    new = OrdNMF(K, n_members=2, max_iter=5, seed=8).fit(info.path, init_model=old)
    assert new.n_members_ == 2
    for j in range(2):  # member j: the single fit warm-started from old's member j
        one = OrdNMF(K, n_members=1, max_iter=6, seed=3 + j).fit(info.path)
        warm = OrdNMF(K, n_members=1, max_iter=5, seed=8 + j).fit(info.path, init_model=one)
        cols = slice(j * K, (j + 1) * K)
        assert np.array_equal(new.user_factors[:, cols] * 2, warm.user_factors)  # 2: exact
        assert np.array_equal(new.item_factors[:, cols], warm.item_factors)
        assert np.array_equal(new.delta_[j], warm.delta_)


def test_members_resume_from_their_own_checkpoints(tmp_path, caplog):
    info = _store(str(tmp_path / "s.zarr"))
    kw = {"n_members": 2, "max_iter": 12, "seed": 1, "checkpoint_every": 4}
    ckpt = str(tmp_path / "ckpt")
    first = OrdNMF(K, checkpoint_dir=ckpt, **kw).fit(info.path)
    with caplog.at_level("INFO", logger="ordnmf_dask"):
        again = OrdNMF(K, checkpoint_dir=ckpt, **kw).fit(info.path)
    assert any("resum" in r.getMessage() for r in caplog.records)
    assert np.array_equal(first.user_factors, again.user_factors)
    assert np.array_equal(first.item_factors, again.item_factors)
    plain = OrdNMF(K, **kw).fit(info.path)
    assert np.array_equal(first.item_factors, plain.item_factors)


def test_a_failing_member_stops_the_fit_and_writes_nothing(tmp_path):
    info = _store(str(tmp_path / "s.zarr"))
    calls = []

    def callback(it):
        calls.append(it.iteration)
        if it.iteration == 3 and len(calls) > 3:
            raise RuntimeError("member failed")
        return False

    out = tmp_path / "m.zarr"
    with pytest.raises(RuntimeError, match="member failed"):
        OrdNMF(K, n_members=2, max_iter=400, tol=1e-12).fit(
            info.path, out=str(out), callback=callback
        )
    assert not out.exists()
    assert max(calls) < 400  # the other member stopped too


def test_dcpf_ensembles_mix_their_count_laws(tmp_path):
    info = _store(str(tmp_path / "s.zarr"))
    ens = DcPF(K, n_members=2, max_iter=10, seed=2).fit(info.path)
    singles = [DcPF(K, max_iter=10, seed=2 + j, n_members=1).fit(info.path) for j in range(2)]
    np.testing.assert_array_equal(ens.p_, [s.p_ for s in singles])
    np.testing.assert_allclose(
        ens.score([0, 1], [2, 3]), np.mean([s.score([0, 1], [2, 3]) for s in singles], axis=0)
    )


@pytest.mark.cluster
def test_a_cluster_fits_the_same_ensemble(fitted, client):
    """Bitwise the ensemble fitted in-process, after a few iterations (a cluster's are slow)."""
    info = fitted[0]
    kw = {"n_members": M, "max_iter": 4, "seed": 4}
    ens = OrdNMF(K, **kw).fit(info.path)
    on_cluster = OrdNMF(K, **kw).fit(info.path, client)
    assert np.array_equal(on_cluster.user_factors, ens.user_factors)
    assert np.array_equal(on_cluster.item_factors, ens.item_factors)
    np.testing.assert_array_equal(on_cluster.delta_, ens.delta_)


def test_the_cli_fits_describes_and_serves_an_ensemble(tmp_path, capsys):
    info = _store(str(tmp_path / "s.zarr"))
    out = str(tmp_path / "m.zarr")
    args = ["fit", info.path, "--out", out, "-k", "3", "--n-members", "2", "--max-iter", "8"]
    assert main([*args, "--executor", "inprocess"]) == 0
    assert "2 members after" in capsys.readouterr().out
    assert main(["info", out, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_members"] == 2 and len(summary["members"]) == 2
    assert summary["elbo"] is None and summary["thresholds_as_classes"]
    assert main(["info", out]) == 0
    assert "an ensemble of 2 members" in capsys.readouterr().out
    assert main(["recommend", out, "--users", "0", "-n", "3"]) == 0
    assert len([x for x in capsys.readouterr().out.splitlines() if x.strip()]) >= 3
    assert os.path.isdir(out)
