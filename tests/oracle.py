"""Dense numpy reference ("oracle") of IG-OrdNMF exact CAVI and of its evaluation metrics.

Written independently of ``ordnmf_dask`` from docs/design.md §1-§3 and the paper
(Gouvert, Oberlin & Fevotte, ICML 2020).  Everything is dense and deliberately naive:

* ``Y`` is a full ``(U, I)`` integer array of classes ``0..V`` (0 = no interaction);
* every "sum over the nonzeros" is a masked sum over the full matrix (``mask = Y > 0``);
* every "sum over all (u, i)" is literally a sum over all ``U * I`` entries, e.g. the Poisson
  rate ``lambda = E[W] @ E[H].T`` is materialized as a dense matrix.

It is meant for U, I <= ~60 and K <= ~5 and favours clarity over speed.  All arithmetic is float64.

Notation (docs/design.md §1)::

    delta[l] = Delta_l = theta_{l-1} - theta_l   (l = 1..V),  delta[0] = 0 (unused placeholder)
    theta[v] = sum_{l > v} Delta_l               (v = 0..V),  theta[V] = 0
    T[v]     = theta_0 if v == 0 else theta_{v-1}
    G[v]     = theta_0 - T[v]                    (G[0] = G[1] = 0)

Variants kept on purpose because the published numbers were computed with them (docs/design.md §2):

* In ``approx`` mode (q(n) = delta_1, "PF on binarized data") E[n] = 1 on every nonzero, Delta is
  still learned, and the reported bound still uses the local ELBO ``sum_nz log(expm1(x))``.
* Initialization: the given E[W] = W0, E[H] = H0 are used directly as the geometric means GW, GH
  of the first local step; Delta starts from the training histogram (``init_delta``).
* The state returned by ``fit`` is that of the last iteration; ``n_iter`` counts ELBO evaluations
  (there is no ELBO evaluation at initialization).
"""

from __future__ import annotations

import numpy as np
from scipy.special import digamma, gammaln

__all__ = [
    "init_delta",
    "thresholds",
    "T_of",
    "G_of",
    "expected_n",
    "log_expm1",
    "local_step",
    "update_delta",
    "delta_objective",
    "rate_W",
    "rate_H",
    "gamma_elbo_terms",
    "elbo_value",
    "fit",
    "ndcg_at_k",
    "test_loglik",
]


# --------------------------------------------------------------------------------------------
# Thresholds
# --------------------------------------------------------------------------------------------


def _check_Y(Y, V=None):
    Y = np.asarray(Y)
    if Y.dtype == np.bool_:
        raise TypeError("Y must hold integer classes 0..V, not booleans (binarize to {0, 1} ints)")
    if not np.issubdtype(Y.dtype, np.integer):
        raise TypeError(f"Y must be an integer array, got {Y.dtype}")
    if Y.ndim != 2:
        raise ValueError("Y must be a dense 2-D (U, I) array")
    if Y.size and Y.min() < 0:
        raise ValueError("classes must be >= 0")
    if V is not None and Y.size and Y.max() > V:
        raise ValueError(f"classes must be <= V = {V}")
    return Y.astype(np.int64)


def init_delta(Y, V):
    """Initial decrements from the training histogram (docs/design.md §2, "Initialization").

    With n_l = #{y == l} and nnz = #{y > 0}:  Delta_l = n_l / (nnz + n_1 + ... + n_l), l = 1..V.
    Returns an array of length V + 1 with delta[0] = 0.
    """
    Y = _check_Y(Y, V)
    nnz = int(np.count_nonzero(Y > 0))
    delta = np.zeros(V + 1)
    cumulative = 0
    for level in range(1, V + 1):
        n_l = int(np.count_nonzero(Y == level))
        cumulative += n_l
        delta[level] = n_l / (nnz + cumulative)
    return delta


