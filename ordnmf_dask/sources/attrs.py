"""Attributes an ingest records in its store beside the ones every store has
(docs/store-format.md)."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import numpy as np

from ordnmf_dask.sources.values import ValueSpec
from ordnmf_dask.store.blocks import FORMAT_VERSION
from ordnmf_dask.store.header import StoreHeader


def validation_attrs(fraction: float, hist: list[int]) -> dict[str, object]:
    """The attributes that record a validation subset with class counts ``hist``
    (docs/store-format.md)."""
    return {
        "validation_fraction": float(fraction),
        "nnz_validation": sum(hist),
        "hist_validation": hist,
    }


def id_kind(kind: str) -> str:
    """The store's ``id_kind`` attribute for ids of numpy dtype kind ``kind``."""
    return "int" if kind in "iu" else "str"


def ingest_attrs(
    spec: ValueSpec,
    hists: dict[str, np.ndarray],
    row_bounds: np.ndarray,
    col_bounds: np.ndarray,
    sources: list[str],
    kinds: tuple[str, str],
    *,
    min_count: int,
    filter_mode: str,
    duplicates: str,
    test_fraction: float,
    seed: int,
    nnz_per_block: int,
    rows_read: int,
    not_interaction: int,
    filtered: int,
    n_before_split: int,
    test_source: list[str] | None,
) -> dict[str, Any]:
    """The attributes every ingest writes (through its :class:`StoreHeader`), from the class
    counts (V + 1,) of each split (``hists``: "train", "test") and the block bounds (a test
    file's counts of dropped rows and the validation attributes are added to them)."""
    hist = {s: hist_list(h) for s, h in hists.items()}
    header = StoreHeader(
        format_version=FORMAT_VERSION,
        complete=False,
        n_users=int(row_bounds[-1]),
        n_items=int(col_bounds[-1]),
        n_classes=spec.n_classes,
        value_kind=spec.value_kind,
        nnz_train=sum(hist["train"]),
        nnz_test=sum(hist["test"]),
        hist_train=tuple(hist["train"]),
        hist_test=tuple(hist["test"]),
        grid=(len(row_bounds) - 1, len(col_bounds) - 1),
        nnz_per_block=int(nnz_per_block),
        thresholds=None if spec.thresholds is None else tuple(spec.thresholds),
        record={
            "binarize": spec.binarize,
            "binarize_on": None if spec.binarize is None else spec.base,
            "min_count": int(min_count),
            "filter_mode": filter_mode,
            "duplicates": duplicates,
            "split": "random" if test_source is None else "file",
            "test_fraction": float(test_fraction) if test_source is None else None,
            "seed": int(seed),
            "source": sources,
            "test_source": test_source,
            "rows_read": int(rows_read),
            "rows_not_interaction": int(not_interaction),
            "rows_filtered": int(filtered),
            "nnz_before_split": int(n_before_split),
            "id_kind": {"users": id_kind(kinds[0]), "items": id_kind(kinds[1])},
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        },
    )
    return header.to_attrs()


def hist_list(hist: np.ndarray) -> list[int]:
    """Class counts as ``ingest`` stores them (class 0 cleared)."""
    return [0, *(int(x) for x in hist[1:])]
