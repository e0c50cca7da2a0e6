"""What the CAVI loop (:meth:`.cavi.CaviRunner.run`) asks after each iteration, one component a
question: whether to take a checkpoint now (:class:`CheckpointPolicy`), whether the bound is
sound and the fit has converged (:class:`StopRule`), and what validation says and keeps
(:class:`EarlyStopping`). Each holds its own small state on the client and submits nothing; the
loop does the submitting, so that the tasks and their order are the loop's alone."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ordnmf_dask.engine.flight import Flight, chunks_of
from ordnmf_dask.errors import ELBODecreaseError, shown
from ordnmf_dask.model import anneal

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Future

ROUNDOFF = 1e-10  # relative ELBO decrease tolerated as floating-point round-off


def mean_gain(elbo: list[float], window: int) -> float:
    """The relative ELBO gain per iteration over the last ``window`` iterations (fewer at the
    start; inf after the first): the stopping rule compares it with tol."""
    if len(elbo) < 2:
        return math.inf
    back = min(window, len(elbo) - 1)
    return (elbo[-1] - elbo[-1 - back]) / (back * abs(elbo[-1 - back]))


def early_stopping(scores: list[float], patience: int, window: int = 1) -> tuple[int, bool]:
    """The early-stopping rule on the validation scores so far (higher is better): the index of
    the evaluation whose state is kept, and whether the fit stops now.

    Each score is smoothed as the mean of the last ``window`` scores up to it (fewer at the
    start), so that the rule follows the metric's trend rather than one evaluation's noise; the
    kept evaluation is the first with the highest smoothed score, the newest state of the best
    stretch. The fit stops once ``patience`` evaluations have followed it (0: never early).
    """
    kept, best = 0, -math.inf
    for j in range(len(scores)):
        smoothed = math.fsum(scores[max(0, j - window + 1) : j + 1]) / min(window, j + 1)
        if smoothed > best:
            kept, best = j, smoothed
    return kept, bool(patience) and len(scores) - 1 - kept >= patience


@dataclass
class CheckpointPolicy:
    """When a running fit takes a checkpoint: every ``every`` iterations (0: never by count) or
    once ``minutes`` have passed since the last one (None: never by time), never after the last
    iteration (the result is saved then), and only where a checkpoint's one state can restart
    the optimizer's cycle: one due elsewhere is owed to the next such iteration, so the
    trajectory does not depend on when checkpoints are taken, nor on whether they are."""

    every: int
    minutes: float | None
    owed: bool = False
    since: float = field(default_factory=time.monotonic)

    def take(self, n_done: int, last: bool, cycle_start: bool) -> bool:
        """Whether to checkpoint the state after iteration ``n_done``, submitted now."""
        due = bool(self.every) and n_done % self.every == 0
        late = self.minutes is not None and time.monotonic() - self.since >= 60 * self.minutes
        take = (due or late or self.owed) and not last and cycle_start
        self.owed = (due or self.owed) and not take
        return take

    def dropped(self) -> None:
        """The checkpoint being taken was of a step the optimizer refused: owed again."""
        self.owed = True

    def taken(self) -> None:
        """A checkpoint was completed now (the clock of ``minutes`` restarts)."""
        self.since = time.monotonic()


@dataclass
class StopRule:
    """The bound's checks and the stopping rule: an ascended bound that is not finite, or that
    decreases (beyond round-off) once the annealing schedule is over, fails the fit; the fit has
    converged when the mean relative gain over ``window`` iterations is below tol, after
    ``min_iter`` iterations and with the whole window at the model's own shapes."""

    tol: float
    min_iter: int
    anneal: int
    window: int

    def record(self, state: Any, n: int, elbo: float, objective: float) -> Exception | None:
        """Append iteration ``n``'s bounds to ``state`` (a :class:`~.cavi.CaviState`); the
        failure they show, if any, to be raised once the callback has seen the iteration."""
        state.elbo.append(elbo)
        failure: Exception | None = None
        if not math.isfinite(objective):
            failure = FloatingPointError(f"ELBO is {elbo} at iteration {n}")
        elif n > anneal.exact_from(self.anneal) and objective < state.objective - ROUNDOFF * abs(
            state.objective
        ):
            failure = ELBODecreaseError(
                f"ELBO decreased at iteration {n}: {shown(state.objective)} -> {shown(objective)}"
            )
        state.objective = objective
        return failure

    def converged(self, elbo: list[float], n: int) -> bool:
        """Whether the fit has converged after iteration ``n``, its bounds so far ``elbo``."""
        return (
            mean_gain(elbo, self.window) < self.tol and n - 1 >= self.min_iter and self.settled(n)
        )

    def settled(self, n_done: int) -> bool:
        """Whether the rule may read the bounds after ``n_done`` iterations: all of its window's
        at the model's own shapes (always without annealing)."""
        return self.anneal == 0 or n_done - self.window >= anneal.exact_from(self.anneal)


@dataclass(frozen=True)
class Validation:
    """Validation during a fit: ``score(w, h, params)`` gives the figures of a state (its
    factor-chunk futures and global parameters) as a dict whose float ``metric`` is higher when
    better. Evaluated every ``every`` iterations and at the last one; :func:`early_stopping`
    with ``patience`` and ``window`` says when to stop early and which evaluated state is the
    fit's result, whatever stopped it."""

    score: Callable[[list[Future], list[Future], Any], dict[str, Any]]
    every: int
    patience: int
    window: int = 1


@dataclass
class EarlyStopping:
    """Validation's state during one fit: the figures so far and the state the rule keeps
    (``best``: its iteration, chunks and global parameters). States of the annealing schedule
    (``anneal`` iterations) are not of the model and are not scored."""

    validation: Validation
    anneal: int
    best: tuple[int, Flight, Any] | None = None

    def due(self, n_done: int, final: bool) -> bool:
        """Whether the state after iteration ``n_done`` is scored (``final``: it ends the fit)."""
        return n_done > self.anneal and (n_done % self.validation.every == 0 or final)

    def score(self, n_done: int, scored: Flight, state: Any) -> tuple[dict[str, Any], bool]:
        """Score the state after iteration ``n_done`` (``scored``: its chunks as futures, its
        global parameters ``state.params``), its figures appended to ``state.validation`` (of a
        :class:`~.cavi.CaviState`); returns them and whether the fit stops early."""
        start, params, history = time.perf_counter(), state.params, state.validation
        assert scored.w is not None and scored.h is not None
        figures = {"iteration": n_done, **self.validation.score(scored.w, scored.h, params)}
        figures["seconds"] = time.perf_counter() - start
        history.append(figures)
        v = self.validation
        kept, early = early_stopping([f["metric"] for f in history], v.patience, v.window)
        if kept == len(history) - 1:
            self.best = (n_done, chunks_of(scored), params)
        return figures, early
