"""Warm start from a saved model onto a store that grew (engine/warmstart.py): rows matched by
raw id, known rows keep their old state, new ones get fold-in rows or the cold draws, every
family, different grids on both sides; incompatible models refused before any work; the warm
start recorded in the model and in the checkpoint fingerprint.

The models warm-started from are fitted in-process (bitwise the cluster's fit,
tests/test_inprocess.py); the warm starts themselves (the initial chunks, every family's warm
fit, the command line's) run on the session's worker processes."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import zarr
from conftest import CLI, dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import BePoF, DcPF, OrdNMF
from ordnmf_dask.engine import tasks, warmstart
from ordnmf_dask.engine.cavi import CaviConfig, CaviRunner
from ordnmf_dask.errors import InputError
from ordnmf_dask.estimator import ESTIMATORS
from ordnmf_dask.model.foldin_rows import fold_in_rows
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.modelstore.model import model_fingerprint, open_model, store_fingerprint

V, K = 4, 3
HERE = {"executor": "inprocess"}  # the fits that are not the subject: in-process
N_USERS, N_ITEMS = 90, 60
OLD_USERS, OLD_ITEMS = 70, 45  # the old store holds the first rows and columns


@pytest.fixture(scope="module")
def data():
    y = synthetic_ordinal(N_USERS, N_ITEMS, V, density=0.3, seed=2)
    train, test = dense_split(y)
    # a few new users interact only with new items, a few new items only with new users
    train[OLD_USERS : OLD_USERS + 3, :OLD_ITEMS] = 0
    test[OLD_USERS : OLD_USERS + 3, :OLD_ITEMS] = 0
    train[:OLD_USERS, OLD_ITEMS : OLD_ITEMS + 2] = 0
    test[:OLD_USERS, OLD_ITEMS : OLD_ITEMS + 2] = 0
    return train, test


@pytest.fixture(scope="module")
def stores(data, tmp_path_factory):
    """The old store (first users and items, raw ids 1000 + u and 500 + i, grid 2 x 2) and the
    grown store (every user and item, in another order, grid 3 x 1)."""
    tmp = tmp_path_factory.mktemp("warm")
    train, test = data
    uid, iid = 1000 + np.arange(N_USERS), 500 + np.arange(N_ITEMS)
    old = store_from_dense(
        tmp / "old.zarr",
        train[:OLD_USERS, :OLD_ITEMS],
        test[:OLD_USERS, :OLD_ITEMS],
        V,
        (2, 2),
        uid[:OLD_USERS],
        iid[:OLD_ITEMS],
    )
    pu = np.random.default_rng(0).permutation(N_USERS)
    pi = np.random.default_rng(1).permutation(N_ITEMS)
    new = store_from_dense(
        tmp / "new.zarr", train[pu][:, pi], test[pu][:, pi], V, (3, 1), uid[pu], iid[pi]
    )
    return tmp, old, new, pu, pi


def _initial(client, est, info, source, tmp):
    """The warm-start chunks the fit would start from, gathered."""
    seed = est._validate()[1].model.seed
    family = est._family(info)
    runner = CaviRunner(
        client, info, family, CaviConfig(K, seed=seed), str(tmp / "ck-initial"), False
    )
    params = warmstart.start_params(family, source)
    w, h = warmstart.initial_chunks(runner, source, params, {"W": 0.3, "H": 0.3})
    return client.gather(w), client.gather(h), family, params


def _stack(chunks, field):
    return np.concatenate([getattr(c, field) for c in chunks])


def test_known_rows_keep_their_state_new_rows_are_folded_in(client, stores, data):
    tmp, old, new, pu, pi = stores
    train, _ = data
    est = OrdNMF(K, max_iter=15, tol=1e-12, **HERE, n_members=1)
    est.fit(old.path, out=tmp / "m-old.zarr")
    m = open_model(str(tmp / "m-old.zarr"))
    source = warmstart.open_source(str(tmp / "m-old.zarr"), "OrdNMF", est._family(new), K, new)
    w, h, family, params = _initial(client, OrdNMF(K, n_members=1), new, source, tmp)
    np.testing.assert_array_equal(params, m.delta)  # thresholds from the old model
    old_w = {f: m.factor("W", f).compute() for f in ("mean", "geo")}
    old_h = {f: m.factor("H", f).compute() for f in ("mean", "geo")}
    new_w = {f: _stack(w, f) for f in ("mean", "geo")}
    new_h = {f: _stack(h, f) for f in ("mean", "geo")}
    # known users / items: new row j holds raw row pu[j] (pi[j]); its old row has that index
    for f in ("mean", "geo"):
        known_u = np.flatnonzero(pu < OLD_USERS)
        np.testing.assert_array_equal(new_w[f][known_u], old_w[f][pu[known_u]])
        known_i = np.flatnonzero(pi < OLD_ITEMS)
        np.testing.assert_array_equal(new_h[f][known_i], old_h[f][pi[known_i]])

    alpha = 0.3
    # new users with known items: the fold-in against the old H (built here from the dense data)
    for j in np.flatnonzero(pu >= OLD_USERS):
        row = train[pu[j], :OLD_ITEMS]
        cols = np.flatnonzero(row)
        if cols.size == 0:  # only new items: the cold draws of the fit's seed
            cold = tasks.random_chunk(0, 0, j, j + 1, K)
            np.testing.assert_array_equal(new_w["mean"][j], cold.mean[0])
            continue
        block = CsrBlock.from_coo(
            np.zeros(cols.size, np.int64),
            np.arange(cols.size),
            row[cols].astype(np.uint8),
            (1, cols.size),
        )
        fold = fold_in_rows(
            block,
            old_h["mean"][cols],
            np.log(old_h["geo"][cols]),
            old_h["mean"].sum(axis=0),
            alpha,
            warmstart.likelihood(family, params),
            max_iter=warmstart.FOLDIN_MAX_ITER,
            tol=warmstart.FOLDIN_TOL,
        )
        np.testing.assert_allclose(new_w["mean"][j], fold.mean[0], rtol=1e-10)
        np.testing.assert_allclose(new_w["geo"][j], np.exp(fold.log_mean[0]), rtol=1e-10)
    # new items with known users: the same fold-in on the transposed data, against the old W
    n_folded = 0
    for j in np.flatnonzero(pi >= OLD_ITEMS):
        col = train[:OLD_USERS, pi[j]]
        rows = np.flatnonzero(col)
        if rows.size == 0:
            cold = tasks.random_chunk(0, 1, j, j + 1, K)
            np.testing.assert_array_equal(new_h["mean"][j], cold.mean[0])
            continue
        n_folded += 1
        block = CsrBlock.from_coo(
            np.zeros(rows.size, np.int64),
            np.arange(rows.size),
            col[rows].astype(np.uint8),
            (1, rows.size),
        )
        fold = fold_in_rows(
            block,
            old_w["mean"][rows],
            np.log(old_w["geo"][rows]),
            old_w["mean"].sum(axis=0),
            alpha,
            warmstart.likelihood(family, params),
            max_iter=warmstart.FOLDIN_MAX_ITER,
            tol=warmstart.FOLDIN_TOL,
        )
        np.testing.assert_allclose(new_h["mean"][j], fold.mean[0], rtol=1e-10)
    assert n_folded >= 5


@pytest.mark.parametrize("name", ["OrdNMF", "BePoF", "PF", "DcPF"])
def test_every_family_warm_starts_onto_the_grown_store(client, stores, name):
    """A warm fit on the grown store starts far above a cold one (its first bound is higher)
    and records where it came from; the old model is untouched."""
    tmp, old, new, _, _ = stores
    klass = ESTIMATORS[name]
    kw = {"threshold": 3} if name in ("BePoF", "PF") else {}
    old_model = tmp / f"{name}-old.zarr"
    klass(K, max_iter=15, tol=1e-12, **kw, **HERE, n_members=1).fit(old.path, out=old_model)
    before = dict(zarr.open_group(str(old_model), mode="r").attrs)
    # one iteration: the first bounds are compared
    warm = klass(K, max_iter=1, tol=1e-12, **kw, n_members=1).fit(
        new.path, client, init_model=old_model, out=tmp / f"{name}-warm.zarr"
    )
    cold = klass(K, max_iter=1, tol=1e-12, **kw, **HERE, n_members=1).fit(new.path)
    assert warm.elbo_[0] > cold.elbo_[0]
    attrs = open_model(warm.model_path_).attrs
    assert attrs["init_model"] == {"path": str(old_model), "fingerprint": model_fingerprint(before)}
    assert attrs["warm_start"] is True
    assert dict(zarr.open_group(str(old_model), mode="r").attrs) == before


@pytest.mark.parametrize("name", ["OrdNMF", "DcPF"])
def test_a_warm_start_on_its_own_store_continues_the_fit_exactly(stores, name):
    """Warm-started on its own store, a model of M iterations continues as the fit would have:
    the bounds and factors of M + N iterations, bitwise (the known rows' E[x], exp(E[log x])
    and the global parameters are the whole state; the prior rates follow from E[x])."""
    tmp, _, new, _, _ = stores
    klass, m, n = ESTIMATORS[name], 6, 4
    kw = {"tol": 1e-12, "executor": "inprocess"}
    first = klass(K, max_iter=m, **kw, n_members=1).fit(
        new.path, out=tmp / f"{name}-first-{m}.zarr"
    )
    warm = klass(K, max_iter=n, **kw, n_members=1).fit(new.path, init_model=first)
    whole = klass(K, max_iter=m + n, **kw, n_members=1).fit(new.path)
    assert warm.elbo_ == whole.elbo_[m:]
    assert np.array_equal(np.asarray(warm.W_), np.asarray(whole.W_))
    assert np.array_equal(np.asarray(warm.H_), np.asarray(whole.H_))


def test_dcpf_starts_from_the_old_p(stores):
    tmp, old, new, _, _ = stores
    old_model = tmp / "dcpf-p.zarr"
    DcPF(K, max_iter=8, tol=1e-12, p=0.3, **HERE, n_members=1).fit(old.path, out=old_model)
    source = warmstart.open_source(
        str(old_model), "DcPF", DcPF(K, n_members=1)._family(new), K, new
    )
    p_old = float(open_model(str(old_model)).attrs["p"])
    assert p_old != 0.5
    assert warmstart.start_params(DcPF(K, p=0.5, n_members=1)._family(new), source) == p_old
    fixed = DcPF(K, p=0.5, update_p=False, n_members=1)._family(new)
    assert warmstart.start_params(fixed, source) == 0.5  # a fixed p stays the fit's


def test_provenance_is_recorded(stores):
    tmp, old, new, _, _ = stores
    m = OrdNMF(K, max_iter=2, **HERE, n_members=1).fit(old.path, out=tmp / "prov.zarr")
    attrs = open_model(m.model_path_).attrs
    assert set(attrs["versions"]) == {
        "ordnmf-dask",
        "numpy",
        "scipy",
        "dask",
        "distributed",
        "zarr",
        "numba",
    }
    assert attrs["store"]["fingerprint"] == store_fingerprint(old.path)
    assert store_fingerprint(old.path) != store_fingerprint(new.path)
    assert attrs["init_model"] is None


def test_a_store_changed_in_place_changes_its_fingerprint(tmp_path, data):
    train, test = data
    a = store_from_dense(tmp_path / "a.zarr", train, test, V, (2, 2))
    b = store_from_dense(tmp_path / "b.zarr", train, test, V, (2, 2))
    assert store_fingerprint(a.path) == store_fingerprint(b.path)  # same content, same print
    changed = train.copy()
    u, i = np.argwhere(changed == 2)[0]
    changed[u, i] = 3
    c = store_from_dense(tmp_path / "c.zarr", changed, test, V, (2, 2))
    assert store_fingerprint(c.path) != store_fingerprint(a.path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda ck: BePoF(K, checkpoint_dir=ck, n_members=1),
            "its model class OrdNMF differs from this fit's BePoF",
        ),
        (
            lambda ck: OrdNMF(K + 1, checkpoint_dir=ck, n_members=1),
            f"its K = {K} differs from this fit's K = {K + 1}",
        ),
    ],
)
def test_incompatible_models_are_refused_before_any_work(client, stores, make, message):
    tmp, old, new, _, _ = stores
    old_model = tmp / "refuse-old.zarr"
    if not old_model.exists():
        OrdNMF(K, max_iter=2, **HERE, n_members=1).fit(old.path, out=old_model)
    ckpt = tmp / "refuse-ck"
    with pytest.raises(InputError, match=message):
        make(str(ckpt)).fit(new.path, client, init_model=old_model, out=tmp / "refused.zarr")
    assert not (tmp / "refused.zarr").exists() and not ckpt.exists()


def test_another_number_of_classes_is_refused(tmp_path, data):
    train, test = data
    three = np.minimum(train, 3), np.minimum(test, 3)
    small = store_from_dense(tmp_path / "v3.zarr", *three, 3, (1, 1))
    full = store_from_dense(tmp_path / "v4.zarr", train, test, V, (1, 2))
    OrdNMF(K, max_iter=2, **HERE, n_members=1).fit(small.path, out=tmp_path / "v3-model.zarr")
    with pytest.raises(InputError, match="its 3 classes differ from the 4 of this fit's data"):
        OrdNMF(K, **HERE, n_members=1).fit(full.path, init_model=tmp_path / "v3-model.zarr")


def test_the_warm_start_source_enters_the_checkpoint_fingerprint(stores):
    """Checkpoints of a fit warm-started from one model are not resumed by a fit from another:
    it refuses, naming restart, and keeps them."""
    tmp, old, new, _, _ = stores
    a, b = tmp / "src-a.zarr", tmp / "src-b.zarr"
    OrdNMF(K, max_iter=3, seed=0, **HERE, n_members=1).fit(old.path, out=a)
    OrdNMF(K, max_iter=3, seed=1, **HERE, n_members=1).fit(old.path, out=b)
    ckpt = tmp / "src-ck"
    est = OrdNMF(
        K, max_iter=4, tol=1e-12, checkpoint_dir=str(ckpt), checkpoint_every=2, **HERE, n_members=1
    )
    est.fit(new.path, init_model=a)
    kept = sorted(p.name for p in ckpt.iterdir())
    assert kept
    with pytest.raises(InputError, match="restart=True"):
        est.fit(new.path, init_model=b)
    assert sorted(p.name for p in ckpt.iterdir()) == kept
    again = est.fit(new.path, init_model=a)  # the same source resumes
    assert again.n_iter_ == 4


def test_cli_init_model(client, stores):
    tmp, old, new, _, _ = stores
    OrdNMF(K, max_iter=3, **HERE, n_members=1).fit(old.path, out=tmp / "cli-old.zarr")
    r = subprocess.run(
        [
            *CLI,
            "fit",
            "--n-members",
            "1",
            new.path,
            "--out",
            str(tmp / "cli-warm.zarr"),
            "-k",
            str(K),
            "--max-iter",
            "2",
            "--init-model",
            str(tmp / "cli-old.zarr"),
            "--scheduler",
            client.scheduler.address,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    attrs = open_model(str(tmp / "cli-warm.zarr")).attrs
    assert attrs["init_model"]["path"] == str(tmp / "cli-old.zarr")
    assert attrs["resolved_config"]["model"]["init_model"] == str(tmp / "cli-old.zarr")
    r = subprocess.run(
        [
            *CLI,
            "fit",
            "--n-members",
            "1",
            new.path,
            "--out",
            str(tmp / "cli-bad.zarr"),
            "-k",
            str(K + 1),
            "--init-model",
            str(tmp / "cli-old.zarr"),
            "--scheduler",
            client.scheduler.address,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("ordnmf-dask fit: error: --init-model")
    assert not (tmp / "cli-bad.zarr").exists()


def test_ids_of_another_type_are_refused(tmp_path, data):
    train, test = data
    named = store_from_dense(
        tmp_path / "named.zarr",
        train,
        test,
        V,
        (1, 1),
        np.array([f"u{j}" for j in range(N_USERS)]),
        np.array([f"i{j}" for j in range(N_ITEMS)]),
    )
    numbered = store_from_dense(tmp_path / "numbered.zarr", train, test, V, (2, 1))
    OrdNMF(K, max_iter=2, **HERE, n_members=1).fit(named.path, out=tmp_path / "named-model.zarr")
    with pytest.raises(InputError, match="its users ids are strings, those of store .* integers"):
        OrdNMF(K, **HERE, n_members=1).fit(numbered.path, init_model=tmp_path / "named-model.zarr")
