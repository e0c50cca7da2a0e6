"""Serving from a saved model in memory, without a cluster: top-n recommendations, similar items
and users, pair scores, and fold-in of new users and items (docs/design.md, "Serving").

A :class:`Server` holds the factors of one model in memory (read on first use, kept in a small
per-process cache keyed by the model directory's identity on disk). The score of a pair is
``E[w_u] . E[h_i]``, the ranking score of :mod:`.recommend` (every family's P(y_ui > 0) and, for
the ordinal models, every P(y_ui >= s) increase with it). Top-n lists are those of
:mod:`.recommend`: float64 scores, best first, ties to the lower index. To get them quickly, each
list is screened on float32 scores with a margin that provably keeps every item of the float64
top n (the factors are nonnegative, so a K-term dot product has a relative rounding error of at
most gamma_{K+2}), and only the candidates are scored again in float64.

Raw ids map through the model's own copy of the id maps when it holds one, else through those of
its store (see :func:`id_map`). A user's training items (``filter_already_seen``) are read from
the model's own index of them (:mod:`ordnmf_dask.modelstore.seen`), or for a model without one
(or when a store is given) from the store; only when asked, and only the user-blocks of the
requested users.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np
import psutil
import zarr

from ordnmf_dask.errors import InputError, StoreError, shown
from ordnmf_dask.model import compiling
from ordnmf_dask.model.ensemble import fold_in_members
from ordnmf_dask.model.kernels import jit
from ordnmf_dask.modelstore import seen
from ordnmf_dask.modelstore.model import ModelInfo, open_model
from ordnmf_dask.params import validate_call
from ordnmf_dask.postfit import foldin
from ordnmf_dask.postfit.evaluate import check_compatible
from ordnmf_dask.postfit.topn import check_n, factor_mean, ranked_pairs
from ordnmf_dask.sources.values import ValueSpec
from ordnmf_dask.store import idmap, locations
from ordnmf_dask.store.blocks import StoreInfo, open_store, read_block
from ordnmf_dask.store.idmap import id_list

_BUDGET = 1 << 23  # scores in one dense (rows x candidates) slab
_SMALL_SLAB = 1 << 18  # scores of a slab screened in numpy (_screen)
_SAFE32 = (2.0**-60, 2.0**60)  # nonzero entries in this range: float32 products stay normal
_SEEN_BUDGET = 1 << 29  # bytes of the seen-items index a server keeps in memory (512 MiB)

Recs = list[tuple[Any, float]]


# ------------------------------------------------------------------------------ top-n numerics


@jit()
def _heap_push(heap: np.ndarray, size: int, v: float) -> None:
    """Put ``v`` in the min-heap ``heap[:size + 1]`` (``heap[:size]`` is one)."""
    i = size
    heap[i] = v
    while i > 0 and heap[(i - 1) // 2] > heap[i]:
        p = (i - 1) // 2
        heap[p], heap[i] = heap[i], heap[p]
        i = p


@jit()
def _heap_replace_min(heap: np.ndarray, v: float) -> None:
    """Replace the least element of the full min-heap ``heap`` by ``v``."""
    n = len(heap)
    heap[0] = v
    i = 0
    while 2 * i + 1 < n:
        c = 2 * i + 1
        if c + 1 < n and heap[c + 1] < heap[c]:
            c += 1
        if heap[i] <= heap[c]:
            break
        heap[i], heap[c] = heap[c], heap[i]
        i = c


@jit()
def _screen_compiled(s: np.ndarray, n: int, shrink: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_screen` of a large slab (a batch of rows).

    One pass per row: a min-heap holds the n best scores so far, and a column is kept as a
    candidate only if it reaches ``shrink`` times the heap's least (which only grows); the
    candidates are filtered by the final bound at the end. (Serial: numba's parallel loop ran
    this several times slower.)
    """
    m, width = s.shape
    room = 2 * n + 16
    kept = np.empty((m, room), np.int64)
    counts = np.zeros(m, np.int64)
    bound = np.empty(m)
    rescan = np.zeros(m, np.bool_)
    for r in range(m):
        heap = np.empty(n)
        size = 0
        buf = np.empty(room, np.int64)  # never rebound: that would slow the loop down tenfold
        used = 0
        cut = -np.inf
        for j in range(width):
            v = np.float64(s[r, j])
            if v < cut or v == -np.inf:
                continue
            if not rescan[r]:
                if used == room:  # drop what the bound has passed since
                    w = 0
                    for t in range(used):
                        if np.float64(s[r, buf[t]]) >= cut:
                            buf[w] = buf[t]
                            w += 1
                    used = w
                    rescan[r] = 2 * used > room  # many near-ties: count and collect by a rescan
                if not rescan[r]:
                    buf[used] = j
                    used += 1
            if size < n:
                _heap_push(heap, size, v)
                size += 1
            elif v > heap[0]:
                _heap_replace_min(heap, v)
            if size == n:
                cut = heap[0] * shrink
        bound[r] = cut
        c = 0
        if rescan[r]:
            for j in range(width):
                v = np.float64(s[r, j])
                if v != -np.inf and v >= cut:
                    c += 1
        else:
            for t in range(used):
                if np.float64(s[r, buf[t]]) >= cut:
                    kept[r, c] = buf[t]
                    c += 1
        counts[r] = c
    ptr = np.zeros(m + 1, np.int64)
    ptr[1:] = np.cumsum(counts)
    cols = np.empty(ptr[-1], np.int64)
    for r in range(m):
        if not rescan[r]:
            cols[ptr[r] : ptr[r + 1]] = kept[r, : counts[r]]
            continue
        at = ptr[r]
        for j in range(width):
            v = np.float64(s[r, j])
            if v != -np.inf and v >= bound[r]:
                cols[at] = j
                at += 1
    return ptr, cols


