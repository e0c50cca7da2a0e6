"""Warm start of a fit from a saved model, onto the same store or one that grew (docs/design.md §2).

Users and items are matched by raw id against the model's training ids (the copy in the model
when it has one, else its training store). On each block of the new store, on the workers:

- a known row starts from its old posterior state, E[x] and exp(E[log x]), which is what the
  engine's first local step and first update read (:class:`~ordnmf_dask.model.updates.FactorChunk`);
- a new row with interactions with known rows of the other side starts from a fold-in against
  the old factors (:func:`ordnmf_dask.model.foldin_rows.fold_in_rows`, run on the transposed
  block for items), with the old thresholds (or p);
- a new row with no such interaction starts as a cold fit does (the Gamma(1, 1) draws of the
  fit's seed);
- the global parameters (Delta, or p) start at the old model's values.

Nothing of the size of a factor matrix reaches the client: each task reads only the old rows it
needs (by old block), and the new store's blocks of its own row or column.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from ordnmf_dask.engine import tasks
from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.model.ensemble import member_columns
from ordnmf_dask.model.families import Family, OrdinalFamily
from ordnmf_dask.model.foldin_rows import Likelihood, fold_in_rows
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import ModelInfo, model_fingerprint, open_model
from ordnmf_dask.modelstore.modelheader import MemberLaw, ModelHeader
from ordnmf_dask.runtime.reduce import tree_sum
from ordnmf_dask.store import idmap
from ordnmf_dask.store.blocks import AXES, StoreInfo
from ordnmf_dask.store.csr import load_block

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Future

FOLDIN_MAX_ITER = 100  # per new row: a start, refined by the fit itself
FOLDIN_TOL = 1e-4
SIDES = {"W": ("users", "row_bounds", 0), "H": ("items", "col_bounds", 1)}


@dataclass(frozen=True)
class OldFactors:
    """The factors of a warm start's model as the fit's tasks read them: its path, its chunks'
    row boundaries per factor, and of an ensemble the member started from."""

    path: str
    bounds: dict[str, np.ndarray]
    member: int | None
    n_members: int
    k: int

    def columns(self, name: str, values: np.ndarray, field: str) -> np.ndarray:
        """Rows of ``field`` of factor ``name`` as the fit starts from them: of an ensemble,
        the member's K columns, E[w] and exp(E[log w]) multiplied back by the number of
        members (the ensemble holds them divided by it)."""
        if self.member is None:
            return values
        values = values[:, member_columns(self.k, self.member)]
        return values * self.n_members if name == "W" and field in ("mean", "geo") else values


@dataclass(frozen=True)
class Source:
    """A saved model checked to warm-start a fit: its path, attributes, where its training
    ids are, and its fingerprint (:func:`~ordnmf_dask.modelstore.model.model_fingerprint`)."""

    path: str
    header: ModelHeader
    ids: str
    fingerprint: str
    member: int | None = None  # of an ensemble: the member a member of the fit starts from

    @property
    def law(self) -> MemberLaw:
        """The global parameters the fit starts from: the model's, or its member's."""
        return self.header.laws[self.member or 0]

    def factors(self) -> OldFactors:
        """What the tasks that read the model's factors need of it (small, sent with each)."""
        return OldFactors(
            self.path,
            {name: self.bounds(name) for name in SIDES},
            self.member,
            self.header.n_members,
            self.header.n_components,
        )

    def bounds(self, name: str) -> np.ndarray:
        """Row boundaries of the old model's chunks of factor ``name``."""
        h = self.header
        return np.asarray(h.row_bounds if name == "W" else h.col_bounds, dtype=np.int64)

    def describe(self) -> dict[str, Any]:
        """What a fit records of its warm-start source (provenance and checkpoint fingerprint)."""
        member = {} if self.member is None else {"member": self.member}
        return {"path": self.path, "fingerprint": self.fingerprint, **member}


