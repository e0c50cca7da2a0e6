"""The per-piece and per-partition tasks of the distributed ingest (:mod:`.distributed`).

Every task reads its inputs from the staging directory, writes its outputs there, and returns
only small values or degree vectors that are tree-reduced on the workers (O(I) per item
vector; a partition's users only, joined in order, per user vector). Staged files are plain
``.npy`` arrays (no pickle). The rows of a test file go through the same passes beside
the training rows (``test_codes_task``, ``test_partition_task``, the test side of
``dedupe_task``, ``block_task``), with the test-file rules of :mod:`.testset`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.filtering import dedupe, distinct_ids, encode_pair, encode_sorted
from ordnmf_dask.sources.memchunks import MemoryChunk
from ordnmf_dask.sources.origin import Origin, Taken
from ordnmf_dask.sources.parquet import ParquetChunk
from ordnmf_dask.sources.split import SplitRule, id_hashes, lookup, pair_hash
from ordnmf_dask.sources.testset import (
    classify_test_rows,
    first_overlap,
    known_test,
    overlap_message,
)
from ordnmf_dask.sources.textsplit import Chunk, chunk_origin, parse_chunk
from ordnmf_dask.sources.values import ValueSpec, classify
from ordnmf_dask.store import locations
from ordnmf_dask.store.blocks import CHUNK, zarr_id_dtype
from ordnmf_dask.store.grid import BlockedNonzeros, block_sort
from ordnmf_dask.store.staged import (
    Gather,
    StagedIds,
    load_arrays,
    load_rows,
    remove_arrays,
    save_arrays,
    save_segments,
    staging_dir,
    widen,
)

_SAMPLE = 64  # distinct ids per chunk and side sampled for the id ranges' splitters
AnyChunk = Chunk | ParquetChunk | MemoryChunk


def as_kind(ids: np.ndarray, kind: str) -> np.ndarray:
    """Ids in the global kind (``"i"``: int64, ``"U"``: str; integers in decimal)."""
    return ids if ids.dtype.kind == kind else ids.astype(str)


def chunk_prefix(tmp: str, index: int) -> str:
    return locations.join(staging_dir(tmp, "chunks"), f"{index:06d}")


def _piece(tmp: str, index: int, part: int, columns: list[str]) -> dict[str, np.ndarray]:
    """The rows of chunk ``index`` routed to partition ``part`` (see ``partition_task``)."""
    prefix = chunk_prefix(tmp, index)
    lo, hi = load_arrays(prefix, ["part_offsets"])["part_offsets"][part : part + 2]
    return {n: load_rows(prefix, f"p_{n}", int(lo), int(hi)) for n in columns}


def _part_prefix(tmp: str, part: int) -> str:
    return locations.join(staging_dir(tmp, "nonzeros"), f"{part:06d}")


# --------------------------------------------------------------------------- pass 1: parse


def parse_task(chunk: AnyChunk, tmp: str) -> dict:
    """Parse a chunk (text byte range, Parquet row group or data in memory), dictionary-encode
    its ids, stage (codes, values, line) and its distinct ids (``users``, ``items``, in the
    order first seen: nothing later needs them sorted); return a summary.

    Returns
    -------
    dict
        rows, value max, first value that is not a positive integer (value, line) or None;
        per side ("users", "items"), the number of distinct ids and ``_SAMPLE`` of them (to
        cut the ids into ranges).
    """
    triples = parse_chunk(chunk)
    if triples is None:
        return {"rows": 0, "vmax": None, "bad": None}
    (users, uc), (items, ic) = encode_pair(
        triples.users, triples.items, triples.origin, distinct_ids
    )
    values, line = triples.values, triples.origin.line
    assert isinstance(line, np.ndarray)  # a chunk's rows carry their lines (or row numbers)
    if len(line) and line.max() < 2**31:
        line = line.astype(np.int32)  # staged smaller; joined rows widen it back
    save_arrays(
        chunk_prefix(tmp, chunk.index),
        {
            "uc": uc,
            "ic": ic,
            "users": users,
            "items": items,
            "values": values,
            "line": line,
        },
    )
    bad = np.flatnonzero((values < 1) | (values != np.round(values)))
    return {
        **{
            what: (
                len(ids),
                widen(ids[np.linspace(0, len(ids) - 1, min(_SAMPLE, len(ids))).astype(int)]),
            )
            for what, ids in (("users", users), ("items", items))
        },
        "rows": len(values),
        "vmax": float(values.max()),
        "bad": None if not bad.size else (float(values[bad[0]]), int(line[bad[0]])),
    }


# --------------------------------------------------------------------------- pass 2: ids


def _range_prefix(tmp: str, what: str, index: int, kind: str) -> str:
    """Where id range ``index`` stages its ``kind``: "ids" (kept to name ids in messages) or
    "codes" (removed once every chunk has its codes)."""
    return locations.join(staging_dir(tmp, kind), f"{what}-{index:06d}")


def split_ids_task(index: int, tmp: str, what: str, kind: str, splitters: np.ndarray) -> list:
    """Group a parsed chunk's distinct ``what`` ids by id range ``(splitters[r-1],
    splitters[r]]``: staged as ``r_<what>`` with the order that groups them
    (``r_<what>_order``) in place of the parsed ids, which are removed (they would otherwise
    sit beside the grouped ones at the staging's peak); returns the (R + 1,) offsets of the
    ranges in them, as a list.

    Ids of another kind than the global one (integers among string ids) are converted first.
    A rerun of the task (its worker lost after the removal) finds the grouped ids and returns
    the same offsets.
    """
    prefix = chunk_prefix(tmp, index)
    try:
        ids = load_arrays(prefix, [what], staged=True)[what]
    except FileNotFoundError:
        grouped = load_arrays(prefix, [f"r_{what}"], staged=True)[f"r_{what}"]
        return _range_offsets(_id_ranges(grouped, splitters), len(splitters))
    if ids.dtype.kind != "S":
        ids = as_kind(ids, kind)
    ranges = _id_ranges(ids, splitters)
    small = ranges.astype(np.int16) if len(splitters) < np.iinfo(np.int16).max else ranges
    order = np.argsort(small, kind="stable")  # a radix sort for 16-bit keys
    save_arrays(prefix, {f"r_{what}": ids[order], f"r_{what}_order": order.astype(np.int32)})
    remove_arrays(prefix, [what])
    return _range_offsets(ranges, len(splitters))


def remove_task(index: int, tmp: str, names: list[str]) -> None:
    """Remove the staged arrays ``names`` of chunk ``index`` (on the workers, which staged
    them: at a URL, one request each)."""
    remove_arrays(chunk_prefix(tmp, index), names)


def _id_ranges(ids: np.ndarray, splitters: np.ndarray) -> np.ndarray:
    """The id range of each id (of the global kind, or ASCII ones staged as bytes)."""
    if ids.dtype.kind == "S":  # compared as UTF-8, whose byte order is the code points' order
        splitters = np.char.encode(splitters, "utf-8")
    return np.searchsorted(splitters, ids, side="left")


def _range_offsets(ranges: np.ndarray, n_splitters: int) -> list[int]:
    return [0, *(int(x) for x in np.cumsum(np.bincount(ranges, minlength=n_splitters + 1)))]


@dataclass(frozen=True)
class RangeJob:
    """Id range ``index`` and its piece in every chunk: (chunk index, start, stop)."""

    index: int
    pieces: tuple[tuple[int, int, int], ...]


def range_task(job: RangeJob, tmp: str, what: str) -> int:
    """Sorted distinct ids of one id range (the union of its pieces); stages them (``ids``),
    their hashes (``hashes``: ``split.id_hashes``, for the random split) and, piece after
    piece, the pieces' codes among them (``codes``, int32); returns how many there are."""
    loaded = [
        load_rows(chunk_prefix(tmp, c), f"r_{what}", lo, hi, staged=True)
        for c, lo, hi in job.pieces
    ]
    if len({a.dtype.kind for a in loaded}) > 1:  # ASCII pieces beside others
        loaded = [widen(a) for a in loaded]
    ids, codes = encode_sorted(np.concatenate(loaded))
    ids = widen(ids)
    save_arrays(_range_prefix(tmp, what, job.index, "ids"), {"ids": ids, "hashes": id_hashes(ids)})
    save_arrays(_range_prefix(tmp, what, job.index, "codes"), {"codes": codes})
    return len(ids)


class IdRanges:
    """The global sorted ids of one kind, read entry by entry from their staged ranges (for
    messages naming an id): no task holds all of them."""

    def __init__(self, tmp: str, what: str, offsets: np.ndarray) -> None:
        self.tmp, self.what, self.offsets = tmp, what, offsets

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, code: int) -> object:
        r = int(np.searchsorted(self.offsets, code, side="right")) - 1
        at = int(code) - int(self.offsets[r])
        return load_rows(_range_prefix(self.tmp, self.what, r, "ids"), "ids", at, at + 1)[0]

    def hashes(self, start: int, stop: int) -> np.ndarray:
        """The staged hashes (``split.id_hashes``) of the ids of codes ``start .. stop - 1``."""
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        last = int(np.searchsorted(self.offsets, stop, side="left"))
        parts = [np.zeros(0, np.uint64)]
        for r in range(max(first, 0), min(last, len(self.offsets) - 1)):
            lo, hi = int(self.offsets[r]), int(self.offsets[r + 1])
            parts.append(
                load_rows(
                    _range_prefix(self.tmp, self.what, r, "ids"),
                    "hashes",
                    max(start, lo) - lo,
                    min(stop, hi) - lo,
                )
            )
        return np.concatenate(parts)

    def load(self) -> np.ndarray:
        """All of them, in order (only a test file's chunks need them)."""
        return np.concatenate(
            [
                load_arrays(_range_prefix(self.tmp, self.what, r, "ids"), ["ids"])["ids"]
                for r in range(len(self.offsets) - 1)
            ]
        )

    def staged(self, kept: np.ndarray, kind: str) -> StagedIds:
        """The ids of codes ``kept`` (increasing) to write to the store: pieces of the ranges'
        staged ids cut at the store's chunk bounds; ``kind`` "i" (int64) or "U" (str)."""
        edges = np.unique(
            np.concatenate(
                [
                    [0, len(kept)],
                    np.searchsorted(kept, self.offsets[1:-1]),
                    np.arange(CHUNK, len(kept), CHUNK),
                ]
            )
        )
        parts = []
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            r = int(np.searchsorted(self.offsets, kept[lo], side="right")) - 1
            local = kept[lo:hi] - self.offsets[r]
            take = (
                range(int(local[0]), int(local[-1]) + 1)
                if local[-1] - local[0] + 1 == len(local)
                else local.astype(np.int32)
            )
            parts.append(Gather(_range_prefix(self.tmp, self.what, r, "ids"), "ids", take))
        return StagedIds(tuple(parts), zarr_id_dtype(kind))


