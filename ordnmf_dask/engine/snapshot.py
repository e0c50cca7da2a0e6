"""A checkpoint's header and content rules: what a resumed fit may trust (docs/design.md,
"Safety rules").

:class:`CheckpointHeader` is the one writer and the one reader of a checkpoint's root
attributes: its format and fingerprint from the start, then the client's :class:`Snapshot` and
the column sums of every chunk. Read back, every field is typed and bounded by the fit that
resumes (its :class:`Layout`: the rows of each chunk, K, the family, max_iter) before anything
is allocated from it, and :func:`content_problem` holds each chunk read back to the model's
rules (finite, positive where a Gamma posterior is), so that a damaged or hostile checkpoint is
a :class:`CheckpointError` naming it and the field, skipped or refused, never resumed into a
NaN bound or an error blamed on the output model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ordnmf_dask.errors import CheckpointError
from ordnmf_dask.model.families import Family
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.store.header import HeaderFields, is_int, is_number
from ordnmf_dask.store.kinds import CHECKPOINT_FORMAT, CHECKPOINT_NAME

GROUPS = ("W", "H", "SW", "SH")
MAX_PASSES = 2**53  # exactly representable: more full passes than any fit makes
_FLOAT_CHARS = 64  # a number as zarr writes it, on its own indented line (<= 36), doubled
_SLACK = 1 << 20  # room for the names and fields around the numbers
_PARAMS_MAX = 512  # more numbers than any family's parameters and scalar fields hold


@dataclass(frozen=True)
class Snapshot:
    """The client-side part of the state after an iteration (JSON-able)."""

    iteration: int
    params: Any
    elbo: list[float]
    objective: float
    small: list[float]
    w_sum: list[float]
    h_sum: list[float]
    passes: int = 0  # full passes over the blocks so far
    step_max: float = 1.0  # the SQUAREM optimizer's largest step for the next cycle
    extrapolations: tuple[int, int] = (0, 0)  # extrapolated steps kept, refused


@dataclass(frozen=True)
class Layout:
    """What a checkpoint of one fit holds: the rows of each chunk of every group (W, H, SW,
    SH), K and the family (the lengths of its parameters and statistics); it is resumed only
    before ``max_iter``."""

    rows: Mapping[str, list[int]]
    n_components: int
    family: Family
    max_iter: int

    def max_bytes(self) -> int:
        """The largest root ``zarr.json`` such a checkpoint can have: its numbers, bounded by
        the layout, and some room for the names."""
        k = self.n_components
        numbers = sum(len(r) for r in self.rows.values()) * k + 2 * (k + 1) + self.max_iter
        numbers += self.family.small_size + _PARAMS_MAX
        return _SLACK + _FLOAT_CHARS * numbers


@dataclass(frozen=True)
class CheckpointHeader:
    """The root attributes of a checkpoint (docs/design.md §4, "Checkpoints"): ``format`` and
    ``fingerprint`` from its start (so that even an unfinished one says whose it is); once
    complete also ``snapshot`` and ``colsums``, the column sums of each chunk of each group
    (checked when the chunk is read back)."""

    fingerprint: str
    snapshot: Snapshot | None = None
    colsums: Mapping[str, list[list[float]]] | None = None

    def to_attrs(self) -> dict[str, Any]:
        """The attributes as written (JSON values)."""
        attrs: dict[str, Any] = {"format": CHECKPOINT_FORMAT, "fingerprint": self.fingerprint}
        if self.snapshot is not None:
            snap = dict(self.snapshot.__dict__, extrapolations=list(self.snapshot.extrapolations))
            attrs |= {"snapshot": snap, "colsums": dict(self.colsums or {}), "complete": True}
        return attrs

    @classmethod
    def from_attrs(
        cls, attrs: Mapping[str, Any], where: str, layout: Layout, print_: str
    ) -> CheckpointHeader:
        """The complete header of the checkpoint at ``where`` as the fit of ``layout`` and
        fingerprint ``print_`` resumes it; CheckpointError naming the checkpoint and the first
        field that is missing, of the wrong type or range, or contradicts another."""
        if attrs.get("complete") is not True or attrs.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{where}: incomplete or unknown format")
        if attrs.get("fingerprint") != print_:
            raise CheckpointError(f"{where}: written for another store or configuration")
        raw = attrs.get("snapshot")
        if not isinstance(raw, dict):
            raise _fields(attrs, where).fail("snapshot", "a table of the fit's state", raw)
        snap = _snapshot(_fields(raw, where, "snapshot"), where, layout)
        colsums = _colsums(_fields(attrs, where), layout)
        k = layout.n_components
        for name, total in (("W", snap.w_sum), ("H", snap.h_sum)):
            summed = np.sum(colsums[name], axis=0) if colsums[name] else np.zeros(k)
            if not np.allclose(summed, total[:k], rtol=1e-9, atol=0.0):
                f = _fields(raw, where, "snapshot")
                rule = f"the sum of its {name} chunks' column sums (colsums.{name})"
                raise f.fail(f"{name.lower()}_sum", rule, total[:k])
        return cls(print_, snap, colsums)


def _fields(attrs: Mapping[str, Any], where: str, table: str = "") -> HeaderFields:
    return HeaderFields(attrs, where, "checkpoint", table, error=CheckpointError)


def _numbers(f: HeaderFields, name: str, length: int, low: float = -math.inf) -> list[float]:
    """A list of ``length`` finite numbers >= ``low``."""
    value = f.get(name)
    if not isinstance(value, list) or len(value) != length:
        raise f.fail(name, f"a list of {length} finite numbers", value)
    return [f.number(name, x, low) for x in value]


def _snapshot(f: HeaderFields, where: str, layout: Layout) -> Snapshot:
    """The snapshot, each field bounded by ``layout``; its iteration is the one its name says."""
    iteration = f.integer("iteration", 1, layout.max_iter - 1)
    named = CHECKPOINT_NAME.match(where.rstrip("/").rsplit("/", 1)[-1])
    if named is not None and int(named.group(1)) != iteration:
        raise f.fail("iteration", f"{int(named.group(1))}, the iteration its name says", iteration)
    params = f.get("params")
    wrong = layout.family.params_problem(params)
    if wrong is not None:
        raise f.fail("params", wrong, params)
    k = layout.n_components
    sums = {name: _numbers(f, name, k + 1) for name in ("w_sum", "h_sum")}
    for name, value in sums.items():
        if min(value[:k], default=0.0) < 0.0:
            raise f.fail(name, f"{k} column sums >= 0 and a bound", value)
    extrapolations = f.get("extrapolations", [0, 0])
    if not (
        isinstance(extrapolations, list)
        and len(extrapolations) == 2
        and all(is_int(x) and 0 <= x <= MAX_PASSES for x in extrapolations)
    ):
        raise f.fail("extrapolations", "[kept, refused], two integers >= 0", extrapolations)
    step_max = f.number("step_max", f.get("step_max", 1.0), 1.0)
    return Snapshot(
        iteration=iteration,
        params=params,
        elbo=_numbers(f, "elbo", iteration),
        objective=f.number("objective"),
        small=_numbers(f, "small", layout.family.small_size),
        w_sum=sums["w_sum"],
        h_sum=sums["h_sum"],
        passes=f.integer("passes", 0, MAX_PASSES, f.get("passes", 0)),
        step_max=step_max,
        extrapolations=(int(extrapolations[0]), int(extrapolations[1])),
    )


def _colsums(f: HeaderFields, layout: Layout) -> dict[str, list[list[float]]]:
    """The column sums of every chunk: one list of K finite numbers per chunk of each group."""
    raw = f.get("colsums")
    if not isinstance(raw, dict) or sorted(raw) != sorted(GROUPS):
        raise f.fail("colsums", f"a table of the groups {', '.join(GROUPS)}", raw)
    k, out = layout.n_components, {}
    for name in GROUPS:
        chunks, n = raw[name], len(layout.rows[name])
        g = f"colsums.{name}"
        if not isinstance(chunks, list) or len(chunks) != n:
            raise f.fail(g, f"a list of {n} chunks' column sums", chunks)
        for sums in chunks:
            if not isinstance(sums, list) or len(sums) != k or not all(map(is_number, sums)):
                raise f.fail(g, f"lists of {k} finite numbers", sums)
        out[name] = [[float(x) for x in sums] for sums in chunks]
    return out


def parse(text: bytes, where: str, layout: Layout) -> dict[str, Any]:
    """The root attributes of a checkpoint from its ``zarr.json`` (bounded by ``layout``);
    CheckpointError naming it when it is too large or not a zarr group's metadata."""
    if len(text) > layout.max_bytes():
        raise CheckpointError(
            f"{where}: its zarr.json holds more than {layout.max_bytes()} bytes, more than a "
            "checkpoint of this fit can (the checkpoint is damaged)"
        )
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{where}: unreadable zarr.json ({exc})") from None
    attrs = doc.get("attributes") if isinstance(doc, dict) else None
    if not isinstance(attrs, dict):
        raise CheckpointError(f"{where}: zarr.json holds no group attributes")
    return attrs


