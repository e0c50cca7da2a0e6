"""The package imports lazily (fast ``ordnmf-dask --help``) with the same public names."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("dask", "distributed", "scipy", "zarr", "numba", "numpy")


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout


def test_import_and_help_load_no_heavy_dependency():
    out = _run(
        "import sys, contextlib, io\n"
        "import ordnmf_dask, ordnmf_dask.sources\n"
        "from ordnmf_dask.app.cli import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['synth', '--help'])\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    assert out.strip() == "[]"


def test_public_names_are_the_submodule_objects():
    import ordnmf_dask
    from ordnmf_dask import errors, estimator
    from ordnmf_dask.postfit import evaluate, export, foldin, pairs, ppc, recommend
    from ordnmf_dask.sources import ingest
    from ordnmf_dask.store import blocks
    from ordnmf_dask.tuning import schedule, search

    expected = {
        "OrdNMF": estimator.OrdNMF,
        "PF": estimator.PF,
        "BePoF": estimator.BePoF,
        "DcPF": estimator.DcPF,
        "StoreInfo": blocks.StoreInfo,
        "evaluate": evaluate.evaluate,
        "fold_in": foldin.fold_in,
        "recommend_for": foldin.recommend_for,
        "ingest": ingest.ingest,
        "ingest_arrays": ingest.ingest_arrays,
        "ingest_distributed": ingest.ingest_distributed,
        "open_store": blocks.open_store,
        "read_block": blocks.read_block,
        "posterior_predictive": ppc.posterior_predictive,
        "predict_pairs": pairs.predict_pairs,
        "recommend": recommend.recommend,
        "InputError": errors.InputError,
        "StoreError": errors.StoreError,
        "export": export.export,
        "tune": search.tune,
        "LogUniform": schedule.LogUniform,
    }
    assert set(expected) == set(ordnmf_dask.__all__) <= set(dir(ordnmf_dask))
    for name, obj in expected.items():
        assert getattr(ordnmf_dask, name) is obj, name


def test_public_functions_stay_functions_after_internal_imports():
    out = _run(
        "import types\n"
        "import ordnmf_dask.sources.ingest, ordnmf_dask.postfit.evaluate\n"
        "import ordnmf_dask\n"
        "print(isinstance(ordnmf_dask.evaluate, types.FunctionType),\n"
        "      isinstance(ordnmf_dask.ingest, types.FunctionType))\n"
    )
    assert out.split() == ["True", "True"]


def test_python_dash_m_runs_the_command():
    """``python -m ordnmf_dask ARGS`` is the ``ordnmf-dask`` command: same version line, and a
    usage error gets the command's exit code 2."""
    done = subprocess.run(
        [sys.executable, "-m", "ordnmf_dask", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.startswith("ordnmf-dask "), done.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "ordnmf_dask", "fit", "--n-members", "1", "--no-such-flag"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "ordnmf-dask: error:" in bad.stderr, bad.stderr
