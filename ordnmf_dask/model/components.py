"""Which components a fitted model uses: pure functions on the posterior shapes.

A component the prior switched off carries no latent counts: its posterior shape is its prior
shape for every user, ``a^W_uk = alpha_W`` (so E[w_uk] is the user's prior-driven mean and its
column repeats that of every other switched-off component). ``a^W_uk - alpha_W = sum_i
E[c_uik]`` is the user's expected count on k, so a component is *active* when some user puts a
share of at least :data:`ACTIVE_SHARE` of its expected counts on it (docs/design.md, "Class
probabilities").
"""

from __future__ import annotations

import numpy as np

ACTIVE_SHARE = 0.01


def max_count_share(shape: np.ndarray, alpha: float) -> np.ndarray:
    """(K,) the largest share, over the rows (users) of ``shape`` (n, K), of a row's expected
    latent counts ``shape - alpha`` that falls on each component (0 for an empty chunk)."""
    counts = np.maximum(np.asarray(shape, dtype=np.float64) - alpha, 0.0)
    total = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)
    return share.max(axis=0, initial=0.0)