def open_source(
    model: Any,
    estimator: str,
    family: Family,
    k: int,
    store: StoreInfo,
    n_members: int = 1,
    member: int | None = None,
) -> Source:
    """The model at ``model`` (a path or a fitted estimator), checked against a fit of
    ``estimator`` with ``k`` components, ``n_members`` members and ``family`` on ``store``
    (``member``: the member of the fit and of the model's ensemble it starts); InputError
    naming what differs (model class, K, members, number of classes, id types) or what is
    missing."""
    m: ModelInfo = open_model(os.fspath(getattr(model, "model_path_", model)))
    h = m.header
    where = f"init_model {m.path}"
    if h.model != estimator:
        raise InputError(f"{where}: its model class {h.model} differs from this fit's {estimator}")
    if h.n_members != n_members:
        raise InputError(
            f"{where}: it holds {h.n_members} member(s) and this fit {n_members}: each member "
            f"continues its own, so give n_members={h.n_members} (or fit afresh)"
        )
    if h.n_components != k:
        raise InputError(f"{where}: its K = {h.n_components} differs from this fit's K = {k}")
    if isinstance(family, OrdinalFamily):
        old_v = len(h.laws[0].delta or ()) - 1
        if old_v != family.n_classes:
            raise InputError(
                f"{where}: its {old_v} classes differ from the {family.n_classes} "
                "of this fit's data"
            )
    try:
        ids = m.ids_path
    except StoreError as exc:
        raise InputError(f"{where}: the raw ids of its rows cannot be matched: {exc}") from None
    for axis in AXES:
        old = zarr.open_array(os.path.join(ids, axis, "ids"), mode="r").dtype.kind in "iu"
        new = zarr.open_array(os.path.join(store.path, axis, "ids"), mode="r").dtype.kind in "iu"
        if old != new:
            kinds = {True: "integers", False: "strings"}
            raise InputError(
                f"{where}: its {axis} ids are {kinds[old]}, those of store "
                f"{store.path} are {kinds[new]}"
            )
    return Source(m.path, h, ids, model_fingerprint(m.attrs), member if n_members > 1 else None)


def start_params(family: Family, source: Source) -> Any:
    """The global parameters to start from: the old model's Delta (or p), unless the family
    keeps them fixed (then its own fixed values)."""
    if isinstance(family, OrdinalFamily):
        if family.fixed_delta is not None:
            return family.init_params()
        return family.from_json(list(source.law.delta or ()))
    if not family.update_p:
        return family.init_params()
    return family.from_json(source.law.p)


def match(store: str, axis: str, start: int, stop: int, ids: str, bounds: np.ndarray) -> np.ndarray:
    """Old global index of each of the rows ``start .. stop - 1`` of ``axis`` of ``store`` (-1
    for a new id), looked up slice by slice of the old ids (``bounds``)."""
    out = np.full(stop - start, -1, dtype=np.int64)
    if stop == start:
        return out
    wanted = np.array(idmap.ids_slice(store, axis, start, stop))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        pos, local = idmap.find_in_slice(ids, axis, lo, hi, wanted)
        out[pos] = lo + local
    return out


def read_rows(
    old: OldFactors, name: str, index: np.ndarray, fields: Sequence[str]
) -> list[np.ndarray]:
    """``fields`` of the old rows ``index`` (global, any order) of factor ``name``, each
    (len(index), K) (:meth:`OldFactors.columns`), read block by block (only those rows)."""
    model, bounds = old.path, old.bounds[name]
    order = np.argsort(index, kind="stable")
    which = np.searchsorted(bounds, index[order], side="right") - 1
    parts: list[list[np.ndarray]] = [[] for _ in fields]
    for j in np.unique(which).tolist():
        local = index[order][which == j] - bounds[j]
        for part, field in zip(parts, fields, strict=True):
            value = chunkstore.read_field(model, name, j, field, local)
            part.append(old.columns(name, value, field))
    out = []
    for part in parts:
        rows = np.concatenate(part) if part else np.empty((0, 0))
        value = np.empty_like(rows)
        value[order] = rows
        out.append(value)
    return out


def column_sum(old: OldFactors, name: str, j: int) -> np.ndarray:
    """(K,) column sums of E[.] of chunk ``j`` of the old factor ``name``."""
    mean = chunkstore.read_field(old.path, name, j, "mean")
    return old.columns(name, mean, "mean").sum(axis=0)


@dataclass(frozen=True)
class Plan:
    """What every warm-start task of one fit shares (small: paths, bounds, the likelihood)."""

    store: str
    values: str  # the family's block values ("class", "raw", "ge:S")
    old: OldFactors
    likelihood: Likelihood
    alpha: dict[str, float]
    seed: int
    k: int


def likelihood(family: Family, params: Any) -> Likelihood:
    """The observation model the fold-in of new rows uses: the family at the start parameters."""
    if isinstance(family, OrdinalFamily):
        return Likelihood("ordinal", delta=np.asarray(params), approx=family.approx)
    return Likelihood("dcpf", p=float(params), t=family.t)


