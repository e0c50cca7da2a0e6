"""An ensemble's factors: its members' posteriors side by side (docs/design.md, "Ensembles").

The mean of M members' rates ``(1/M) sum_m w_m . h_m`` is the rate of one factorization whose
rows hold the members' K columns side by side, with E[w] divided by M: every reader of a rate
(ranking, top-n, pair scores, exports, the ranking metrics) reads the ensemble as it reads one
fit. Under q, ``w / M`` is Gamma with the same shape and M times the rate, so the chunk stays a
posterior of its own: E[w] and exp(E[log w]) divided by M, the prior rate multiplied by M.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ordnmf_dask.model.foldin_rows import FoldIn, Likelihood, fold_in_rows
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.model.updates import FactorChunk


def stack_members(chunks: Sequence[FactorChunk], divisor: float) -> FactorChunk:
    """One chunk of the members' ``chunks`` side by side, each q(x) that of ``x / divisor``
    (M for W, 1 for H); its ELBO term is the members' sum."""
    shapes = [c.shape for c in chunks if c.shape is not None]
    priors = [c.prior_rate for c in chunks if c.prior_rate is not None]
    return FactorChunk(
        mean=np.concatenate([c.mean for c in chunks], axis=1) / divisor,
        geo=np.concatenate([c.geo for c in chunks], axis=1) / divisor,
        shape=np.concatenate(shapes, axis=1) if len(shapes) == len(chunks) else None,
        prior_rate=np.concatenate(priors, axis=1) * divisor if len(priors) == len(chunks) else None,
        elbo=float(sum(c.elbo for c in chunks)),
    )


def member_columns(k: int, m: int) -> slice:
    """The columns of member ``m`` in a chunk of members of ``k`` components each."""
    return slice(m * k, (m + 1) * k)


def member_view(
    mean: np.ndarray, var: np.ndarray | None, k: int, m: int, n_members: int, scaled: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Member ``m``'s E[x] and Var[x] from an ensemble's factor arrays (rows, M K): its
    columns, with ``scaled`` (W) multiplied back by M."""
    cols = member_columns(k, m)
    f = float(n_members) if scaled else 1.0
    mean_m = mean[:, cols] * f
    return mean_m, None if var is None else var[:, cols] * (f * f)


def fold_in_members(
    block: CsrBlock,
    mean: np.ndarray,
    log_mean: np.ndarray,
    colsum: np.ndarray,
    alpha: float,
    likelihoods: Sequence[Likelihood],
    k: int,
    other_scaled: bool,
    **options: Any,
) -> FoldIn:
    """Fold-in of new rows against an ensemble's other side (``mean``, ``log_mean`` of the
    touched rows and ``colsum`` of all its rows, M K columns): each member's own rows against
    its columns (multiplied back by M where ``other_scaled``: new items against W) with its
    own thresholds, side by side as the ensemble holds them (new users' E[w] divided by M).
    One member is :func:`fold_in_rows` itself."""
    n = len(likelihoods)
    if n == 1:
        return fold_in_rows(block, mean, log_mean, colsum, alpha, likelihoods[0], **options)
    f = float(n) if other_scaled else 1.0
    shift = np.log(f)
    parts = []
    for m, likelihood in enumerate(likelihoods):
        cols = member_columns(k, m)
        parts.append(
            fold_in_rows(
                block,
                mean[:, cols] * f,
                log_mean[:, cols] + shift,
                colsum[cols] * f,
                alpha,
                likelihood,
                **options,
            )
        )
    div = 1.0 if other_scaled else float(n)  # the new rows: W divided by M, H as it is
    side = lambda name: np.concatenate([getattr(p, name) for p in parts], axis=1)  # noqa: E731
    return FoldIn(
        mean=side("mean") / div,
        log_mean=side("log_mean") - np.log(div),
        shape=side("shape"),
        rate=side("rate") * div,
        prior_rate=side("prior_rate") * div,
        n_iter=np.max([p.n_iter for p in parts], axis=0),
        converged=np.all([p.converged for p in parts], axis=0),
    )
