"""Build a block store from text or Parquet files, or in-memory arrays.

Pipeline: parse -> check every value (errors name file and line) -> merge duplicate pairs ->
classes (dropping rows that are "not an interaction") -> min-count filtering -> contiguous id maps
(sorted by raw id) -> train/test split -> block grid -> sorted blocks -> atomic store write.
The whole input is held in memory while ingesting.
"""

from __future__ import annotations

import datetime as _dt
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.filtering import (
    DUPLICATE_POLICIES,
    FILTER_MODES,
    dedupe,
    factorize,
    ids_from_array,
    min_count_mask,
    normalize_text_ids,
)
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.split import (
    check_test_fraction,
    check_validation_fraction,
    lookup,
    n_test_rows,
    random_test_mask,
    validation_mask,
)
from ordnmf_dask.sources.text import read_triples
from ordnmf_dask.sources.values import ValueSpec, classify, make_spec
from ordnmf_dask.store.blocks import StoreInfo, check_target, write_store
from ordnmf_dask.store.grid import DEFAULT_NNZ_PER_BLOCK, block_sort, choose_bounds

PathLike = str | os.PathLike


@dataclass(frozen=True, eq=False)
class _Rows:
    """Raw input rows: ids (int64 or str, (n,)), values float64 (n,), and their origin."""

    users: np.ndarray
    items: np.ndarray
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


def ingest(
    inputs: PathLike | Sequence[PathLike],
    out: PathLike,
    *,
    ratings: str | None = None,
    counts: str | Sequence[float] | None = None,
    binarize: float | None = None,
    scale_max: int | None = None,
    min_count: int = 0,
    filter_mode: str = "paper",
    duplicates: str = "error",
    test: PathLike | Sequence[PathLike] | None = None,
    test_fraction: float = 0.2,
    validation_fraction: float = 0.0,
    seed: int = 0,
    nnz_per_block: int = DEFAULT_NNZ_PER_BLOCK,
    grid: tuple[int, int] | None = None,
    overwrite: bool = False,
    delimiter: str | None = None,
    header: bool | None = None,
    columns: Sequence[int | str] = (0, 1, 2),
) -> StoreInfo:
    """Ingest files of (user, item, value) rows into a block store at ``out``.

    Parameters
    ----------
    inputs : path or sequence of paths
        Training data (all data if ``test`` is None); several files are concatenated. Delimited
        text, or Parquet (files ending in ``.parquet`` / ``.parq``, or directories of them,
        read row group by row group; needs the ``parquet`` extra).
    out : path
        Store directory to create (see ``ordnmf_dask.store.blocks``).
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
    test : path or sequence of paths, optional
        A held-out test set (same format and value rules) instead of a random split. Rows whose
        user or item is not in the filtered training data are dropped, counted in the attribute
        ``test_unknown_dropped`` and reported with a warning; a pair also in ``inputs`` is an error.
    test_fraction : float
        Fraction of the nonzeros drawn at random for test (ignored if ``test`` is given).
    validation_fraction : float
        Fraction of the training nonzeros (those left by the test split) kept apart as the
        validation subset, for validation during the fit: the pairs with the smallest pair hash
        of the same seed (``ordnmf_dask.sources.split.validation_mask``). 0: no validation subset.
    seed : int
        Seed of the random split: the test set is the ``round(test_fraction * n)`` pairs with
        the smallest seeded pair hash (``ordnmf_dask.sources.split.random_test_mask``).
    nnz_per_block : int
        Target train nonzeros per block when ``grid`` is None.
    grid : (int, int), optional
        Explicit (n_r, n_c).
    overwrite : bool
        Replace an existing store at ``out`` (only after the new one is complete).
    delimiter, header, columns
        Parsing options; see ``ordnmf_dask.sources.text.read_triples``. ``columns`` are 0-based
        positions or column names (a text header's fields, Parquet column names).

    Returns
    -------
    StoreInfo

    Raises
    ------
    InputError
        Any invalid input; nothing is left at ``out`` nor in a temporary sibling.
    """
    check_target(out, overwrite)
    parsed = read_triples(inputs, delimiter=delimiter, header=header, columns=columns)
    train = _Rows(
        normalize_text_ids(parsed.users),
        normalize_text_ids(parsed.items),
        parsed.values,
        parsed.origin,
    )
    test_rows = None
    if test is not None:
        tp = read_triples(test, delimiter=delimiter, header=header, columns=columns)
        test_rows = _Rows(tp.users, tp.items, tp.values, tp.origin)
    sources = [os.path.abspath(os.fspath(p)) for p in as_list(inputs)]
    test_sources = None if test is None else [os.path.abspath(os.fspath(p)) for p in as_list(test)]
    return _build(
        train, test_rows, out, label=inputs_label(as_list(inputs)), sources=sources,
        test_sources=test_sources, ratings=ratings,
        counts=counts, binarize=binarize, scale_max=scale_max, min_count=min_count,
        filter_mode=filter_mode, duplicates=duplicates, test_fraction=test_fraction, seed=seed,
        nnz_per_block=nnz_per_block, grid=grid, overwrite=overwrite,
        validation_fraction=validation_fraction,
    )  # fmt: skip