# --------------------------------------------------------------------------- pass 3: codes


@dataclass(frozen=True)
class CodesJob:
    """Chunk ``chunk`` and where its ids' codes are: per side, (range, start, stop) in the
    ranges' staged ``codes``, in range order (the order of ``split_ids_task``'s groups)."""

    chunk: AnyChunk
    users: tuple[tuple[int, int, int], ...]
    items: tuple[tuple[int, int, int], ...]


def codes_task(
    job: CodesJob,
    tmp: str,
    spec: ValueSpec,
    user_offsets: np.ndarray,
    item_offsets: np.ndarray,
    stride: int,
) -> np.ndarray:
    """Check every value of a chunk and stage the global codes of its distinct ids (``to_u``,
    ``to_i``); return every ``stride``-th row's user code (a row-weighted sample of users)."""
    prefix = chunk_prefix(tmp, job.chunk.index)
    data = load_arrays(prefix, ["uc", "values", "line"])
    classify(spec, data["values"], chunk_origin(job.chunk, data["line"]))  # names file, line
    to_u = _global_codes(tmp, prefix, "users", job.users, user_offsets)
    to_i = _global_codes(tmp, prefix, "items", job.items, item_offsets)
    save_arrays(prefix, {"to_u": to_u, "to_i": to_i})
    remove_arrays(prefix, ["r_users_order", "r_items_order"])
    return to_u[data["uc"][job.chunk.index % stride :: stride]]


