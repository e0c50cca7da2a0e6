"""One step of a fit in flight: the futures of its state, as the loop and the optimizer see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Future

PARTS = ("w", "h", "sw", "sh", "params", "small", "w_sum", "h_sum")  # what the next step reads


@dataclass
class Flight:
    """Futures of one iteration's state (or values, for what was restored from a checkpoint).

    w, h : factor chunks; sw, sh : shape statistics of the local step (lazy sums); params :
    global parameters used by this iteration's updates and local step; small, w_sum, h_sum :
    summed O(K + V) statistics; result : ``tasks.iteration_result`` (None before the first
    iteration). A step run as one task (``whole``: the future of the dict of those parts, on
    the worker, as in-process futures: ``cavi.run_step``) has its parts as Dask futures only
    once :meth:`.cavi.CaviRunner.parts` has picked them (None until then).
    """

    w: list[Any] | None
    h: list[Any] | None
    sw: list[Any] | None
    sh: list[Any] | None
    params: Any
    small: Any
    w_sum: Any
    h_sum: Any
    result: Future | None
    fallback: Flight | None = None  # an extrapolated step's: kept if its bound is lower
    step: Future | None = None  # an extrapolated step's (K,) steps, one per component
    passes: int = 0  # full passes over the blocks this step costs
    whole: Future | None = None  # a step run as one task: the dict of its parts' values


def chunks_of(st: Flight) -> Flight:
    """What a fit's state keeps of the step ``st``: its chunks (or the task holding them), not
    its sums and shape statistics, which workers would otherwise hold an iteration longer."""
    return Flight(st.w, st.h, None, None, None, None, None, None, None, whole=st.whole)