def ingest_arrays(
    users: Sequence | np.ndarray,
    items: Sequence | np.ndarray,
    values: Sequence | np.ndarray,
    out: PathLike,
    *,
    ratings: str | None = None,
    counts: str | Sequence[float] | None = None,
    binarize: float | None = None,
    scale_max: int | None = None,
    min_count: int = 0,
    filter_mode: str = "paper",
    duplicates: str = "error",
    test: tuple[Sequence, Sequence, Sequence] | None = None,
    test_fraction: float = 0.2,
    validation_fraction: float = 0.0,
    seed: int = 0,
    nnz_per_block: int = DEFAULT_NNZ_PER_BLOCK,
    grid: tuple[int, int] | None = None,
    overwrite: bool = False,
) -> StoreInfo:
    """Ingest in-memory (users, items, values) arrays of shape (n,) into a store at ``out``.

    Raw ids may be integers (stored as int64) or strings. ``test`` is an optional
    ``(users, items, values)`` tuple used instead of a random split. Errors name the 0-based
    row. Other options as in ``ingest``.
    """
    check_target(out, overwrite)
    train = _arrays_to_rows(users, items, values, "input arrays")
    test_rows = None if test is None else _arrays_to_rows(*test, "test arrays")
    return _build(
        train, test_rows, out, label="input arrays", sources=[],
        test_sources=None if test is None else [],
        ratings=ratings, counts=counts, binarize=binarize, scale_max=scale_max,
        min_count=min_count, filter_mode=filter_mode, duplicates=duplicates,
        test_fraction=test_fraction, seed=seed, nnz_per_block=nnz_per_block, grid=grid,
        overwrite=overwrite, validation_fraction=validation_fraction,
    )  # fmt: skip


def as_list(paths: PathLike | Sequence[PathLike]) -> list[PathLike]:
    return [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)


def inputs_label(paths: Sequence[PathLike]) -> str:
    """The input files as messages name them: the first three as given, then how many more."""
    names = [os.fspath(p) for p in paths]
    more = f" and {len(names) - 3} more files" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more


def check_train_left(label: str, n: int, test_fraction: float) -> None:
    """Raise InputError if the random split of ``n`` nonzeros leaves none for training."""
    if n_test_rows(n, test_fraction) == n:
        raise InputError(
            f"{label}: the random split leaves no training data: all {n} nonzeros go to the "
            f"test set (test_fraction={test_fraction:g}); give more data or a smaller "
            "test_fraction"
        )


def _arrays_to_rows(users: object, items: object, values: object, label: str) -> _Rows:
    u = ids_from_array(users, f"{label}: user")
    i = ids_from_array(items, f"{label}: item")
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
        raise InputError(f"min_count must be a non-negative integer, got {min_count!r}")
    if filter_mode not in FILTER_MODES:
        raise InputError(f"filter_mode must be one of {FILTER_MODES}, got {filter_mode!r}")
    if duplicates not in DUPLICATE_POLICIES:
        raise InputError(f"duplicates must be one of {DUPLICATE_POLICIES}, got {duplicates!r}")
    check_test_fraction(test_fraction)
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")


