"""A store's header: its group attributes as one typed, checked record (docs/store-format.md).

:class:`StoreHeader` is the one reader and the one writer of a store's attributes: every field
has a type and a range and is checked against the others (classes against the histograms,
histograms against the nonzero counts, the block grid against the shape) before a reader
allocates anything from it; :func:`check_arrays` then holds the arrays' recorded shapes to the
header before they are read. A contradiction is a :class:`StoreError` naming the store and the
field, so that a damaged or hostile header is an error, never an allocation, a hang or a wrong
answer. The attributes a store records for the record (sources, cleaning counts, creation
time, ``synth``) are kept as they are in :attr:`StoreHeader.record`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ordnmf_dask.errors import StoreError, shown
from ordnmf_dask.params import MAX_CLASSES

INT64_MAX = 2**63 - 1


class HeaderFields:
    """Typed reads of one header's fields, each failure a StoreError (or ``error``) naming
    ``where`` (the store, model or checkpoint) and the field."""

    def __init__(
        self,
        attrs: Mapping[str, Any],
        where: str,
        kind: str,
        table: str = "",
        error: type[Exception] = StoreError,
    ) -> None:
        """``table``: the attribute (a table) ``attrs`` is, named in front of its fields."""
        self.attrs, self.where, self.kind, self.error = attrs, where, kind, error
        self.prefix = f"{table}." if table else ""

    def fail(self, name: str, rule: str, value: Any = None, show: bool = True) -> Exception:
        got = f", got {_short(value)}" if show else ""
        return self.error(
            f"{self.where}: {self.kind} attribute {self.prefix}{name} must be {rule}{got} "
            f"(the {self.kind} is damaged)"
        )

    def get(self, name: str, default: Any = ...) -> Any:
        if name not in self.attrs:
            if default is ...:
                raise self.error(
                    f"{self.where}: {self.kind} attribute {self.prefix}{name} is missing (the "
                    f"{self.kind} is damaged)"
                )
            return default
        return self.attrs[name]

    def integer(self, name: str, low: int = 0, high: int = INT64_MAX, value: Any = ...) -> int:
        """An integer field in [low, high]."""
        value = self.get(name) if value is ... else value
        if not is_int(value) or not low <= value <= high:
            raise self.fail(name, f"an integer in {low}..{high}", value)
        return int(value)

    def number(self, name: str, value: Any = ..., low: float = -math.inf, above: bool = False):
        """A finite number >= low (> low with ``above``)."""
        value = self.get(name) if value is ... else value
        if not is_number(value) or value < low or (above and value == low):
            bound = "" if low == -math.inf else f" {'>' if above else '>='} {low:g}"
            raise self.fail(name, f"a finite number{bound}", value)
        return float(value)

    def counts(self, name: str, length: int, value: Any = ...) -> tuple[int, ...]:
        """A list of ``length`` integers >= 0 (a class histogram)."""
        value = self.get(name) if value is ... else value
        if not isinstance(value, list | tuple) or len(value) != length:
            size = len(value) if isinstance(value, list | tuple) else None
            raise self.fail(
                name, f"a list of {length} counts (classes 0..{length - 1})", size, size is not None
            )
        if not all(is_int(x) and 0 <= x <= INT64_MAX for x in value):
            raise self.fail(name, "a list of integers >= 0", value)
        return tuple(int(x) for x in value)

    def bounds(self, name: str, end: int, value: Any = ...) -> tuple[int, ...]:
        """Block boundaries: integers from 0, increasing, ending at ``end``."""
        value = self.get(name) if value is ... else value
        ok = (
            isinstance(value, list | tuple | np.ndarray)
            and len(value) >= 2
            and all(is_int(x) and 0 <= x <= INT64_MAX for x in value)
        )
        b = np.asarray(value, dtype=np.int64) if ok else None
        if b is None or b[0] != 0 or b[-1] != end or np.any(np.diff(b) < 0):
            raise self.fail(name, f"nondecreasing integers from 0 to {end}", value)
        return tuple(int(x) for x in b)


def is_int(value: Any) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def is_number(value: Any) -> bool:
    """A finite real number, not a bool."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool | np.bool_)
        and math.isfinite(value)
    )


