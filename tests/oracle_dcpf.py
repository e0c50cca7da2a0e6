"""Dense numpy reference ("oracle") of dcPF with the logarithmic element distribution.

Written from docs/design.md §5 and the published variant of the algorithm (Gouvert, Oberlin &
Fevotte, UAI 2019; Basbug & Engelhardt 2016), independently of ``ordnmf_dask``.  Everything is
dense and deliberately naive, like ``tests/oracle.py`` (whose Gamma prior/posterior ELBO term it
reuses):

* ``Y`` is a full ``(U, I)`` array of counts; 0 means "no interaction" and only enters the
  Poisson rate term (sums over ALL (u, i));
* every "sum over the nonzeros" is a masked sum over the full matrix (``mask = Y > 0``).

Model: y_ui = sum of n_ui i.i.d. Log(p) elements, n_ui ~ Poisson(t lambda_ui), lambda = W H^T,
so y_ui ~ NB(r = t lambda_ui / -log(1 - p), success probability 1 - p).

Local step (nonzeros only), with the geometric means GW = exp(E[log W]), GH = exp(E[log H])::

    Lambda = GW GH^T,  s = t Lambda
    p == 0:      E[n] = y,  local = -sum log(y!) + sum y log s          (PF on the raw counts)
    p == 1:      E[n] = 1,  local = sum log s                          (PF on binarized data)
    0 < p < 1:   r = s / -log(1 - p);  E[n] = r (digamma(y + r) - digamma(r)),
                 local = -sum log(y!) + (sum y) log p + sum [lgamma(y+r) - lgamma(r)];
                 for integer y both differences are finite sums, used here as they stand:
                 digamma(y + r) - digamma(r) = sum_{j<y} 1 / (r + j) and
                 lgamma(y + r) - lgamma(r) = sum_{j<y} log(r + j) (exact at any r, where
                 subtracting lgamma values loses every digit once r ~ 1 / p is large)
    SW_uk = sum_i E[n_ui] / Lambda_ui GW_uk GH_ik,   SH_ik = sum_u (same)

One iteration: (1) beta_u = alpha_W / mean_k E[w_uk], beta_i = alpha_H / mean_k E[h_ik];
(2) p: 10 Newton steps on ``s_y log p - s_en log(-log(1 - p))`` (``update_p``; p = 0 when
s_en >= s_y, where that objective rises all the way to p -> 0);
(3) W: a = alpha_W + SW, b = beta_u + t sum_i E[h_ik] (dense sum over ALL items, no sparse
correction); (4) H likewise with the NEW E[W]; (5) local step; (6) ELBO =
local - t sum_all E[W] E[H]^T + Gamma prior/posterior terms.  Stopping as ``oracle.fit``.
"""

from __future__ import annotations

import numpy as np
from oracle import gamma_elbo_terms
from scipy.special import digamma, gammaln

__all__ = ["local_step", "p_objective", "update_p", "fit"]


def _check_counts(Y):
    Y = np.asarray(Y)
    if Y.ndim != 2:
        raise ValueError("Y must be a dense 2-D (U, I) array of counts")
    if Y.size and Y.min() < 0:
        raise ValueError("counts must be >= 0")
    if not np.all(Y == np.round(Y)):
        raise ValueError("counts must be integers")
    return Y.astype(np.float64)


def local_step(Y, GW, GH, p, t=1.0):
    """dcPF-Log local step (see the module docstring), dense.

    Returns ``En`` (dense, 0 off the nonzeros), ``Lambda`` (dense), ``SW``, ``SH``,
    ``s_en = sum E[n]``, ``s_y = sum y`` and ``local`` (the local ELBO term).
    """
    Y = _check_counts(Y)
    GW = np.asarray(GW, dtype=np.float64)
    GH = np.asarray(GH, dtype=np.float64)
    mask = Y > 0
    y = Y[mask]

    Lambda = GW @ GH.T
    s = t * Lambda[mask]
    if p == 0.0:
        en = y.copy()
        local = -gammaln(y + 1).sum() + (y * np.log(s)).sum()
    elif p == 1.0:
        en = np.ones_like(y)
        local = np.log(s).sum()
    else:
        r = s / -np.log1p(-p)  # -log(1 - p), computed stably
        en, rising = np.zeros_like(y), np.zeros_like(y)
        for j in range(int(y.max())):
            part = y > j
            en[part] += r[part] / (r[part] + j)
            rising[part] += np.log(r[part] + j)
        local = -gammaln(y + 1).sum() + y.sum() * np.log(p) + rising.sum()

    En = np.zeros_like(Y)
    En[mask] = en
    R = np.zeros_like(Lambda)
    R[mask] = en / Lambda[mask]
    # E[c_uik] = R_ui GW_uk GH_ik, summed over i (SW) or u (SH); zeros contribute R = 0.
    SW = np.einsum("ui,uk,ik->uk", R, GW, GH)
    SH = np.einsum("ui,uk,ik->ik", R, GW, GH)
    return {
        "En": En,
        "Lambda": Lambda,
        "SW": SW,
        "SH": SH,
        "s_en": float(en.sum()),
        "s_y": float(y.sum()),
        "local": float(local),
    }


def p_objective(p, s_en, s_y):
    """The p-dependent part of the bound at fixed q(n): s_y log p - s_en log(-log(1 - p))."""
    return s_y * np.log(p) - s_en * np.log(-np.log1p(-p))


