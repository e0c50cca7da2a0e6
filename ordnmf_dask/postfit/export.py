"""Export of a fitted model to partitioned Parquet, locally or at any fsspec URL (``s3://``, ...).

Three datasets, each a directory of ``part-<b:05d>.parquet`` files, one per block, written by the
workers: ``user_factors`` and ``item_factors`` (raw ``id``, then E[w] or E[h] as ``f0 ..
f{K-1}``) and ``recommendations`` (``user``, ``rank``, ``item``, ``score``: the top-N of
:mod:`.topn`). The layout is in docs/model-format.md ("Export").

An export is complete or absent: ``_SUCCESS`` (a JSON manifest of every part and its rows) is
written last. A local export is written to ``OUT.tmp-<random>`` and renamed into place; object
stores cannot rename, so there the parts go to their final names between a ``_PENDING`` marker
written first (listing every part it will write) and the manifest; a failed export removes them
(an interrupted one keeps the marker while a part may still be written, so that the prefix stays
recognisably ours). Only an export (complete, or marked pending) is ever replaced, and only the
files its manifest or marker lists are removed. The marks are those of stores and models at URLs
(:class:`ordnmf_dask.store.locations.Place`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zarr
from fsspec.implementations.local import LocalFileSystem

from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import ModelInfo, open_model
from ordnmf_dask.postfit.classes import ClassLaw, law_of, top_at_least
from ordnmf_dask.postfit.executor import client_for
from ordnmf_dask.postfit.topn import block_top, check_n, open_pair
from ordnmf_dask.runtime.inprocess import wait
from ordnmf_dask.runtime.progress import track
from ordnmf_dask.store import idmap
from ordnmf_dask.store.blocks import (
    AXES,
    StoreInfo,
    check_target,
    discard_temporary,
    publish,
    temporary_path,
)
from ordnmf_dask.store.kinds import EXPORT, MANIFEST, export_listing
from ordnmf_dask.store.locations import PENDING, Place
from ordnmf_dask.store.outputs import check_place

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Client, Future

EXPORT_FORMAT = 1
WHAT = ("factors", "recommendations")
FACTORS = {"user_factors": ("W", "users"), "item_factors": ("H", "items")}  # dataset -> source
RECOMMENDATIONS = "recommendations"
SLAB = 1 << 16  # rows per Parquet row group (ids are read per slab, so memory stays bounded)


def part_name(dataset: str, block: int) -> str:
    """Path of a part file relative to the export's root."""
    return f"{dataset}/part-{block:05d}.parquet"


def id_type(ids_root: str, axis: str) -> pa.DataType:
    """Arrow type of the raw ids of ``axis``: int64, or string."""
    kind = zarr.open_array(f"{ids_root}/{axis}/ids", mode="r").dtype.kind
    return pa.int64() if kind in "iu" else pa.string()


def factor_schema(ids: pa.DataType, k: int) -> pa.Schema:
    """``id`` then one float64 column ``f<j>`` per component."""
    return pa.schema(
        [pa.field("id", ids, nullable=False)]
        + [pa.field(f"f{j}", pa.float64(), nullable=False) for j in range(k)]
    )


def recommendation_schema(users: pa.DataType, items: pa.DataType, proba: bool = False) -> pa.Schema:
    """``user``, ``rank``, ``item``, ``score`` (and with ``proba``, ``proba``: P(y >= s | y >
    0) of the pair at the export's ``proba_at`` s)."""
    return pa.schema(
        [
            pa.field("user", users, nullable=False),
            pa.field("rank", pa.int32(), nullable=False),
            pa.field("item", items, nullable=False),
            pa.field("score", pa.float64(), nullable=False),
        ]
        + ([pa.field("proba", pa.float64(), nullable=False)] if proba else [])
    )


def factor_part(
    model: str,
    ids_root: str,
    name: str,
    index: int,
    start: int,
    schema: pa.Schema,
    fs: fsspec.AbstractFileSystem,
    path: str,
) -> int:
    """Write E[.] of chunk ``index`` of factor ``name`` ("W" or "H"), whose first row is index
    ``start``, with its raw ids, as the Parquet file ``path``; on a worker. Returns its rows."""
    mean = chunkstore.read_field(model, name, index, "mean")
    axis = FACTORS["user_factors" if name == "W" else "item_factors"][1]
    with fs.open(path, "wb") as fh, pq.ParquetWriter(fh, schema) as writer:
        for lo in range(0, max(len(mean), 1), SLAB):
            hi = min(len(mean), lo + SLAB)
            ids = pa.array(idmap.ids_slice(ids_root, axis, start + lo, start + hi), schema[0].type)
            writer.write_table(
                pa.Table.from_arrays(
                    [ids, *(pa.array(mean[lo:hi, j]) for j in range(mean.shape[1]))], schema=schema
                )
            )
    return len(mean)


