"""The contract every estimator keeps, checked the same way for each family (in the spirit of
scikit-learn's estimator checks): fit, save / load, resume, restarts, the parameter protocol,
clone, repr and pickle. The tests that fit share one small count store and fit in-process
(the contract is the estimator's, whatever runs its tasks: ``tests/test_inprocess.py`` checks
that an in-process fit is bitwise the cluster's, a resume across executors too); the others
need no store."""

from __future__ import annotations

import copy
import inspect
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ordnmf_dask import PF, BePoF, DcPF, OrdNMF, StoreError, ingest_arrays
from ordnmf_dask.engine.control import ROUNDOFF, mean_gain
from ordnmf_dask.estimator import CaviEstimator

K, ITERS, STOP, EVERY = 2, 8, 4, 3  # a stopped fit (STOP) resumes from its checkpoint at EVERY
N_CLASSES = 4
INPROCESS = "inprocess"  # the executor of every fit here

# class, constructor arguments, and each family attribute with its shape
FAMILIES: dict[str, tuple[type[CaviEstimator], dict[str, Any], dict[str, tuple[int, ...]]]] = {
    "OrdNMF": (OrdNMF, {}, {"delta_": (N_CLASSES + 1,), "theta_": (N_CLASSES + 1,)}),
    "BePoF": (BePoF, {"threshold": 2}, {"delta_": (2,), "theta_": (2,)}),
    "PF": (PF, {"threshold": 3}, {"delta_": (2,), "theta_": (2,)}),
    "DcPF": (DcPF, {"p": 0.3}, {"p_": ()}),
}
# PF's reported bound keeps the local term of q(n) = delta_1, which its updates do not maximise
# (docs/design.md §2): only the exact bounds never decrease
EXACT_BOUND = {"OrdNMF", "BePoF", "DcPF"}


FACTORS = ("W_", "H_", "log_W_", "log_H_")  # properties: dask arrays made on first use


def fitted_state(est: CaviEstimator) -> dict[str, Any]:
    """Every fitted attribute (public, ending in ``_``) but the model's path, dask arrays
    computed."""
    state = {}
    for name in [*vars(est), *(f for f in FACTORS if hasattr(est, f))]:
        if name.endswith("_") and not name.startswith("_") and name != "model_path_":
            value = getattr(est, name)
            state[name] = value.compute() if hasattr(value, "compute") else value
    return state