def update_p(p, s_en, s_y, steps=10):
    """``steps`` Newton steps on f(p) = (1 - p)/p * (-log(1 - p)) = s_en / s_y.

    f(p) = s_en / s_y is the stationarity condition of ``p_objective``; f falls from 1 (p -> 0)
    to 0 (p -> 1), so when s_en >= s_y the objective rises all the way to p -> 0 and the result
    is p = 0 (the Poisson limit).  Otherwise each step is halved while it would leave [0, 1];
    the final value is kept only if it is strictly inside (0, 1) and increases
    ``p_objective``, otherwise ``p`` is returned unchanged.
    """
    if s_en >= s_y:
        return 0.0
    ratio = s_en / s_y
    q = float(p)
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(steps):
            f = (1.0 - q) / q * -np.log1p(-q)
            grad = (q + np.log1p(-q)) / q**2
            step = (f - ratio) / grad
            if not np.isfinite(step):
                # Newton has run into the boundary (f(q) - ratio and/or grad are 0 or NaN in
                # floating point): halving an infinite step never ends, and a NaN step makes
                # q NaN, which the acceptance test below rejects.  Give up the same way.
                q = np.nan
                break
            while q - step < 0 or q - step > 1:
                step /= 2
            q -= step
        accept = 0.0 < q < 1.0 and p_objective(q, s_en, s_y) > p_objective(p, s_en, s_y)
    return float(q) if accept else float(p)


def fit(
    Y,
    W0,
    H0,
    p=0.5,
    t=1.0,
    update_p_=True,
    alpha_W=0.3,
    alpha_H=0.3,
    tol=1e-5,
    max_iter=1000,
    min_iter=0,
):
    """CAVI for dcPF-Log (module docstring), dense.

    Initialization: E[W] = W0, E[H] = H0, used directly as GW, GH in the first local step (no
    ELBO evaluated there).  p is learned only when ``update_p_`` and 0 < p < 1.  Stopping:
    rel_n = (ELBO_n - ELBO_{n-1}) / |ELBO_{n-1}| (rel_0 = +inf); stop after iteration n
    (zero-based) when rel_n < tol and n >= min_iter, or after ``max_iter`` iterations;
    ``n_iter`` = number of ELBO evaluations.  A relative decrease beyond 1e-9 raises
    AssertionError.  Also returns the trace of p (``p_trace``, the p used in each iteration).
    """
    Y = _check_counts(Y)
    EW = np.array(W0, dtype=np.float64, copy=True)
    EH = np.array(H0, dtype=np.float64, copy=True)
    U, K = EW.shape
    I = EH.shape[0]  # noqa: E741
    if Y.shape != (U, I) or EH.shape[1] != K:
        raise ValueError("shape mismatch between Y, W0 and H0")
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError("p must be in [0, 1]")

    loc = local_step(Y, EW, EH, p, t)  # first local step: GW = W0, GH = H0
    elbo, p_trace = [], []
    ElogW = ElogH = aW = bW = aH = bH = betaW = betaH = None
    for n in range(max_iter):
        # 1. empirical Bayes for the prior rates
        betaW = alpha_W / EW.mean(axis=1)
        betaH = alpha_H / EH.mean(axis=1)
        # 2. p from the last local step's sums
        if update_p_ and 0.0 < p < 1.0:
            p = update_p(p, loc["s_en"], loc["s_y"])
        p_trace.append(p)
        # 3. W: rate t * sum over ALL items of E[h]
        aW = alpha_W + loc["SW"]
        bW = betaW[:, None] + t * EH.sum(axis=0)[None, :]
        EW = aW / bW
        ElogW = digamma(aW) - np.log(bW)
        # 4. H, with the new E[W]
        aH = alpha_H + loc["SH"]
        bH = betaH[:, None] + t * EW.sum(axis=0)[None, :]
        EH = aH / bH
        ElogH = digamma(aH) - np.log(bH)
        # 5. local step
        loc = local_step(Y, np.exp(ElogW), np.exp(ElogH), p, t)
        # 6. ELBO
        value = (
            loc["local"]
            - t * (EW @ EH.T).sum()
            + gamma_elbo_terms(alpha_W, betaW[:, None], aW, bW)
            + gamma_elbo_terms(alpha_H, betaH[:, None], aH, bH)
        )
        elbo.append(float(value))
        rel = np.inf if n == 0 else (elbo[n] - elbo[n - 1]) / abs(elbo[n - 1])
        if rel < -1e-9:
            raise AssertionError(
                f"dcPF ELBO decreased at iteration {n}: {elbo[n - 1]!r} -> {elbo[n]!r} "
                f"(rel {rel:.3e})"
            )
        if rel < tol and n >= min_iter:
            break

    return {
        "elbo": elbo,
        "EW": EW,
        "EH": EH,
        "ElogW": ElogW,
        "ElogH": ElogH,
        "aW": aW,
        "bW": bW,
        "aH": aH,
        "bH": bH,
        "betaW": betaW,
        "betaH": betaH,
        "p": p,
        "p_trace": p_trace,
        "t": t,
        "n_iter": len(elbo),
        "En": loc["En"],
        "s_en": loc["s_en"],
        "s_y": loc["s_y"],
    }
