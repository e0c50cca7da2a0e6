"""The functional core of a fit (ordnmf_dask/fitting.py): plan_fit checks without writing,
run_fit fits, and an estimator's fit is the core's fit; synth's plan writes nothing either."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import dense_split, store_from_dense, synthetic_ordinal

from ordnmf_dask import InputError
from ordnmf_dask.datasets.synth import plan_synth, write_synth
from ordnmf_dask.estimator import DcPF, OrdNMF
from ordnmf_dask.fitting import fit, plan_fit, resolve_params, run_fit
from ordnmf_dask.params import DEFAULTS

SETTINGS = {
    "n_components": 2,
    "n_members": 1,
    "max_iter": 4,
    "executor": "inprocess",
    "validation_every": 0,
}


@pytest.fixture
def store(tmp_path):
    y = synthetic_ordinal(20, 15, 3, seed=5)
    return store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (2, 2))


def test_the_core_fit_is_the_estimator_fit_bitwise(tmp_path, store):
    """The function and the estimator give one model: same factors, same attributes."""
    a = fit(store.path, "DcPF", {**SETTINGS, "p": 0.3}, out=tmp_path / "a.zarr")
    b = DcPF(**SETTINGS, p=0.3).fit(store.path, out=tmp_path / "b.zarr")
    assert a.attrs["model"] == "DcPF" and a.attrs["params"] == b._model.attrs["params"]
    assert a.attrs["elbo"] == b.elbo_ and a.attrs["p"] == b.p_
    for name in ("W", "H"):
        for field in ("mean", "log_mean"):
            assert np.array_equal(a.factor(name, field).compute(), b._factor(name, field).compute())


def test_a_plan_writes_nothing_and_the_run_saves_where_it_said(tmp_path, store):
    out, ckpt = tmp_path / "m.zarr", tmp_path / "ck"
    plan = plan_fit(store.path, "OrdNMF", {**SETTINGS, "checkpoint_dir": str(ckpt)}, out=out)
    assert not out.exists() and not ckpt.exists()
    assert plan.out == os.fspath(out) and plan.settings.model.alpha_W == DEFAULTS["alpha_W"]
    model = run_fit(plan)
    assert model.path == plan.out and model.attrs["n_iter"] == 4


def test_a_plan_refuses_what_the_fit_would_refuse_before_any_work(tmp_path, store):
    with pytest.raises(InputError, match="OrdNMF has no parameter 'p'"):
        plan_fit(store.path, "OrdNMF", {"p": 0.5})
    with pytest.raises(InputError, match="K \\(n_components\\) = 16 is larger"):
        plan_fit(store.path, "OrdNMF", {**SETTINGS, "n_components": 16})
    OrdNMF(**SETTINGS).fit(store.path, out=tmp_path / "m.zarr")
    with pytest.raises(InputError, match="exists"):  # the model is not replaced unasked
        plan_fit(store.path, "OrdNMF", SETTINGS, out=tmp_path / "m.zarr")


def test_parameters_not_given_take_the_table_defaults():
    cfg, values = resolve_params("PF", {"n_components": 3})
    assert cfg.n_components == 3 and cfg.tol == DEFAULTS["tol"]
    assert "approx" not in values.values() and values.model.approx is None
    assert values.model.threshold == DEFAULTS["threshold"] == values.value("threshold")


def test_a_synth_plan_writes_nothing(tmp_path):
    plan = plan_synth(tmp_path / "s.zarr", 40, 30, 300, 2, 3, seed=1)
    assert not (tmp_path / "s.zarr").exists()
    info = write_synth(plan)
    assert info.n_users == 40 and info.attrs["synth"]["seed"] == 1
    with pytest.raises(InputError):
        plan_synth(tmp_path / "s.zarr", 40, 30, 300, 2, 3)  # exists, no overwrite
