"""SQUAREM extrapolation of the variational state (Varadhan & Roland 2008, scheme S3), with a
step per component.

One CAVI iteration is a map F on the state u = (log E[x], log exp(E[log x])) of every factor
row (all the next iteration reads of W and H). From u0, u1 = F(u0), u2 = F(u1), with
r = u1 - u0 and v = u2 - 2 u1 + u0, the extrapolated state is u0 + 2 a r + a^2 v. The step
a_k = sqrt(|r_k|^2 / |v_k|^2), clipped to [1, step_max], is taken per component k from the
norms of column k of W and H together: the components converge at different rates, and one
scalar step would follow the fastest (a = 1 gives u2 itself). A fixed point of F is one of the
extrapolation; the engine keeps the extrapolated step only when the bound after F of it is not
below the bound at u2 (docs/design.md, "Accelerated optimizer").
"""

from __future__ import annotations

import numpy as np

STEP_MAX0 = 1.0  # the first cycles' largest step
STEP_FACTOR = 4.0  # the largest step grows by this when taken, and shrinks by it when refused
LINEAR_GAIN = 1e-3  # extrapolate once a relative ELBO gain per iteration has fallen below this


def squared_norms(u0: np.ndarray, u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """(2, K) ``[|r_k|^2, |v_k|^2]`` of one (n, K) part of the state, per column (float64,
    summed in a fixed order)."""
    r = u1 - u0
    v = u2 - u1 - r
    return np.stack([np.sum(r * r, axis=0), np.sum(v * v, axis=0)])


def step_length(norms: np.ndarray, step_max: float) -> np.ndarray:
    """(K,) steps a_k of scheme S3 from the summed (2, K) ``[|r_k|^2, |v_k|^2]``, clipped to
    [1, step_max] (1 where v_k vanishes: that component has stopped moving along a curve)."""
    rr, vv = np.asarray(norms[0], dtype=np.float64), np.asarray(norms[1], dtype=np.float64)
    moving = (vv > 0.0) & np.isfinite(rr) & np.isfinite(vv)
    ratio = np.divide(rr, vv, out=np.ones_like(rr), where=moving)
    return np.where(moving, np.clip(np.sqrt(ratio), 1.0, step_max), 1.0)


def extrapolate(
    u0: np.ndarray, u1: np.ndarray, u2: np.ndarray, step: np.ndarray | float
) -> np.ndarray:
    """``u0 + 2 a r + a^2 v``, a per column (exactly ``u2`` at a = 1 up to round-off)."""
    r = u1 - u0
    v = u2 - u1 - r
    return u0 + (2.0 * step) * r + (step * step) * v


def next_step_max(step_max: float, step: np.ndarray | float, accepted: bool) -> float:
    """The largest step of the next cycle: grown after a step with a component at the limit
    was kept, shrunk (not below 1) after one was refused, else unchanged."""
    if not np.any(np.asarray(step) == step_max):
        return step_max
    return step_max * STEP_FACTOR if accepted else max(1.0, step_max / STEP_FACTOR)
