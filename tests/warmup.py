"""Fills numba's cache before the test processes start: a small synthetic store, fits of
OrdNMF (the default ensemble) and dcPF in this process, evaluation, a batch of recommendations
(600 x 500 scores: the compiled screen) and class probabilities compile the package's kernels
once. With an empty cache (a fresh clone) the test processes, their command-line subprocesses
and their cluster workers would otherwise compile the same kernels side by side
(docs/guide/testing.md). Run by tests/conftest.py as a subprocess, its argument the directory to
work in."""

from __future__ import annotations

import sys
from pathlib import Path

from ordnmf_dask import DcPF, OrdNMF, evaluate
from ordnmf_dask.datasets.synth import synth


def main(work: Path) -> None:
    store = synth(work / "store.zarr", 600, 500, 6000, 3).path
    model = OrdNMF(3, max_iter=2, seed=0).fit(store, show_progress=False)
    users = model._server().users.raw(list(range(600)))
    model.recommend(users, 5)
    items = model._server().items.raw([0, 1, 2, 3])
    for posterior in ("mean", "gamma"):
        model.predict_proba(users[:4], items, posterior=posterior)
    evaluate(store, model.save(work / "model.zarr"))
    DcPF(3, max_iter=2, seed=0).fit(store, show_progress=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
