"""Top-N recommendations in raw ids, per user-block on the workers.

Scored and merged as :mod:`.topn` says (training items excluded, ties broken by the lower item
index). Only file names, row counts and (for given users) their n recommendations reach the
client: never a U x K or I x K matrix. All users' lists are written as Parquet by
:mod:`.export`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.modelstore.model import ModelInfo
from ordnmf_dask.postfit.executor import client_for
from ordnmf_dask.postfit.export import plan_export, write_export
from ordnmf_dask.postfit.topn import block_top, check_n, named_top, open_pair
from ordnmf_dask.store import idmap
from ordnmf_dask.store.blocks import StoreInfo
from ordnmf_dask.store.idmap import id_list

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Client


def recommend(
    store: str | os.PathLike | StoreInfo,
    model: Any,
    client: Client | None = None,
    *,
    n: int = 10,
    users: Sequence[Any] | None = None,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    n_workers: int | None = None,
    allow_other_store: bool = False,
    proba_at: int | None = None,
) -> str | dict[Any, list[tuple[Any, float]]]:
    """Top-``n`` items per user in raw ids, training items excluded, ranked by E[W] E[H]^T.

    Parameters
    ----------
    store : the store the model was fitted on (its id maps and training nonzeros).
    model : a model directory or a fitted estimator (its ``model_path_``).
    client : a ``distributed.Client``; default the current one, else in this process when the
        store is small (:func:`~ordnmf_dask.postfit.executor.client_for`), else a LocalCluster
        of ``n_workers`` processes, closed on return.
    n : list length (fewer for a user with fewer than n items outside its training set).
    users : raw user ids (ints or strings; coerced to the store's id type): recommend for
        these only. Unknown ids raise InputError naming them.
    out : with ``users=None``: where to write every user's list, as the ``recommendations``
        dataset of an export (:func:`ordnmf_dask.postfit.export.export`: Parquet parts
        ``OUT/recommendations/part-<r:05d>.parquet``, columns user, rank, item, score;
        complete or absent); a directory or an fsspec URL.
    overwrite : replace an existing ``out`` if it is an export.
    allow_other_store : use ``store`` even if the model was fitted on another store (by
        default an InputError: :func:`~ordnmf_dask.postfit.evaluate.check_compatible`).
    proba_at : with ``out``: the export's column ``proba`` (see
        :func:`ordnmf_dask.postfit.export.export`); for given users, the in-memory
        :meth:`~ordnmf_dask.estimator.CaviEstimator.recommend` gives it.

    Returns
    -------
    ``out`` (absolute path) for all users; for given users a dict
    ``{user id as given: [(raw item id, score), ...] best first}`` in the order given.

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import OrdNMF
    >>> model = OrdNMF(n_components=3, n_members=1, max_iter=20).fit(store)
    >>> from ordnmf_dask import recommend
    >>> top = recommend(store, model, n=3, users=[0, 1])  # raw ids, training items left out
    >>> sorted(top), [len(v) for v in top.values()]
    ([0, 1], [3, 3])
    """
    n = check_n(n)
    if (users is None) == (out is None):
        raise InputError("give either users (raw ids) or out (a directory for all users)")
    wanted = [] if users is None else id_list(users, "users")
    info, m = open_pair(store, model, allow_other_store)
    plan = None
    if out is None and proba_at is not None:
        raise InputError(
            "proba_at for given users is served in memory: OrdNMF.load(model).recommend(users, "
            "proba_at=s)"
        )
    if out is not None:  # every check before any cluster starts
        plan = plan_export(m, info, out, ["recommendations"], n, overwrite, proba_at=proba_at)
    with client_for(client, m, n_workers, info) as cl:
        if plan is None:
            with m.reading():
                return _for_users(cl, m, info, wanted, n)
        return write_export(cl, plan)


def _for_users(
    cl: Client, m: ModelInfo, info: StoreInfo, users: list[Any], n: int
) -> dict[Any, list[tuple[Any, float]]]:
    index = idmap.lookup(cl, info.path, "users", info.row_bounds.tolist(), users)
    rb = info.row_bounds
    wanted = np.unique(index)
    block_of = np.searchsorted(rb, wanted, side="right") - 1
    found: dict[int, list[tuple[Any, float]]] = {}
    jobs = []
    for r in np.unique(block_of).tolist():
        rows = wanted[block_of == r] - rb[r]
        top = block_top(cl, m, info, r, n, rows)
        jobs.append((wanted[block_of == r], cl.submit(named_top, top, info.path, pure=False)))
    for global_rows, fut in jobs:
        found.update(zip(global_rows.tolist(), fut.result(), strict=True))
    return {user: found[int(i)] for user, i in zip(users, index.tolist(), strict=True)}
