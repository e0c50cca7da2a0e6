"""Strips on a cluster of several workers read factor chunks through views made on the
chunks' workers (mean and geo only), not the chunks themselves."""

from __future__ import annotations

from typing import Any

from conftest import dense_split, store_from_dense, synthetic_ordinal
from dask.utils import key_split
from distributed import wait
from distributed.diagnostics.plugin import SchedulerPlugin

from ordnmf_dask.engine import cavi
from ordnmf_dask.engine.cavi import CaviConfig, CaviRunner
from ordnmf_dask.model.families import OrdinalFamily

STRIPS = {"local_strip", "row_correction_strip", "col_correction_strip"}


class Inputs(SchedulerPlugin):
    """Records the task names each strip task read, as it finishes."""

    name = "test-views-inputs"

    def __init__(self) -> None:
        self.seen: dict[str, list[str]] = {}
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        ts = self.scheduler.tasks.get(key)
        if finish == "memory" and ts is not None and key_split(key) in STRIPS:
            self.seen[str(key)] = sorted(key_split(d.key) for d in ts.dependencies)


def _seen(dask_scheduler: Any) -> dict[str, list[str]]:
    return dask_scheduler.plugins[Inputs.name].seen


def test_strips_read_views_of_the_factor_chunks(tmp_path, client, monkeypatch):
    """A task per strip (the graph whose keys name the strips; a worker's strips grouped in one
    task read the same views, tests/test_engine.py)."""
    monkeypatch.setattr(cavi, "ONE_TASK_PER_WORKER", False)
    y = synthetic_ordinal(30, 25, 4, seed=0)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 4, (3, 3))
    family = OrdinalFamily(tuple(store.hist_train.tolist()))
    runner = CaviRunner(client, store, family, CaviConfig(3), str(tmp_path), cache_blocks=True)
    client.register_plugin(Inputs())
    try:
        w, h = runner.random_init()
        params = family.init_params()
        sw, sh, small = runner._local_pass(w, h, params)
        corr = runner._row_corrections(params, h) + runner._col_corrections(params, w)
        ends = [x[0] if isinstance(x, tuple) else x for x in [*sw, *sh, small, *corr]]
        wait(ends)
        seen = client.run_on_scheduler(_seen)
    finally:
        client.unregister_scheduler_plugin(Inputs.name)
    assert {key_split(k) for k in seen} == STRIPS
    for inputs in seen.values():
        assert "pass_view" in inputs and "random_chunk" not in inputs