def thresholds(delta):
    """theta_v = sum_{l > v} Delta_l for v = 0..V (so theta_V = 0 and theta_0 = sum(Delta))."""
    delta = np.asarray(delta, dtype=np.float64)
    V = delta.shape[0] - 1
    return np.array([delta[v + 1 :].sum() for v in range(V + 1)])


def T_of(theta):
    """T_v = theta_0 for v = 0 and theta_{v-1} for v >= 1 (paper eq. "T"). Length V + 1."""
    theta = np.asarray(theta, dtype=np.float64)
    T = np.empty_like(theta)
    T[0] = theta[0]
    T[1:] = theta[:-1]
    return T


def G_of(theta):
    """G_v = theta_0 - T_v (G_0 = G_1 = 0). Length V + 1."""
    theta = np.asarray(theta, dtype=np.float64)
    return theta[0] - T_of(theta)


# --------------------------------------------------------------------------------------------
# Local step
# --------------------------------------------------------------------------------------------


def expected_n(x):
    """Mean of ZTP(x): x / (1 - exp(-x)), computed as x / -expm1(-x); equals 1 at x = 0."""
    x = np.asarray(x, dtype=np.float64)
    out = np.ones_like(x)
    pos = x > 0
    out[pos] = x[pos] / -np.expm1(-x[pos])
    return out


def log_expm1(x):
    """log(exp(x) - 1) for x > 0, via the identity exp(x) - 1 = exp(x) (1 - exp(-x)).

    Written as x + log(-expm1(-x)) so that it neither overflows (large x) nor loses precision
    (small x).
    """
    x = np.asarray(x, dtype=np.float64)
    return x + np.log(-np.expm1(-x))


def local_step(Y, GW, GH, delta, approx=False):
    """Local step of docs/design.md §2, dense.

    Lambda = GW @ GH.T (dense, all entries); on the nonzeros x = Lambda * Delta_y,
    E[n] = x / (1 - exp(-x)) (approx: E[n] = 1), and the expected allocations summed over the
    nonzeros::

        SW_uk = sum_{i: y_ui > 0} E[n_ui] / Lambda_ui * GW_uk * GH_ik
        SH_ik = sum_{u: y_ui > 0} E[n_ui] / Lambda_ui * GW_uk * GH_ik

    elbo_local = sum over nonzeros of log(expm1(x)) -- also in approx mode (published variant).
    bound_local = the local bound of the q(n, c) actually used: elbo_local in exact mode,
    sum over nonzeros of log(x) in approx mode (q(n) = delta_1).
    ``En`` is returned as a dense (U, I) array that is 0 on the zeros.
    """
    Y = _check_Y(Y)
    GW = np.asarray(GW, dtype=np.float64)
    GH = np.asarray(GH, dtype=np.float64)
    delta = np.asarray(delta, dtype=np.float64)
    mask = Y > 0

    Lambda = GW @ GH.T
    x = Lambda * delta[Y]  # delta[0] = 0, so x = 0 off the nonzeros
    if approx:
        En = mask.astype(np.float64)
    else:
        En = np.where(mask, expected_n(x), 0.0)

    R = np.zeros_like(Lambda)
    R[mask] = En[mask] / Lambda[mask]
    # E[c_uik] = R_ui * GW_uk * GH_ik; sum over i (resp. u), zeros contribute nothing (R = 0).
    SW = np.einsum("ui,uk,ik->uk", R, GW, GH)
    SH = np.einsum("ui,uk,ik->ik", R, GW, GH)

    elbo_local = float(log_expm1(x[mask]).sum())
    # Local bound of the q(n, c) actually used: equal to elbo_local in exact mode; with
    # q(n) = delta_1 (approx) it is sum_nz log(x) (paper: log(1 - e^-x) replaced by log x).
    bound_local = float(np.log(x[mask]).sum()) if approx else elbo_local
    return {
        "Lambda": Lambda,
        "En": En,
        "SW": SW,
        "SH": SH,
        "elbo_local": elbo_local,
        "bound_local": bound_local,
    }


# --------------------------------------------------------------------------------------------
# Global updates
# --------------------------------------------------------------------------------------------