def _global_codes(
    tmp: str,
    prefix: str,
    what: str,
    pieces: tuple[tuple[int, int, int], ...],
    offsets: np.ndarray,
) -> np.ndarray:
    """Global codes of a chunk's distinct ``what`` ids, in their order (int32)."""
    codes = np.concatenate(
        [np.zeros(0, np.int32)]
        + [
            load_rows(_range_prefix(tmp, what, r, "codes"), "codes", lo, hi) + np.int32(offsets[r])
            for r, lo, hi in pieces
        ]
    )
    out = np.empty_like(codes)
    out[load_arrays(prefix, [f"r_{what}_order"])[f"r_{what}_order"]] = codes
    return out


def test_codes_task(
    chunk: AnyChunk,
    tmp: str,
    spec: ValueSpec,
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    t_users: np.ndarray,
    t_items: np.ndarray,
    stride: int,
) -> np.ndarray:
    """Check every value of a test chunk and stage, for its distinct ids, their codes among
    the training ids (``to_u``, ``to_i``; -1 for an id the training data lacks, as
    ``split.lookup`` finds them in memory) and among the test set's own sorted ids
    (``to_tu``, ``to_ti``); return every ``stride``-th row's training user code (-1 left
    out)."""
    prefix = chunk_prefix(tmp, chunk.index)
    data = load_arrays(prefix, ["uc", "users", "items", "values", "line"])
    classify(spec, data["values"], chunk_origin(chunk, data["line"]))
    to_u, to_i = lookup(user_ids, data["users"]), lookup(item_ids, data["items"])
    save_arrays(
        prefix,
        {
            "to_u": to_u,
            "to_i": to_i,
            "to_tu": np.searchsorted(t_users, as_kind(data["users"], t_users.dtype.kind)).astype(
                np.int32
            ),
            "to_ti": np.searchsorted(t_items, as_kind(data["items"], t_items.dtype.kind)).astype(
                np.int32
            ),
        },
    )
    u = to_u[data["uc"][chunk.index % stride :: stride]]
    return u[u >= 0]


