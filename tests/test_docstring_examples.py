"""Every public name of the package shows an example in its docstring, and each example runs as
shown (doctest, in a fresh working directory): the API pages of the site cannot show code
that no longer works."""

from __future__ import annotations

import doctest
import inspect

import pytest

import ordnmf_dask
from ordnmf_dask import datasets

PUBLIC = {name: getattr(ordnmf_dask, name) for name in ordnmf_dask.__all__} | {
    name: getattr(datasets, name) for name in ("fetch_movielens_small", "cache_dir")
}
# what an example needs beyond this process: a LocalCluster, the shipped MovieLens copy
MARKS = {"tune": pytest.mark.cluster, "fetch_movielens_small": pytest.mark.data}


def test_every_public_name_has_an_examples_section():
    missing = [
        name
        for name, obj in PUBLIC.items()
        if "Examples\n--------\n>>> " not in (inspect.getdoc(obj) or "")
    ]
    assert missing == []


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=MARKS[n]) if n in MARKS else n for n in PUBLIC]
)
def test_example_runs_as_shown(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write their stores and models here
    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(PUBLIC[name], name, globs={})
    assert test.examples, name
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, out=out.append)
    assert runner.failures == 0, "".join(out)