def assert_same_fit(a: CaviEstimator, b: CaviEstimator) -> None:
    """Bitwise the same fitted state (same attributes, same values)."""
    sa, sb = fitted_state(a), fitted_state(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        if isinstance(sa[name], np.ndarray):
            assert sa[name].dtype == sb[name].dtype and sa[name].shape == sb[name].shape, name
            assert np.array_equal(sa[name], sb[name]), name
        else:
            assert sa[name] == sb[name], name


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return request.param


def make(family: str, **params: Any) -> CaviEstimator:
    klass, args, _ = FAMILIES[family]
    return klass(K, **{"n_members": 1, **args, **params})


@pytest.fixture(scope="module")
def count_store(tmp_path_factory: pytest.TempPathFactory):
    """Poisson counts of a rank-2 model, 40 users x 30 items on a 2 x 2 grid, in 4 classes;
    DcPF reads the counts themselves."""
    rng = np.random.default_rng(0)
    y = rng.poisson(rng.gamma(1.0, 1.0, (40, K)) @ rng.gamma(1.0, 1.5, (K, 30)))
    u, i = np.nonzero(y)
    info = ingest_arrays(
        u,
        i,
        y[u, i],
        tmp_path_factory.mktemp("contract") / "s.zarr",
        counts=[0, 1, 3, 8],
        grid=(2, 2),
        seed=0,
    )
    assert info.n_classes == N_CLASSES and info.attrs["value_kind"] == "counts"
    return info


@pytest.fixture(scope="module")
def family_fit(family, count_store, tmp_path_factory) -> CaviEstimator:
    """An uninterrupted fit stopped by ``max_iter`` (tol is never reached)."""
    out = tmp_path_factory.mktemp(family) / "m.zarr"
    return make(family, max_iter=ITERS, tol=1e-14, executor=INPROCESS).fit(count_store, out=out)


# -- fitting --------------------------------------------------------------------------------------
def test_fit_sets_the_fitted_attributes(family, family_fit, count_store):
    assert family_fit.n_iter_ == ITERS == len(family_fit.elbo_) and family_fit.converged_ is False
    elbo = np.asarray(family_fit.elbo_)
    assert np.all(np.isfinite(elbo))
    if family in EXACT_BOUND:
        assert np.all(np.diff(elbo) >= -ROUNDOFF * np.abs(elbo[:-1])), np.diff(elbo)
    assert family_fit.W_.shape == family_fit.log_W_.shape == (count_store.n_users, K)
    assert family_fit.H_.shape == family_fit.log_H_.shape == (count_store.n_items, K)
    w, h = family_fit.W_.compute(), family_fit.H_.compute()
    assert np.all(w > 0) and np.all(h > 0) and np.all(np.isfinite(family_fit.log_W_.compute()))
    for name, shape in FAMILIES[family][2].items():
        assert np.shape(getattr(family_fit, name)) == shape, name
        assert np.all(np.isfinite(getattr(family_fit, name))), name
    assert [r["kept"] for r in family_fit.runs_] == [True]


def test_a_converged_fit_stops_before_max_iter(family, count_store):
    est = make(family, max_iter=100, tol=1e-2, executor=INPROCESS).fit(count_store)
    assert est.converged_ is True and est.n_iter_ == len(est.elbo_) < 100
    elbo, window = est.elbo_, 3 if est.optimizer == "squarem" else 1  # the documented rule
    assert mean_gain(elbo, window) < 1e-2 <= mean_gain(elbo[:-1], window)


def test_save_and_load_round_trip(family, family_fit, tmp_path):
    path = family_fit.save(tmp_path / "saved.zarr")
    loaded = CaviEstimator.load(path)
    assert type(loaded) is type(family_fit) and loaded.get_params() == family_fit.get_params()
    assert_same_fit(loaded, family_fit)
    assert type(family_fit).load(path).get_params() == family_fit.get_params()


def test_a_stopped_fit_resumes_to_the_uninterrupted_one(family, family_fit, count_store, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    keep = {"checkpoint_every": EVERY, "checkpoint_dir": ckpt, "executor": INPROCESS}
    first = make(family, max_iter=STOP, tol=1e-14, **keep)
    first.fit(count_store)
    assert first.n_iter_ == STOP and first.elbo_ == family_fit.elbo_[:STOP]
    seen: list[int] = []
    resumed = make(family, max_iter=ITERS, tol=1e-14, **keep)
    resumed.fit(count_store, resume=True, callback=lambda info: seen.append(info.iteration))
    assert seen == list(range(EVERY + 1, ITERS + 1))  # it went on from the checkpoint
    assert_same_fit(resumed, family_fit)


def test_restarts_keep_the_best_run(family, count_store):
    est = make(family, max_iter=3, n_init=2, executor=INPROCESS).fit(count_store)
    seed = est.get_params()["seed"]
    assert [r["seed"] for r in est.runs_] == [seed, seed + 1]
    kept = [r for r in est.runs_ if r["kept"]]
    assert len(kept) == 1 and kept[0]["elbo"] == max(r["elbo"] for r in est.runs_)
    assert est.elbo_[-1] == kept[0]["elbo"] and est.n_iter_ == kept[0]["n_iter"]
    assert est.runs_[0]["elbo"] != est.runs_[1]["elbo"]  # two different starts


# -- the parameter protocol -----------------------------------------------------------------------
def declared_defaults(klass: type) -> dict[str, Any]:
    """The default of each keyword the class's constructors declare (the nearest one wins)."""
    defaults: dict[str, Any] = {}
    for k in klass.__mro__:
        if "__init__" in vars(k) and issubclass(k, CaviEstimator):
            for p in inspect.signature(k.__init__).parameters.values():
                if p.default is not p.empty:
                    defaults.setdefault(p.name, p.default)
    return defaults


def test_params_are_the_constructor_keywords_with_their_defaults(family):
    klass = FAMILIES[family][0]
    params, declared = klass().get_params(), declared_defaults(klass)
    assert list(params) == list(inspect.signature(klass).parameters)  # each one, in order
    assert params == {name: declared[name] for name in params}
    assert klass().get_params(deep=False) == params  # no parameter is an estimator
    assert vars(klass()).keys() == params.keys()  # the constructor sets nothing else


def test_set_params_round_trip_and_unknown_names(family):
    est = make(family)
    before = est.get_params()
    changed = {"n_components": 5, "tol": 0.25, "max_iter": 17, "seed": 9}
    assert est.set_params(**changed) is est
    assert est.get_params() == {**before, **changed}
    for name, value in changed.items():  # each keyword is also the constructor's
        assert type(est)(**{name: value}).get_params()[name] == value
    with pytest.raises(ValueError, match="no_such_param"):
        est.set_params(tol=0.5, no_such_param=1)
    assert est.tol == 0.25  # nothing set by a refused call
    with pytest.raises(TypeError, match="no_such_param"):
        type(est)(no_such_param=1)


def test_a_parameter_of_another_model_is_refused():
    """PF is BePoF with approx fixed: approx is not one of its parameters, by keyword or by
    set_params, nor is DcPF's p one of OrdNMF's."""
    assert PF().approx is True and "approx" not in PF().get_params()  # PF's constant
    with pytest.raises(TypeError, match="approx"):
        PF(approx=False)
    with pytest.raises(ValueError, match="approx"):
        PF().set_params(approx=False)
    with pytest.raises(ValueError, match="'p'"):
        OrdNMF().set_params(p=0.5)


def sklearn_clone(est: CaviEstimator) -> CaviEstimator:
    """``sklearn.base.clone`` for an estimator without estimator parameters: the class built
    from deep copies of ``get_params(deep=False)``, whose constructor must keep each one as
    given (scikit-learn checks identity and raises otherwise)."""
    params = {name: copy.deepcopy(value) for name, value in est.get_params(deep=False).items()}
    new = type(est)(**params)
    for name, value in new.get_params(deep=False).items():
        assert value is params[name], name
    return new


def test_clone_is_unfitted_with_equal_params(family_fit):
    clone = sklearn_clone(family_fit)
    assert type(clone) is type(family_fit) and clone.get_params() == family_fit.get_params()
    assert fitted_state(family_fit) and not fitted_state(clone)
    assert not hasattr(clone, "model_path_")


def test_clone_keeps_unusual_values_as_given(family):
    """The constructor neither checks nor converts (fit does): a clone of any values is
    equal, even of values fit would refuse."""
    est = make(family, select_components=[4, 2], work_dir=Path("/w"), tol=-1, max_iter=2.5)
    assert sklearn_clone(est).get_params() == est.get_params()


def test_repr_names_the_class_and_its_params(family):
    est = make(family, tol=0.125)
    text = repr(est)
    assert text.startswith(f"{type(est).__name__}(") and "tol=0.125" in text
    for name, value in FAMILIES[family][1].items():
        assert f"{name}={value!r}" in text


# -- pickle: parameters, and a fitted model by reference to its directory -------------------------
def test_an_unfitted_estimator_pickles_to_equal_params(family):
    est = make(family, tol=0.125)
    back = pickle.loads(pickle.dumps(est))
    assert type(back) is type(est) and back.get_params() == est.get_params()
    assert vars(back) == vars(est)


def test_a_fitted_estimator_pickles_by_reference_to_its_model(family_fit, tmp_path):
    back = pickle.loads(pickle.dumps(family_fit))
    assert type(back) is type(family_fit) and back.get_params() == family_fit.get_params()
    assert back.model_path_ == family_fit.model_path_
    assert vars(back).keys() == vars(family_fit).keys()
    assert_same_fit(back, family_fit)
    kept = type(family_fit).load(family_fit.save(tmp_path / "kept.zarr"))
    data = pickle.dumps(kept)
    shutil.rmtree(kept.model_path_)
    with pytest.raises(StoreError, match="kept.zarr"):  # not factors read as zeros
        pickle.loads(data)
