"""Fold-in of new users (H and the thresholds fixed, no refit) and recommendations for them.

The numerics are :func:`ordnmf_dask.model.foldin_rows.fold_in_rows` (an ensemble's:
:func:`ordnmf_dask.model.ensemble.fold_in_members`). Here: which rows of the model to
read and where. The workers compute the K column sums of E[H] per item-block (summed along a
fixed tree) and read, per item-block, only the rows of E[H], E[log H] of the items the new users
touched; the fold-in itself runs in one worker task. The client sends the interactions and
receives E[w] of the new users, (n_new, K).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.errors import InputError, StoreError, shown
from ordnmf_dask.model import compiling, metrics
from ordnmf_dask.model.ensemble import fold_in_members
from ordnmf_dask.model.foldin_rows import FoldIn, Likelihood
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.modelstore.model import ModelInfo, open_model
from ordnmf_dask.modelstore.modelheader import MemberLaw
from ordnmf_dask.params import validate_call
from ordnmf_dask.postfit.executor import client_for
from ordnmf_dask.postfit.topn import check_n, factor_mean, named_top, open_pair
from ordnmf_dask.runtime.reduce import tree_reduce, tree_sum
from ordnmf_dask.sources.origin import Named, Origin
from ordnmf_dask.sources.values import ValueSpec, classify, describe, spec_of
from ordnmf_dask.store import idmap
from ordnmf_dask.store.blocks import StoreInfo, open_store
from ordnmf_dask.store.idmap import id_list

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Client

log = logging.getLogger("ordnmf_dask")


def _dcpf(law: MemberLaw) -> Likelihood:
    assert law.p is not None and law.t is not None  # a dcPF model records them
    return Likelihood("dcpf", p=float(law.p), t=float(law.t))


def likelihoods_of(m: ModelInfo) -> tuple[list[Likelihood], int | None]:
    """The frozen observation model of each member of ``m`` (one for a single fit) and the
    binarization threshold (BePoF / PF)."""
    h = m.header
    if h.family == "dcpf":
        return [_dcpf(law) for law in h.laws], None
    params = h.params
    threshold = params.get("threshold")
    approx = bool(params.get("approx", False))
    return (
        [
            Likelihood("ordinal", delta=np.asarray(law.delta, np.float64), approx=approx)
            for law in h.laws
        ],
        None if threshold is None else int(threshold),
    )


def _colsum(model: str, c: int) -> np.ndarray:
    return factor_mean(model, "H", c).sum(axis=0)


def factor_rows(
    model: str, name: str, index: int, local: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """E[x], E[log x] of chunk ``index`` of factor ``name`` ("W" or "H"), only the ``local`` rows
    if given (E[log x] = log E[x] when the model does not hold it)."""
    mean = chunkstore.read_field(model, name, index, "mean", local)
    if chunkstore.has_field(model, name, index, "log_mean"):
        return mean, chunkstore.read_field(model, name, index, "log_mean", local)
    return mean, np.log(mean)


def _run(
    parts: list[tuple[np.ndarray, np.ndarray]],
    colsum: np.ndarray,
    block: CsrBlock,
    alpha: float,
    likelihoods: list[Likelihood],
    k: int,
    max_iter: int,
    tol: float,
    seed: int | None,
) -> FoldIn:
    eh = np.concatenate([p[0] for p in parts]) if parts else np.empty((0, colsum.shape[0]))
    log_eh = np.concatenate([p[1] for p in parts]) if parts else eh.copy()
    with compiling.announced_as("fold-in"):
        return fold_in_members(
            block,
            eh,
            log_eh,
            colsum,
            alpha,
            likelihoods,
            k,
            False,
            max_iter=max_iter,
            tol=tol,
            seed=seed,
        )


def _item_index(cl: Client, m: ModelInfo, info: StoreInfo | None, flat: list[Any]) -> np.ndarray:
    """Global item indices of ``flat``: raw ids via the store, else indices checked in range."""
    if info is not None:
        return idmap.lookup(cl, info.path, "items", info.col_bounds.tolist(), flat)
    n_items = m.header.store.n_items
    out = np.empty(len(flat), dtype=np.int64)
    for j, value in enumerate(flat):
        ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
        if not ok or not 0 <= int(value) < n_items:
            raise InputError(
                f"unknown item index {shown(value)}: expected an integer in 0..{n_items - 1} "
                "(pass store= to give raw item ids)"
            )
        out[j] = int(value)
    return out


def value_spec(m: ModelInfo) -> ValueSpec | None:
    """How the store ``m`` was fitted on made classes of its raw values: from the model's
    record of its store, else (models saved before they recorded it) from the store's own
    attributes when it can be read; None when neither says (the values are then classes)."""
    recorded = m.attrs.get("store") or {}
    if "value_kind" in recorded:
        return spec_of(recorded)
    try:
        return spec_of(open_store(recorded["path"]).attrs) if recorded.get("path") else None
    except StoreError:
        return None


def check_values(
    values: np.ndarray,
    likelihood: Likelihood,
    n_classes: int,
    threshold: int | None,
    spec: ValueSpec | None = None,
    origin: Origin | Named | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(values the model sees, mask of the interactions kept) of raw ``values`` on the scale
    the store was ingested from (``spec``, :func:`value_spec`: half-star ratings, counts, ...,
    turned into classes as the ingest did, and binarized as the fit did); without ``spec``,
    classes 1..``n_classes``. InputError for a value that fits no class, saying what to pass
    and, given ``origin`` (a file's rows), where the value is."""
    where = origin or Origin.arrays(len(values), "fold-in values")

    def fail(bad: np.ndarray, problem: str) -> None:
        if np.any(bad):
            k = int(np.flatnonzero(bad)[0])
            at = f"{where.where(k)}: " if origin is not None else ""
            raise InputError(at + problem.format(v=shown(values[k])))

    fail(~np.isfinite(values), "interaction value {v}: values must be finite numbers")
    if likelihood.family == "dcpf" and (spec is None or spec.value_kind == "counts"):
        fail(values <= 0, "count {v}: dcPF fold-in needs positive counts (0 means no interaction)")
        return values.astype(np.float64), np.ones(len(values), dtype=bool)
    if spec is None:
        bad = (values != np.round(values)) | (values < 1) | (values > n_classes)
        fail(bad, f"interaction value {{v}}: expected a class in 1..{n_classes}")
        y, keep = values.astype(np.int64), np.ones(len(values), dtype=bool)
    else:
        try:
            classes, keep = classify(spec, values, where)
        except InputError as exc:
            raise InputError(
                f"{exc}; pass values on the scale the store was ingested from: {describe(spec)}"
            ) from None
        y = classes[keep].astype(np.int64)
    if likelihood.family == "dcpf":  # a class store: its classes are the counts it fitted
        return y.astype(np.float64), keep
    if threshold is None:
        return y.astype(np.uint8), keep
    above = y >= threshold
    keep = keep.copy()
    keep[np.flatnonzero(keep)[~above]] = False
    return np.ones(int(above.sum()), dtype=np.uint8), keep


