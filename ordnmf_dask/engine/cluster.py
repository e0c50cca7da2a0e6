"""Which Dask client a fit runs on: the given one, the current one, or a LocalCluster we own."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from distributed import Client, LocalCluster

log = logging.getLogger(__name__)


@contextmanager
def resolve_client(client: Client | None = None, n_workers: int = 2) -> Iterator[Client]:
    """Yield ``client``; else the current client; else a LocalCluster of worker processes.

    A LocalCluster started here (``n_workers`` single-threaded processes, bound to localhost)
    is closed on exit; a given or current client is left running.
    """
    if client is not None:
        yield client
        return
    try:
        yield Client.current()
        return
    except ValueError:
        pass
    with LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    ) as cluster, Client(cluster) as own:
        log.info("started LocalCluster: %d workers, dashboard %s", n_workers, own.dashboard_link)
        yield own
