"""Which Dask client a fit runs on: the given one, the current one, or a LocalCluster we own."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from distributed import Client, LocalCluster
from distributed.security import Security

log = logging.getLogger(__name__)


@contextmanager
def resolve_client(
    client: Client | None = None,
    n_workers: int = 2,
    *,
    threads_per_worker: int = 1,
    memory_limit: str | int | None = "auto",
    security: Security | None = None,
    host: str = "127.0.0.1",
    dashboard_address: str = "127.0.0.1:0",
) -> Iterator[Client]:
    """Yield ``client``; else the current client; else a LocalCluster of worker processes.

    A LocalCluster started here (``n_workers`` processes of ``threads_per_worker`` threads,
    scheduler and dashboard bound to ``host`` / ``dashboard_address``, loopback by default;
    TLS when ``security`` requires encryption) is closed on exit; a given or current client is
    left running.
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
        threads_per_worker=threads_per_worker,
        memory_limit="auto" if memory_limit is None else memory_limit,
        processes=True,
        host=host,
        dashboard_address=dashboard_address,
        security=security,
    ) as cluster, Client(cluster, security=security) as own:
        log.info(
            "started LocalCluster: %d workers x %d threads, scheduler %s, dashboard %s",
            n_workers, threads_per_worker, cluster.scheduler_address, own.dashboard_link,
        )
        yield own
