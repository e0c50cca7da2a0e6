"""Fold-in: the factors of NEW users from their interactions, with H and the thresholds fixed.

Coordinate ascent on q(w_u) alone, i.e. the W half of one CAVI iteration (docs/design.md §2)
repeated with q(H), Delta (or dcPF's p, t) frozen at their fitted values:

1. ``beta_u = alpha_W / mean_k E[w_uk]``                      (empirical-Bayes prior rate)
2. ``a^W = alpha_W + SW``; ``b^W_uk = beta_u + theta_0 colsum_k(E[H]) - sum_i G_{y_ui} E[h_ik]``
   (dcPF: ``b^W = beta_u + t colsum(E[H])``, no sparse correction)
3. local step with ``GW = exp(E[log w_u])`` and the fitted ``GH = exp(E[log H])`` -> next SW.

Initialization (chosen here, documented): ``E[w_uk] = 1`` for every new user and k (or Gamma(1, 1)
draws with a seed, as the fit does), used directly as the geometric mean in a first local step,
exactly as the fit uses its initial draws. Each user stops on its own when the relative change
``sum_k |E[w_uk]^new - E[w_uk]^old| / sum_k E[w_uk]^old`` falls below ``tol`` (its rows are then
frozen), so a user's result does not depend on the other users folded in with it.

New items are folded in by the same function on the transposed interactions (rows: the new
items; columns: the users they touched; fixed side: E[W], E[log W]; prior alpha_H): the H update
is the W update with the roles of the two sides swapped.

Only K column sums of E[H] and the rows of E[H], E[log H] of the touched items are needed.
Pure numpy / scipy; the orchestration (which rows to read, where) is in
:mod:`ordnmf_dask.postfit.foldin`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ordnmf_dask.model import dcpf, kernels
from ordnmf_dask.model.gamma import gamma_moments
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.model.sizes import held_bytes
from ordnmf_dask.model.thresholds import gap_from_delta, theta_from_delta
from ordnmf_dask.model.updates import empirical_bayes_rate


@dataclass(frozen=True)
class Likelihood:
    """The frozen observation model of a fitted model.

    family : "ordinal" (OrdNMF, BePoF, PF) or "dcpf".
    delta : (V + 1,) threshold decrements (ordinal); approx : q(n) = delta_1 (PF).
    p, t : dcPF's element parameter and rate scale.
    """

    family: str
    delta: np.ndarray | None = None
    approx: bool = False
    p: float = 0.5
    t: float = 1.0

    @property
    def ordinal_delta(self) -> np.ndarray:
        """``delta`` of an ordinal model (which always has one)."""
        if self.delta is None:
            raise ValueError(f"a {self.family!r} likelihood has no delta")
        return self.delta

    def rate_scale(self) -> float:
        """theta_0 (ordinal) or t (dcPF): the factor of colsum(E[H]) in b^W."""
        if self.family == "ordinal":
            return float(theta_from_delta(self.ordinal_delta)[0])
        return float(self.t)

    def shape_stat(self, block: CsrBlock, gw: np.ndarray, gh: np.ndarray) -> np.ndarray:
        """SW = GW * (R @ GH), shape (n_rows, K), from the family's local step."""
        if self.family == "ordinal":
            return kernels.local_step(block, gw, gh, gw, gh, self.ordinal_delta, self.approx).sw
        return dcpf.local_step(block, gw, gh, gw, gh, self.p, self.t).sw

    def correction(self, block: CsrBlock, eh: np.ndarray) -> np.ndarray | None:
        """sum_i G_{y_ui} E[h_i], shape (n_rows, K) (ordinal), None for dcPF."""
        if self.family == "ordinal":
            return kernels.row_correction(block, gap_from_delta(self.ordinal_delta), eh)
        return None


@dataclass(frozen=True)
class FoldIn:
    """q(w) of the folded-in users.

    mean, log_mean, shape, rate : (n_new, K); prior_rate : (n_new, 1);
    n_iter : (n_new,) W updates done per user; converged : (n_new,) bool.
    """

    __sizeof__ = held_bytes  # what Dask counts for memory and transfers

    mean: np.ndarray
    log_mean: np.ndarray
    shape: np.ndarray
    rate: np.ndarray
    prior_rate: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray


def initial_mean(n_new: int, k: int, seed: int | None) -> np.ndarray:
    """E[w] at the start: ones, or Gamma(1, 1) draws from ``SeedSequence([seed, j])`` for user j."""
    if seed is None:
        return np.ones((n_new, k))
    rows = [
        np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, j]))).gamma(1.0, 1.0, k)
        for j in range(n_new)
    ]
    return np.array(rows).reshape(n_new, k)


def fold_in_rows(
    block: CsrBlock,
    eh: np.ndarray,
    log_eh: np.ndarray,
    colsum_h: np.ndarray,
    alpha: float,
    likelihood: Likelihood,
    *,
    max_iter: int = 500,
    tol: float = 1e-6,
    seed: int | None = None,
    init: np.ndarray | None = None,
) -> FoldIn:
    """CAVI on q(w) of new users with q(H) and the thresholds fixed (see the module docstring).

    Parameters
    ----------
    block : the new users' interactions, (n_new, m) CSR over the m touched items; ``y`` holds the
        classes 1..V of the model (ordinal) or the counts (dcPF).
    eh, log_eh : (m, K) E[h_i], E[log h_i] of the touched items.
    colsum_h : (K,) sum over ALL items of E[h_i].
    alpha : alpha_W.
    seed : see :func:`initial_mean`; init : (n_new, K) starting E[w] instead (if given).

    Returns
    -------
    FoldIn with (n_new, K) factors.
    """
    n_new, k = block.shape[0], eh.shape[1]
    gh = np.exp(log_eh)
    base = likelihood.rate_scale() * colsum_h
    corr = likelihood.correction(block, eh)
    rate_nz = base if corr is None else base - corr  # (n_new, K) or (K,)
    rate_nz = np.broadcast_to(rate_nz, (n_new, k))
    mean = initial_mean(n_new, k, seed) if init is None else np.array(init, float)
    log_mean = np.log(mean)
    shape = np.full((n_new, k), alpha)
    rate = np.full((n_new, k), np.nan)
    beta = np.full((n_new, 1), np.nan)
    n_iter = np.zeros(n_new, dtype=np.int64)
    active = np.arange(n_new)
    sw = likelihood.shape_stat(block, mean, gh)  # first local step: the initial E[w] as GW
    for _ in range(max_iter):
        if active.size == 0:
            break
        sub = block.take_rows(active) if active.size < n_new else block
        old = mean[active]
        b = empirical_bayes_rate(alpha, old)
        a_new = alpha + sw
        r_new = b + rate_nz[active]
        m_new, lm_new = gamma_moments(a_new, r_new)
        mean[active], log_mean[active] = m_new, lm_new
        shape[active], rate[active], beta[active] = a_new, r_new, b
        n_iter[active] += 1
        change = np.abs(m_new - old).sum(axis=1) / old.sum(axis=1)
        keep = change >= tol
        active, sub_keep = active[keep], np.flatnonzero(keep)
        if active.size:
            sub = sub.take_rows(sub_keep) if sub_keep.size < sub.shape[0] else sub
            sw = likelihood.shape_stat(sub, np.exp(lm_new[sub_keep]), gh)
    converged = np.ones(n_new, dtype=bool)
    converged[active] = False
    return FoldIn(mean, log_mean, shape, rate, beta, n_iter, converged)
