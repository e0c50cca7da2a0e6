"""Dask measures the dataclasses of arrays that tasks return by the arrays they hold."""

from __future__ import annotations

import numpy as np
from conftest import dense_split, store_from_dense, synthetic_ordinal
from dask.sizeof import sizeof
from distributed import wait

from ordnmf_dask.engine.cavi import CaviConfig, CaviRunner
from ordnmf_dask.model.families import OrdinalFamily
from ordnmf_dask.model.foldin_rows import FoldIn
from ordnmf_dask.model.kernels import CsrBlock, LocalStats, RowStats
from ordnmf_dask.model.updates import FactorChunk


def test_sizeof_counts_the_arrays():
    a, b = np.ones((300, 7)), np.ones((40, 7))
    small = np.zeros(13)
    block = CsrBlock(
        np.zeros(301, np.int64), np.zeros(900, np.int32), np.ones(900, np.uint8), (300, 40)
    )
    cases = [
        (FactorChunk(a, a.copy(), a.copy(), np.ones((300, 1)), 1.0), 3 * a.nbytes + 2400),
        (FactorChunk(a, b), a.nbytes + b.nbytes),
        (LocalStats(a, b, small), a.nbytes + b.nbytes + small.nbytes),
        (RowStats(a, (b, b, b), small), a.nbytes + 3 * b.nbytes + small.nbytes),
        (block, 301 * 8 + 900 * 5),
        (
            FoldIn(a, a, a, a, np.ones((300, 1)), np.ones(300, int), np.ones(300, bool)),
            4 * a.nbytes + 2400 + 2400 + 300,
        ),
    ]
    for obj, arrays in cases:
        assert arrays <= sizeof(obj) < arrays + 1000, type(obj).__name__


def test_scheduler_knows_the_size_of_factor_chunks(tmp_path, client):
    """What the scheduler records for a W chunk (used for task placement, stealing and the
    workers' managed memory) covers its (n, K) arrays."""
    y = synthetic_ordinal(30, 20, 3, seed=1)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (2, 1))
    family = OrdinalFamily(tuple(store.hist_train.tolist()))
    runner = CaviRunner(
        client, store, family, CaviConfig(4, max_iter=1), str(tmp_path), cache_blocks=True
    )
    w, _ = runner.random_init()
    wait(w)
    keys = [f.key for f in w]
    nbytes = client.run_on_scheduler(
        lambda dask_scheduler: [dask_scheduler.tasks[k].nbytes for k in keys]
    )
    rows = np.diff(store.row_bounds)
    for n, n_rows in zip(nbytes, rows, strict=True):
        assert n >= n_rows * 4 * 8  # at least E[W] (the initial draws are also exp(E[log W]))