def fold_in(
    model: Any,
    items: Sequence[Sequence[Any]],
    values: Sequence[Sequence[float]],
    *,
    store: str | os.PathLike | StoreInfo | None = None,
    client: Client | None = None,
    max_iter: int = 500,
    tol: float = 1e-6,
    seed: int | None = None,
    n_workers: int | None = None,
    allow_other_store: bool = False,
) -> np.ndarray:
    """E[w] of NEW users from their interactions, with q(H) and the thresholds fixed.

    Coordinate ascent on q(w_u) only (see :mod:`ordnmf_dask.model.foldin_rows`): the model's Delta
    (OrdNMF, BePoF, PF; approx mode kept) or p and t (dcPF) and its q(H) are not changed.

    Parameters
    ----------
    model : a model directory or a fitted estimator.
    items : per new user, the items it interacted with: raw item ids when ``store`` is given
        (unknown ids raise InputError naming them), else item indices 0..I-1.
    values : per new user, the same length as its items: values on the scale the store was
        ingested from (half-star ratings, integer ratings, counts: as ``fit(X)`` takes them),
        made classes as the ingest did (a store whose rule is not recorded: classes 1..V);
        BePoF / PF models binarize them at their threshold, as the fit did (classes below it
        are dropped); dcPF takes raw counts on a count store.
    store : the store the model was fitted on, to map raw item ids.
    max_iter, tol : per user, stop when ``sum_k |dE[w_uk]| / sum_k E[w_uk] < tol``.
    seed : None starts from E[w_uk] = 1; an integer from Gamma(1, 1) draws (seeded by
        ``(seed, j)`` for the j-th new user), as the fit's initialization.
    allow_other_store : use ``store`` even if the model was fitted on another store (by
        default an InputError: :func:`~ordnmf_dask.postfit.evaluate.check_compatible`).

    Returns
    -------
    (n_new, K) float64 E[w] of the new users, in the order given (an ensemble's: (n_new,
    n_members * K), each member's against its own columns, as the model's W holds them).

    Examples
    --------
    >>> from ordnmf_dask import OrdNMF, fold_in
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> model = OrdNMF(n_components=3, n_members=1, max_iter=20).fit(store)
    >>> fold_in(model, [[1, 2, 3]], [[10, 8, 9]]).shape  # a new user who rated items 1, 2, 3
    (1, 3)
    """
    settings = validate_call("fold_in", {"max_iter": max_iter, "tol": tol, "seed": seed})
    max_iter, tol, seed = settings["max_iter"], settings["tol"], settings["seed"]
    m = open_model(os.fspath(getattr(model, "model_path_", model)))
    info = None if store is None else open_pair(store, m.path, allow_other_store)[0]
    likelihoods, threshold = likelihoods_of(m)
    flat_items, flat_values, user = flatten(items, values)
    y, keep = check_values(
        flat_values, likelihoods[0], m.header.store.n_classes, threshold, value_spec(m)
    )
    alpha = m.header.alpha("users")
    col_bounds = np.asarray(m.header.col_bounds, dtype=np.int64)
    with client_for(client, m, n_workers, info) as cl:
        index = _item_index(cl, m, info, flat_items)
        block = interactions(user[keep], index[keep], y, len(items))
        touched = np.unique(index[keep])
        n_c = len(col_bounds) - 1
        sums = tree_sum(cl, [cl.submit(_colsum, m.path, c, pure=False) for c in range(n_c)])
        which = np.searchsorted(col_bounds, touched, side="right") - 1
        parts = [
            cl.submit(factor_rows, m.path, "H", c, touched[which == c] - col_bounds[c], pure=False)
            for c in np.unique(which).tolist()
        ]
        law = (alpha, likelihoods, m.header.n_components)
        result = cl.submit(_run, parts, sums, block, *law, max_iter, tol, seed, pure=False).result()
    warn_unconverged(result, "users", max_iter, tol, block)
    return result.mean


