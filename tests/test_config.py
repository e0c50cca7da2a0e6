"""Job files: parsing and validation, flags over file, the resolved config saved with the model,
and `--scheduler-file` against real `dask scheduler` / `dask worker` processes."""

from __future__ import annotations

from pathlib import Path

import dask
import pytest
import zarr
from conftest import dense_split, store_from_dense, synthetic_ordinal
from daskprocs import dask_processes

from ordnmf_dask import OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.app.config import build, estimator_kwargs, flag_overrides
from ordnmf_dask.app.provenance import read_config
from ordnmf_dask.errors import ConfigError


@pytest.fixture
def store_20x15(tmp_path):
    y = synthetic_ordinal(20, 15, 3, seed=2)
    return store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (2, 2))


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_flags_override_only_what_was_given():
    raw = {
        "model": {"n_components": 4, "max_iter": 50, "seed": 1, "tol": 1},
        "cluster": {"scheduler": "tcp://10.0.0.1:8786"},
        "checkpoint": {"dir": "/scratch/ck", "every": 5, "minutes": 10},
    }
    flags = {"max_iter": 3, "seed": None, "approx": None, "workers": 1, "debug": True}
    cfg = build(raw, flag_overrides(flags), "job.toml")
    assert (cfg.model.max_iter, cfg.model.seed, cfg.model.n_components) == (3, 1, 4)
    assert cfg.model.tol == 1.0 and isinstance(cfg.model.tol, float)
    assert cfg.cluster.mode == "local" and cfg.cluster.local_spec.workers == 1  # flag wins
    assert cfg.logging.level == "DEBUG"
    kwargs, unused = estimator_kwargs(cfg, "DcPF")
    assert (kwargs["n_components"], kwargs["max_iter"], kwargs["seed"]) == (4, 3, 1)
    assert (kwargs["checkpoint_dir"], kwargs["checkpoint_every"]) == ("/scratch/ck", 5)
    assert "approx" not in kwargs and unused == []
    assert estimator_kwargs(build({"model": {"approx": True}}, {}, "job.toml"), "DcPF")[1] == [
        "model.approx"
    ]
    assert cfg.to_dict()["checkpoint"] == {"dir": "/scratch/ck", "every": 5, "minutes": 10.0}
    with pytest.raises(ConfigError, match="only one of"):
        build({}, flag_overrides({"scheduler": "tcp://a:1", "workers": 2}), "job.toml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[model]\nn_componets = 5\n", "unknown key 'n_componets' in [model]"),
        ("[modle]\nn_components = 5\n", "unknown section [modle]"),
        ("[model]\nn_components = '5'\n", "key 'n_components' in [model] must be an integer"),
        ("[model]\napprox = 1\n", "key 'approx' in [model] must be a boolean"),
        ("[cluster]\nlocal = {workers = 2, memory = '4GB'}\n", "'local.memory' in [cluster]"),
        ("[cluster]\nlocal = {workers = 'two'}\n", "'local.workers' in [cluster] must be an"),
        ("[cluster]\nscheduler = 'tcp://a:1'\nscheduler_file = 's.json'\n", "only one of"),
        ("[checkpoint]\nminutes = 'often'\n", "'minutes' in [checkpoint] must be a finite"),
        ("[logging]\nlevel = 'LOUD'\n", "'level' in [logging] must be one of"),
        ("[model\n", "not a valid TOML file"),
    ],
)
def test_bad_config_exits_2_naming_file_and_key(tmp_path, store_20x15, capsys, text, message):
    job = write(tmp_path / "job.toml", text)
    code = main(
        [
            "fit",
            "--n-members",
            "1",
            store_20x15.path,
            "--out",
            str(tmp_path / "m.zarr"),
            "--config",
            job,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert job in err and message in err and "Traceback" not in err
    assert not (tmp_path / "m.zarr").exists()


def test_missing_required_values_exit_2(tmp_path, store_20x15, capsys):
    job = write(tmp_path / "job.toml", "[model]\nn_components = 2\n")
    assert (
        main(["fit", "--n-members", "1", "--config", job, "--out", str(tmp_path / "m.zarr")]) == 2
    )
    assert f"missing STORE (or set it in {job})" in capsys.readouterr().err
    assert main(["fit", "--n-members", "1", store_20x15.path, "-k", "2"]) == 2
    assert "missing --out MODEL" in capsys.readouterr().err


@pytest.mark.cluster
def test_fit_from_file_with_flags_and_resolved_config_in_model(tmp_path, store_20x15):
    model = tmp_path / "m.zarr"
    job = write(
        tmp_path / "job.toml",
        f"""
[store]
path = "{store_20x15.path}"
[model]
n_components = 2
max_iter = 40
seed = 7
tol = 1e-12
[cluster]
local = {{workers = 1, threads_per_worker = 1, memory_limit = "1GB"}}
[checkpoint]
dir = "{tmp_path / "ck"}"
every = 5
[output]
model = "{model}"
[logging]
level = "warning"
file = "{tmp_path / "fit.log"}"
""",
    )
    assert main(["fit", "--n-members", "1", "--config", job, "--max-iter", "4", "--seed", "3"]) == 0
    fitted = OrdNMF.load(model)
    assert fitted.n_iter_ == 4 and fitted.seed == 3
    # a model saved before the seed was renamed (and n_workers dropped) still loads
    attrs = zarr.open_group(model, mode="r+").attrs
    saved = {("random_state" if k == "seed" else k): v for k, v in attrs["params"].items()}
    attrs["params"] = {**saved, "n_workers": 1}
    assert OrdNMF.load(model).get_params() == fitted.get_params()
    resolved = read_config(model)
    assert resolved["source"] == job
    assert resolved["model"]["max_iter"] == 4 and resolved["model"]["seed"] == 3
    assert resolved["model"]["n_components"] == 2 and resolved["model"]["tol"] == 1e-12
    assert resolved["cluster"]["local"]["memory_limit"] == "1GB"
    assert resolved["checkpoint"]["every"] == 5
    assert resolved["logging"] == {"level": "WARNING", "file": str(tmp_path / "fit.log")}
    assert (tmp_path / "fit.log").exists()
    # the output exists now: refused unless overwrite is given (flag or file)
    assert main(["fit", "--n-members", "1", "--config", job, "--max-iter", "4"]) == 2


@pytest.mark.cluster  # a `dask scheduler` and worker process
def test_scheduler_file(tmp_path, store_20x15):
    """A fit on the scheduler a scheduler file names is the fit in this process, bit for bit
    (in-process == cluster: tests/test_inprocess.py)."""
    sched_file = tmp_path / "scheduler.json"
    with dask_processes(sched_file, 1):
        assert (
            main(
                [
                    "fit",
                    "--n-members",
                    "1",
                    store_20x15.path,
                    "--out",
                    str(tmp_path / "m.zarr"),
                    "-k",
                    "2",
                    "--max-iter",
                    "6",
                    "--seed",
                    "1",
                    "--scheduler-file",
                    str(sched_file),
                ]
            )
            == 0
        )
    local = OrdNMF(2, max_iter=6, seed=1, executor="inprocess", n_members=1).fit(store_20x15)
    remote = OrdNMF.load(tmp_path / "m.zarr")
    assert remote.elbo_ == local.elbo_
    assert read_config(tmp_path / "m.zarr")["cluster"]["scheduler_file"] == str(sched_file)


def test_missing_scheduler_file_times_out_with_exit_3(tmp_path, store_20x15, capsys):
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        code = main(
            [
                "fit",
                "--n-members",
                "1",
                store_20x15.path,
                "--out",
                str(tmp_path / "m.zarr"),
                "-k",
                "2",
                "--scheduler-file",
                str(tmp_path / "none.json"),
            ]
        )
    assert code == 3
    assert "none.json did not appear within 1s" in capsys.readouterr().err