def ids_task(chunks: list[int], tmp: str, what: str) -> np.ndarray:
    """Sorted distinct ``what`` ids of the parsed ``chunks`` (of a test file, whose ids every
    partition holds anyway): int64 if all are, else str."""
    loaded = [load_arrays(chunk_prefix(tmp, c), [what])[what] for c in chunks]
    kind = "U" if any(ids.dtype.kind == "U" for ids in loaded) else "i"
    return encode_sorted(np.concatenate([as_kind(ids, kind) for ids in loaded]))[0]


_PARSED = ("uc", "ic", "to_u", "to_i", "values", "line")  # its ids were removed by codes_task
_TEST_PARSED = (*_PARSED, "to_tu", "to_ti")
_TEST_IDS = ("users", "items")


def partition_task(chunk: AnyChunk, tmp: str, part_bounds: np.ndarray) -> list[int]:
    """Route a chunk's rows (global codes) to user-range partitions; returns the partitions hit.

    The rows are staged once, stably sorted by partition, with ``part_offsets`` (P + 1,): the
    rows of partition p are ``[part_offsets[p], part_offsets[p + 1])`` (one file per column and
    chunk, not per chunk and partition). The chunk's parsed files are removed.
    """
    prefix = chunk_prefix(tmp, chunk.index)
    data = load_arrays(prefix, _PARSED)
    u, i = data["to_u"][data["uc"]], data["to_i"][data["ic"]]
    part = np.searchsorted(part_bounds, u, side="right") - 1
    routed = {"u": u, "i": i, "values": data["values"], "line": data["line"]}
    return _route(prefix, part, len(part_bounds) - 1, routed, _PARSED)