def flatten(
    ids: Sequence[Sequence[Any]],
    values: Sequence[Sequence[float]],
    new: str = "user",
    other: str = "item",
) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """The interactions of new rows (``new``: "user" or "item") as flat lists, checked: one value
    per id and no id given twice for a row. Returns (ids, float64 values, row of each)."""
    ids = [id_list(a, f"{other}s[{j}]") for j, a in enumerate(_rows(ids, f"{other}s"))]
    values = _rows(values, "values")
    if len(ids) != len(values):
        raise InputError(f"{other}s has {len(ids)} {new}s but values has {len(values)}")
    for j, (a, v) in enumerate(zip(ids, values, strict=True)):
        if len(a) != len(v):
            raise InputError(f"new {new} {j}: {len(a)} {other}s but {len(v)} values")
        seen: set[Any] = set()
        for x in a:
            if x in seen:
                raise InputError(f"new {new} {j}: {other} {shown(x)} given twice")
            seen.add(x)
    flat_ids = [x for a in ids for x in a]
    flat_values = _numbers([x for v in values for x in v])
    return flat_ids, flat_values, np.repeat(np.arange(len(ids)), [len(a) for a in ids])


def _rows(rows: Any, name: str) -> list[Any]:
    """A list of per-row lists (TypeError for a string or a single value)."""
    if isinstance(rows, str | bytes) or not hasattr(rows, "__len__"):
        raise TypeError(f"{name} must be a list with one list per new row, got {shown(rows)}")
    out = list(rows)
    for j, row in enumerate(out):
        if isinstance(row, str | bytes) or not hasattr(row, "__len__"):
            raise TypeError(f"{name}[{j}] must be a list, got {shown(row)}")
    return out


def _numbers(values: list[Any]) -> np.ndarray:
    """Interaction values as float64; InputError for one that is not a real number."""
    for x in values:
        if isinstance(x, bool | str | bytes | complex | np.complexfloating):
            raise InputError(f"interaction value {shown(x)} is not a real number")
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError("interaction values must be real numbers") from None


def warn_unconverged(
    result: FoldIn,
    noun: str,
    max_iter: int,
    tol: float,
    block: CsrBlock,
    names: Sequence[Any] | None = None,
) -> None:
    """Warn about the new rows (of ``block``) whose fold-in did not converge; rows without any
    interaction are named apart: they have nothing to fit (their factors only shrink towards 0
    under the prior), which is no failure to converge. ``names``: the rows' raw ids, which the
    warning gives (default: their positions)."""
    empty = np.diff(block.indptr) == 0
    if empty.any():
        rows = np.flatnonzero(empty)
        shown_rows = [str(j) if names is None else repr(names[j]) for j in rows[:5].tolist()]
        listed = ", ".join(shown_rows) + (" ..." if rows.size > 5 else "")
        log.warning(
            "fold-in: %d new %s without any interaction (%s): nothing to fit, their factors "
            "only reflect the prior",
            rows.size,
            noun,
            listed,
        )
    failed = ~result.converged & ~empty
    if failed.any():
        log.warning(
            "fold-in: %d of %d new %s did not converge in %d iterations (tol %g)",
            int(failed.sum()),
            int((~empty).sum()),
            noun,
            max_iter,
            tol,
        )


