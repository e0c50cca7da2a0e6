"""SQUAREM extrapolation of the variational state (Varadhan & Roland 2008, scheme S3).

One CAVI iteration is a map F on the state u = (log E[x], log exp(E[log x])) of every factor
row (all the next iteration reads of W and H). From u0, u1 = F(u0), u2 = F(u1), with
r = u1 - u0 and v = u2 - 2 u1 + u0, the extrapolated state is u0 + 2 a r + a^2 v with the step
a = sqrt(|r|^2 / |v|^2) clipped to [1, step_max] (a = 1 gives u2 itself). A fixed point of F
is one of the extrapolation; the engine keeps the extrapolated step only when the bound after
F of it is not below the bound at u2 (docs/design.md, "Accelerated optimizer").
"""

from __future__ import annotations

import math

import numpy as np

STEP_MAX0 = 1.0  # the first cycles' largest step
STEP_FACTOR = 4.0  # the largest step grows by this when taken, and shrinks by it when refused
LINEAR_GAIN = 1e-3  # extrapolate once a relative ELBO gain per iteration has fallen below this


def squared_norms(u0: np.ndarray, u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """``[|r|^2, |v|^2]`` of one part of the state (float64, summed in a fixed order)."""
    r = u1 - u0
    v = u2 - u1 - r
    return np.array([float(np.sum(r * r)), float(np.sum(v * v))])


def step_length(norms: np.ndarray, step_max: float) -> float:
    """The step a of scheme S3 from the summed ``[|r|^2, |v|^2]``, clipped to [1, step_max]
    (1 when v vanishes: the state has stopped moving along a curve)."""
    rr, vv = float(norms[0]), float(norms[1])
    if not (vv > 0.0 and math.isfinite(rr) and math.isfinite(vv)):
        return 1.0
    return min(max(math.sqrt(rr / vv), 1.0), step_max)


def extrapolate(u0: np.ndarray, u1: np.ndarray, u2: np.ndarray, step: float) -> np.ndarray:
    """``u0 + 2 a r + a^2 v`` (exactly ``u2`` at a = 1 up to round-off)."""
    r = u1 - u0
    v = u2 - u1 - r
    return u0 + (2.0 * step) * r + (step * step) * v


def next_step_max(step_max: float, step: float, accepted: bool) -> float:
    """The largest step of the next cycle: grown after a step at the limit was kept, shrunk
    (not below 1) after one at the limit was refused, else unchanged."""
    if step != step_max:
        return step_max
    return step_max * STEP_FACTOR if accepted else max(1.0, step_max / STEP_FACTOR)
