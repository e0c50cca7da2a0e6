"""The pure parts of hyper-parameter tuning: the search space, its sampling, and the schedule of
successive halving (docs/design.md, "Tuning"). No Dask, no I/O: :mod:`ordnmf_dask.tuning.search`
runs the fits.

A space maps an estimator parameter (``n_components``, ``alpha_W``, ``alpha_H``) to a list of
values (a grid axis, or a uniform choice when sampling) or to a :class:`LogUniform` range
(sampling only). Successive halving runs every trial for the first rung's number of iterations,
keeps the best ``1 / eta`` of them by the validation metric, continues those to the next rung's
budget, and so on up to ``max_iter``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ordnmf_dask.errors import InputError, UsageError, shown
from ordnmf_dask.params import PARAMS, problem

#: the parameters a space may search
SEARCHED = ("n_components", "alpha_W", "alpha_H")


@dataclass(frozen=True)
class LogUniform:
    """Values drawn log-uniformly in [low, high] (rounded to the nearest integer for
    ``n_components``).

    Examples
    --------
    >>> from ordnmf_dask import LogUniform
    >>> space = {"alpha_W": LogUniform(0.05, 2.0), "n_components": LogUniform(5, 100)}  # for tune
    """

    low: float
    high: float


Space = Mapping[str, Sequence[Any] | LogUniform]


def check_space(space: Space) -> None:
    """InputError naming the first parameter of ``space`` that is not searchable or whose values
    break its rule (:func:`ordnmf_dask.params.problem`)."""
    if not space:
        raise InputError(f"the search space is empty: give values for some of {SEARCHED}")
    for name, values in space.items():
        if name not in SEARCHED:
            raise InputError(f"cannot search {name!r}: the space takes {', '.join(SEARCHED)}")
        if isinstance(values, LogUniform):
            wrong = next(
                (w for w in map(lambda v: problem(name, v), [values.low, values.high]) if w), None
            )
            if wrong is None and not values.low <= values.high:
                wrong = f"must be a range low <= high, got {values.low}:{values.high}"
        elif isinstance(values, str) or not isinstance(values, Sequence) or not values:
            wrong = f"must be a non-empty list of values or a LogUniform range, got {values!r}"
        else:
            wrong = next((w for w in map(lambda v: problem(name, v), values) if w), None)
        if wrong is not None:
            raise InputError(f"search space {name} {wrong}")


def parse_values(name: str, text: str, flag: str) -> list[Any] | LogUniform:
    """A space entry from its command-line spelling after ``flag``: values joined by commas
    (``10,20,50``) or a range ``LOW:HIGH`` (sampled log-uniformly); UsageError if neither."""
    cast = int if PARAMS[name].kind == "int" else float
    try:
        if ":" in text:
            low, high = text.split(":")
            return LogUniform(cast(low), cast(high))
        values = [cast(t) for t in text.split(",") if t.strip()]
    except ValueError:
        values = []
    if not values:
        kind = "integers" if cast is int else "numbers"
        raise UsageError(f"{flag} takes {kind} joined by commas or a range LOW:HIGH, got {text!r}")
    return values


def grid(space: Space) -> list[dict[str, Any]]:
    """Every combination of the listed values, the first parameter varying slowest."""
    check_space(space)
    ranges = [name for name, values in space.items() if isinstance(values, LogUniform)]
    if ranges:
        raise InputError(
            f"a grid takes lists of values; {ranges[0]} is a range (give "
            "n_trials to sample the space instead)"
        )
    names = list(space)
    return [
        dict(zip(names, combo, strict=True))
        for combo in itertools.product(*(cast(Sequence[Any], space[n]) for n in names))
    ]


def sample(space: Space, n_trials: int, seed: int) -> list[dict[str, Any]]:
    """``n_trials`` independent draws from ``space`` with the stream of ``seed``: a listed
    value uniformly, a range log-uniformly (the same draws for the same space and seed)."""
    check_space(space)
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise InputError(f"n_trials must be an integer >= 1, got {shown(n_trials)}")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, n_trials])))
    trials = []
    for _ in range(n_trials):
        trial = {}
        for name, values in space.items():
            if isinstance(values, LogUniform):
                value = math.exp(rng.uniform(math.log(values.low), math.log(values.high)))
                trial[name] = round(value) if name == "n_components" else value
            else:
                trial[name] = values[int(rng.integers(len(values)))]
        trials.append(trial)
    return trials


def rungs(min_budget: int, max_iter: int, eta: int) -> list[int]:
    """Iteration budgets of the rungs: ``max_iter // eta**j`` for j = n, ..., 1, 0, with n the
    largest such that ``min_budget * eta**n <= max_iter`` (one rung when min_budget =
    max_iter)."""
    for name, value, low in (
        ("min_budget", min_budget, 1),
        ("max_iter", max_iter, 1),
        ("eta", eta, 2),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"{name} must be an integer >= {low}, got {shown(value)}")
    if min_budget > max_iter:
        raise InputError(f"min_budget must be <= max_iter, got {min_budget} > {max_iter}")
    n = 0
    while min_budget * eta ** (n + 1) <= max_iter:
        n += 1
    return [max_iter // eta**j for j in range(n, -1, -1)]


def n_kept(n: int, eta: int) -> int:
    """How many of ``n`` trials go on to the next rung: the best ``n // eta``, at least one."""
    return max(1, n // eta)


def ranked(scores: Mapping[int, float]) -> list[int]:
    """Trial numbers best first: higher score first, a missing (NaN) score last, ties by the
    lower trial number."""

    def key(trial: int) -> tuple[bool, float, int]:
        score = scores[trial]
        missing = score is None or math.isnan(score)
        return missing, 0.0 if missing else -score, trial

    return sorted(scores, key=key)
