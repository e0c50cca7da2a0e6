"""Probe: hierarchical per-row prior rates (HPF's activity and popularity scales, Gopalan et al.
2015) in place of the fit's empirical-Bayes point rate ``alpha / mean_k E[x_k]``.

Each row's rate xi ~ Gamma(a2, c) gets its own Gamma factor q(xi) = Gamma(a2 + K alpha,
c + sum_k E[x_k]), updated in closed form before the row's factors (a coordinate step of CAVI);
the factors then see E[xi] as their prior rate and alpha E[log xi] in the bound, which also gains
each row's E[log p(xi)] - E[log q(xi)]. ``c = a2 / mean`` of the chunk's empirical-Bayes rates
(the hyperprior centred on the chunk's typical scale; a2 sets how strongly a row's scale is pulled
toward it: a2 -> 0 is the package's point rate). Applied to both sides (users' activity and
items' popularity), in this process only: :func:`patched` swaps the fit's Gamma update for the
duration of a ``with`` block (bench/optimum.py ``--hier A2``). Not wired into the package.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from scipy.special import digamma, gammaln

from ordnmf_dask.model import updates


def hierarchical_update(a2: float):  # noqa: ANN201
    """A drop-in for ``gamma_update`` with the hierarchical row rate of hyper-shape ``a2``."""

    def update(alpha, old_mean, shape_stat, rate_base, correction, mean, geo, shape):  # noqa: ANN001, ANN202
        n, k = shape_stat.shape
        row_mean = old_mean.mean(axis=1, keepdims=True)
        c = a2 / float(np.mean(alpha / row_mean))  # the hyperprior's rate: mean E[xi] = EB's
        s_xi = a2 + k * alpha
        r_xi = c + old_mean.sum(axis=1, keepdims=True)
        e_xi, elog_xi = s_xi / r_xi, digamma(s_xi) - np.log(r_xi)
        a = alpha + shape_stat
        b = e_xi + rate_base[None, :]
        if correction.shape[0] == n and n > 0:
            b = b - correction
        mean[:] = a / b
        shape[:] = a
        geo[:] = np.exp(digamma(a)) / b
        term = (alpha - a) * digamma(a) - alpha * np.log(b) - e_xi * mean
        term += alpha * elog_xi - gammaln(alpha) + a + gammaln(a)
        xi = a2 * np.log(c) - gammaln(a2) + (a2 - 1) * elog_xi - c * e_xi
        xi -= s_xi * np.log(r_xi) - gammaln(s_xi) + (s_xi - 1) * elog_xi - s_xi
        return e_xi, float(term.sum() + xi.sum())

    return update


@contextmanager
def patched(a2: float | None) -> Iterator[None]:
    """The fit's Gamma update replaced by :func:`hierarchical_update` (None: unchanged)."""
    if a2 is None:
        yield
        return
    original = updates.gamma_update
    updates.gamma_update = hierarchical_update(a2)
    try:
        yield
    finally:
        updates.gamma_update = original
