"""The SQUAREM optimizer on the engine's passes (docs/design.md, "Accelerated optimizer").

It decides what the loop submits next: a plain iteration, or every third one in the linear phase
an extrapolated step (:mod:`ordnmf_dask.model.extrapolation`) whose fallback is the state before
it; and, when the step's bound comes back, whether it is kept. Everything it submits runs on the
workers; the client holds only its small state (the cycle's flights, the largest step, where the
linear phase began).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.engine import tasks
from ordnmf_dask.errors import shown
from ordnmf_dask.model import anneal, extrapolation
from ordnmf_dask.runtime.reduce import tree_sum

if TYPE_CHECKING:
    from ordnmf_dask.engine.flight import Flight

log = logging.getLogger(__name__)


class Squarem:
    """SQUAREM's state for one fit of ``runner`` (a :class:`~.cavi.CaviRunner`)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.chain: list[Flight] = []  # the flights submitted since the cycle began
        self.step_max = extrapolation.STEP_MAX0
        self.elbo: list[float] = []  # the fit's bounds so far (the state's own list)
        self.linear_from: int | None = None  # bounds known when the linear phase began
        self.scanned = 0  # bounds looked at for it

    def restart(self, cur: Flight, elbo: list[float]) -> None:
        """A cycle begins at ``cur`` (a start, a checkpoint read back, a refused step's
        fallback); ``elbo`` is the fit's list of bounds, which the loop keeps appending to."""
        self.chain, self.elbo = [cur], elbo

    def at_cycle_start(self) -> bool:
        """Whether the last submitted state begins a cycle: a checkpoint, which holds one
        state, may be taken there without changing the trajectory."""
        return len(self.chain) == 1

    def advance(self, cur: Flight, number: int) -> Flight:
        """Submit the step after ``cur``, iteration ``number`` of the fit: in the linear phase,
        every third step from the last extrapolation, an extrapolated one; else an iteration."""
        runner = self.runner
        if len(self.chain) == 3:  # three states of the linear phase: extrapolate
            if self.step_max > 1.0:
                nxt = runner.extrapolation(*self.chain, self.step_max, number)
                self.chain = [nxt]
                return nxt
            # a step of at most 1 is the plain iteration: take it as a step at the limit
            self.step_max = extrapolation.next_step_max(self.step_max, self.step_max, True)
            self.chain = []
        nxt = runner.iteration(cur, number)
        # before the linear phase every state starts a cycle (and may be checkpointed)
        self.chain = [*self.chain, nxt] if self._linear(number - 2) else [nxt]
        return nxt

    def keep(self, cur: Flight, res: dict[str, Any], state: Any) -> bool:
        """Whether the step ``cur``, whose result is ``res``, is kept: any plain iteration;
        an extrapolated one when its bound is finite and not below the last kept one (else the
        fit goes on from ``cur.fallback``: the ELBO never decreases). The largest step of the
        next cycles follows; ``state`` (the fit's :class:`~.cavi.CaviState`) counts them."""
        if cur.fallback is None:
            return True
        assert cur.step is not None
        step, objective = cur.step.result(), res["objective"]
        kept = bool(np.isfinite(objective)) and objective >= state.objective
        self.step_max = extrapolation.next_step_max(self.step_max, step, kept)
        state.extrapolations[0 if kept else 1] += 1
        log.debug(
            "extrapolated steps %.3g..%.3g %s: bound %s, last kept %s",
            float(np.min(step)),
            float(np.max(step)),
            "kept" if kept else "refused",
            shown(objective),
            shown(state.objective),
        )
        return kept

    def _linear(self, known: int) -> bool:
        """Whether, within its first ``known`` bounds, the fit has entered its linear phase
        (a relative gain below ``extrapolation.LINEAR_GAIN``). Early steps move far and
        nonlinearly, where an extrapolation mostly jumps between basins. ``known`` lags the
        submitted iteration by two, which every submission has gathered whether or not it was
        submitted ahead: the decision does not depend on when results came back."""
        if self.linear_from is None:
            elbo = self.elbo
            first = anneal.exact_from(self.runner.cfg.anneal)  # gains of the model's own bound
            for j in range(max(self.scanned, first), min(known, len(elbo))):
                if (elbo[j] - elbo[j - 1]) / abs(elbo[j - 1]) < extrapolation.LINEAR_GAIN:
                    self.linear_from = j + 1
                    break
                self.scanned = j + 1
        return self.linear_from is not None and self.linear_from <= known

    def extrapolated(
        self, s0: Flight, s1: Flight, s2: Flight, step_max: float, number: int
    ) -> Flight:
        """The graph of one iteration from the extrapolation of three successive states (the
        runner's :meth:`~.cavi.CaviRunner.extrapolation`): the step (at most ``step_max``) from
        norms summed over every chunk on the workers, the extrapolated chunks where their rows
        live, a local pass there with ``s2``'s global parameters, then an iteration."""
        runner = self.runner
        client, submit, home = runner.client, runner.client.submit, runner.chunk_homes
        rows = {
            "w": (list(zip(s0.w, s1.w, s2.w, strict=True)), home["row"]),
            "h": (list(zip(s0.h, s1.h, s2.h, strict=True)), home["col"]),
        }
        norms = [
            submit(tasks.extrapolation_norms, *states, **where)
            for triples, homes in rows.values()
            for states, where in zip(triples, homes, strict=True)
        ]
        step = submit(tasks.extrapolation_step, tree_sum(client, norms), step_max)
        w, h = (
            [
                submit(tasks.extrapolated_chunk, *states, step, **where)
                for states, where in zip(triples, homes, strict=True)
            ]
            for triples, homes in rows.values()
        )
        out = runner.iteration(runner.start_flight(w, h, s2.params), number)
        out.step = step
        return out
