"""The ingest pipeline: tasks that a runner executes in this process or on a cluster, in bounded
memory per task.

The same store for the same input and options whatever runs the tasks and however the input is
cut (arrays, ids and attributes; only ``created`` differs): many files, big text files cut
into byte ranges at line boundaries, Parquet files read row group by row group
(:mod:`.textsplit`, :mod:`.parquet`), a dask DataFrame read partition by partition on the
workers (:mod:`.memchunks`). Every option is checked before any input is read
(``options.plan_ingest``). Steps (tasks in
:mod:`.distributed_tasks`; everything big goes through ``TMP/_staging``: on disk, visible to
every worker, or for a URL ``out`` a prefix under it in the object store; held in memory when
the tasks run in this process on a small input, ``staged.held_staging``):

1. plan: per text file, delimiter, header and columns from its first non-blank line; chunks of
   ``chunk_bytes`` and their first line numbers (a newline-counting pass); per Parquet file,
   its columns and row groups (one chunk each) from its footer; per dask DataFrame partition,
   one chunk (its columns checked against the frame's);
2. parse each chunk (``textsplit.parse_chunk``; errors name file and line, row, or partition
   and row); stage its columns and its distinct raw ids (unsorted), and return a sample of those;
   value statistics give the value rule (``values.make_spec``);
3. global ids without any task holding them all: splitters from the samples cut each side's
   ids into ranges (each chunk groups its ids by range); one task per range makes the union of
   the range's pieces of every chunk (sorted, as ``np.unique`` sorts them) and their codes
   among it; a range's offset is the number of ids in the ranges before it. Check every
   value, give each chunk its global codes and route rows to user-range partitions, cut from
   a row-weighted sample of user codes so that they hold about as many rows each;
4. per partition: merge duplicate pairs (``filtering.dedupe``; all rows of a pair are in the same
   partition, in input order) and classify;
5. min-count filtering by degree reductions (items then users below ``min_count`` drop out,
   once for "paper", until nothing changes for "stable"): a row is kept iff its user and item
   are still "alive", so only degree vectors travel (a partition's users only,
   joined in partition order; every item, summed);
6. split: each pair's subset by the seeded hash of its raw ids (``split.SplitRule``); the id
   hashes are staged with the id ranges (``range_task``), so a partition reads
   those of its users, and every partition gets those of all items (O(I));
7. block bounds from the train degrees (``grid.bounds_from_degrees``); each partition stages
   its nonzeros block by block, sorted; as partitions are increasing user ranges, a block is the
   concatenation of its pieces in partition order, which ``staged.assemble_store`` writes
   chunk by chunk.

``build_chunked`` runs them as named stages over one :class:`_Context` (the plan, the runner,
the temporary store, the inputs), each a function that takes the results of those before it:
parse (step 2), code ids and partition (step 3), deduplicate (4), filter (5), split and block
(6, 7), write (7).

A test file (``test``) instead of step 6's random test set is parsed with the training files
(its values count for the value rule) and its ids merged apart. Its rows are routed with the
training rows: a row of a training user to that user's partition, a row of another user by its
place among the test set's sorted users (cut at the partitions' first training ids, so that
partition order is the test users' order). Per partition, :mod:`.testset`'s
functions check that no test pair is a training pair, merge and classify the test pairs; in
step 7 those whose user or item did not survive the filter are dropped and counted. Test errors
are raised after every training error. The validation set is then drawn by the pair hash
from all filtered pairs.

Memory per task: one chunk (a dask DataFrame partition; other data in memory, already held by
the client, is one chunk), one id range (about ``2 * rows_per_partition`` ids read), one
partition (``rows_per_partition`` rows on average, test rows included) or one output chunk,
plus the O(I) item vectors and, while filtering by ``min_count``, a user mask (one byte per
user). With a test file, its chunks also hold the training ids (to look theirs up) and every
partition the test set's distinct ids. The client holds per-user degree vectors and the codes
of the kept users; the ids themselves go from their staged ranges to the store through copy
jobs, like the nonzeros.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.runtime.runner import Runner
from ordnmf_dask.sources.attrs import hist_list, ingest_attrs, validation_attrs
from ordnmf_dask.sources.datakinds import is_dask_dataframe, memory_label
from ordnmf_dask.sources.distributed_tasks import (
    AnyChunk,
    CodesJob,
    Final,
    IdRanges,
    PartJob,
    RangeJob,
    TestSet,
    as_kind,
    block_task,
    codes_task,
    dedupe_task,
    degree_task,
    ids_task,
    join_add,
    parse_task,
    partition_task,
    range_task,
    remove_task,
    split_ids_task,
    test_codes_task,
    test_partition_task,
    train_degrees_task,
)
from ordnmf_dask.sources.inputs import as_list, expand_inputs, inputs_label, is_parquet, source_name
from ordnmf_dask.sources.memchunks import MemoryChunk, frame_chunks, memory_chunk
from ordnmf_dask.sources.options import IngestPlan
from ordnmf_dask.sources.origin import Origin, RowGroups
from ordnmf_dask.sources.parquet import (
    ParquetChunk,
    ParquetFormat,
    check_same_columns,
    check_some_rows,
    parquet_chunks,
)
from ordnmf_dask.sources.split import check_train_left, check_validation_left, split_rule
from ordnmf_dask.sources.testset import check_test_left, warn_unknown
from ordnmf_dask.sources.text import Column
from ordnmf_dask.sources.textsplit import Chunk, FileFormat, input_format, scan_range
from ordnmf_dask.sources.values import ValueSpec, make_spec, warn_whole_stars
from ordnmf_dask.store.blocks import StoreInfo
from ordnmf_dask.store.grid import bounds_from_degrees
from ordnmf_dask.store.staged import (
    assemble_store,
    finish_store,
    held_staging,
    remove_staging,
    staging_dir,
    temporary_store,
)

PathLike = str | os.PathLike
_HELD_CHUNKS = 8  # an in-process ingest of at most this many chunks stages in memory
_SAMPLED_ROWS = 1 << 22  # user codes sampled (about) to balance the partitions by rows


@dataclass(eq=False)
class _Input:
    """One input (training or test data) as chunks.

    ``label`` names it in messages, ``sources`` are what the store records, ``names`` is an
    Origin of no rows naming each of its files (or partitions), and ``files`` the paths of its
    files (None for data in memory), each of which must hold data rows.
    """

    label: str
    sources: list[str]
    names: Origin
    chunks: list[AnyChunk]
    files: list[str] | None


def build_chunked(plan: IngestPlan, runner: Runner) -> StoreInfo:
    """The store of ``plan``, built chunk by chunk by ``runner``'s tasks, in the named stages
    of the module docstring (parse, code ids, partition, deduplicate, filter, split and block,
    write), each a function of one :class:`_Context`: on a cluster, whose every worker must
    see the input files, and ``out``'s directory when it is local (a URL ``out`` is written
    from the workers, staging in place), or in this process. A dask DataFrame's partitions are
    the chunks, each computed on the worker that parses it; other data in memory is one
    chunk."""
    read = (plan.delimiter, plan.header, plan.columns, plan.chunk_bytes)
    train = _plan_input(runner, plan.inputs, "input", *read, 0)
    tested = (
        None
        if plan.test is None
        else _plan_input(runner, plan.test, "test", *read, len(train.chunks))
    )
    ins = [train] if tested is None else [train, tested]
    held = runner.client is None and sum(len(i.chunks) for i in ins) <= _HELD_CHUNKS
    overwrite = plan.options["overwrite"]
    with (
        temporary_store(plan.out, overwrite, runner) as (path, tmp),
        held_staging(tmp) if held else contextlib.nullcontext(),
    ):
        staging_dir(tmp)
        ctx = _Context(plan, runner, tmp, train, tested)
        parsed = _parse_stage(ctx)
        codes = _code_ids_stage(ctx, parsed)
        parts = _partition_stage(ctx, parsed, codes)
        merged = _deduplicate_stage(ctx, parsed, codes, parts)
        kept = _filter_stage(ctx, codes, parts)
        blocked = _split_and_block_stage(ctx, parsed, codes, parts, merged, kept)
        _write_stage(ctx, parsed, codes, merged, kept, blocked)
        return finish_store(tmp, path, overwrite)


@dataclass(eq=False)
class _Context:
    """What every stage of one ingest reads: its checked plan, the runner of its tasks, the
    temporary store (``TMP``, whose ``_staging`` holds everything big) and its inputs."""

    plan: IngestPlan
    runner: Runner
    tmp: str
    train: _Input
    tested: _Input | None

    @property
    def options(self) -> dict[str, Any]:
        return self.plan.options


@dataclass(eq=False)
class _Parsed:
    """Stage parse: the value rule, the rows of each chunk per input (training, then test) and
    the training chunks' summaries (``parse_task``)."""

    spec: ValueSpec
    rows: list[list[int]]
    summaries: list[dict]

    @property
    def n_rows(self) -> int:
        return sum(map(sum, self.rows))