def delta_objective(delta, Y, En, lam, V):
    """sum_{l=1..V} [N_l log Delta_l - D_l Delta_l], the Delta-dependent part of the ELBO with
    N_l = sum_{y == l} E[n] and D_l = sum over ALL (u, i) with y <= l of lambda_ui."""
    Y = _check_Y(Y, V)
    total = 0.0
    for level in range(1, V + 1):
        N_l = En[Y == level].sum()
        D_l = lam[Y <= level].sum()
        total += N_l * np.log(delta[level]) - D_l * delta[level]
    return float(total)


def update_delta(Y, En, lam, V):
    """VBEM closed form (paper eq. "update delta"; docs/design.md §2 step 2), dense:

        Delta_l = sum_{y_ui == l} E[n_ui] / sum_{all (u, i) with y_ui <= l} lambda_ui

    with lambda = E[W] E[H]^T (arithmetic means), zeros included in the denominator.
    """
    Y = _check_Y(Y, V)
    delta = np.zeros(V + 1)
    for level in range(1, V + 1):
        delta[level] = En[Y == level].sum() / lam[Y <= level].sum()
    return delta


def rate_W(Y, EH, betaW, theta):
    """b^W_uk = beta_u + sum_i T_{y_ui} E[h_ik] over ALL items i (paper, Algorithm 1)."""
    Y = _check_Y(Y)
    Tmat = T_of(theta)[Y]
    return np.asarray(betaW, dtype=np.float64)[:, None] + Tmat @ EH


def rate_H(Y, EW, betaH, theta):
    """b^H_ik = beta_i + sum_u T_{y_ui} E[w_uk] over ALL users u (paper, Algorithm 1)."""
    Y = _check_Y(Y)
    Tmat = T_of(theta)[Y]
    return np.asarray(betaH, dtype=np.float64)[:, None] + Tmat.T @ EW


