"""Attributes an ingest records in its store beside the ones every store has
(docs/store-format.md)."""

from __future__ import annotations


def validation_attrs(fraction: float, hist: list[int]) -> dict[str, object]:
    """The attributes that record a validation subset with class counts ``hist``
    (docs/store-format.md)."""
    return {"validation_fraction": float(fraction), "nnz_validation": sum(hist),
            "hist_validation": hist}  # fmt: skip


def id_kind(kind: str) -> str:
    """The store's ``id_kind`` attribute for ids of numpy dtype kind ``kind``."""
    return "int" if kind in "iu" else "str"