@dataclass(eq=False)
class _Codes:
    """Stage code ids: both sides' global ids, the chunks with rows (training, test), the test
    set's ids (a test input) and the row-weighted sample of user codes of every chunk."""

    users: _Coded
    items: _Coded
    live: list[AnyChunk]
    t_live: list[AnyChunk]
    test_set: TestSet | None
    sample: list[np.ndarray]


@dataclass(eq=False)
class _Parts:
    """Stage partition: the user-code bounds of the partitions and their jobs."""

    bounds: np.ndarray
    jobs: list[PartJob]

    @property
    def parts(self) -> list[int]:
        return [j.part for j in self.jobs]


@dataclass(eq=False)
class _Merged:
    """Stage deduplicate: per partition, (pairs, pairs not an interaction, its test results)."""

    results: list[Any]

    @property
    def n_not(self) -> int:
        return sum(m[1] for m in self.results)

    @property
    def n_kept(self) -> int:
        return sum(m[0] - m[1] for m in self.results)


@dataclass(eq=False)
class _Kept:
    """Stage filter: the alive users and items (a :class:`Final` without its split) and the
    degrees of what the filter keeps."""

    fin: Final
    user_deg: np.ndarray
    item_deg: np.ndarray

    @property
    def n(self) -> int:
        return int(self.user_deg.sum())