def gamma_elbo_terms(alpha, beta, a, b):
    """sum over entries of E_q[log p(x)] - E_q[log q(x)], p = Gamma(alpha, beta) and
    q = Gamma(a, b) (shape, rate); ``beta`` broadcasts against ``a`` (e.g. shape (U, 1))."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    beta = np.broadcast_to(np.asarray(beta, dtype=np.float64), a.shape)
    Ex = a / b
    Elogx = digamma(a) - np.log(b)
    e_log_p = (alpha - 1.0) * Elogx - beta * Ex + alpha * np.log(beta) - gammaln(alpha)
    entropy_q = a - np.log(b) + gammaln(a) + (1.0 - a) * digamma(a)
    return float((e_log_p + entropy_q).sum())


def elbo_value(Y, elbo_local, theta, EW, EH, aW, bW, aH, bH, betaW, betaH, alpha_W, alpha_H):
    """docs/design.md §2 step 6, dense:

        ELBO = elbo_local - theta_0 sum_{all (u,i)} lambda_ui + sum_nz G_y lambda_ui
               + gamma prior/posterior terms of W and H,

    lambda = E[W] E[H]^T.  (-theta_0 sum_all lambda + sum_nz G_y lambda = -sum_all T_y lambda.)
    """
    Y = _check_Y(Y)
    mask = Y > 0
    lam = EW @ EH.T
    G = G_of(theta)[Y]
    data = elbo_local - theta[0] * lam.sum() + (G * lam)[mask].sum()
    prior_W = gamma_elbo_terms(alpha_W, np.asarray(betaW)[:, None], aW, bW)
    prior_H = gamma_elbo_terms(alpha_H, np.asarray(betaH)[:, None], aH, bH)
    return float(data + prior_W + prior_H)


# --------------------------------------------------------------------------------------------
# CAVI
# --------------------------------------------------------------------------------------------


def fit(
    Y,
    V,
    W0,
    H0,
    alpha_W=0.3,
    alpha_H=0.3,
    tol=1e-5,
    max_iter=1000,
    min_iter=0,
    approx=False,
    fixed_delta=None,
):
    """Exact CAVI for IG-OrdNMF (docs/design.md §2), dense.

    ``fixed_delta`` (V + 1,): keep Delta at this value and skip step 2 (BePoF with theta_0 = 1).

    Initialization: E[W] = W0, E[H] = H0; the first local step uses them directly as GW, GH;
    Delta from the training histogram (``init_delta``).  No ELBO is evaluated at initialization.

    Each iteration, in this order:
      1. beta_u = alpha_W / mean_k E[w_uk], beta_i = alpha_H / mean_k E[h_ik]
      2. Delta_l = sum_{y==l} E[n] / sum_{y<=l} lambda (lambda = E[W]E[H]^T, zeros included)
      3. a^W = alpha_W + SW, b^W = beta_u + sum_i T_{y_ui} E[h_ik]      (SW of the last local step)
      4. a^H = alpha_H + SH, b^H = beta_i + sum_u T_{y_ui} E[w_uk]      (with the NEW E[W])
      5. local step with GW = exp(E[log W]), GH = exp(E[log H])
      6. ELBO (``elbo_value``)
    Stopping: rel_n = (ELBO_n - ELBO_{n-1}) / |ELBO_{n-1}| (rel_0 = +inf); stop after iteration n
    (zero-based) when rel_n < tol and n >= min_iter, or after max_iter iterations.  A relative
    decrease beyond 1e-9 of the ascended objective raises AssertionError.

    approx (q(n) = delta_1, "PF on binarized data"): E[n] = 1 throughout, Delta is still learned,
    and the reported ``elbo`` (which drives stopping) still uses sum_nz log(expm1(x)) -- the
    published variant.  That reported value is NOT the bound CAVI ascends in this mode and CAN
    decrease (see tests/test_oracle.py); the monotonicity assertion is therefore made on
    ``objective``, the same expression with sum_nz log(x) as local term (the exact bound of
    q(n) = delta_1).  In exact mode ``objective == elbo``.
    """
    Y = _check_Y(Y, V)
    EW = np.array(W0, dtype=np.float64, copy=True)
    EH = np.array(H0, dtype=np.float64, copy=True)
    U, K = EW.shape
    I = EH.shape[0]  # noqa: E741
    if Y.shape != (U, I) or EH.shape[1] != K:
        raise ValueError("shape mismatch between Y, W0 and H0")

    delta = init_delta(Y, V) if fixed_delta is None else np.asarray(fixed_delta, dtype=float)
    theta = thresholds(delta)
    loc = local_step(Y, EW, EH, delta, approx)  # first local step: GW = W0, GH = H0

    elbo = []  # reported bound (docs/design.md §2 step 6); drives the stopping rule
    objective = []  # bound of the q actually ascended; == elbo unless approx
    ElogW = ElogH = aW = bW = aH = bH = betaW = betaH = None
    for n in range(max_iter):
        # 1. empirical Bayes for the prior rates
        betaW = alpha_W / EW.mean(axis=1)
        betaH = alpha_H / EH.mean(axis=1)
        # 2. thresholds (VBEM)
        lam = EW @ EH.T
        if fixed_delta is None:
            delta = update_delta(Y, loc["En"], lam, V)
        theta = thresholds(delta)
        # 3. W
        aW = alpha_W + loc["SW"]
        bW = rate_W(Y, EH, betaW, theta)
        EW = aW / bW
        ElogW = digamma(aW) - np.log(bW)
        # 4. H, with the new E[W]
        aH = alpha_H + loc["SH"]
        bH = rate_H(Y, EW, betaH, theta)
        EH = aH / bH
        ElogH = digamma(aH) - np.log(bH)
        # 5. local step
        loc = local_step(Y, np.exp(ElogW), np.exp(ElogH), delta, approx)
        # 6. ELBO and stopping
        global_terms = elbo_value(
            Y, 0.0, theta, EW, EH, aW, bW, aH, bH, betaW, betaH, alpha_W, alpha_H
        )
        elbo.append(loc["elbo_local"] + global_terms)
        objective.append(loc["bound_local"] + global_terms)
        if n > 0:
            obj_rel = (objective[n] - objective[n - 1]) / abs(objective[n - 1])
            if obj_rel < -1e-9:
                raise AssertionError(
                    f"ELBO decreased at iteration {n}: {objective[n - 1]!r} -> "
                    f"{objective[n]!r} (rel {obj_rel:.3e})"
                )
        rel = np.inf if n == 0 else (elbo[n] - elbo[n - 1]) / abs(elbo[n - 1])
        if rel < tol and n >= min_iter:
            break

    return {
        "elbo": elbo,
        "objective": objective,
        "EW": EW,
        "EH": EH,
        "ElogW": ElogW,
        "ElogH": ElogH,
        "aW": aW,
        "bW": bW,
        "aH": aH,
        "bH": bH,
        "delta": delta,
        "theta": theta,
        "n_iter": len(elbo),
        "betaW": betaW,
        "betaH": betaH,
        "En": loc["En"],
    }


# --------------------------------------------------------------------------------------------
# Evaluation (docs/design.md §3)
# --------------------------------------------------------------------------------------------


def ndcg_at_k(EW, EH, Y_train, Y_test, s, k=100):
    """Mean NDCG@k over users with at least one relevant test item.

    For each user: candidates are the items NOT in the user's train set (Y_train[u, i] == 0),
    ranked by the score E[W] @ E[H].T, descending; ties are broken by the lower item index first
    (stable sort on -score).  Relevance = 1[Y_test[u, i] >= s].  DCG = sum over the top k of
    rel / log2(rank + 2) (rank 0-based); IDCG = sum_{r < min(#relevant, k)} 1 / log2(r + 2), with
    #relevant = #{i : Y_test[u, i] >= s}.  Users with no relevant test item are left out of the
    mean (NaN if no user has one).
    """
    if s < 1:
        raise ValueError("relevance threshold s must be >= 1")
    Y_train = np.asarray(Y_train)
    Y_test = np.asarray(Y_test)
    scores = np.asarray(EW, dtype=np.float64) @ np.asarray(EH, dtype=np.float64).T
    per_user = []
    for u in range(scores.shape[0]):
        relevant = Y_test[u] >= s
        n_rel = int(relevant.sum())
        if n_rel == 0:
            continue
        candidates = np.flatnonzero(Y_train[u] == 0)
        order = np.argsort(-scores[u, candidates], kind="stable")
        top = candidates[order][:k]
        gains = relevant[top].astype(np.float64)
        dcg = float(np.sum(gains / np.log2(np.arange(top.size) + 2.0)))
        idcg = float(np.sum(1.0 / np.log2(np.arange(min(n_rel, k)) + 2.0)))
        per_user.append(dcg / idcg)
    return float(np.mean(per_user)) if per_user else float("nan")


def test_loglik(EW, EH, delta, Y_test):
    """sum over the test nonzeros of log P(y | y > 0, lambda), lambda = E[w_u] . E[h_i]:

    log P(y = v) = -lambda theta_v + log(1 - exp(-lambda Delta_v))    (v >= 1)
    log P(y > 0) = log(1 - exp(-lambda theta_0))
    """
    Y_test = _check_Y(Y_test)
    delta = np.asarray(delta, dtype=np.float64)
    theta = thresholds(delta)
    mask = Y_test > 0
    lam = (np.asarray(EW, dtype=np.float64) @ np.asarray(EH, dtype=np.float64).T)[mask]
    y = Y_test[mask]
    log_p_y = -lam * theta[y] + np.log(-np.expm1(-lam * delta[y]))
    log_p_pos = np.log(-np.expm1(-lam * theta[0]))
    return float(np.sum(log_p_y - log_p_pos))


# pytest would otherwise try to collect ``test_loglik`` when this module is imported by a test.
test_loglik.__test__ = False
