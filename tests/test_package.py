"""The package imports lazily (fast ``ordnmf-dask --help``) with the same public names."""

from __future__ import annotations

import subprocess
import sys
import types

HEAVY = ("dask", "distributed", "scipy", "zarr", "numba", "numpy")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout  # fmt: skip


def test_import_and_help_load_no_heavy_dependency():
    out = _run(
        "import sys, contextlib, io\n"
        "import ordnmf_dask, ordnmf_dask.io\n"
        "from ordnmf_dask.cli import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['synth', '--help'])\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    assert out.strip() == "[]"


def test_public_names_are_the_submodule_objects():
    import importlib

    import ordnmf_dask
    from ordnmf_dask import estimator, foldin, ppc, recommendations
    from ordnmf_dask import io as io_pkg
    from ordnmf_dask.io import ingest as ingest_fn
    from ordnmf_dask.io import store

    evaluate_mod = importlib.import_module("ordnmf_dask.evaluate")
    ingest_mod = importlib.import_module("ordnmf_dask.io.ingest")
    expected = {
        "OrdNMF": estimator.OrdNMF, "PF": estimator.PF, "BePoF": estimator.BePoF,
        "DcPF": estimator.DcPF, "StoreInfo": store.StoreInfo, "evaluate": evaluate_mod.evaluate,
        "fold_in": foldin.fold_in, "recommend_for": foldin.recommend_for,
        "ingest": ingest_mod.ingest, "ingest_arrays": ingest_mod.ingest_arrays,
        "open_store": store.open_store, "posterior_predictive": ppc.posterior_predictive,
        "recommend": recommendations.recommend,
    }  # fmt: skip
    assert set(expected) == set(ordnmf_dask.__all__) <= set(dir(ordnmf_dask))
    for name, obj in expected.items():
        assert getattr(ordnmf_dask, name) is obj, name
    # functions named like their own submodule stay functions once the submodule is loaded
    assert isinstance(ordnmf_dask.evaluate, types.FunctionType)
    assert ingest_fn is io_pkg.ingest and isinstance(io_pkg.ingest, types.FunctionType)
    assert io_pkg.read_block is store.read_block and io_pkg.Block is store.Block


def test_submodule_imported_first_does_not_shadow_the_function():
    out = _run(
        "import types\n"
        "import ordnmf_dask.io.ooc, ordnmf_dask.evaluate\n"  # internal imports come first
        "import ordnmf_dask, ordnmf_dask.io as io\n"
        "print(isinstance(ordnmf_dask.evaluate, types.FunctionType),\n"
        "      isinstance(io.ingest, types.FunctionType))\n"
    )
    assert out.split() == ["True", "True"]
