"""A fit's malloc setting on every worker of a cluster, as a worker plugin; a module of its own,
imported only where a cluster is used, since it imports ``distributed``."""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ordnmf_dask.runtime.cluster import worker_malloc


class WorkerMalloc(WorkerPlugin):
    """Applies :func:`~ordnmf_dask.runtime.cluster.worker_malloc` with ``keep`` on each worker
    as it starts or joins."""

    name = "ordnmf-dask-malloc"

    def __init__(self, keep: bool) -> None:
        self.keep = keep

    def setup(self, worker: Any) -> None:
        worker_malloc(self.keep)


def set_worker_malloc(client: Any, keep: bool) -> None:
    """The malloc setting of a fit on ``client``'s workers (:func:`worker_malloc`), on every
    worker, those that join later (a lost one restarted) included: freed memory kept when its
    factors fit the workers' memory (``keep``), else returned."""
    client.register_plugin(WorkerMalloc(keep), name=WorkerMalloc.name)
