"""Turn raw values into ordinal classes 1..V (uint8; class 0 means "no interaction").

Three ways to define classes, plus optional binarization:

- ratings ``"halfstar"``: class = 2 * rating, which must be an integer in 1..10 (MovieLens), V = 10.
- ratings ``"integer"``: the rating itself, an integer in 1..V; V = ``scale_max`` (default: the
  largest value observed).
- counts: class = number of thresholds strictly below the count, V = number of thresholds;
  ``"paper"`` uses (0, 1, 2, 5, 10, 20, 50, 100, 200, 500), so 1 -> 1, 2 -> 2, 3..5 -> 3, ...,
  > 500 -> 10. Counts must be > 0. With user thresholds whose first element is > 0, counts at or
  below it get class 0 and the row is dropped as "not an interaction".
- binarize at S: class 1 if value >= S, else the row is dropped as "not an interaction"; V = 1.
  Alone it applies to the raw value; combined with ratings or counts it applies to the class
  (e.g. for halfstar ratings S is in class units 1..10, so S = 8 keeps ratings >= 4.0).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ordnmf_dask.errors import InputError, shown
from ordnmf_dask.params import MAX_CLASSES, RATING_KINDS
from ordnmf_dask.sources.origin import Named, Origin, Taken

PAPER_THRESHOLDS: tuple[float, ...] = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500)


@dataclass(frozen=True)
class ValueSpec:
    """A resolved value -> class rule.

    Attributes
    ----------
    base : str
        ``"ratings-halfstar"``, ``"ratings-integer"``, ``"counts"`` or ``"raw"`` (binarize alone).
    base_classes : int
        Number of classes before binarization (1 for ``"raw"``).
    thresholds : tuple of float or None
        Count thresholds (counts only).
    binarize : float or None
        Binarization threshold S (class units, or raw units when ``base == "raw"``).
    """

    base: str
    base_classes: int
    thresholds: tuple[float, ...] | None = None
    binarize: float | None = None

    @property
    def n_classes(self) -> int:
        """V, the largest class."""
        return 1 if self.binarize is not None else self.base_classes

    @property
    def value_kind(self) -> str:
        """The store's ``value_kind`` attribute."""
        return "binary" if self.binarize is not None else self.base


def check_thresholds(thresholds: Sequence[float]) -> tuple[float, ...]:
    """Validate count thresholds: finite, first >= 0, strictly increasing, 1..255 of them."""
    t = np.asarray(thresholds, dtype=np.float64).ravel()
    if t.size == 0 or t.size > MAX_CLASSES:
        raise InputError(f"count thresholds: need 1..{MAX_CLASSES} values, got {t.size}")
    if not np.all(np.isfinite(t)):
        raise InputError(f"count thresholds must be finite, got {shown(list(thresholds))}")
    if t[0] < 0:
        raise InputError(f"count thresholds must start at a value >= 0, got {t[0]:g}")
    if np.any(np.diff(t) <= 0):
        raise InputError(
            f"count thresholds must be strictly increasing, got {shown(list(thresholds))}"
        )
    return tuple(float(x) for x in t)


def make_spec(
    values: np.ndarray,
    origin: Origin,
    *,
    ratings: str | None = None,
    counts: str | Sequence[float] | None = None,
    binarize: float | None = None,
    scale_max: int | None = None,
) -> ValueSpec:
    """Resolve the options into a ``ValueSpec`` (``values``: float64 (n,), used for defaults).

    If none of ratings/counts/binarize is given and every value is a positive integer, the
    data are treated as ``ratings="integer"``.
    """
    if ratings is not None and counts is not None:
        raise InputError("give either ratings= or counts=, not both")
    if binarize is not None:
        if isinstance(binarize, bool) or not np.isfinite(float(binarize)):
            raise InputError(f"binarize must be a finite number, got {shown(binarize)}")
        binarize = float(binarize)
    if scale_max is not None and ratings not in (None, "integer"):
        raise InputError("scale_max applies to ratings='integer' only")
    if counts is not None:
        given = PAPER_THRESHOLDS if _is_paper(counts) else cast(Sequence[float], counts)
        thresholds = check_thresholds(given)
        return ValueSpec("counts", len(thresholds), thresholds, binarize)
    if ratings is None and binarize is not None:
        return ValueSpec("raw", 1, None, binarize)
    if ratings is None:
        bad = np.flatnonzero((values < 1) | (values != np.round(values)))
        if bad.size:
            v = values[bad[0]]
            raise InputError(
                f"{origin.where(int(bad[0]))}: value {v:g} is not a positive "
                f"integer; {_classes_hint(v, values.max())}"
            )
        ratings = "integer"
    if ratings == "halfstar":
        return ValueSpec("ratings-halfstar", 10, None, binarize)
    if ratings == "integer":
        if scale_max is None:  # the scale is the largest rating: every rating must be a class
            _fail(
                (values < 1) | (values != np.round(values)),
                values,
                origin,
                "rating {v:g} is not an integer class 1, 2, ...",
            )
        top = scale_max if scale_max is not None else (int(values.max()) if values.size else 1)
        if isinstance(top, bool) or int(top) != top or not 1 <= top <= MAX_CLASSES:
            hint = (
                ""
                if scale_max is not None or top <= MAX_CLASSES
                # counts, likely
                else (
                    "; if the values are counts (plays, clicks), pass counts='paper' (the paper's "
                    "count classes) or binarize=S (class 1 where value >= S)"
                )
            )
            raise InputError(
                f"integer rating scale must be 1..V with 1 <= V <= {MAX_CLASSES}, got {top}{hint}"
            )
        return ValueSpec("ratings-integer", int(top), None, binarize)
    raise InputError(f"ratings must be one of {RATING_KINDS}, got {ratings!r}")