def _build(
    train: _Rows,
    test: _Rows | None,
    out: PathLike,
    *,
    label: str,
    sources: list[str],
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
    check_options(min_count, filter_mode, duplicates, test_fraction, seed)
    check_validation_fraction(validation_fraction)
    values, origin = train.values, train.origin
    if test is not None:  # the value rules (and a default integer scale) cover both sets
        values = np.concatenate([train.values, test.values])
        origin = Origin.concat([train.origin, test.origin])
    spec = make_spec(
        values, origin, ratings=ratings, counts=counts, binarize=binarize, scale_max=scale_max
    )
    classify(spec, values, origin)  # every row checked, errors name its line

    user_ids, u = factorize(train.users)
    item_ids, i = factorize(train.items)
    rows, raw = dedupe(u, i, train.values, train.origin, duplicates, user_ids, item_ids)
    u, i, origin = u[rows], i[rows], train.origin.take(rows)
    pair_keys = (u, i)  # all training pairs, for the test-overlap check
    y, keep = classify(spec, raw, origin)
    n_not_interaction = int((~keep).sum())
    if not keep.any():
        raise InputError(
            f"{label}: no interactions left: every row is below the binarize/count threshold"
        )
    u, i, y, raw = u[keep], i[keep], y[keep], raw[keep]

    keep = min_count_mask(u, i, len(user_ids), len(item_ids), min_count, filter_mode)
    if not keep.any():
        raise InputError(
            f"{label}: everything was filtered away by min_count={min_count} "
            f"(filter_mode={filter_mode!r})"
        )
    n_filtered = int((~keep).sum())
    user_sel, u = factorize(u[keep])
    item_sel, i = factorize(i[keep])
    data = _Nonzeros(u, i, y[keep], raw[keep])
    data = data.take(np.lexsort((data.i, data.u)))
    n_before_split = len(data.u)

    extra: dict[str, object] = {}
    if test is None:
        check_train_left(label, n_before_split, test_fraction)
        is_test = random_test_mask(data.u, data.i, len(item_sel), test_fraction, seed)
        train_nz, test_nz = data.take(~is_test), data.take(is_test)
    else:
        train_nz = data
        test_nz, extra = _file_test(
            test, spec, duplicates, user_ids, item_ids, pair_keys, origin,
            user_ids[user_sel], item_ids[item_sel],
        )  # fmt: skip

    val_nz = None
    if validation_fraction > 0:
        is_val = validation_mask(train_nz.u, train_nz.i, len(item_sel), validation_fraction, seed)
        train_nz, val_nz = train_nz.take(~is_val), train_nz.take(is_val)
        if len(train_nz.u) == 0:
            raise InputError(f"{label}: the validation split leaves no training data "
                             f"(validation_fraction={validation_fraction:g})")
        extra.update(validation_attrs(validation_fraction, _hist(val_nz.y, spec)))

    n_users, n_items = len(user_sel), len(item_sel)
    row_bounds, col_bounds = choose_bounds(
        train_nz.u, train_nz.i, n_users, n_items, nnz_per_block, grid
    )
    blocked = [
        None if nz is None else block_sort(nz.u, nz.i, nz.y, nz.raw, row_bounds, col_bounds)
        for nz in (train_nz, test_nz, val_nz)
    ]
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
        "nnz_train": len(train_nz.y),
        "nnz_test": len(test_nz.y),
        "hist_train": _hist(train_nz.y, spec),
        "hist_test": _hist(test_nz.y, spec),
        "grid": [len(row_bounds) - 1, len(col_bounds) - 1],
        "nnz_per_block": int(nnz_per_block),
        "source": sources,
        "test_source": test_sources,
        "rows_read": len(train.values),
        "rows_not_interaction": n_not_interaction,
        "rows_filtered": n_filtered,
        "nnz_before_split": n_before_split,
        "id_kind": {"users": id_kind(user_ids), "items": id_kind(item_ids)},
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
    _check_overlap(test, all_users, all_items, pair_keys, train_origin)
    t_users, tu = factorize(test.users)
    t_items, ti = factorize(test.items)
    rows, raw = dedupe(tu, ti, test.values, test.origin, duplicates, t_users, t_items)
    y, keep = classify(spec, raw, test.origin.take(rows))
    u = lookup(final_users, test.users[rows])
    i = lookup(final_items, test.items[rows])
    unknown = keep & ((u < 0) | (i < 0))
    n_unknown = int(unknown.sum())
    if n_unknown:
        warnings.warn(
            f"{n_unknown} test rows dropped: their user or item is not in the (filtered) "
            "training data",
            UserWarning,
            stacklevel=4,
        )
    keep &= ~unknown
    nz = _Nonzeros(u[keep], i[keep], y[keep], raw[keep])
    nz = nz.take(np.lexsort((nz.i, nz.u)))
    extra = {
        "test_unknown_dropped": n_unknown,
        "test_not_interaction": int((~keep).sum()) - n_unknown,
    }
    return nz, extra


def _check_overlap(
    test: _Rows,
    all_users: np.ndarray,
    all_items: np.ndarray,
    pair_keys: tuple[np.ndarray, np.ndarray],
    train_origin: Origin,
) -> None:
    """Raise InputError naming the first test row whose (user, item) pair is in the train data."""
    tu = lookup(all_users, test.users)
    ti = lookup(all_items, test.items)
    width = np.int64(max(len(all_items), 1))
    train_keys = pair_keys[0] * width + pair_keys[1]
    order = np.argsort(train_keys)
    known = (tu >= 0) & (ti >= 0)
    test_keys = np.where(known, tu * width + ti, -1)
    pos = np.minimum(np.searchsorted(train_keys[order], test_keys), len(order) - 1)
    shared = np.flatnonzero(known & (train_keys[order][pos] == test_keys))
    if shared.size:
        k = int(shared[0])
        j = int(order[pos[k]])
        raise InputError(
            f"{test.origin.where(k)}: test pair (user {test.users[k]!s}, item {test.items[k]!s}) "
            f"is also in the training data at {train_origin.where(j)}"
        )


def _hist(y: np.ndarray, spec: ValueSpec) -> list[int]:
    hist = np.bincount(y, minlength=spec.n_classes + 1)
    hist[0] = 0
    return [int(x) for x in hist]


def id_kind(ids: np.ndarray) -> str:
    return "int" if ids.dtype.kind in "iu" else "str"