def test_partition_task(
    chunk: AnyChunk, tmp: str, part_bounds: np.ndarray, test_bounds: np.ndarray
) -> list[int]:
    """``partition_task`` for a test chunk: a row of a training user goes to that user's
    partition, a row of another user to partition p if its code among the test set's users is
    in ``[test_bounds[p], test_bounds[p + 1])``. Routed: training codes ``u``, ``i`` (or -1)
    and test codes ``tu``, ``ti``."""
    prefix = chunk_prefix(tmp, chunk.index)
    data = load_arrays(prefix, _TEST_PARSED)
    u, i = data["to_u"][data["uc"]], data["to_i"][data["ic"]]
    tu, ti = data["to_tu"][data["uc"]], data["to_ti"][data["ic"]]
    part = (
        np.where(
            u >= 0,
            np.searchsorted(part_bounds, u, side="right"),
            np.searchsorted(test_bounds, tu, side="right"),
        )
        - 1
    )
    routed = {"u": u, "i": i, "tu": tu, "ti": ti, "values": data["values"], "line": data["line"]}
    return _route(prefix, part, len(part_bounds) - 1, routed, _TEST_PARSED + _TEST_IDS)


def _route(
    prefix: str,
    part: np.ndarray,
    n_parts: int,
    routed: dict[str, np.ndarray],
    parsed: tuple[str, ...],
) -> list[int]:
    """Stage ``routed`` sorted by partition with ``part_offsets``, remove the ``parsed`` files;
    return the partitions hit."""
    small = part.astype(np.int16) if n_parts <= np.iinfo(np.int16).max else part
    order = np.argsort(small, kind="stable")  # a radix sort for 16-bit keys
    counts = np.bincount(part, minlength=n_parts)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    save_arrays(
        prefix, {**{f"p_{n}": a[order] for n, a in routed.items()}, "part_offsets": offsets}
    )
    remove_arrays(prefix, parsed)
    return [int(p) for p in np.flatnonzero(counts)]


# --------------------------------------------------------------------------- pass 3: merge


@dataclass(frozen=True)
class PartJob:
    """Partition ``part`` and the (chunk index, file index) of its pieces, in input order:
    training pieces (every partition has some: each of its users has training rows), then
    test pieces."""

    part: int
    pieces: tuple[tuple[int, int], ...]
    test_pieces: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, eq=False)
class TestSet:
    """What the partitions need of a test file: its sorted distinct ids and an Origin (of no
    rows) naming its files or partitions."""

    users: np.ndarray
    items: np.ndarray
    names: Origin


def _gather(
    tmp: str, part: int, pieces: tuple[tuple[int, int], ...], columns: list[str], names: Origin
) -> tuple[dict[str, np.ndarray], Origin, np.ndarray]:
    """The rows of a partition's pieces in input order, their Origin and their chunk index."""
    loaded = [_piece(tmp, c, part, columns) for c, _ in pieces]
    cat = {n: np.concatenate([p[n] for p in loaded]) for n in columns}
    sizes = [len(p["line"]) for p in loaded]
    fidx, cidx = (np.repeat(np.array([x[k] for x in pieces], np.int32), sizes) for k in (1, 0))
    return cat, names.rows(fidx, cat["line"]), cidx