def _short(value: Any) -> str:
    text = shown(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


#: The fields :class:`StoreHeader` types; every other attribute is kept in ``record``.
_TYPED = (
    "format_version",
    "complete",
    "n_users",
    "n_items",
    "n_classes",
    "value_kind",
    "thresholds",
    "nnz_train",
    "nnz_test",
    "hist_train",
    "hist_test",
    "nnz_validation",
    "hist_validation",
    "grid",
    "nnz_per_block",
)


@dataclass(frozen=True)
class StoreHeader:
    """The group attributes of a store (docs/store-format.md, "Group attributes"), checked.

    ``hist_*`` have V + 1 entries (index 0 is 0) summing to the split's nonzeros; ``grid`` is
    (R, C) with 1 <= R <= max(U, 1) and 1 <= C <= max(I, 1); ``thresholds`` (count stores) are
    V finite increasing numbers; ``nnz_validation`` / ``hist_validation`` are both None in a
    store without a validation subset.
    """

    format_version: int
    complete: bool
    n_users: int
    n_items: int
    n_classes: int
    value_kind: str
    nnz_train: int
    nnz_test: int
    hist_train: tuple[int, ...]
    hist_test: tuple[int, ...]
    grid: tuple[int, int]
    nnz_per_block: int | None = None
    thresholds: tuple[float, ...] | None = None
    nnz_validation: int | None = None
    hist_validation: tuple[int, ...] | None = None
    record: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], where: str) -> StoreHeader:
        """The header of the store at ``where`` from its attributes; StoreError naming the
        first field that is missing, of the wrong type or range, or contradicts another."""
        f = HeaderFields(attrs, where, "store")
        v = f.integer("n_classes", 1, MAX_CLASSES)
        hists = {}
        for split in ("train", "test", "validation"):
            if split == "validation" and f.get("nnz_validation", None) is None:
                if f.get("hist_validation", None) is not None:
                    raise f.fail("nnz_validation", "given with hist_validation", None, False)
                continue
            nnz = f.integer(f"nnz_{split}")
            hist = f.counts(f"hist_{split}", v + 1)
            if hist[0] != 0 or sum(hist) != nnz:
                raise f.fail(
                    f"hist_{split}",
                    f"class counts (class 0: 0) summing to nnz_{split} = {nnz}",
                    list(hist),
                )
            hists[split] = (nnz, hist)
        n_users, n_items = f.integer("n_users"), f.integer("n_items")
        grid = f.get("grid")
        if not (isinstance(grid, list | tuple) and len(grid) == 2):
            raise f.fail("grid", "[R, C], the numbers of user- and item-blocks", grid)
        rows = f.integer("grid", 1, max(n_users, 1), grid[0])
        cols = f.integer("grid", 1, max(n_items, 1), grid[1])
        kind, thresholds = value_rule(f, v)
        version, complete = f.get("format_version"), f.get("complete")
        if not is_int(version) or not isinstance(complete, bool):
            raise f.fail("format_version", "an integer, with a boolean complete", version)
        validation = hists.get("validation", (None, None))
        return cls(
            format_version=int(version),
            complete=complete,
            n_users=n_users,
            n_items=n_items,
            n_classes=v,
            value_kind=kind,
            nnz_train=hists["train"][0],
            nnz_test=hists["test"][0],
            hist_train=hists["train"][1],
            hist_test=hists["test"][1],
            grid=(rows, cols),
            nnz_per_block=_optional(f, "nnz_per_block"),
            thresholds=thresholds,
            nnz_validation=validation[0],
            hist_validation=validation[1],
            record={k: val for k, val in attrs.items() if k not in _TYPED},
        )

    def to_attrs(self) -> dict[str, Any]:
        """The attributes as written (JSON values), the record's first."""
        typed: dict[str, Any] = {
            "format_version": self.format_version,
            "complete": self.complete,
            "n_users": self.n_users,
            "n_items": self.n_items,
            "n_classes": self.n_classes,
            "value_kind": self.value_kind,
            "thresholds": None if self.thresholds is None else list(self.thresholds),
            "nnz_train": self.nnz_train,
            "nnz_test": self.nnz_test,
            "hist_train": list(self.hist_train),
            "hist_test": list(self.hist_test),
            "grid": list(self.grid),
        }
        if self.nnz_per_block is not None:
            typed["nnz_per_block"] = self.nnz_per_block
        if self.nnz_validation is not None:
            typed["nnz_validation"] = self.nnz_validation
            typed["hist_validation"] = list(self.hist_validation or ())
        return {**self.record, **typed}

    @property
    def splits(self) -> tuple[str, ...]:
        """The block subsets: train, test, and validation when the store has one."""
        with_validation = self.nnz_validation is not None
        return ("train", "test", "validation") if with_validation else ("train", "test")

    def nnz(self, split: str) -> int:
        """Nonzeros of ``split``."""
        return {"train": self.nnz_train, "test": self.nnz_test}.get(split, self.nnz_validation or 0)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape every array of the store must have, by its path in the group."""
        r, c = self.grid
        shapes: dict[str, tuple[int, ...]] = {
            "row_bounds": (r + 1,),
            "col_bounds": (c + 1,),
            "users/ids": (self.n_users,),
            "items/ids": (self.n_items,),
        }
        for split in self.splits:
            n = self.nnz(split)
            shapes[f"{split}/offsets"] = (r * c + 1,)
            shapes[f"{split}/indptr"] = (c * self.n_users + r * c,)
            for name in ("cols", "y", "raw"):
                shapes[f"{split}/{name}"] = (n,)
        return shapes


def prepared(attrs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``attrs`` as a writer records them: through :class:`StoreHeader`, so that no store is
    written with a header its readers would refuse (``format_version`` and ``complete`` are the
    writer's own, set where it writes them)."""
    probe = {"format_version": 0, "complete": False, **attrs}
    out = StoreHeader.from_attrs(probe, where).to_attrs()
    return {k: v for k, v in out.items() if k in attrs}