@dataclass(eq=False)
class _Blocked:
    """Stage split and block: the block bounds, each partition's placed pieces
    (``block_task``) and the attributes of the test input's checks."""

    row_bounds: np.ndarray
    col_bounds: np.ndarray
    placed: list[dict]
    extra: dict[str, Any]


def _parse_stage(ctx: _Context) -> _Parsed:
    """Parse every chunk (step 2); the value rule from all their values."""
    o = ctx.options
    ins = [ctx.train] if ctx.tested is None else [ctx.train, ctx.tested]
    spec, rows, summaries = _parse(
        ctx.runner, ins, ctx.tmp, o["ratings"], o["counts"], o["binarize"], o["scale_max"]
    )
    return _Parsed(spec, rows, summaries)


def _code_ids_stage(ctx: _Context, parsed: _Parsed) -> _Codes:
    """Global ids of both sides and each chunk's codes (step 3), the test input's among the
    training ids."""
    runner, tmp, per_range = ctx.runner, ctx.tmp, 2 * ctx.plan.rows_per_partition
    found = [k for k, n in enumerate(parsed.rows[0]) if n > 0]
    live = [ctx.train.chunks[k] for k in found]
    summaries = [parsed.summaries[k] for k in found]
    users = _code_ids(runner, live, summaries, tmp, "users", per_range)
    items = _code_ids(runner, live, summaries, tmp, "items", per_range)
    stride = max(1, parsed.n_rows // _SAMPLED_ROWS)
    coded = [CodesJob(c, users.pieces[k], items.pieces[k]) for k, c in enumerate(live)]
    offsets = users.ranges.offsets, items.ranges.offsets
    sample = runner.map(codes_task, coded, tmp, parsed.spec, *offsets, stride)
    remove_staging(tmp, "codes")  # every chunk has its codes now
    if ctx.tested is None:
        return _Codes(users, items, live, [], None, sample)
    t_live = [c for c, n in zip(ctx.tested.chunks, parsed.rows[1], strict=True) if n > 0]
    t_index = [c.index for c in t_live]
    test_set = TestSet(
        runner.map(ids_task, [t_index], tmp, "users")[0],
        runner.map(ids_task, [t_index], tmp, "items")[0],
        ctx.tested.names,
    )
    sample += runner.map(
        test_codes_task,
        t_live,
        tmp,
        parsed.spec,
        runner.share(users.ranges.load()),  # to look their ids up
        runner.share(items.ranges.load()),
        runner.share(test_set.users),
        runner.share(test_set.items),
        stride,
    )
    return _Codes(users, items, live, t_live, test_set, sample)


def _partition_stage(ctx: _Context, parsed: _Parsed, codes: _Codes) -> _Parts:
    """Route the rows to user-range partitions of about as many rows each (step 3)."""
    runner, tmp = ctx.runner, ctx.tmp
    n_users = len(codes.users.ranges)
    n_parts = max(1, min(n_users, math.ceil(parsed.n_rows / ctx.plan.rows_per_partition)))
    bounds = _sample_bounds(np.concatenate(codes.sample), n_users, n_parts)
    hits = runner.map(partition_task, codes.live, tmp, bounds)
    t_hits = (
        []
        if codes.test_set is None
        else runner.map(
            test_partition_task,
            codes.t_live,
            tmp,
            bounds,
            _test_bounds(codes.users, codes.test_set.users, bounds),
        )
    )
    jobs = [
        PartJob(p, _pieces(codes.live, hits, p), _pieces(codes.t_live, t_hits, p))
        for p in range(len(bounds) - 1)
    ]
    return _Parts(bounds, jobs)


def _deduplicate_stage(ctx: _Context, parsed: _Parsed, codes: _Codes, parts: _Parts) -> _Merged:
    """Merge each partition's duplicate pairs and classify them (step 4); InputError when no
    interaction is left."""
    runner = ctx.runner
    merged = _Merged(
        runner.map(
            dedupe_task,
            parts.jobs,
            ctx.tmp,
            parsed.spec,
            ctx.options["duplicates"],
            codes.users.ranges,
            codes.items.ranges,
            runner.share(ctx.train.names),
            None if codes.test_set is None else runner.share(codes.test_set),
        )
    )
    remove_staging(ctx.tmp, "chunks")  # every row is in a partition now
    if merged.n_kept == 0:
        raise InputError(
            f"{ctx.train.label}: no interactions left: every row is below the binarize/count "
            "threshold"
        )
    return merged


def _filter_stage(ctx: _Context, codes: _Codes, parts: _Parts) -> _Kept:
    """The ``min_count`` filter by degree reductions (step 5); InputError when it drops
    everything."""
    runner, o = ctx.runner, ctx.options
    n_items = len(codes.items.ranges)
    fin = _filter(
        runner,
        parts.parts,
        ctx.tmp,
        parts.bounds,
        n_items,
        o["min_count"],
        o["filter_mode"],
        o["seed"],
    )
    alive = runner.share(fin.user_alive), runner.share(fin.item_alive)
    user_deg, item_deg = runner.map_reduce(
        degree_task, parts.parts, join_add, ctx.tmp, parts.bounds, *alive, n_items
    )
    kept = _Kept(fin, user_deg, item_deg)
    if kept.n == 0:
        raise InputError(
            f"{ctx.train.label}: everything was filtered away by min_count={o['min_count']} "
            f"(filter_mode={o['filter_mode']!r})"
        )
    return kept


def _split_and_block_stage(
    ctx: _Context, parsed: _Parsed, codes: _Codes, parts: _Parts, merged: _Merged, kept: _Kept
) -> _Blocked:
    """Each kept pair's subset by the seeded hash of its raw ids (step 6), the block bounds
    from the train degrees and each partition's nonzeros staged block by block (step 7); the
    test input's errors and checks."""
    runner, o, tested = ctx.runner, ctx.options, ctx.tested
    extra: dict[str, Any] = {}
    if tested is not None:
        extra["test_not_interaction"] = _test_errors([m[2] for m in merged.results])
    fraction = None if tested is not None else o["test_fraction"]
    validation_fraction = o["validation_fraction"]
    kept_before = np.concatenate([[0], np.cumsum(kept.user_deg > 0)]).astype(np.int64)
    n_items = len(codes.items.ranges)
    fin = Final(
        parts.bounds,
        kept.fin.user_alive,
        kept.fin.item_alive,
        kept_before[parts.bounds],
        _index_map(kept.item_deg > 0),
        int(np.count_nonzero(kept.item_deg > 0)),
        o["seed"],
        split_rule(fraction, validation_fraction),
        codes.users.ranges,
        codes.items.ranges.hashes(0, n_items),
        file_test=tested is not None,
    )
    shared = runner.share(fin)
    deg_u, deg_i = runner.map_reduce(train_degrees_task, parts.parts, join_add, ctx.tmp, shared)
    check_train_left(ctx.train.label, kept.n, int(deg_u.sum()), fraction, validation_fraction)
    row_bounds, col_bounds = bounds_from_degrees(deg_u, deg_i, o["nnz_per_block"], o["grid"])
    placed = runner.map(
        block_task, parts.parts, ctx.tmp, shared, row_bounds, col_bounds, parsed.spec.n_classes
    )
    remove_staging(ctx.tmp, "nonzeros")  # every nonzero is in a block piece now
    if validation_fraction > 0:
        n_validation = sum(int(res["hist_validation"].sum()) for res in placed)
        check_validation_left(
            ctx.train.label, n_validation, int(deg_u.sum()), validation_fraction, o["seed"]
        )
    if tested is not None:
        n_unknown = sum(res["test_unknown"] for res in placed)
        check_test_left(
            tested.label,
            sum(int(res["hist_test"].sum()) for res in placed),
            n_unknown,
            extra["test_not_interaction"],
        )
        warn_unknown(n_unknown, 6)  # the caller of ``ingest``
        extra = {"test_unknown_dropped": n_unknown, **extra}
    return _Blocked(row_bounds, col_bounds, placed, extra)


def _write_stage(
    ctx: _Context, parsed: _Parsed, codes: _Codes, merged: _Merged, kept: _Kept, blocked: _Blocked
) -> None:
    """The store's blocks, attributes and id maps written into the temporary store (step 7,
    ``staged.assemble_store``)."""
    o, validation_fraction = ctx.options, ctx.options["validation_fraction"]
    n_blocks = (len(blocked.row_bounds) - 1) * (len(blocked.col_bounds) - 1)
    blocks: dict[str, list[list]] = {"train": [], "test": []}
    if validation_fraction > 0:
        blocks["validation"] = []
    hists = {}
    for split in blocks:
        blocks[split] = [[] for _ in range(n_blocks)]
        for res in blocked.placed:  # partition order
            for b, seg in zip(*res[split], strict=True):
                blocks[split][b].append(seg)
        hists[split] = np.sum([res[f"hist_{split}"] for res in blocked.placed], axis=0)
    warn_whole_stars(parsed.spec, sum(hists.values()), 6)  # the caller of ``ingest``
    attrs = ingest_attrs(
        parsed.spec,
        hists,
        blocked.row_bounds,
        blocked.col_bounds,
        ctx.train.sources,
        (codes.users.kind, codes.items.kind),
        min_count=o["min_count"],
        filter_mode=o["filter_mode"],
        duplicates=o["duplicates"],
        test_fraction=o["test_fraction"],
        seed=o["seed"],
        nnz_per_block=o["nnz_per_block"],
        rows_read=sum(parsed.rows[0]),
        not_interaction=merged.n_not,
        filtered=merged.n_kept - kept.n,
        n_before_split=kept.n,
        test_source=None if ctx.tested is None else ctx.tested.sources,
    )
    attrs.update(blocked.extra)
    if validation_fraction > 0:
        attrs.update(validation_attrs(validation_fraction, hist_list(hists["validation"])))
    assemble_store(
        ctx.tmp,
        ctx.runner,
        attrs,
        blocked.row_bounds,
        blocked.col_bounds,
        blocks,
        codes.users.ranges.staged(np.flatnonzero(kept.user_deg > 0), codes.users.kind),
        codes.items.ranges.staged(np.flatnonzero(kept.item_deg > 0), codes.items.kind),
    )


def _plan_input(
    runner: Runner,
    data: Any,
    role: str,
    delimiter: str | None,
    header: bool | None,
    columns: tuple[Column, Column, Column] | None,
    chunk_bytes: int,
    first_index: int,
) -> _Input:
    """``role`` data ("input" or "test") as chunks numbered from ``first_index``: files (their
    formats read and checked), a dask DataFrame (its columns checked) or other data in
    memory."""
    if is_dask_dataframe(data):
        parts, label = frame_chunks(data, columns, role, first_index)
        return _Input(label, [], _names([c.path for c in parts], False), list(parts), None)
    held = memory_label(data, role)
    if held is not None:
        chunk = memory_chunk(data, held, columns, first_index)
        names = dataclasses.replace(_names([held], False), matrix_cols=chunk.matrix_cols)
        return _Input(held, [], names, [chunk], None)
    sources = as_list(data)
    paths = expand_inputs(sources)
    formats = runner.map(input_format, paths, delimiter, header, columns)
    check_same_columns([f for f in formats if isinstance(f, ParquetFormat)])
    check_some_rows([f for f in formats if isinstance(f, ParquetFormat)], len(formats))
    chunks = plan(runner, formats, chunk_bytes, first_index)
    return _Input(
        inputs_label(sources),
        [source_name(p) for p in sources],
        _file_names(formats),
        list(chunks),
        [f.path for f in formats],
    )


def _pieces(
    chunks: list[AnyChunk], hits: list[list[int]], part: int
) -> tuple[tuple[int, int], ...]:
    """(chunk index, file index) of the chunks with rows in partition ``part``, in order."""
    return tuple((c.index, c.file_index) for c, h in zip(chunks, hits, strict=True) if part in h)


def _test_bounds(users: _Coded, t_users: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Cuts (P + 1,) of the test set's sorted user ids into P ranges for the test rows of users
    without training rows: at the partitions' first training ids if both are of one kind (then
    partition order is also the order of the test users, as in memory), else even."""
    n_parts = len(bounds) - 1
    if users.kind == t_users.dtype.kind and n_parts > 1:
        inner = np.searchsorted(t_users, np.array([users.ranges[b] for b in bounds[1:-1]]))
    else:
        inner = np.arange(1, n_parts) * len(t_users) // n_parts
    return np.concatenate([[0], inner, [len(t_users)]]).astype(np.int64)


def _test_errors(results: list[dict]) -> int:
    """Raise the test file's first error as memory does (a test row whose pair is a training
    pair, the first in input order; else the first failing partition's); return the test
    pairs that are not an interaction."""
    overlaps = [r["overlap"] for r in results if r["overlap"] is not None]
    if overlaps:
        raise InputError(min(overlaps)[1])
    for r in results:
        if r["failure"] is not None:
            raise InputError(r["failure"])
    return sum(r["not"] for r in results)


def plan(
    runner: Runner,
    formats: list[FileFormat | ParquetFormat],
    chunk_bytes: int,
    first_index: int = 0,
) -> list[Chunk | ParquetChunk]:
    """Chunks of every file in input order, numbered from ``first_index``: text at line
    boundaries, with their first line numbers; Parquet by row group."""
    jobs, owners = [], []
    for f_idx, fmt in enumerate(formats):
        if isinstance(fmt, ParquetFormat):
            continue
        full = source_name(fmt.path)
        for x0 in range(0, fmt.size, chunk_bytes):
            jobs.append((full, x0, min(x0 + chunk_bytes, fmt.size), fmt.size))
            owners.append(f_idx)
    scanned = runner.map(scan_range, jobs) if jobs else []
    by_file: dict[int, list[tuple[int, int, int]]] = {}
    for f_idx, res in zip(owners, scanned, strict=True):
        by_file.setdefault(f_idx, []).append(res)
    chunks: list[Chunk | ParquetChunk] = []
    for f_idx, fmt in enumerate(formats):
        if isinstance(fmt, ParquetFormat):
            chunks += parquet_chunks(fmt, f_idx, first_index + len(chunks))
            continue
        line = 1
        for start, stop, n_lines in by_file.get(f_idx, []):
            if stop > start:
                chunks.append(
                    Chunk(
                        first_index + len(chunks),
                        f_idx,
                        fmt.path,
                        start,
                        stop,
                        line,
                        fmt.delim,
                        fmt.header_at,
                        fmt.columns,
                        fmt.n_fields,
                    )
                )
            line += n_lines
    return chunks


def _file_names(formats: list[FileFormat | ParquetFormat]) -> Origin:
    """An Origin of no rows naming every input file (and the row groups of Parquet files)."""
    groups = tuple(f.row_groups if isinstance(f, ParquetFormat) else None for f in formats)
    return _names(
        [f.path for f in formats], True, groups if any(g is not None for g in groups) else None
    )


def _names(
    sources: list[str], is_file: bool, row_groups: tuple[RowGroups | None, ...] | None = None
) -> Origin:
    """An Origin of no rows naming ``sources``: the rows found later take their file (or
    partition) index and line (or row) from it (``Origin.rows``)."""
    empty = np.zeros(0, np.int64)
    return Origin(tuple(sources), empty.astype(np.int32), empty, is_file, row_groups)


def _parse(
    runner: Runner,
    ins: list[_Input],
    tmp: str,
    ratings: str | None,
    counts: Any,
    binarize: float | None,
    scale_max: int | None,
) -> tuple[ValueSpec, list[list[int]], list[dict]]:
    """Parse every chunk of the inputs; return the value rule (of all their values, as in
    memory), the rows of each chunk per input and the training chunks' summaries
    (``parse_task``). A chunk of data in memory drops its data."""
    chunks = [c for inp in ins for c in inp.chunks]
    smalls = runner.gather_all(runner.submit(parse_task, chunks, tmp))
    rows: list[list[int]] = []
    owner: list[_Input] = []
    at = 0
    for inp in ins:
        mine = smalls[at : at + len(inp.chunks)]
        at += len(inp.chunks)
        for res in mine:
            if (msg := runner.failure(res)) is not None:
                raise InputError(msg)
        rows.append([s["rows"] for s in mine])
        owner += [inp] * len(mine)
        _check_rows(inp, rows[-1])
        inp.chunks = [c.light() if isinstance(c, MemoryChunk) else c for c in inp.chunks]
    found = [(inp, c, s) for inp, c, s in zip(owner, chunks, smalls, strict=True) if s["rows"]]
    top = max(s["vmax"] for _, _, s in found)
    bad = next(((inp, c, s["bad"]) for inp, c, s in found if s["bad"]), None)
    values = [top] if bad is None else [bad[2][0], top]
    # make_spec names only the first value that breaks a rule: the bad one, if any
    inp, c = (bad[0], bad[1]) if bad is not None else (found[0][0], found[0][1])
    line = 0 if bad is None else bad[2][1]
    origin = inp.names.rows(
        np.full(len(values), c.file_index, np.int32), np.full(len(values), line, np.int64)
    )
    spec = make_spec(
        np.asarray(values, np.float64),
        origin,
        ratings=ratings,
        counts=counts,
        binarize=binarize,
        scale_max=scale_max,
    )
    return spec, rows, smalls[: len(ins[0].chunks)]


def _check_rows(inp: _Input, rows: list[int]) -> None:
    """Raise InputError for a file without data rows (in file order, like the in-memory reader),
    or data in memory without any."""
    if inp.files is None:
        if sum(rows) == 0:
            raise InputError(f"{inp.label}: no data rows (it is empty)")
        return
    by_file: dict[int, int] = {}
    for chunk, n in zip(inp.chunks, rows, strict=True):
        by_file[chunk.file_index] = by_file.get(chunk.file_index, 0) + n
    for f_idx, path in enumerate(inp.files):
        if by_file.get(f_idx, 0) == 0 and not is_parquet(path):  # 0-row Parquet files add none
            raise InputError(f"{path}: no data rows (only a header line)")


@dataclass(frozen=True, eq=False)
class _Coded:
    """The global sorted ids of one side, staged in ranges; their kind ("i": int64, "U": str);
    per chunk, its pieces (range, start, stop) in the ranges' staged codes."""

    ranges: IdRanges
    kind: str
    pieces: list[tuple[tuple[int, int, int], ...]]


def _code_ids(
    runner: Runner,
    chunks: list[AnyChunk],
    parsed: list[dict],
    tmp: str,
    what: str,
    ids_per_range: int,
) -> _Coded:
    """Sorted distinct ``what`` ids of the parsed ``chunks`` (as ``np.unique`` in memory: int64
    if all are, else str), in ranges cut at splitters from the chunks' samples, each range
    the union of its pieces in one task (``range_task``) of about ``ids_per_range`` ids read."""
    kind = "U" if any(p[what][1].dtype.kind == "U" for p in parsed) else "i"
    sample = np.unique(np.concatenate([as_kind(p[what][1], kind) for p in parsed]))
    n_ranges = max(1, min(len(sample), math.ceil(sum(p[what][0] for p in parsed) / ids_per_range)))
    # each range ends at a sampled id, the last beyond its splitter at the largest: none is empty
    splitters = sample[np.arange(1, n_ranges) * len(sample) // n_ranges - 1]
    found = runner.map(split_ids_task, [c.index for c in chunks], tmp, what, kind, splitters)
    cuts = np.array(found, dtype=np.int64).reshape(len(chunks), n_ranges + 1)
    lengths = np.diff(cuts, axis=1)
    starts = np.cumsum(lengths, axis=0) - lengths  # where each piece is in its range's codes
    jobs = [
        RangeJob(
            r,
            tuple(
                (c.index, int(cuts[k, r]), int(cuts[k, r + 1]))
                for k, c in enumerate(chunks)
                if lengths[k, r]
            ),
        )
        for r in range(n_ranges)
    ]
    offsets = np.concatenate([[0], np.cumsum(runner.map(range_task, jobs, tmp, what))])
    # every range has read its pieces: only their order is needed from now on
    runner.map(remove_task, [c.index for c in chunks], tmp, [f"r_{what}"])
    pieces = [
        tuple(
            (int(r), int(starts[k, r]), int(starts[k, r] + lengths[k, r]))
            for r in np.flatnonzero(lengths[k])
        )
        for k in range(len(chunks))
    ]
    return _Coded(IdRanges(tmp, what, offsets.astype(np.int64)), kind, pieces)


def _sample_bounds(sample: np.ndarray, n_users: int, n_parts: int) -> np.ndarray:
    """Cuts (P' + 1,) of the user codes into at most ``n_parts`` ranges of about as many rows,
    from a row-weighted sample of user codes; every range starts at a user with rows."""
    at = np.arange(1, n_parts) * len(sample) // n_parts  # quantiles of the sorted sample
    picked = np.partition(sample, np.unique(at))[at] if len(sample) and len(at) else at[:0]
    inner = np.unique(picked)
    inner = inner[(inner > 0) & (inner < n_users)]
    return np.concatenate([[0], inner, [n_users]]).astype(np.int64)


def _filter(
    runner: Runner,
    parts: list[int],
    tmp: str,
    bounds: np.ndarray,
    n_items: int,
    min_count: int,
    mode: str,
    seed: int,
) -> Final:
    """Alive users and items after the ``min_count`` filter (step 5), by degree reductions."""
    if min_count <= 1:
        return Final(bounds, None, None, None, None, n_items, seed)
    user_alive = np.ones(int(bounds[-1]), dtype=bool)
    item_alive = np.ones(n_items, dtype=bool)
    while True:
        ua, ia = runner.share(user_alive), runner.share(item_alive)
        _, item_deg = runner.map_reduce(
            degree_task, parts, join_add, tmp, bounds, ua, ia, n_items, "i"
        )
        before = int(item_deg.sum())
        item_alive = item_alive & (item_deg >= min_count)
        ia = runner.share(item_alive)
        user_deg, _ = runner.map_reduce(
            degree_task, parts, join_add, tmp, bounds, ua, ia, n_items, "u"
        )
        user_alive = user_alive & (user_deg >= min_count)
        after = int(user_deg[user_alive].sum())
        if mode == "paper" or after == before:
            return Final(bounds, user_alive, item_alive, None, None, n_items, seed)


def _index_map(kept: np.ndarray) -> np.ndarray:
    """Old code -> new contiguous index (int64), -1 where not kept."""
    out = np.full(len(kept), -1, dtype=np.int64)
    out[kept] = np.arange(int(kept.sum()), dtype=np.int64)
    return out