def dedupe_task(
    job: PartJob,
    tmp: str,
    spec: ValueSpec,
    policy: str,
    user_ids: IdRanges,
    item_ids: IdRanges,
    names: Origin,
    test: TestSet | None,
) -> tuple[int, int, dict | None]:
    """Merge duplicate pairs of a partition, classify, stage the interactions; the same for
    its test rows if ``test`` is given (a test file).

    ``names`` is an Origin (of no rows) naming the training input's files (or partitions),
    to name rows in messages.

    Returns
    -------
    (int, int, dict or None)
        Distinct pairs, pairs that are "not an interaction", and of the test rows (None without
        a test file): ``overlap``, the first test row whose pair is a training pair, as
        ((chunk index, line), message), or None; ``failure``, the message of the first test
        pair that cannot be merged or classified, or None; ``not``, test pairs that are not an
        interaction. Test errors are returned, not raised, so that every training error is
        raised first, as in memory.
    """
    cat, origin, _ = _gather(tmp, job.part, job.pieces, ["u", "i", "values", "line"], names)
    rows, raw = dedupe(cat["u"], cat["i"], cat["values"], origin, policy, user_ids, item_ids)
    y, keep = classify(spec, raw, Taken(origin, rows))
    n, n_not = len(rows), int((~keep).sum())
    kept = rows if n_not == 0 else rows[keep]
    save_arrays(
        _part_prefix(tmp, job.part),
        {
            "u": cat["u"][kept],
            "i": cat["i"][kept],
            "y": y if n_not == 0 else y[keep],
            "raw": raw if n_not == 0 else raw[keep],
        },
    )
    if test is None:
        return n, n_not, None
    return (
        n,
        n_not,
        _test_rows(
            job,
            tmp,
            spec,
            policy,
            len(item_ids),
            test,
            cat["u"][rows],
            cat["i"][rows],
            origin.take(rows),
        ),
    )


def _test_rows(
    job: PartJob,
    tmp: str,
    spec: ValueSpec,
    policy: str,
    n_items: int,
    test: TestSet,
    train_u: np.ndarray,
    train_i: np.ndarray,
    train_origin: Origin,
) -> dict:
    """The test side of ``dedupe_task``: the overlap check against the partition's training
    pairs (all of them, interactions or not, as in memory), then the test pairs merged and
    classified; the interactions are staged with their training codes (-1 where unknown)."""
    prefix = _part_prefix(tmp, job.part)
    out: dict = {"overlap": None, "failure": None, "not": 0}
    if not job.test_pieces:
        empty = np.zeros(0, np.int64)
        save_arrays(
            prefix,
            {
                "test_u": empty,
                "test_i": empty,
                "test_y": np.zeros(0, np.uint8),
                "test_raw": np.zeros(0),
            },
        )
        return out
    columns = ["u", "i", "tu", "ti", "values", "line"]
    cat, origin, cidx = _gather(tmp, job.part, job.test_pieces, columns, test.names)
    hit = first_overlap(cat["u"], cat["i"], n_items, train_u, train_i)
    if hit is not None:
        k, j = hit
        out["overlap"] = (
            (int(cidx[k]), int(cat["line"][k])),
            overlap_message(
                origin, k, test.users[cat["tu"][k]], test.items[cat["ti"][k]], train_origin, j
            ),
        )
    try:
        rows, y, raw, keep = classify_test_rows(
            cat["tu"], cat["ti"], cat["values"], origin, policy, test.users, test.items, spec
        )
    except InputError as exc:
        out["failure"] = str(exc)
        return out
    rows = rows[keep]
    save_arrays(
        prefix,
        {
            "test_u": cat["u"][rows],
            "test_i": cat["i"][rows],
            "test_y": y[keep],
            "test_raw": raw[keep],
        },
    )
    out["not"] = int((~keep).sum())
    return out


# --------------------------------------------------------------------------- filtering


def join_add(a: tuple, b: tuple) -> tuple:
    """Combine (users, items) degree results of consecutive partitions: the user parts (of
    their own user ranges) joined in order, the item parts (of all items) added."""
    return np.concatenate([a[0], b[0]]), a[1] + b[1]


def degree_task(
    part: int,
    tmp: str,
    bounds: np.ndarray,
    user_alive: np.ndarray | None,
    item_alive: np.ndarray | None,
    n_items: int,
    sides: str = "ui",
) -> tuple[np.ndarray, np.ndarray]:
    """(Interactions per user of the partition's user range, per item) among rows of alive
    users and items (None: all alive); a side not in ``sides`` ("u", "i") is left empty, so
    that a filter round reduces only the side it needs (``join_add``)."""
    data = load_arrays(_part_prefix(tmp, part), ["u", "i"])
    keep = _alive(data["u"], data["i"], user_alive, item_alive)
    lo, hi = int(bounds[part]), int(bounds[part + 1])
    empty = np.zeros(0, np.int64)
    users = np.bincount(data["u"][keep] - lo, minlength=hi - lo) if "u" in sides else empty
    items = np.bincount(data["i"][keep], minlength=n_items) if "i" in sides else empty
    return users.astype(np.int64), items.astype(np.int64)


