"""Every public name of the package, and every public method and property of the estimators,
shows an example in its docstring, and each example runs as shown (doctest, in a fresh working
directory): the API pages of the site cannot show code that no longer works. A method's
example continues the class's: it uses the ``store`` and ``model`` of :class:`OrdNMF`'s."""

from __future__ import annotations

import doctest
import inspect

import pytest

import ordnmf_dask
from ordnmf_dask import OrdNMF, datasets
from ordnmf_dask.datasets.synth import synth

PUBLIC = {name: getattr(ordnmf_dask, name) for name in ordnmf_dask.__all__} | {
    name: getattr(datasets, name) for name in ("fetch_movielens_small", "cache_dir")
}
# what an example needs beyond this process: a LocalCluster, the shipped MovieLens copy
MARKS = {"tune": pytest.mark.cluster, "fetch_movielens_small": pytest.mark.data}
# the estimators' own API: what scikit-learn's protocol and the serving methods add
METHODS = {
    name: member
    for name, member in vars(ordnmf_dask.estimator.CaviEstimator).items()
    if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
} | {"load": vars(ordnmf_dask.estimator.CaviEstimator)["load"].__func__}


def test_every_public_name_and_method_has_an_examples_section():
    missing = [
        name
        for name, obj in (PUBLIC | METHODS).items()
        if "Examples\n--------\n>>> " not in (inspect.getdoc(obj) or "")
    ]
    assert missing == []


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=MARKS[n]) if n in MARKS else n for n in PUBLIC]
)
def test_example_runs_as_shown(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write their stores and models here
    _run(PUBLIC[name], name, {})


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """The ``store`` and ``model`` of the class example of :class:`OrdNMF`."""
    store = synth(tmp_path_factory.mktemp("class") / "ratings.zarr", 200, 100, 4000, 3, seed=0)
    return store, OrdNMF(n_components=3, n_members=2, max_iter=30).fit(store)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_example_runs_as_shown(name, fitted, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store, model = fitted
    member = METHODS[name]
    target = member.fget if isinstance(member, property) else member
    _run(target, name, {"OrdNMF": OrdNMF, "store": store, "model": model})


def _run(obj: object, name: str, globs: dict) -> None:
    """Run the examples of ``obj``'s docstring with ``globs``; fail with doctest's report."""
    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(obj, name, globs=globs)
    assert test.examples, name
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, out=out.append)
    assert runner.failures == 0, "".join(out)