def shape_problem(recorded: Mapping[str, tuple[int, ...]], rows: int, k: int) -> str | None:
    """What makes the arrays of a chunk, by the shapes their metadata record (``recorded``:
    field -> shape), no state of ``rows`` rows of a fit with K = ``k``, or None: checked before
    a byte is read, so that a chunk claiming 10^12 rows allocates nothing."""
    for name, shape in recorded.items():
        want = (rows, 1) if name == "prior_rate" else (rows, k)
        if shape != want:
            return f"{name} records shape {shape}, not {want}"
    return None


def content_problem(value: FactorChunk | np.ndarray, rows: int, k: int) -> str | None:
    """What makes a chunk read back unusable as the state of a fit with K = ``k``, or None:
    a factor chunk's E[x] and shape (rows, K), finite and > 0, with exp(E[log x]) finite and
    >= 0, its posterior shapes and prior rates finite and > 0; a shape statistic (rows, K),
    finite and >= 0."""
    if isinstance(value, FactorChunk):
        arrays = [
            ("mean", value.mean, (rows, k), 0.0, True),
            ("geo", value.geo, (rows, k), 0.0, False),
            ("shape", value.shape, (rows, k), 0.0, True),
            ("prior_rate", value.prior_rate, (rows, 1), 0.0, True),
        ]
        if not math.isfinite(value.elbo):
            return f"its ELBO term is {value.elbo}"
    else:
        arrays = [("statistic", value, (rows, k), 0.0, False)]
    for name, array, shape, low, strict in arrays:
        if array is None:
            continue
        if array.shape != shape:
            return f"{name} has shape {array.shape}, not {shape}"
        if not np.isfinite(array).all():
            return f"{name} holds values that are not finite"
        if (array <= low).any() if strict else (array < low).any():
            return f"{name} holds values {'<=' if strict else '<'} {low:g}"
    return None