def _alive(
    u: np.ndarray, i: np.ndarray, user_alive: np.ndarray | None, item_alive: np.ndarray | None
) -> np.ndarray:
    keep = np.ones(len(u), dtype=bool)
    if user_alive is not None:
        keep &= user_alive[u]
    if item_alive is not None:
        keep &= item_alive[i]
    return keep


# --------------------------------------------------------------------------- after filtering


@dataclass(frozen=True, eq=False)
class Final:
    """Filter result and final indices. Users: partition p's kept users are numbered from
    ``user_first[p]`` in code order (each partition finds which of its users are kept from
    its own rows); items: ``item_map`` (old code -> new index, -1 if removed), O(I)."""

    bounds: np.ndarray  # (P + 1,) the partitions' user code ranges
    user_alive: np.ndarray | None
    item_alive: np.ndarray | None
    user_first: np.ndarray | None
    item_map: np.ndarray | None
    n_items: int
    seed: int
    #: which pair hashes are test and validation pairs (None: before the split)
    rule: SplitRule | None = None
    user_ids: IdRanges | None = None  # the users' staged ids, for their hashes
    item_hash: np.ndarray | None = None  # (I,) the hash of each item code's raw id
    file_test: bool = False  # the test pairs are those of a test file (staged as ``test_*``)


def _user_map(part: int, fin: Final, u: np.ndarray) -> np.ndarray:
    """Old code -> new index (-1 if removed) of the partition's users, from its kept rows'
    user codes ``u``."""
    assert fin.user_first is not None
    lo, hi = int(fin.bounds[part]), int(fin.bounds[part + 1])
    kept = np.bincount(u - lo, minlength=hi - lo) > 0
    return np.where(kept, np.cumsum(kept) - 1 + fin.user_first[part], -1)