def recommendation_part(
    top: tuple[np.ndarray, ...],
    ids_root: str,
    start: int,
    schema: pa.Schema,
    fs: fsspec.AbstractFileSystem,
    path: str,
) -> int:
    """Write the top-n ``(scores, items)`` of the users ``start ..`` (one row each, best first,
    excluded slots -inf at the end) as rows (user, rank, item, score) of the Parquet file
    ``path``, with a third array of ``top`` as the column ``proba``; on a worker. A user with
    no item left has no row. Returns the rows written."""
    scores, items = top[:2]
    count = 0
    with fs.open(path, "wb") as fh, pq.ParquetWriter(fh, schema) as writer:
        for lo in range(0, max(len(scores), 1), SLAB):
            hi = min(len(scores), lo + SLAB)
            keep = np.isfinite(scores[lo:hi])
            users = idmap.ids_slice(ids_root, "users", start + lo, start + hi)
            per_user = keep.sum(axis=1)
            writer.write_table(
                pa.Table.from_arrays(
                    [
                        pa.array(users, schema[0].type).take(
                            np.repeat(np.arange(hi - lo), per_user)
                        ),
                        pa.array(np.nonzero(keep)[1].astype(np.int32) + 1),
                        pa.array(
                            idmap.ids_at(ids_root, "items", items[lo:hi][keep]), schema[2].type
                        ),
                        pa.array(scores[lo:hi][keep]),
                        *(pa.array(extra[lo:hi][keep]) for extra in top[2:]),
                    ],
                    schema=schema,
                )
            )
            count += int(per_user.sum())
    return count


# ------------------------------------------------------------------------------ the target


@dataclass(frozen=True)
class Target:
    """Where an export goes: a filesystem, the root path on it, the name to report, and whether
    an existing export there may be replaced."""

    fs: fsspec.AbstractFileSystem
    root: str
    url: str
    overwrite: bool

    @property
    def local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def marker(self, root: str, name: str) -> dict[str, Any] | None:
        """The JSON marker ``name`` under ``root`` if it is one of ours, else None."""
        return Place(self.fs, root, self.url).marker(name, EXPORT)

    def is_export(self, root: str) -> bool:
        """Whether ``root`` holds an export (complete, or pending at a URL)."""
        return any(self.marker(root, m) is not None for m in (MANIFEST, PENDING))

    def check_local(self, path: str) -> str:
        """``path`` (local) after checking it may be written: new, or an export we may replace."""
        return check_target(
            path, self.overwrite, "Parquet export written by ordnmf_dask", self.is_export, EXPORT
        )


def open_target(
    out: str | os.PathLike,
    overwrite: bool,
    storage_options: dict[str, Any] | None,
    inputs: Mapping[str, str] | None = None,
) -> Target:
    """The export's target, after checking it may be (over)written (InputError if not): a new
    path, or with ``overwrite`` an export; never one of ``inputs`` (label -> path), inside one
    or containing one (:func:`ordnmf_dask.store.outputs.check_place`)."""
    text = os.fspath(out)
    fs, root = fsspec.core.url_to_fs(text, **(storage_options or {}))
    target = Target(fs, root.rstrip("/"), text, overwrite)
    if target.local:
        path = check_place(root, "the export", EXPORT, inputs)
        path = target.check_local(path)
        return Target(fs, path, path, overwrite)
    fs.invalidate_cache()
    if fs.exists(target.root):
        if not overwrite:
            raise InputError(f"{text} already exists; pass overwrite=True to replace it")
        if not target.is_export(target.root):
            raise InputError(
                f"refusing to overwrite {text}: it is not a Parquet export written by ordnmf_dask"
            )
    return target


# ------------------------------------------------------------------------------ the export


