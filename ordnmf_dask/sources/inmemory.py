"""Build a block store from the rows of its inputs held in memory, in this process.

Steps: read (``readers.rows_of``; errors name file and line) -> check every value -> merge
duplicate pairs -> classes (dropping rows that are "not an interaction") -> min-count filtering
-> contiguous id maps (sorted by raw id) -> train/test split -> block grid -> sorted blocks ->
atomic store write. Ids are dictionary-encoded by pyarrow (the strings are dropped once
encoded), one sort of the (user, item) codes orders the rows for the duplicate check and for
the blocks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.attrs import hist_list, ingest_attrs, validation_attrs
from ordnmf_dask.sources.filtering import dedupe, encode_ids, encode_pair, min_count_mask
from ordnmf_dask.sources.memory import Rows
from ordnmf_dask.sources.nonzeros import Nonzeros
from ordnmf_dask.sources.options import IngestPlan
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.readers import rows_of
from ordnmf_dask.sources.split import (
    check_train_left,
    id_hashes,
    lookup,
    pair_hash,
    split_rule,
)
from ordnmf_dask.sources.testset import (
    check_test_left,
    classify_test_rows,
    first_overlap,
    known_test,
    overlap_message,
    warn_unknown,
)
from ordnmf_dask.sources.text import release_memory
from ordnmf_dask.sources.values import ValueSpec, classify, make_spec
from ordnmf_dask.store.blocks import StoreInfo, write_store
from ordnmf_dask.store.grid import block_sort, choose_bounds

PathLike = str | os.PathLike


def build_in_memory(plan: IngestPlan) -> StoreInfo:
    """The store of ``plan``, its inputs read whole into memory."""
    train, label, sources = rows_of(plan.inputs, plan.delimiter, plan.header, plan.columns, "input")
    test_rows, test_label, test_sources = (
        (None, None, None)
        if plan.test is None
        else rows_of(plan.test, plan.delimiter, plan.header, plan.columns, "test", ids=True)
    )
    return _build(
        train,
        test_rows,
        plan.out,
        label=label,
        sources=sources,
        test_label=test_label,
        test_sources=test_sources,
        **plan.options,
    )


def _build(
    train: Rows,
    test: Rows | None,
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
    data = Nonzeros(u, i, y, raw)  # still in (user, item) order: compacting keeps it
    del u, i, y, raw
    release_memory()  # what the sort and the filters freed
    n_before_split = len(data.u)

    extra: dict[str, object] = {}
    rule = split_rule(test_fraction if test is None else None, validation_fraction)
    is_test, is_val = rule.masks(
        pair_hash(
            id_hashes(user_ids[user_sel])[data.u], id_hashes(item_ids[item_sel])[data.i], seed
        )
    )
    if test is None:
        train_nz, test_nz = data.take(~is_test), data.take(is_test)
    else:
        train_nz = data
        test_nz, extra = _file_test(
            test,
            str(test_label),
            spec,
            duplicates,
            user_ids,
            item_ids,
            pair_keys,
            train_origin,
            user_ids[user_sel],
            item_ids[item_sel],
        )
    del data
    check_train_left(
        label,
        n_before_split,
        n_before_split - int(is_test.sum() + is_val.sum()),
        test_fraction if test is None else None,
        validation_fraction,
    )

    val_nz = None
    if validation_fraction > 0:
        is_val = is_val[~is_test]  # the training pairs' (test pairs are never validation)
        train_nz, val_nz = train_nz.take(~is_val), train_nz.take(is_val)
        extra.update(validation_attrs(validation_fraction, hist_list(_hist(val_nz.y, spec))))
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
        blocked.append(
            None
            if nz is None
            else block_sort(nz.u, nz.i, nz.y, nz.raw, row_bounds, col_bounds, presorted=True)
        )
        del nz
    hists = {"train": _hist(blocked[0].y, spec), "test": _hist(blocked[1].y, spec)}
    attrs = ingest_attrs(
        spec,
        hists,
        row_bounds,
        col_bounds,
        sources,
        (user_ids.dtype.kind, item_ids.dtype.kind),
        min_count=min_count,
        filter_mode=filter_mode,
        duplicates=duplicates,
        test_fraction=test_fraction,
        seed=seed,
        nnz_per_block=nnz_per_block,
        rows_read=n_rows,
        not_interaction=n_not_interaction,
        filtered=n_filtered,
        n_before_split=n_before_split,
        test_source=None if test is None else test_sources,
    )
    attrs.update(extra)
    return write_store(
        out,
        attrs,
        row_bounds,
        col_bounds,
        blocked[0],
        blocked[1],
        user_ids[user_sel],
        item_ids[item_sel],
        overwrite=overwrite,
        validation=blocked[2],
    )


def _file_test(
    test: Rows,
    label: str,
    spec: ValueSpec,
    duplicates: str,
    all_users: np.ndarray,
    all_items: np.ndarray,
    pair_keys: tuple[np.ndarray, np.ndarray],
    train_origin: Origin,
    final_users: np.ndarray,
    final_items: np.ndarray,
) -> tuple[Nonzeros, dict[str, object]]:
    """Test nonzeros in the final index space, and attrs describing dropped rows."""
    tu, ti = lookup(all_users, test.users), lookup(all_items, test.items)
    hit = first_overlap(tu, ti, len(all_items), *pair_keys)
    if hit is not None:
        raise InputError(
            overlap_message(
                test.origin, hit[0], test.users[hit[0]], test.items[hit[0]], train_origin, hit[1]
            )
        )
    del tu, ti
    t_users, tu = encode_ids(test.users, test.origin, "user")
    t_items, ti = encode_ids(test.items, test.origin, "item")
    rows, y, raw, keep = classify_test_rows(
        tu, ti, test.values, test.origin, duplicates, t_users, t_items, spec
    )
    u = lookup(final_users, test.users[rows])
    i = lookup(final_items, test.items[rows])
    nz, n_unknown = known_test(u, i, y, raw, keep)
    n_not = int((~keep).sum())
    check_test_left(label, len(nz.u), n_unknown, n_not)
    warn_unknown(n_unknown, 7)  # the caller of ``ingest``
    extra = {
        "test_unknown_dropped": n_unknown,
        "test_not_interaction": n_not,
    }
    return nz, extra


def _compact(codes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The codes (of ``n``) in use, sorted (m,), and every code's index among them (n,)."""
    used = np.bincount(codes, minlength=n) > 0
    if used.all():
        return np.arange(n), codes
    index = np.cumsum(used, dtype=np.int32) - 1
    return np.flatnonzero(used), index[codes]


def _hist(y: np.ndarray, spec: ValueSpec) -> np.ndarray:
    """Nonzeros per class (V + 1,) of classes ``y``."""
    return np.bincount(y, minlength=spec.n_classes + 1)