def _new_interactions(
    plan: Plan, name: str, index: int, new: np.ndarray, others: Sequence[np.ndarray]
) -> tuple[CsrBlock, np.ndarray]:
    """The interactions of the new rows ``new`` (local, increasing) of block ``index`` of side
    ``name`` with KNOWN rows of the other side (``others``: old index of each row of each
    block of the other side, -1 if new), as a (len(new), m) CSR over the m distinct old indices
    touched (returned, increasing). For items the blocks are read transposed."""
    rows, cols, ys = [], [], []
    for j, other in enumerate(others):
        b = load_block(
            plan.store, "train", *((index, j) if name == "W" else (j, index)), plan.values
        )
        own, oth = (b.rows, b.cols) if name == "W" else (b.cols, b.rows)
        is_new = np.zeros(b.shape[SIDES[name][2]], dtype=bool)
        is_new[new] = True
        old = other[oth]
        keep = is_new[own] & (old >= 0)
        rows.append(np.searchsorted(new, own[keep]))
        cols.append(old[keep])
        ys.append(b.y[keep])
    row = np.concatenate(rows)
    touched, col = np.unique(np.concatenate(cols), return_inverse=True)
    order = np.lexsort((col, row))
    y = np.concatenate(ys)[order]
    return CsrBlock.from_coo(row[order], col[order], y, (len(new), len(touched))), touched


def warm_chunk(
    plan: Plan,
    name: str,
    index: int,
    start: int,
    own: np.ndarray,
    others: Sequence[np.ndarray],
    colsum: np.ndarray,
) -> FactorChunk:
    """Initial chunk ``index`` of factor ``name`` (rows ``start ..`` of the new store, ``own``:
    their old indices or -1): old state for known rows, fold-in or cold draws for new ones.

    ``others`` and ``colsum`` are the other side's old indices per block and its old column
    sums of E[.] (what the fold-in of new rows needs)."""
    n, k = len(own), plan.k
    mean, geo = np.empty((n, k)), np.empty((n, k))
    known = np.flatnonzero(own >= 0)
    if known.size:
        mean[known], geo[known] = read_rows(plan.old, name, own[known], ("mean", "geo"))
    new = np.flatnonzero(own < 0)
    if new.size == 0:
        return FactorChunk(mean, geo)
    which = SIDES[name][2]
    cold = tasks.random_chunk(plan.seed, which, start, start + n, k)
    mean[new], geo[new] = cold.mean[new], cold.geo[new]
    block, touched = _new_interactions(plan, name, index, new, others)
    seen = np.flatnonzero(np.diff(block.indptr) > 0)
    if seen.size:
        other = "H" if name == "W" else "W"
        eh, geo_h = read_rows(plan.old, other, touched, ("mean", "geo"))
        fold = fold_in_rows(
            block.take_rows(seen),
            eh,
            np.log(geo_h),
            colsum,
            plan.alpha[name],
            plan.likelihood,
            max_iter=FOLDIN_MAX_ITER,
            tol=FOLDIN_TOL,
        )
        mean[new[seen]], geo[new[seen]] = fold.mean, np.exp(fold.log_mean)
    return FactorChunk(mean, geo)


def initial_chunks(
    runner: Any, source: Source, params: Any, alpha: dict[str, float]
) -> tuple[list[Future], list[Future]]:
    """Submit the warm-start chunks of ``runner``'s store (a
    :class:`~ordnmf_dask.engine.cavi.CaviRunner`), each where it will live."""
    client, store, family = runner.client, runner.store, runner.family
    bounds = {"W": store.row_bounds, "H": store.col_bounds}
    maps: dict[str, list[Future]] = {}
    for name, (axis, _, _) in SIDES.items():
        b = bounds[name]
        maps[name] = [
            client.submit(
                match,
                store.path,
                axis,
                int(b[j]),
                int(b[j + 1]),
                source.ids,
                source.bounds(name),
                pure=False,
            )
            for j in range(len(b) - 1)
        ]
    old = source.factors()
    colsums = {
        name: tree_sum(
            client,
            [
                client.submit(column_sum, old, name, j, pure=False)
                for j in range(len(source.bounds(name)) - 1)
            ],
        )
        for name in SIDES
    }
    plan = Plan(
        store.path,
        family.values,
        old,
        likelihood(family, params),
        alpha,
        runner.cfg.seed,
        runner.cfg.n_components,
    )

    def args(name: str) -> list[tuple[Any, ...]]:
        other = "H" if name == "W" else "W"
        return [
            (plan, name, j, int(bounds[name][j]), maps[name][j], maps[other], colsums[other])
            for j in range(len(maps[name]))
        ]

    return runner.submit_initial(warm_chunk, args("W"), args("H"))