def export(
    model: Any,
    out: str | os.PathLike,
    *,
    what: Sequence[str] = WHAT,
    n: int = 10,
    store: str | os.PathLike | StoreInfo | None = None,
    client: Client | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    n_workers: int | None = None,
    allow_other_store: bool = False,
    proba_at: int | None = None,
) -> str:
    """Export a model as partitioned Parquet to a local directory or a URL.

    Parameters
    ----------
    model : a model directory or a fitted estimator (its ``model_path_``).
    out : a directory or an fsspec URL (``s3://bucket/prefix``, ...); credentials and options
        as fsspec finds them, or ``storage_options``.
    what : any of "factors" (``user_factors``, ``item_factors``) and "recommendations".
    n : recommendations per user (fewer for a user with fewer items outside its training set).
    store : recommendations only: the training store (its training nonzeros are excluded);
        default the model's own index of them, or for a model saved without one the store the
        model records.
    client : a ``distributed.Client``; default the current one, else in this process when the
        model is small (:func:`~ordnmf_dask.postfit.executor.client_for`), else a
        LocalCluster of ``n_workers`` processes, closed on return.
    overwrite : replace ``out`` if it is an export (nothing else is ever replaced).
    allow_other_store : use ``store`` even if the model was fitted on another store (by
        default an InputError: :func:`~ordnmf_dask.postfit.evaluate.check_compatible`).
    proba_at : a class s in 1..V: recommendations get a column ``proba``, P(y >= s | y > 0)
        of the pair (the plug-in law, which rises with the score: docs/design.md, "Class
        probabilities").

    Returns
    -------
    ``out`` (an absolute path when local).

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import OrdNMF
    >>> model = OrdNMF(n_components=3, n_members=1, max_iter=20).fit(store)
    >>> from pathlib import Path
    >>> from ordnmf_dask import export
    >>> _ = export(model, "exp", what=("factors",))  # partitioned Parquet, raw ids
    >>> sorted(p.name for p in Path("exp").iterdir())
    ['_SUCCESS', 'item_factors', 'user_factors']
    """
    if isinstance(what, str) or not what or any(w not in WHAT for w in what):
        raise InputError(f"what must be a list of some of {', '.join(WHAT)}, got {what!r}")
    m = open_model(os.fspath(getattr(model, "model_path_", model)))
    info = None
    if RECOMMENDATIONS in what:
        info = training_store(m, store, allow_other_store)
    plan = plan_export(m, info, out, what, n, overwrite, storage_options, proba_at)
    with client_for(client, m, n_workers, info) as cl:
        return write_export(cl, plan)


def training_store(
    m: ModelInfo, store: str | os.PathLike | StoreInfo | None, allow_other_store: bool = False
) -> StoreInfo | None:
    """The store whose training items recommendations leave out: ``store`` if given (checked
    to match the model unless ``allow_other_store``), else none when the model holds its own
    index of them, else the store the model records (StoreError saying what to pass when it
    cannot be read)."""
    if store is not None:
        return open_pair(store, m.path, allow_other_store)[0]
    if m.has_seen:
        return None
    recorded = m.header.store.path
    try:
        if recorded is None:
            raise StoreError("the model records no training store")
        return open_pair(recorded, m.path)[0]
    except StoreError as exc:
        raise StoreError(
            f"{m.path}: the model holds no index of its users' training items (saved before "
            f"models carried one), which recommendations leave out, and {exc}; pass "
            "store=STORE (the training store), or export only the factors"
        ) from None


@dataclass(frozen=True)
class Plan:
    """An export checked and ready to write: where, from what, which datasets and parts."""

    target: Target
    model: ModelInfo
    store: StoreInfo | None  # the training store (recommendations without the model's index)
    n: int
    ids_root: str
    parts: list[tuple[str, int]]  # (dataset, block) of every part file
    schemas: dict[str, pa.Schema]
    proba_at: int | None = None  # the class s of the recommendations' column proba
    law: ClassLaw | None = None  # the model's law of the classes, with proba_at

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(d for d, _ in self.parts))