def value_rule(f: HeaderFields, n_classes: int) -> tuple[str, tuple[float, ...] | None]:
    """``value_kind`` and ``thresholds``, with ``binarize`` and ``binarize_on`` checked too: how
    raw values became classes, as a store records it and a model records of its store (fold-in
    and ``predict`` map values through it, so a damaged rule is refused here, not met there)."""
    kind = f.get("value_kind")
    if not isinstance(kind, str):
        raise f.fail("value_kind", "a string", kind)
    thresholds = f.get("thresholds", None)
    if thresholds is not None:
        t = [f.number("thresholds", x) for x in thresholds] if _listlike(thresholds) else None
        if t is None or (kind == "counts" and len(t) != n_classes) or np.any(np.diff(t) <= 0):
            need = f"{n_classes} " if kind == "counts" else ""
            raise f.fail("thresholds", f"{need}finite increasing numbers", thresholds)
        thresholds = tuple(t)
    elif kind == "counts":
        raise f.fail("thresholds", f"the {n_classes} count thresholds of a count store", None)
    binarize = f.get("binarize", None)
    if binarize is not None and not is_number(binarize):
        raise f.fail("binarize", "a finite number, or null", binarize)
    on = f.get("binarize_on", None)
    if on is not None and not isinstance(on, str):
        raise f.fail("binarize_on", "a value kind (a string), or null", on)
    return kind, thresholds


def _optional(f: HeaderFields, name: str) -> int | None:
    value = f.get(name, None)
    return None if value is None else f.integer(name, 1, value=value)


def _listlike(value: Any) -> bool:
    return isinstance(value, list | tuple)


def check_arrays(header: StoreHeader, shapes: Mapping[str, tuple[int, ...]], where: str) -> None:
    """StoreError unless every array's recorded shape (``shapes``: path in the group -> shape,
    from the arrays' metadata) is the one the header gives: checked before anything is read, so
    that an array's metadata claiming 10^12 elements is an error, not an allocation."""
    for name, want in header.expected_shapes().items():
        got = shapes.get(name)
        if got is not None and tuple(got) != want:
            raise StoreError(
                f"{where}: array {name} has shape {tuple(got)}, but the store's header gives "
                f"{want} (the store is damaged)"
            )


def check_bounds(header: StoreHeader, row_bounds: np.ndarray, col_bounds: np.ndarray, where: str):
    """StoreError unless the block bounds read from the store agree with the header."""
    f = HeaderFields({}, where, "store")
    f.bounds("row_bounds", header.n_users, row_bounds.tolist())
    f.bounds("col_bounds", header.n_items, col_bounds.tolist())


def check_offsets(header: StoreHeader, split: str, offsets: np.ndarray, where: str) -> None:
    """StoreError unless the block offsets of ``split`` run from 0 to its nonzero count."""
    if offsets[0] != 0 or offsets[-1] != header.nnz(split) or np.any(np.diff(offsets) < 0):
        raise StoreError(
            f"{where}: array {split}/offsets must increase from 0 to nnz_{split} = "
            f"{header.nnz(split)} (the store is damaged)"
        )