def _kept_rows(part: int, tmp: str, fin: Final, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """A partition's interactions after filtering, in codes before it."""
    data = load_arrays(_part_prefix(tmp, part), list(columns))
    if fin.user_alive is None and fin.item_alive is None:  # no min_count filter
        return data
    keep = _alive(data["u"], data["i"], fin.user_alive, fin.item_alive)
    return {k: a[keep] for k, a in data.items()}


_SUBSETS = ("train", "test", "validation")  # a kept pair's subset, staged by its number
_TRAIN, _TEST, _VALIDATION = range(3)


def _kept(
    part: int, tmp: str, fin: Final, subset: np.ndarray | None, columns: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A partition's interactions after filtering (``columns`` of them), in final indices, the
    subset of each (``subset`` as staged by ``train_degrees_task``; None: by the hash of its
    raw ids, ``split.SplitRule``), and its user map."""
    d = _kept_rows(part, tmp, fin, columns)
    assert fin.item_map is not None and fin.rule is not None
    assert fin.user_ids is not None and fin.item_hash is not None
    lo, hi = int(fin.bounds[part]), int(fin.bounds[part + 1])
    if subset is None:
        h = pair_hash(fin.user_ids.hashes(lo, hi)[d["u"] - lo], fin.item_hash[d["i"]], fin.seed)
        is_test, is_val = fin.rule.masks(h)
        del h
        subset = is_test.view(np.uint8) * np.uint8(_TEST)
        subset[is_val] = _VALIDATION
    user_map = _user_map(part, fin, d["u"])
    d["u"] = user_map[d["u"] - lo]
    d["i"] = fin.item_map[d["i"]]
    return d, subset, user_map


def train_degrees_task(part: int, tmp: str, fin: Final) -> tuple:
    """(Train nonzeros per kept user of the partition, per item (I',)), in final indices; stages
    the subset of each kept pair (``subset``) for ``block_task``."""
    d, subset, _ = _kept(part, tmp, fin, None, ("u", "i"))
    save_arrays(_part_prefix(tmp, part), {"subset": subset})
    assert fin.user_first is not None
    first, stop = int(fin.user_first[part]), int(fin.user_first[part + 1])
    train = subset == _TRAIN
    return (
        np.bincount(d["u"][train] - first, minlength=stop - first).astype(np.int64),
        np.bincount(d["i"][train], minlength=fin.n_items).astype(np.int64),
    )


def block_task(
    part: int,
    tmp: str,
    fin: Final,
    row_bounds: np.ndarray,
    col_bounds: np.ndarray,
    n_classes: int,
) -> dict:
    """Stage a partition's nonzeros block by block, sorted by (row, col) within each block
    (``grid.block_sort``: a partition's nonzeros are in (user, item) order).

    Returns
    -------
    dict
        ``{"train" | "test" | "validation": ([block ids], [Segment]), "hist_" + the same:
        (V + 1,)}`` (validation empty without a validation fraction); with a test
        file, ``test_unknown``: its interactions dropped as their user or item is not in the
        filtered training data.
    """
    subset = load_arrays(_part_prefix(tmp, part), ["subset"])["subset"]
    d, _, user_map = _kept(part, tmp, fin, subset, ("u", "i", "y", "raw"))
    every = block_sort(
        d["u"], d["i"], d["y"], d["raw"], row_bounds, col_bounds, True, subset, len(_SUBSETS)
    )
    del d
    n_blocks = (len(row_bounds) - 1) * (len(col_bounds) - 1)
    splits = {s: _subset_blocks(every, k, n_blocks) for k, s in enumerate(_SUBSETS)}
    out: dict = {}
    if fin.file_test:
        t, out["test_unknown"] = _file_test(part, tmp, fin, user_map)
        splits["test"] = block_sort(
            t["u"], t["i"], t["y"], t["raw"], row_bounds, col_bounds, presorted=True
        )
    for split, nz in splits.items():
        ids = np.flatnonzero(np.diff(nz.offsets))
        segs = save_segments(
            locations.join(staging_dir(tmp, split), f"{part:06d}"),
            {"rows": nz.rows, "cols": nz.cols, "y": nz.y, "raw": nz.raw},
            nz.offsets[ids],
            nz.offsets[ids + 1],
        )
        out[split] = ([int(b) for b in ids], segs)
        out[f"hist_{split}"] = np.bincount(nz.y, minlength=n_classes + 1).astype(np.int64)
    return out


def _subset_blocks(nz: BlockedNonzeros, k: int, n_blocks: int) -> BlockedNonzeros:
    """The blocks of subset ``k`` of nonzeros sorted subset by subset (views)."""
    offsets = nz.offsets[k * n_blocks : (k + 1) * n_blocks + 1]
    lo, hi = int(offsets[0]), int(offsets[-1])
    return BlockedNonzeros(nz.rows[lo:hi], nz.cols[lo:hi], nz.y[lo:hi], nz.raw[lo:hi], offsets - lo)


def _file_test(
    part: int, tmp: str, fin: Final, user_map: np.ndarray
) -> tuple[dict[str, np.ndarray], int]:
    """A partition's test interactions in final indices, sorted (``testset.known_test``), and
    how many were dropped as unknown to the filtered training data (``user_map``: the
    partition's, see ``_kept``; a training user's test rows are in its partition)."""
    assert fin.item_map is not None
    t = load_arrays(_part_prefix(tmp, part), ["test_u", "test_i", "test_y", "test_raw"])
    u, i = t["test_u"], t["test_i"]
    u = np.where(u >= 0, user_map[np.maximum(u - fin.bounds[part], 0)], -1)  # -1: not training
    i = np.where(i >= 0, fin.item_map[i], -1)
    nz, n_unknown = known_test(u, i, t["test_y"], t["test_raw"], np.ones(len(u), dtype=bool))
    return {"u": nz.u, "i": nz.i, "y": nz.y, "raw": nz.raw}, n_unknown