def interactions(
    row: np.ndarray,
    other: np.ndarray,
    y: np.ndarray,
    n_new: int,
    new: str = "user",
    noun: str = "item",
) -> CsrBlock:
    """(n_new, m) CSR over the m distinct touched ``other`` indices, in increasing order."""
    touched, col = np.unique(other, return_inverse=True)
    order = np.lexsort((col, row))
    u, c = row[order], col[order]
    dup = (np.diff(u) == 0) & (np.diff(c) == 0)
    if np.any(dup):
        j = int(np.flatnonzero(dup)[0])
        raise InputError(f"new {new} {int(u[j])}: {noun} index {int(touched[c[j]])} given twice")
    return CsrBlock.from_coo(u, c, y[order], (n_new, len(touched)))


def _score(
    model: str, c: int, w: np.ndarray, exclude: CsrBlock, col_offset: int, n: int
) -> tuple[np.ndarray, np.ndarray]:
    return metrics.topk_block(w, factor_mean(model, "H", c), exclude, col_offset, n)


def recommend_for(
    model: Any,
    w: np.ndarray,
    exclude_items: Sequence[Sequence[Any]] | None = None,
    n: int = 10,
    *,
    store: str | os.PathLike | StoreInfo | None = None,
    client: Client | None = None,
    n_workers: int | None = None,
    allow_other_store: bool = False,
) -> dict[int, list[tuple[Any, float]]]:
    """Top-``n`` items for users given by their factors (e.g. from :func:`fold_in`).

    Parameters
    ----------
    w : (n_new, K) E[w] of the users.
    exclude_items : per user, items never recommended (typically the ones folded in): raw item
        ids when ``store`` is given, else item indices.
    store : maps raw ids both ways; without it, items are returned as indices.
    allow_other_store : use ``store`` even if the model was fitted on another store (by
        default an InputError: :func:`~ordnmf_dask.postfit.evaluate.check_compatible`).

    Returns
    -------
    ``{row j of w: [(item, score), ...]}`` best first (score = w . E[h_i], ties to the lower
    index): the shape of :func:`ordnmf_dask.recommend` for given users, keyed by row.

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import OrdNMF
    >>> model = OrdNMF(n_components=3, n_members=1, max_iter=20).fit(store)
    >>> from ordnmf_dask import fold_in, recommend_for
    >>> w = fold_in(model, [[1, 2, 3]], [[10, 8, 9]])
    >>> top = recommend_for(model, w, [[1, 2, 3]], n=2)  # the new user's own items left out
    >>> len(top[0]), {1, 2, 3} & {item for item, _ in top[0]}
    (2, set())
    """
    n = check_n(n)
    m = open_model(os.fspath(getattr(model, "model_path_", model)))
    info = None if store is None else open_pair(store, m.path, allow_other_store)[0]
    w = np.asarray(w, dtype=np.float64)
    cb = np.asarray(m.header.col_bounds, dtype=np.int64)
    if exclude_items is None:
        exclude_items = [[] for _ in range(len(w))]
    rows = _rows(exclude_items, "exclude_items")
    exclude_items = [id_list(a, f"exclude_items[{j}]") for j, a in enumerate(rows)]
    if w.ndim != 2 or len(exclude_items) != w.shape[0]:
        raise InputError(f"w must be (n_users, K) with one exclusion list per row, got {w.shape}")
    with client_for(client, m, n_workers, info) as cl:
        flat = [x for a in exclude_items for x in a]
        index = _item_index(cl, m, info, flat)
        user = np.repeat(np.arange(len(w)), [len(a) for a in exclude_items])
        w_f = cl.scatter(w, hash=False)
        cands = []
        for c in range(len(cb) - 1):
            mine = (index >= cb[c]) & (index < cb[c + 1])
            order = np.lexsort((index[mine], user[mine]))
            u, i = user[mine][order], index[mine][order] - cb[c]
            shape = (len(w), int(cb[c + 1] - cb[c]))
            excl = CsrBlock.from_coo(u, i, np.ones(len(u), np.uint8), shape)
            cands.append(cl.submit(_score, m.path, c, w_f, excl, int(cb[c]), n, pure=False))
        top = tree_reduce(cl, cands, metrics.merge_topk, n)
        if info is not None:
            return dict(enumerate(cl.submit(named_top, top, info.path, pure=False).result()))
        scores, items = top.result()
    keep = np.isfinite(scores)
    return {
        j: list(zip(items[j][keep[j]].tolist(), scores[j][keep[j]].tolist(), strict=True))
        for j in range(len(w))
    }
