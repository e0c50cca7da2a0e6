"""Build a block store from text or Parquet files (local or at URLs), or data in memory
(pandas DataFrame, pyarrow Table, scipy.sparse matrix, arrays).

Pipeline: parse -> check every value (errors name file and line) -> merge duplicate pairs ->
classes (dropping rows that are "not an interaction") -> min-count filtering -> contiguous id maps
(sorted by raw id) -> train/test split -> block grid -> sorted blocks -> atomic store write.
The whole input is held in memory while ingesting, as numpy/pyarrow columns: ids are
dictionary-encoded by pyarrow (the strings are dropped once encoded), one sort of the
(user, item) codes orders the rows for the duplicate check and for the blocks.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import numpy as np
import pyarrow as pa

from ordnmf_dask.dist.progress import shows_progress
from ordnmf_dask.errors import InputError, shown
from ordnmf_dask.sources.filtering import (
    DUPLICATE_POLICIES,
    FILTER_MODES,
    dedupe,
    encode_ids,
    encode_pair,
    ids_from_array,
    min_count_mask,
    raw_ids,
)
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.parquet import column_ids, column_values
from ordnmf_dask.sources.split import (
    check_test_fraction,
    check_train_left,
    check_validation_fraction,
    id_hashes,
    lookup,
    pair_hash,
    split_rule,
)
from ordnmf_dask.sources.text import check_columns, read_triples, release_memory
from ordnmf_dask.sources.values import ValueSpec, classify, make_spec
from ordnmf_dask.store.blocks import StoreInfo, check_target, write_store
from ordnmf_dask.store.grid import (
    DEFAULT_NNZ_PER_BLOCK,
    auto_grid,
    block_sort,
    check_grid,
    choose_bounds,
)

PathLike = str | os.PathLike

log = logging.getLogger("ordnmf_dask")


@dataclass(eq=False)
class _Rows:
    """Raw input rows: ids (pyarrow strings, or np.ndarray of int64 or str, (n,)), values
    float64 (n,), and their origin. ``_build`` drops the ids once they are encoded."""

    users: Any
    items: Any
    values: np.ndarray
    origin: Origin


@dataclass(frozen=True, eq=False)
class _Nonzeros:
    """Interactions in final index space: u, i int64 (n,), y uint8 (n,), raw float64 (n,)."""

    u: np.ndarray
    i: np.ndarray
    y: np.ndarray
    raw: np.ndarray

    def take(self, idx: np.ndarray) -> _Nonzeros:
        return _Nonzeros(self.u[idx], self.i[idx], self.y[idx], self.raw[idx])


class IngestOptions(TypedDict, total=False):
    """The options of every ingest (``ingest``, ``ingest_arrays``; ``ingest_distributed`` takes
    the same), described in ``ingest``; ``INGEST_DEFAULTS`` holds their defaults."""

    ratings: str | None
    counts: str | Sequence[float] | None
    binarize: float | None
    scale_max: int | None
    min_count: int
    filter_mode: str
    duplicates: str
    test_fraction: float
    validation_fraction: float
    seed: int
    nnz_per_block: int
    grid: tuple[int, int] | None
    overwrite: bool


INGEST_DEFAULTS: IngestOptions = {
    "ratings": None, "counts": None, "binarize": None, "scale_max": None, "min_count": 0,
    "filter_mode": "paper", "duplicates": "error", "test_fraction": 0.2,
    "validation_fraction": 0.0, "seed": 0, "nnz_per_block": DEFAULT_NNZ_PER_BLOCK, "grid": None,
    "overwrite": False,
}  # fmt: skip


def with_defaults(options: IngestOptions, caller: str) -> dict[str, Any]:
    """``options`` completed with ``INGEST_DEFAULTS`` and checked (``check_ingest_options``);
    an unknown name is a TypeError."""
    unknown = sorted(set(options) - set(INGEST_DEFAULTS))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    opts = {**INGEST_DEFAULTS, **options}
    check_ingest_options(opts)
    return opts


def check_ingest_options(o: dict[str, Any]) -> None:
    """Raise InputError for an option that is wrong whatever the data, before any is read.

    The value rule is resolved on no values (``values.make_spec``), which checks every value
    option; the block options are checked as ``grid`` checks them.
    """
    check_options(o["min_count"], o["filter_mode"], o["duplicates"], o["test_fraction"], o["seed"])
    check_validation_fraction(o["validation_fraction"])
    make_spec(np.zeros(0), Origin.arrays(0), ratings=o["ratings"], counts=o["counts"],
              binarize=o["binarize"], scale_max=o["scale_max"])  # fmt: skip
    if o["grid"] is None:
        auto_grid(0, 1, 1, o["nnz_per_block"])
    else:
        check_grid(o["grid"])


@shows_progress
def ingest(
    inputs: Any,
    out: PathLike,
    *,
    test: Any = None,
    delimiter: str | None = None,
    header: bool | None = None,
    columns: Sequence[int | str] = (0, 1, 2),
    **options: Unpack[IngestOptions],
) -> StoreInfo:
    """Ingest (user, item, value) rows into a block store at ``out``.

    Parameters
    ----------
    inputs : path, URL or glob, a sequence of them, or data in memory
        Training data (all data if ``test`` is None). Files: several are concatenated;
        delimited text (compressed by suffix: ``.gz``, ``.bz2``, ``.zst``, ...) or Parquet
        (files ending in ``.parquet`` / ``.parq``, or directories of them, read row group by row
        group), local or at any fsspec URL (``s3://``, ``gs://``, ``http(s)://``, ...). In
        memory: a pandas DataFrame or a pyarrow Table (``columns`` pick the user, item and
        value columns), a scipy.sparse matrix (users are rows, items columns, values its
        stored entries; explicit zeros are dropped) or a ``(users, items, values)`` tuple of
        arrays; each gives the same store as a CSV file of the same rows. A dask DataFrame
        (here or as ``test``) goes to ``ingest_distributed``.
    out : path
        Store directory to create (see ``ordnmf_dask.store.blocks``).
    test : same kinds as ``inputs``, optional
        A held-out test set (same format and value rules) instead of a random split. Rows whose
        user or item is not in the filtered training data are dropped, counted in the attribute
        ``test_unknown_dropped`` and reported with a warning; a pair also in ``inputs`` is an error,
        and so is a test set left empty.
    delimiter, header, columns
        Parsing options; see ``ordnmf_dask.sources.text.read_triples``. ``columns`` are 0-based
        positions or column names (a text header's fields, Parquet, DataFrame or Table column
        names).
    ratings : {"halfstar", "integer"}, optional
    counts : "paper" or sequence of float, optional
        Count thresholds; see ``ordnmf_dask.sources.values``.
    binarize : float, optional
        Keep rows with value (class, if ratings/counts is given) >= S as class 1; drop the rest.
    scale_max : int, optional
        V for ``ratings="integer"`` (default: largest value in train and test).
        With none of ratings/counts/binarize, all-positive-integer data are integer ratings.
    min_count : int
        Remove users and items with fewer interactions (before the split).
    filter_mode : {"paper", "stable"}
        "paper": items then users, once; "stable": repeat until nothing changes.
    duplicates : {"error", "sum", "max", "last"}
        What to do with repeated (user, item) pairs (values are merged before classes).
    test_fraction : float
        Fraction of the nonzeros drawn at random for test (ignored if ``test`` is given).
    validation_fraction : float
        Fraction of the training nonzeros (those left by the test split) kept apart as the
        validation subset, for validation during the fit, by the same seeded pair hash
        (``ordnmf_dask.sources.split.split_rule``). 0: no validation subset.
    seed : int
        Seed of the random split: a pair is test if the seeded hash of its raw (user, item) ids
        is below ``test_fraction * 2^64`` (``ordnmf_dask.sources.split``), so each pair keeps
        its subset when data are added; the test set holds about ``test_fraction`` of them.
    nnz_per_block : int
        Target train nonzeros per block when ``grid`` is None.
    grid : (int, int), optional
        Explicit (n_r, n_c).
    overwrite : bool
        Replace an existing store at ``out`` (only after the new one is complete).

    Returns
    -------
    StoreInfo

    Raises
    ------
    InputError
        Any invalid input; nothing is left at ``out`` nor in a temporary sibling.
    """
    opts = with_defaults(options, "ingest")
    if is_dask_dataframe(inputs) or is_dask_dataframe(test):
        from ordnmf_dask.sources.distributed import ingest_distributed

        return ingest_distributed(inputs, out, test=test, delimiter=delimiter, header=header,
                                  columns=columns, **options)  # fmt: skip
    check_target(out, opts["overwrite"])
    start = time.monotonic()
    train, label, sources = rows_of(inputs, delimiter, header, columns, "input")
    test_rows, test_label, test_sources = (None, None, None) if test is None else \
        rows_of(test, delimiter, header, columns, "test", ids=True)  # fmt: skip
    info = _build(train, test_rows, out, label=label, sources=sources, test_label=test_label,
                  test_sources=test_sources, **opts)  # fmt: skip
    log.info("ingest: %s: %d users x %d items, %d train / %d test nonzeros in %d x %d blocks "
             "(%.1f s)", info.path, info.n_users, info.n_items, info.nnz_train, info.nnz_test,
             *info.grid, time.monotonic() - start)  # fmt: skip
    return info


@shows_progress
def ingest_arrays(
    users: Sequence | np.ndarray,
    items: Sequence | np.ndarray,
    values: Sequence | np.ndarray,
    out: PathLike,
    *,
    test: tuple[Sequence, Sequence, Sequence] | None = None,
    **options: Unpack[IngestOptions],
) -> StoreInfo:
    """``ingest((users, items, values), out, ...)``: in-memory arrays of shape (n,); raw ids may
    be integers (stored as int64) or strings; errors name the 0-based row."""
    return ingest((users, items, values), out, test=test, **options)


def is_dask_dataframe(data: object) -> bool:
    """Whether ``data`` is a dask DataFrame (without importing dask for other inputs)."""
    return type(data).__module__.startswith("dask") and hasattr(data, "npartitions")


def rows_of(
    data: Any, delimiter: str | None, header: bool | None, columns: Sequence[int | str],
    role: str, ids: bool = False,
) -> tuple[_Rows, str, list[str]]:  # fmt: skip
    """Rows of files or of data in memory, the label that names them in messages and the
    sources recorded in the store. ``ids``: raw ids as arrays (for a test set)."""
    label = memory_label(data, role)
    sources: list[str] = []  # files only
    if label is None:
        paths = as_list(data)
        parsed = read_triples(paths, delimiter=delimiter, header=header, columns=columns)
        rows = _Rows(parsed.users, parsed.items, parsed.values, parsed.origin)
        del parsed  # ``_build`` frees the ids once encoded
        label, sources = inputs_label(paths), [source_name(p) for p in paths]
    elif isinstance(data, tuple):
        rows = _arrays_to_rows(*data, label)
    elif _is_sparse(data):
        coo = data.tocoo()
        stored = coo.data != 0  # an explicit zero is no interaction, as everywhere in scipy.sparse
        rows = _arrays_to_rows(coo.row[stored], coo.col[stored], coo.data[stored], label)
    else:
        table = as_table(data)
        rows = table_rows(table, pick_columns(table.column_names, columns, label), label)
    if ids:
        rows.users = raw_ids(rows.users, rows.origin, "user")
        rows.items = raw_ids(rows.items, rows.origin, "item")
    return rows, label, sources


def memory_label(data: object, role: str) -> str | None:
    """How messages name ``role`` data ("input" or "test") held in memory: a
    ``(users, items, values)`` tuple, a scipy.sparse matrix, a pyarrow Table or a DataFrame
    (pandas, or a pyarrow RecordBatch); None for files."""
    if isinstance(data, tuple) and len(data) == 3:
        return f"{role} arrays"
    if _is_sparse(data):
        return f"{role} matrix"
    if isinstance(data, pa.Table):
        return f"{role} Table"
    return f"{role} DataFrame" if isinstance(data, pa.RecordBatch) or _is_pandas(data) else None


def source_name(path: PathLike) -> str:
    """How the store records an input: a URL as given, a local path made absolute."""
    name = os.fspath(path)
    return name if "://" in name else os.path.abspath(name)


def _is_sparse(data: object) -> bool:
    return type(data).__module__.startswith("scipy.sparse") and hasattr(data, "tocoo")


def as_table(data: object) -> pa.Table | None:
    """A pyarrow Table of a pandas DataFrame or a pyarrow Table / RecordBatch, else None."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if _is_pandas(data):
        return pa.Table.from_pandas(data, preserve_index=False)
    return None


def _is_pandas(data: object) -> bool:
    return type(data).__module__.startswith("pandas") and hasattr(data, "columns")


def pick_columns(names: Sequence[Any], columns: Sequence[int | str], label: str) -> list[str]:
    """The names of the user, item and value columns of a table with columns ``names``, chosen
    by name or 0-based position."""
    names = [str(n) for n in names]
    picked = []
    for c in check_columns(columns):
        if isinstance(c, str) and c not in names:
            raise InputError(f"{label}: no column {c!r} (columns: {', '.join(names)})")
        if not isinstance(c, str) and c >= len(names):
            raise InputError(f"{label}: no column {c} (0-based); it has {len(names)} columns")
        picked.append(c if isinstance(c, str) else names[c])
    return picked


def table_rows(table: pa.Table, picked: list[str], label: str) -> _Rows:
    """The user, item and value columns ``picked`` of a table, checked as Parquet columns are;
    rows are named ``LABEL, row N``."""
    if table.num_rows == 0:
        raise InputError(f"{label}: no data rows (it is empty)")
    origin = Origin.arrays(table.num_rows, label)
    cu, ci, cv = (table.column(name) for name in picked)
    return _Rows(column_ids(cu, origin, "user", picked[0]),
                 column_ids(ci, origin, "item", picked[1]),
                 column_values(cv, origin, picked[2]), origin)  # fmt: skip


def as_list(paths: PathLike | Sequence[PathLike]) -> list[PathLike]:
    return [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)


def inputs_label(paths: Sequence[PathLike]) -> str:
    """The input files as messages name them: the first three as given, then how many more."""
    names = [os.fspath(p) for p in paths]
    more = f" and {len(names) - 3} more files" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def _arrays_to_rows(users: object, items: object, values: object, label: str) -> _Rows:
    u = ids_from_array(users, label, "user")
    i = ids_from_array(items, label, "item")
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{label}: values are not numbers ({exc})") from None
    if v.ndim != 1 or not len(u) == len(i) == len(v):
        raise InputError(f"{label}: users, items, values must be 1-D of equal length")
    if len(v) == 0:
        raise InputError(f"{label}: no data rows (empty arrays)")
    origin = Origin.arrays(len(v), label)
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise InputError(f"{origin.where(int(bad[0]))}: value {v[bad[0]]} is not finite")
    return _Rows(u, i, v, origin)


def check_options(
    min_count: int, filter_mode: str, duplicates: str, test_fraction: float, seed: int
) -> None:
    if isinstance(min_count, bool) or int(min_count) != min_count or min_count < 0:
        raise InputError(f"min_count must be a non-negative integer, got {shown(min_count)}")
    if filter_mode not in FILTER_MODES:
        raise InputError(f"filter_mode must be one of {FILTER_MODES}, got {filter_mode!r}")
    if duplicates not in DUPLICATE_POLICIES:
        raise InputError(f"duplicates must be one of {DUPLICATE_POLICIES}, got {duplicates!r}")
    check_test_fraction(test_fraction)
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {shown(seed)}")


def _build(
    train: _Rows,
    test: _Rows | None,
    out: PathLike,
    *,
    label: str,
    sources: list[str],
    test_label: str | None,
    test_sources: list[str] | None,
    ratings: str | None,
    counts: str | Sequence[float] | None,
    binarize: float | None,
    scale_max: int | None,
    min_count: int,
    filter_mode: str,
    duplicates: str,
    test_fraction: float,
    seed: int,
    nnz_per_block: int,
    grid: tuple[int, int] | None,
    overwrite: bool,
    validation_fraction: float = 0.0,
) -> StoreInfo:
    values, origin = train.values, train.origin
    if test is not None:  # the value rules (and a default integer scale) cover both sets
        values = np.concatenate([train.values, test.values])
        origin = Origin.concat([train.origin, test.origin])
    spec = make_spec(
        values, origin, ratings=ratings, counts=counts, binarize=binarize, scale_max=scale_max
    )
    classes, interaction = classify(spec, values, origin)  # every row checked (errors name it)
    del values, origin
    n_rows = len(train.values)

    (user_ids, u), (item_ids, i) = encode_pair(train.users, train.items, train.origin)
    train.users = train.items = None  # the raw strings are no longer needed
    release_memory()
    rows, raw = dedupe(u, i, train.values, train.origin, duplicates, user_ids, item_ids)
    train.values = np.zeros(0)  # merged into ``raw``
    u, i, origin = u[rows], i[rows], train.origin.take(rows)  # in (user, item) order
    pair_keys = (u, i) if test is not None else None  # training pairs, for the overlap check
    if len(rows) == n_rows:  # no duplicates: the classes of the check above
        y, keep = classes[rows], interaction[rows]
    else:
        y, keep = classify(spec, raw, origin)
    train_origin = origin if test is not None else None  # for the overlap check's messages
    del rows, classes, interaction, origin
    n_not_interaction = int((~keep).sum())
    if n_not_interaction == len(keep):
        raise InputError(
            f"{label}: no interactions left: every row is below the binarize/count threshold"
        )
    if n_not_interaction:
        u, i, y, raw = u[keep], i[keep], y[keep], raw[keep]

    keep = min_count_mask(u, i, len(user_ids), len(item_ids), min_count, filter_mode)
    n_filtered = len(keep) - int(np.count_nonzero(keep))
    if n_filtered == len(keep):
        raise InputError(
            f"{label}: everything was filtered away by min_count={min_count} "
            f"(filter_mode={filter_mode!r})"
        )
    if n_filtered:
        u, i, y, raw = u[keep], i[keep], y[keep], raw[keep]
    del keep
    user_sel, u = _compact(u, len(user_ids))
    item_sel, i = _compact(i, len(item_ids))
    data = _Nonzeros(u, i, y, raw)  # still in (user, item) order: compacting keeps it
    del u, i, y, raw
    release_memory()  # what the sort and the filters freed
    n_before_split = len(data.u)

    extra: dict[str, object] = {}
    rule = split_rule(test_fraction if test is None else None, validation_fraction)
    is_test, is_val = rule.masks(pair_hash(id_hashes(user_ids[user_sel])[data.u],
                                           id_hashes(item_ids[item_sel])[data.i], seed))
    if test is None:
        train_nz, test_nz = data.take(~is_test), data.take(is_test)
    else:
        train_nz = data
        test_nz, extra = _file_test(
            test, str(test_label), spec, duplicates, user_ids, item_ids, pair_keys, train_origin,
            user_ids[user_sel], item_ids[item_sel],
        )  # fmt: skip
    del data
    check_train_left(label, n_before_split, n_before_split - int(is_test.sum() + is_val.sum()),
                     test_fraction if test is None else None, validation_fraction)

    val_nz = None
    if validation_fraction > 0:
        is_val = is_val[~is_test]  # the training pairs' (test pairs are never validation)
        train_nz, val_nz = train_nz.take(~is_val), train_nz.take(is_val)
        extra.update(validation_attrs(validation_fraction, _hist(val_nz.y, spec)))
    del is_test, is_val
    release_memory()

    n_users, n_items = len(user_sel), len(item_sel)
    row_bounds, col_bounds = choose_bounds(
        train_nz.u, train_nz.i, n_users, n_items, nnz_per_block, grid
    )
    splits = [train_nz, test_nz, val_nz]
    del train_nz, test_nz, val_nz
    blocked = []
    while splits:  # each split's unsorted arrays are freed once it is sorted into blocks
        nz = splits.pop(0)
        blocked.append(None if nz is None else block_sort(nz.u, nz.i, nz.y, nz.raw, row_bounds,
                                                          col_bounds, presorted=True))  # fmt: skip
        del nz
    attrs = {
        "complete": False,
        "n_users": n_users,
        "n_items": n_items,
        "n_classes": spec.n_classes,
        "value_kind": spec.value_kind,
        "thresholds": None if spec.thresholds is None else list(spec.thresholds),
        "binarize": spec.binarize,
        "binarize_on": None if spec.binarize is None else spec.base,
        "min_count": int(min_count),
        "filter_mode": filter_mode,
        "duplicates": duplicates,
        "split": "random" if test is None else "file",
        "test_fraction": float(test_fraction) if test is None else None,
        "seed": int(seed),
        "nnz_train": len(blocked[0].y),
        "nnz_test": len(blocked[1].y),
        "hist_train": _hist(blocked[0].y, spec),
        "hist_test": _hist(blocked[1].y, spec),
        "grid": [len(row_bounds) - 1, len(col_bounds) - 1],
        "nnz_per_block": int(nnz_per_block),
        "source": sources,
        "test_source": test_sources,
        "rows_read": n_rows,
        "rows_not_interaction": n_not_interaction,
        "rows_filtered": n_filtered,
        "nnz_before_split": n_before_split,
        "id_kind": {"users": id_kind(user_ids.dtype.kind), "items": id_kind(item_ids.dtype.kind)},
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        **extra,
    }
    return write_store(
        out, attrs, row_bounds, col_bounds, blocked[0], blocked[1],
        user_ids[user_sel], item_ids[item_sel], overwrite=overwrite, validation=blocked[2],
    )  # fmt: skip


def validation_attrs(fraction: float, hist: list[int]) -> dict[str, object]:
    """The attributes that record a validation subset with class counts ``hist``
    (docs/store-format.md)."""
    return {"validation_fraction": float(fraction), "nnz_validation": sum(hist),
            "hist_validation": hist}  # fmt: skip


def _file_test(
    test: _Rows,
    label: str,
    spec: ValueSpec,
    duplicates: str,
    all_users: np.ndarray,
    all_items: np.ndarray,
    pair_keys: tuple[np.ndarray, np.ndarray],
    train_origin: Origin,
    final_users: np.ndarray,
    final_items: np.ndarray,
) -> tuple[_Nonzeros, dict[str, object]]:
    """Test nonzeros in the final index space, and attrs describing dropped rows."""
    tu, ti = lookup(all_users, test.users), lookup(all_items, test.items)
    hit = first_overlap(tu, ti, len(all_items), *pair_keys)
    if hit is not None:
        raise InputError(overlap_message(test.origin, hit[0], test.users[hit[0]],
                                         test.items[hit[0]], train_origin, hit[1]))  # fmt: skip
    del tu, ti
    t_users, tu = encode_ids(test.users, test.origin, "user")
    t_items, ti = encode_ids(test.items, test.origin, "item")
    rows, y, raw, keep = classify_test_rows(tu, ti, test.values, test.origin, duplicates,
                                            t_users, t_items, spec)  # fmt: skip
    u = lookup(final_users, test.users[rows])
    i = lookup(final_items, test.items[rows])
    nz, n_unknown = known_test(u, i, y, raw, keep)
    n_not = int((~keep).sum())
    check_test_left(label, len(nz.u), n_unknown, n_not)
    warn_unknown(n_unknown, 4)  # the caller of ``ingest``
    extra = {
        "test_unknown_dropped": n_unknown,
        "test_not_interaction": n_not,
    }
    return nz, extra


def classify_test_rows(
    tu: np.ndarray, ti: np.ndarray, values: np.ndarray, origin: Origin, duplicates: str,
    t_users: np.ndarray, t_items: np.ndarray, spec: ValueSpec,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Merge the duplicate pairs of test rows (codes ``tu``, ``ti`` into the test set's own
    sorted ids ``t_users``, ``t_items``) and classify them.

    Returns
    -------
    rows, y, raw, keep
        Representative rows in (user, item) order, their classes, merged values, and whether
        each is an interaction.
    """
    rows, raw = dedupe(tu, ti, values, origin, duplicates, t_users, t_items)
    y, keep = classify(spec, raw, origin.take(rows))
    return rows, y, raw, keep


def known_test(
    u: np.ndarray, i: np.ndarray, y: np.ndarray, raw: np.ndarray, keep: np.ndarray
) -> tuple[_Nonzeros, int]:
    """The test interactions (``keep``) whose final user and item indices ``u``, ``i`` exist
    (not -1), sorted by (user, item), and how many interactions were dropped as unknown."""
    unknown = keep & ((u < 0) | (i < 0))
    keep = keep & ~unknown
    nz = _Nonzeros(u[keep], i[keep], y[keep], raw[keep])
    return nz.take(np.lexsort((nz.i, nz.u))), int(unknown.sum())


def check_test_left(label: str, n_test: int, n_unknown: int, n_not: int) -> None:
    """Refuse a test file (``label``) that leaves no test interaction: an empty test set
    measures nothing. ``n_unknown``: its interactions whose user or item is not in the
    (filtered) training data; ``n_not``: its pairs that are not an interaction."""
    if n_test == 0:
        raise InputError(
            f"{label}: no test interactions left: {n_unknown} have a user or an item that is not "
            f"in the (filtered) training data, {n_not} are not an interaction"
        )


def warn_unknown(n_unknown: int, stacklevel: int) -> None:
    """Report test rows dropped because their user or item is not in the training data
    (``stacklevel`` as for ``warnings.warn``, counted from the caller)."""
    if n_unknown:
        warnings.warn(
            f"{n_unknown} test rows dropped: their user or item is not in the (filtered) "
            "training data",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def first_overlap(
    tu: np.ndarray, ti: np.ndarray, n_items: int, train_u: np.ndarray, train_i: np.ndarray
) -> tuple[int, int] | None:
    """The first test row whose (user, item) codes (``tu``, ``ti``; -1 where unknown to the
    training data) are a training pair (``train_u``, ``train_i``), and that pair's index."""
    width = np.int64(max(n_items, 1))
    train_keys = train_u.astype(np.int64) * width + train_i
    order = np.argsort(train_keys)
    known = (tu >= 0) & (ti >= 0)
    if not len(order) or not known.any():
        return None
    test_keys = np.where(known, tu.astype(np.int64) * width + ti, -1)
    pos = np.minimum(np.searchsorted(train_keys[order], test_keys), len(order) - 1)
    shared = np.flatnonzero(known & (train_keys[order][pos] == test_keys))
    if not shared.size:
        return None
    k = int(shared[0])
    return k, int(order[pos[k]])


def overlap_message(
    test_origin: Origin, k: int, user: object, item: object, train_origin: Origin, j: int
) -> str:
    """The error of test row ``k`` (raw ids ``user``, ``item``) whose pair is training row
    ``j``."""
    return (f"{test_origin.where(k)}: test pair (user {user!s}, item {item!s}) is also in the "
            f"training data at {train_origin.where(j)}")  # fmt: skip


def _compact(codes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The codes (of ``n``) in use, sorted (m,), and every code's index among them (n,)."""
    used = np.bincount(codes, minlength=n) > 0
    if used.all():
        return np.arange(n), codes
    index = np.cumsum(used, dtype=np.int32) - 1
    return np.flatnonzero(used), index[codes]


def _hist(y: np.ndarray, spec: ValueSpec) -> list[int]:
    hist = np.bincount(y, minlength=spec.n_classes + 1)
    hist[0] = 0
    return [int(x) for x in hist]


def id_kind(kind: str) -> str:
    """The store's ``id_kind`` attribute for ids of numpy dtype kind ``kind``."""
    return "int" if kind in "iu" else "str"