def spec_of(attrs: Mapping[str, Any]) -> ValueSpec | None:
    """The rule a store was ingested with, from its attributes (or a model's record of them:
    ``value_kind``, ``thresholds``, ``binarize``, ``binarize_on``, ``n_classes``); None when
    they name no rule of this module (synthetic classes, records without them)."""
    kind, binarize = attrs.get("value_kind"), attrs.get("binarize")
    base = attrs.get("binarize_on") if kind == "binary" else kind
    if base == "ratings-halfstar":
        return ValueSpec(base, 10, None, binarize)
    if base == "ratings-integer":  # binarized: the scale before it is not recorded
        return ValueSpec(base, MAX_CLASSES if binarize else int(attrs["n_classes"]), None, binarize)
    if base == "counts" and attrs.get("thresholds"):
        thresholds = tuple(float(t) for t in attrs["thresholds"])
        return ValueSpec(base, len(thresholds), thresholds, binarize)
    if base == "raw" and binarize is not None:
        return ValueSpec(base, 1, None, binarize)
    return None


def describe(spec: ValueSpec) -> str:
    """The values ``spec`` takes, and the ingest option that chose it, in a few words."""
    base = {
        "ratings-halfstar": "half-star ratings 0.5, 1.0, ..., 5.0 (ratings='halfstar')",
        "ratings-integer": f"integer ratings 1..{spec.base_classes} (ratings='integer')",
        "counts": f"counts > 0 (counts={list(spec.thresholds or ())})",
        "raw": "raw values",
    }[spec.base]
    return base if spec.binarize is None else f"{base}, binarized at {spec.binarize:g}"


def _classes_hint(bad: float, top: float) -> str:
    """How to say which classes values make, when ``bad`` (a value) is not a positive integer
    and ``top`` is the largest value: half-star ratings when both are on that scale."""
    if 1 <= bad * 2 <= 10 and bad * 2 == round(bad * 2) and top <= 5:
        return (
            "for half-star ratings 0.5 .. 5 pass ratings='halfstar', else counts= or "
            "binarize= to say how to make classes"
        )
    return "pass ratings=, counts= or binarize= to say how to make classes"


def _is_paper(counts: object) -> bool:
    if isinstance(counts, str):
        if counts != "paper":
            raise InputError(f"counts must be 'paper' or a sequence of thresholds, got {counts!r}")
        return True
    return False


def classify(
    spec: ValueSpec, values: np.ndarray, origin: Origin | Named | Taken
) -> tuple[np.ndarray, np.ndarray]:
    """Classes of raw values.

    Parameters
    ----------
    spec : ValueSpec
    values : np.ndarray of float64, shape (n,)
    origin : Origin, Named or Taken
        Used to name the file and line (and the ids) of an invalid value.

    Returns
    -------
    y : np.ndarray of uint8, shape (n,)
        Class 1..V of kept rows (0 for dropped rows).
    keep : np.ndarray of bool, shape (n,)
        False for rows that are "not an interaction" (below the binarization or first count
        threshold).
    """
    if spec.base == "raw":
        keep = values >= spec.binarize
        return keep.astype(np.uint8), keep
    if spec.base == "counts":
        _fail(values <= 0, values, origin, "count {v:g} must be > 0")
        cls = np.searchsorted(np.asarray(spec.thresholds), values, side="left")
    elif spec.base == "ratings-halfstar":
        twice = values * 2
        bad = (twice < 1) | (twice > 10)  # the cast below is exact for the others
        with np.errstate(invalid="ignore"):
            bad |= twice.astype(np.int64) != twice
        _fail(bad, values, origin, "rating {v:g} is off the halfstar scale 0.5, 1.0, ..., 5.0")
        cls = twice.astype(np.uint8)
        del twice
    else:
        top = spec.base_classes
        bad = (values < 1) | (values > top)
        with np.errstate(invalid="ignore"):
            bad |= values.astype(np.int64) != values
        _fail(bad, values, origin, f"rating {{v:g}} is off the integer scale 1..{top}")
        cls = values.astype(np.uint8)
    keep = cls >= 1
    if spec.binarize is not None:
        keep &= cls >= spec.binarize
        cls = keep.astype(np.int64)
    y = np.where(keep, cls, 0).astype(np.uint8)
    return y, keep


def _fail(
    bad: np.ndarray, values: np.ndarray, origin: Origin | Named | Taken, message: str
) -> None:
    idx = np.flatnonzero(bad)
    if idx.size:
        k = int(idx[0])
        raise InputError(f"{origin.where(k)}: " + message.format(v=values[k]))


def warn_whole_stars(spec: ValueSpec, hist: np.ndarray, stacklevel: int) -> None:
    """Warn when half-star ratings (``hist``: class counts, (V + 1,), of every split) are all
    whole stars: integer 1-5 ratings read as half stars leave the odd classes empty and double
    V (``stacklevel`` as for ``warnings.warn``, counted from the caller)."""
    if spec.base != "ratings-halfstar" or spec.binarize is not None:
        return
    if hist[1:].sum() and not hist[1::2].sum():
        warnings.warn(
            "ratings='halfstar': every rating is a whole star (classes 2, 4, ..., 10 only; "
            "the odd classes stay empty); for integer ratings 1..5 pass ratings='integer'",
            UserWarning,
            stacklevel=stacklevel + 1,
        )
