"""The annealing schedule of the prior shapes (docs/design.md, "Better optima").

Over the first ``n`` iterations of a fit the Gamma prior shapes are ``alpha * scale(m)``, a
geometric fall from ``START`` x alpha at iteration 1 to alpha at iteration ``n + 1``, and alpha
from there on. Large shapes pull every factor towards its row's mean (the empirical-Bayes prior
mean), so the first iterations cannot commit components to the random start's accidents; the
schedule is a function of the iteration number only, so a resumed fit follows it exactly.
"""

from __future__ import annotations

START = 10.0  # the shapes of the first iteration, as a multiple of alpha


def scale(iteration: int, n: int) -> float:
    """The multiple of alpha used by iteration ``iteration`` (1-based) of a fit annealed over
    ``n`` iterations: ``START ** (1 - (iteration - 1) / n)`` up to iteration n, then exactly 1."""
    if iteration > n:
        return 1.0
    return float(START ** (1.0 - (iteration - 1) / n))


def exact_from(n: int) -> int:
    """The first iteration whose bound is the model's own and may be compared with the next
    one (the first at the final shapes): bounds from there on never decrease."""
    return n + 1
