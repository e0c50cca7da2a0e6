"""Where a computation on a fitted model runs: the executor a fit of its store would get."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ordnmf_dask.modelstore.model import ModelInfo
from ordnmf_dask.runtime.cluster import choose_client
from ordnmf_dask.store.blocks import StoreInfo

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Client


@dataclass(frozen=True)
class _Sizes:
    """What decides where a computation on a model runs, as the model records its store."""

    n_users: int
    n_items: int
    nnz_train: int
    grid: tuple[int, int]


@contextmanager
def client_for(
    client: Client | None, m: ModelInfo, n_workers: int | None, info: StoreInfo | None = None
) -> Iterator[Any]:
    """The client a computation on model ``m`` (and store ``info``) runs on: ``client`` if
    given, else as a fit of the model's store would run
    (:func:`~ordnmf_dask.runtime.cluster.choose_client`): in-process when small, no cluster
    started; else the current client or a LocalCluster of ``n_workers``."""
    h = m.header
    sizes = (
        info
        if info is not None
        else _Sizes(h.store.n_users, h.store.n_items, h.store.nnz_train, h.n_blocks)
    )
    with choose_client(client, sizes, h.width, n_workers=n_workers) as cl:
        yield cl