def _screen_small(s: np.ndarray, n: int, shrink: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_screen` of a small slab, in numpy: a partition per row, then one comparison in
    float64 (several passes over the slab, where the compiled kernel makes one)."""
    m, width = s.shape
    nth = np.partition(s, width - n, axis=1)[:, width - n].astype(np.float64)
    cut = nth * shrink  # -inf where a row has fewer than n finite scores
    keep = (s >= cut[:, None]) & (s != -np.inf)
    ptr = np.zeros(m + 1, np.int64)
    np.cumsum(keep.sum(axis=1), out=ptr[1:])
    return ptr, np.nonzero(keep)[1].astype(np.int64)


def _screen(s: np.ndarray, n: int, shrink: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``s``: the columns scoring at least ``shrink`` times its n-th best finite score
    (every finite column when it has fewer than n), in increasing order. Returns a row pointer
    and the columns.

    A slab of a few rows is screened in numpy, so that a command serving a few users calls no
    numba kernel: the first call of one in a process costs more than such a screen (numba's
    start-up, or its compilation on a machine's first run); a batch by the compiled kernel,
    many times faster per row (docs/performance.md, "Serving from the command line").
    """
    if s.size <= _SMALL_SLAB:
        return _screen_small(s, n, shrink)
    with compiling.announced_as("serving"):
        return _screen_compiled(s, n, shrink)


def _gamma(terms: int, unit: float) -> float:
    return terms * unit / (1 - terms * unit)


def _in_range32(x: np.ndarray) -> bool:
    """Whether float32 copies of the nonnegative ``x`` keep every product in the normal range."""
    nonzero = x[x > 0]
    return nonzero.size == 0 or (nonzero.min() >= _SAFE32[0] and nonzero.max() <= _SAFE32[1])


def top_n(
    query: np.ndarray,
    target: np.ndarray,
    target32t: np.ndarray | None,
    n: int,
    banned: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Best ``n`` rows of ``target`` for each row of ``query`` by dot product, in float64.

    Parameters
    ----------
    query : (m, K), target : (N, K) nonnegative float64; target32t : (K, N) float32 copy of
        ``target.T`` (see :func:`screen_copy`; None: screen in float64).
    banned : (query row, target row) pairs never returned, rows sorted increasingly.

    Returns
    -------
    scores : (m, min(n, N)) float64, best first, -inf where a row has fewer candidates;
    cols : same shape, int64 target rows (ties to the lower row; -1 where the score is -inf).
    """
    m, width, k = query.shape[0], target.shape[0], query.shape[1]
    nn = min(n, width)
    scores = np.full((m, nn), -np.inf)
    cols = np.full((m, nn), -1, dtype=np.int64)
    if nn == 0 or m == 0:
        return scores, cols
    screen = target32t if target32t is not None and _in_range32(query) else None
    low = screen is not None
    q, t = (query.astype(np.float32), screen) if screen is not None else (query, target.T)
    g_screen, g_exact = _gamma(k + 4, 2.0**-24 if low else 2.0**-53), _gamma(k + 4, 2.0**-53)
    shrink = (1 - g_screen) * (1 - g_exact) / ((1 + g_screen) * (1 + g_exact))
    b_rows, b_cols = banned if banned is not None else (np.empty(0, np.int64),) * 2
    step = max(1, _BUDGET // width)
    slab = np.empty((min(step, m), width), dtype=t.dtype)  # reused: no fresh pages per slab
    for start in range(0, m, step):
        stop = min(m, start + step)
        s = np.matmul(q[start:stop], t, out=slab[: stop - start])
        lo, hi = np.searchsorted(b_rows, [start, stop])
        s[b_rows[lo:hi] - start, b_cols[lo:hi]] = -np.inf
        ptr, idx = _screen(s, nn, shrink)
        row = np.repeat(np.arange(start, stop), np.diff(ptr))
        exact = np.einsum("ij,ij->i", query[row], target[idx])
        order = np.lexsort((idx, -exact, row))
        row, idx, exact = row[order], idx[order], exact[order]
        rank = np.arange(len(row)) - ptr[row - start]
        keep = rank < nn
        scores[row[keep], rank[keep]] = exact[keep]
        cols[row[keep], rank[keep]] = idx[keep]
    return scores, cols


def screen_copy(x: np.ndarray) -> np.ndarray | None:
    """The (K, N) float32 copy of ``x.T`` that :func:`top_n` screens with (the product with
    this layout costs less than with ``x`` itself), or None when float32 products of ``x``
    could leave the normal range."""
    return np.ascontiguousarray(x.T, dtype=np.float32) if _in_range32(x) else None


def _normalized(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean norm (a zero row stays zero)."""
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


# ------------------------------------------------------------------------------------ id maps


class IdMap:
    """Raw ids <-> indices of one axis, in memory: ``ids`` in index order (int64 or str)."""

    def __init__(self, ids: np.ndarray, noun: str, where: str) -> None:
        self.ids, self.noun, self.where = ids, noun, where
        self._order: np.ndarray | None = None
        self._sorted: np.ndarray = ids

    def index(self, raw: Sequence[Any]) -> np.ndarray:
        """(m,) int64 indices of the raw ids (ints or strings, coerced to the ids' type);
        InputError naming the first unknown ones."""
        if self._order is None:  # _sorted first: a thread that sees _order sees it too
            order = np.argsort(self.ids, kind="stable")
            self._sorted = self.ids[order]
            self._order = order
        integer = self.ids.dtype.kind in "iu"
        ok = np.ones(len(raw), dtype=bool)
        if isinstance(raw, np.ndarray) and raw.dtype.kind == ("i" if integer else "U"):
            wanted = raw.astype(np.int64) if integer else raw  # no per-id coercion needed
        else:
            found, bad = idmap.coerce(raw, integer)
            ok[bad] = False
            wanted = np.zeros(len(raw), dtype=found.dtype)
            wanted[ok] = found
        index = np.full(len(raw), -1, dtype=np.int64)
        if self.ids.size and ok.any():
            sorted_ids = self._sorted
            pos = np.minimum(np.searchsorted(sorted_ids, wanted[ok]), len(sorted_ids) - 1)
            hit = sorted_ids[pos] == wanted[ok]
            index[np.flatnonzero(ok)[hit]] = self._order[pos[hit]]
        missing = np.flatnonzero(index < 0)
        if missing.size:
            names = ", ".join(shown(raw[j]) for j in missing[:5])
            more = f" (and {missing.size - 5} more)" if missing.size > 5 else ""
            raise InputError(f"unknown {self.noun} id {names}{more}: not in {self.where}")
        return index

    def raw(self, index: np.ndarray) -> list[Any]:
        """Raw ids (Python int or str) of the indices."""
        return self.ids[np.asarray(index, dtype=np.int64)].tolist()


def id_map(source: str, axis: str) -> IdMap:
    """The raw ids of ``axis`` ("users" or "items") held in ``source`` (a model holding its id
    maps, or a store), read whole."""
    n = zarr.open_array(f"{source}/{axis}/ids", mode="r").shape[0]
    ids = idmap.ids_slice(source, axis, 0, n)
    dtype = np.int64 if all(isinstance(x, int) for x in ids) else str
    return IdMap(np.array(ids, dtype=dtype), axis[:-1], source)


# ------------------------------------------------------------------------------------- server


def _row_entries(indptr: np.ndarray, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions, in a CSR's column array, of the entries of its rows ``local`` (row after
    row), and each row's number of entries."""
    starts, lengths = indptr[local], indptr[local + 1] - indptr[local]
    before = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum())) + np.repeat(starts - before, lengths), lengths


class Server:
    """The factors of one model in memory, and what is derived from them, built on first use.

    ``store`` (default: the store the model was fitted on) provides the training items of the
    users when given or when the model holds no index of them, and the raw ids when given or
    when the model holds no id maps.
    """

    def __init__(
        self, model: ModelInfo, store: str | None = None, allow_other_store: bool = False
    ) -> None:
        self.model = model
        self.allow_other_store = allow_other_store
        recorded = store or model.header.store.path
        self.store_path = None if recorded is None else locations.location(recorded)
        self._store_given = store is not None
        self._fields: dict[tuple[str, str], np.ndarray] = {}
        self._units: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        self._seen_blocks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._seen_lock = threading.Lock()

    def _field(self, name: str, field: str) -> np.ndarray:
        """``field`` ("mean" or "log_mean") of factor ``name``, all blocks, read once."""
        if (name, field) not in self._fields:
            n = self.model.n_blocks[0 if name == "W" else 1]
            with self.model.reading():  # the version the server was made for, or an error
                if field == "mean":
                    parts = [factor_mean(self.model.path, name, j) for j in range(n)]
                else:
                    parts = [foldin.factor_rows(self.model.path, name, j)[1] for j in range(n)]
            x = np.concatenate(parts)
            if field == "mean" and not (np.all(np.isfinite(x)) and x.min(initial=0.0) >= 0):
                raise StoreError(
                    f"{self.model.path}: factor {name} has negative or non-finite "
                    "entries (the model is damaged)"
                )
            self._fields[name, field] = x
        return self._fields[name, field]

    @property
    def W(self) -> np.ndarray:  # noqa: N802 - the model's notation
        """(U, K) E[W]."""
        return self._field("W", "mean")

    @property
    def H(self) -> np.ndarray:  # noqa: N802
        """(I, K) E[H]."""
        return self._field("H", "mean")

    @cached_property
    def H32t(self) -> np.ndarray | None:  # noqa: N802
        """:func:`screen_copy` of E[H]."""
        return screen_copy(self.H)

    def _unit(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows of E[W] or E[H] scaled to unit norm, and their :func:`screen_copy`."""
        if name not in self._units:
            unit = _normalized(self._field(name, "mean"))
            self._units[name] = (unit, screen_copy(unit))
        return self._units[name]

    @cached_property
    def store(self) -> StoreInfo:
        """The store given, else (for a model without its own index of the training items) the
        training store, whose training items ``filter_already_seen`` needs."""
        fix = "pass store=STORE (the training store), or filter_already_seen=False"
        if self.store_path is None:
            raise StoreError(
                f"{self.model.path}: the model holds no index of its users' "
                f"training items and records no training store; {fix}"
            )
        try:
            info = open_store(self.store_path)
        except StoreError as exc:
            if self._store_given:
                raise
            raise StoreError(
                f"{self.model.path}: the model holds no index of its users' "
                "training items (saved before models carried one) and its training "
                f"store cannot be read ({exc}); {fix}"
            ) from None
        check_compatible(info, self.model, self.allow_other_store)
        return info

    @cached_property
    def _ids_source(self) -> str:
        """Where the raw ids are read: the store given, else the model's own id maps, else its
        training store (:attr:`ModelInfo.ids_path`)."""
        return self.store.path if self._store_given else self.model.ids_path

    @cached_property
    def _spec(self) -> ValueSpec | None:
        """How the training store made classes of raw values (:func:`foldin.value_spec`)."""
        return foldin.value_spec(self.model)

    @cached_property
    def users(self) -> IdMap:
        with self.model.reading():
            return id_map(self._ids_source, "users")

    @cached_property
    def items(self) -> IdMap:
        with self.model.reading():
            return id_map(self._ids_source, "items")

    def _seen_index(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """The model's index of the training items of user-block ``r`` (row pointer, item
        indices), read once and kept: the most recently used user-blocks, within
        :data:`_SEEN_BUDGET` bytes (at least the one asked for)."""
        with self._seen_lock:
            if r in self._seen_blocks:
                self._seen_blocks.move_to_end(r)
                return self._seen_blocks[r]
        with self.model.reading():
            index = seen.load_index(self.model.path, r)
        with self._seen_lock:
            self._seen_blocks[r] = index
            self._seen_blocks.move_to_end(r)
            held = sum(a.nbytes + b.nbytes for a, b in self._seen_blocks.values())
            while held > _SEEN_BUDGET and len(self._seen_blocks) > 1:
                a, b = self._seen_blocks.popitem(last=False)[1]
                held -= a.nbytes + b.nbytes
        return index

    def _seen(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(position in ``users``, item index) of the training nonzeros of the given users
        (sorted, distinct indices), from the model's own index of them unless a store was
        given, else from the training blocks; only the requested users' user-blocks are read."""
        from_model = self.model.has_seen and not self._store_given
        info = None if from_model else self.store
        rb = np.asarray(self.model.header.row_bounds, dtype=np.int64)
        block = np.searchsorted(rb, users, side="right") - 1
        rows, items = [], []
        for r in np.unique(block).tolist():
            pos = np.flatnonzero(block == r)
            local = users[pos] - rb[r]
            if info is None:
                indptr, indices = self._seen_index(r)
                take, lengths = _row_entries(indptr, local)
                rows.append(np.repeat(pos, lengths))
                items.append(indices[take].astype(np.int64))
                continue
            cb = info.col_bounds
            for c in range(info.grid[1]):
                b = read_block(info.path, "train", r, c, values=())
                take, lengths = _row_entries(b.indptr, local)
                rows.append(np.repeat(pos, lengths))
                items.append(b.cols[take].astype(np.int64) + cb[c])
        if not rows:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(rows), np.concatenate(items)

    def _named(self, scores: np.ndarray, cols: np.ndarray, items: IdMap) -> list[Recs]:
        return ranked_pairs(scores, items.raw(cols[np.isfinite(scores)]))

    def _rank_items(
        self,
        w: np.ndarray,
        n: int,
        items: Sequence[Any] | None,
        exclude: Sequence[Any] | None,
        seen: tuple[np.ndarray, np.ndarray] | None,
    ) -> list[Recs]:
        """Top-n items for the rows of ``w`` among ``items`` (default all), minus ``exclude``
        (for every row) and the (row, item) pairs ``seen``."""
        pairs = [seen] if seen is not None else []
        if exclude is not None:
            gone = np.unique(self.items.index(id_list(exclude, "exclude")))
            pairs.append((np.repeat(np.arange(len(w)), len(gone)), np.tile(gone, len(w))))
        if items is None:
            cand, target, target32t = None, self.H, self.H32t
        else:
            cand = np.unique(self.items.index(id_list(items, "items")))
            target = self.H[cand]
            target32t = None if self.H32t is None else self.H32t[:, cand]
        rows = np.concatenate([p[0] for p in pairs]) if pairs else np.empty(0, np.int64)
        cols = np.concatenate([p[1] for p in pairs]) if pairs else np.empty(0, np.int64)
        if cand is not None:  # item index -> column of the restricted target
            pos = np.minimum(np.searchsorted(cand, cols), max(len(cand) - 1, 0))
            inside = cand[pos] == cols if len(cand) else np.zeros(len(cols), bool)
            rows, cols = rows[inside], pos[inside]
        order = np.argsort(rows, kind="stable")
        scores, top = top_n(w, target, target32t, n, (rows[order], cols[order]))
        if cand is not None:
            top = np.where(top >= 0, cand[np.maximum(top, 0)], -1)
        return self._named(scores, top, self.items)

    # -- public operations ------------------------------------------------------------------
    def recommend(
        self,
        user_ids: Any,
        n: int = 10,
        filter_already_seen: bool = True,
        items: Sequence[Any] | None = None,
        exclude: Sequence[Any] | None = None,
    ) -> dict[Any, Recs]:
        """Top-``n`` items per user: ``{user id as given: [(raw item id, score), ...]}``."""
        n = check_n(n)
        users = id_list(user_ids, "user_ids")
        index = self.users.index(users)
        uniq, inverse = np.unique(index, return_inverse=True)
        seen = self._seen(uniq) if filter_already_seen else None
        recs = self._rank_items(self.W[uniq], n, items, exclude, seen)
        return {user: recs[j] for user, j in zip(users, inverse.tolist(), strict=True)}

    def recommend_for(
        self,
        w: np.ndarray,
        n: int = 10,
        exclude: Sequence[Sequence[Any]] | None = None,
        items: Sequence[Any] | None = None,
    ) -> dict[int, Recs]:
        """Top-``n`` items for users given by their factors (e.g. from :meth:`fold_in_users`),
        without the raw items ``exclude[j]`` for row j: ``{row j of w: [(raw item id, score),
        ...]}``, the shape of :meth:`recommend` keyed by row (new users have no id yet)."""
        n = check_n(n)
        w = np.asarray(w, dtype=np.float64)
        k = self.H.shape[1]
        if w.ndim != 2 or w.shape[1] != k or not np.all(np.isfinite(w)) or w.min(initial=0) < 0:
            raise InputError(
                f"w must be a finite nonnegative (n_users, {k}) array, got shape {w.shape}"
            )
        seen = None
        if exclude is not None:
            rows = [id_list(a, f"exclude[{j}]") for j, a in enumerate(id_list(exclude, "exclude"))]
            if len(rows) != len(w):
                raise InputError(f"exclude has {len(rows)} lists for {len(w)} rows of w")
            flat = [x for a in rows for x in a]
            seen = (np.repeat(np.arange(len(w)), [len(a) for a in rows]), self.items.index(flat))
        return dict(enumerate(self._rank_items(w, n, items, None, seen)))

    def similar(self, axis: str, ids: Any, n: int = 10) -> dict[Any, Recs]:
        """The ``n`` rows of ``axis`` ("items" or "users") most similar to each given one by
        the cosine of their E[.] rows, itself excluded: ``{id: [(raw id, cosine), ...]}``."""
        n = check_n(n)
        ids = id_list(ids, f"{axis[:-1]}_ids")
        names = self.items if axis == "items" else self.users
        unit, unit32 = self._unit("H" if axis == "items" else "W")
        index = names.index(ids)
        uniq, inverse = np.unique(index, return_inverse=True)
        rows = np.arange(len(uniq))
        scores, top = top_n(unit[uniq], unit, unit32, n, (rows, uniq))
        recs = self._named(scores, top, names)
        return {x: recs[j] for x, j in zip(ids, inverse.tolist(), strict=True)}

    def score(self, user_ids: Sequence[Any], item_ids: Sequence[Any]) -> np.ndarray:
        """``E[w_u] . E[h_i]`` for the pairs (user_ids[j], item_ids[j]), shape (m,)."""
        users, items = id_list(user_ids, "user_ids"), id_list(item_ids, "item_ids")
        if len(users) != len(items):
            raise InputError(
                f"score needs as many users as items, got {len(users)} and {len(items)}"
            )
        u, i = self.users.index(users), self.items.index(items)
        return np.einsum("ij,ij->i", self.W[u], self.H[i])

    def fold_in(
        self,
        axis: str,
        ids: Sequence[Sequence[Any]],
        values: Sequence[Sequence[float]],
        max_iter: int = 500,
        tol: float = 1e-6,
        seed: int | None = None,
        new_ids: Sequence[Any] | None = None,
    ) -> np.ndarray:
        """E[.] of NEW rows of ``axis`` ("users" or "items") from their interactions with the
        existing other side, which stays fixed with the thresholds (as
        :func:`ordnmf_dask.postfit.foldin.fold_in`, in memory; ``ids`` are the other side's raw
        ids; ``new_ids``, the new rows' own raw ids, name them in warnings). Returns (n_new, K)
        float64, in the order given."""
        settings = validate_call("fold_in", {"max_iter": max_iter, "tol": tol, "seed": seed})
        max_iter, tol, seed = settings["max_iter"], settings["tol"], settings["seed"]
        new, other = ("user", "item") if axis == "users" else ("item", "user")
        flat, flat_values, row = foldin.flatten(ids, values, new, other)
        likelihoods, threshold = foldin.likelihoods_of(self.model)
        n_classes = self.model.header.store.n_classes
        y, keep = foldin.check_values(flat_values, likelihoods[0], n_classes, threshold, self._spec)
        names = self.items if axis == "users" else self.users
        index = names.index(flat)
        block = foldin.interactions(row[keep], index[keep], y, len(ids), new, other)
        touched = np.unique(index[keep])
        name = "H" if axis == "users" else "W"
        mean, log_mean = self._field(name, "mean"), self._field(name, "log_mean")
        alpha = self.model.header.alpha(axis)
        with compiling.announced_as("fold-in"):
            result = fold_in_members(
                block,
                mean[touched],
                log_mean[touched],
                mean.sum(axis=0),
                alpha,
                likelihoods,
                self.model.header.n_components,
                name == "W",
                max_iter=max_iter,
                tol=tol,
                seed=seed,
            )
        foldin.warn_unconverged(result, axis, max_iter, tol, block, new_ids)
        return result.mean


_CACHE: OrderedDict[tuple, Server] = OrderedDict()
_CACHE_SIZE = 2
_CACHE_LOCK = threading.Lock()


def server(
    model: Any, store: str | os.PathLike | None = None, allow_other_store: bool = False
) -> Server:
    """The :class:`Server` of ``model`` (a model directory, an opened :class:`ModelInfo` (kept
    at its version: a model replaced since is an error saying so) or a fitted estimator), from
    the process's cache while the directory on disk is the same one; ``allow_other_store`` as
    for :func:`~ordnmf_dask.postfit.evaluate.check_compatible`."""
    if isinstance(model, ModelInfo):
        opened: ModelInfo | None = model
        path, identity = model.path, model.version
    else:
        opened = None
        path = locations.location(getattr(model, "model_path_", model))
        try:
            identity = locations.identity(locations.join(path, "zarr.json"))
        except OSError:
            open_model(path)  # raises the StoreError that names what is wrong
            raise
    where = None if store is None else locations.location(store)
    key = (path, *identity, where, allow_other_store)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    found = Server(opened or open_model(path), where, allow_other_store)
    with _CACHE_LOCK:
        _CACHE[key] = found
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return found


def fits_in_memory(model: str | os.PathLike) -> bool:
    """Whether serving ``model`` in memory (its factors, their float32 and unit-norm copies)
    takes under half of the memory available now."""
    m = open_model(os.fspath(model))
    s, k = m.header.store, m.header.width
    need = 8 * k * (s.n_users + s.n_items) * 4
    return need < psutil.virtual_memory().available / 2