def plan_export(
    m: ModelInfo,
    info: StoreInfo | None,
    out: str | os.PathLike,
    what: Sequence[str],
    n: int,
    overwrite: bool,
    storage_options: dict[str, Any] | None = None,
    proba_at: int | None = None,
) -> Plan:
    """Check everything an export needs (before any cluster is used): the model's id maps, the
    training items for recommendations (the store ``info``, checked to match the model, or the
    model's own index of them), ``n`` and the target."""
    datasets = [
        d for w in dict.fromkeys(what) for d in (FACTORS if w == "factors" else [RECOMMENDATIONS])
    ]
    law = None
    if RECOMMENDATIONS in datasets:
        n = check_n(n)
        assert info is not None or m.has_seen, "recommendations need the training items"
        if proba_at is not None:
            law = law_of(m)
            proba_at = law.check_level(proba_at)
    elif proba_at is not None:
        raise InputError("proba_at adds a column to the recommendations: export them too")
    ids_root = m.ids_path
    ids = {axis: id_type(ids_root, axis) for axis in AXES}
    k = chunkstore.open_checked(m.path, "W", 0, "mean").shape[1]
    schemas = {
        **{d: factor_schema(ids[axis], k) for d, (_, axis) in FACTORS.items()},
        RECOMMENDATIONS: recommendation_schema(ids["users"], ids["items"], law is not None),
    }
    n_r, n_c = m.n_blocks
    parts = [(d, b) for d in datasets for b in range(n_c if d == "item_factors" else n_r)]
    inputs = {"model": m.path, **({"training store": info.path} if info is not None else {})}
    target = open_target(out, overwrite, storage_options, inputs)
    store = info if RECOMMENDATIONS in datasets else None
    return Plan(target, m, store, n, ids_root, parts, schemas, proba_at, law)


def _submit(cl: Client, plan: Plan, root: str, part: tuple[str, int]) -> Future:
    """Start writing one part file under ``root``; its future gives the rows written."""
    dataset, b = part
    m, fs, schema = plan.model, plan.target.fs, plan.schemas[dataset]
    path = f"{root}/{part_name(*part)}"
    rb, cb = m.header.row_bounds, m.header.col_bounds
    if dataset == RECOMMENDATIONS:
        top = block_top(cl, m, plan.store, b, plan.n)
        if plan.law is not None:
            top = cl.submit(top_at_least, top, m.path, plan.law, plan.proba_at, b, cb)
        return cl.submit(
            recommendation_part, top, plan.ids_root, int(rb[b]), schema, fs, path, pure=False
        )
    name = FACTORS[dataset][0]
    start = int((rb if name == "W" else cb)[b])
    return cl.submit(
        factor_part, m.path, plan.ids_root, name, b, start, schema, fs, path, pure=False
    )


def write_export(
    cl: Client,
    plan: Plan,
    submit: Callable[[Client, Plan, str, tuple[str, int]], Future] | None = None,
) -> str:
    """Write a planned export on ``cl``'s workers, complete or not at all; returns its name.
    ``submit`` starts the writing of one part (default: the factors and recommendations)."""
    submit = submit or _submit
    target, fs = plan.target, plan.target.fs
    manifest: dict[str, Any] = {
        "kind": EXPORT,
        "format_version": EXPORT_FORMAT,
        "model": plan.model.path,
        "n": plan.n if RECOMMENDATIONS in plan.datasets else None,
        **({"proba_at": plan.proba_at} if plan.proba_at is not None else {}),
    }
    place = Place(fs, target.root, target.url)
    if target.local:
        root, scratch = temporary_path(target.root)
        for d in plan.datasets:
            fs.makedirs(f"{root}/{d}")
    else:
        root = target.root
        planned = [part_name(*p) for p in plan.parts]
        # the marker, then the removal of an export open_target allowed us to replace
        place.begin({**manifest, "planned": planned}, export_listing(place))
    futures: list[Future] = []
    try:
        futures = [submit(cl, plan, root, p) for p in plan.parts]
        track(futures, "export: parts")
        wait(futures)
        with plan.model.reading():  # every part from the version planned, or an error
            rows = dict(zip(plan.parts, cl.gather(futures), strict=True))  # re-raises an error
        manifest["datasets"] = {
            d: {
                "parts": [part_name(*p) for p in plan.parts if p[0] == d],
                "rows": [rows[p] for p in plan.parts if p[0] == d],
            }
            for d in plan.datasets
        }
        fs.pipe_file(f"{root}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
        if target.local:
            publish(root, target.root, target.check_local)
        else:
            place.finish()
    except BaseException:
        if not target.local:  # a task still running (interrupted) may yet write its part:
            settled = all(f.done() for f in futures)  # then the pending marker stays
            cl.cancel(futures)
            place.remove(export_listing(place), keep_pending=not settled)
        raise
    finally:
        if target.local:  # a task still running (interrupted) may yet write there
            discard_temporary(scratch, settled=all(f.done() for f in futures))
    return target.url
