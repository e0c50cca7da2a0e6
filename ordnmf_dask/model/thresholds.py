"""Ordinal thresholds of IG-OrdNMF, parametrised by the decrements Delta.

``delta`` always has length V + 1 with ``delta[0] == 0``; ``Delta_l = theta_{l-1} - theta_l``.
"""

from __future__ import annotations

import numpy as np


def init_delta(hist: np.ndarray) -> np.ndarray:
    """Delta from the training histogram (docs/design.md §2).

    ``hist`` has shape (V + 1,), ``hist[v]`` = number of training nonzeros of class v (``hist[0]``
    is ignored). Returns ``Delta_l = n_l / (nnz + n_1 + ... + n_l)`` with ``Delta_0 = 0``.
    """
    counts = np.asarray(hist, dtype=np.float64).copy()
    counts[0] = counts[1:].sum()
    delta = counts / np.cumsum(counts)
    delta[0] = 0.0
    return delta


def theta_from_delta(delta: np.ndarray) -> np.ndarray:
    """``theta_v = sum_{l > v} Delta_l`` for v = 0..V (so ``theta_V = 0``), shape (V + 1,)."""
    tail = np.cumsum(delta[::-1])[::-1]  # tail[v] = sum_{l >= v} Delta_l
    return np.append(tail[1:], 0.0)


def gap_from_delta(delta: np.ndarray) -> np.ndarray:
    """``G_v = theta_0 - T_v`` with ``T_0 = theta_0``, ``T_v = theta_{v-1}``; shape (V + 1,).

    ``G_0 = G_1 = 0``; the sparse rate correction weights each nonzero by ``G_{y}``.
    """
    theta = theta_from_delta(delta)
    t = np.concatenate(([theta[0]], theta[:-1]))
    return theta[0] - t


def update_delta(
    en_by_class: np.ndarray, lam_by_class: np.ndarray, total_lambda: float
) -> np.ndarray:
    """Closed-form VBEM update of Delta (docs/design.md §2 step 2).

    Parameters
    ----------
    en_by_class : (V + 1,) sum of E[n_ui] over the nonzeros of each class.
    lam_by_class : (V + 1,) sum of lambda_ui = E[w_u].E[h_i] over the nonzeros of each class.
    total_lambda : sum of lambda_ui over ALL (u, i) pairs, zeros included.

    Returns
    -------
    delta : (V + 1,), ``Delta_l = N_l / sum_{y_ui <= l} lambda_ui``.
    """
    n_classes = len(en_by_class) - 1
    delta = np.zeros(n_classes + 1)
    denom = total_lambda
    for level in range(n_classes, 0, -1):
        if level < n_classes:
            denom = denom - lam_by_class[level + 1]
        # an empty class with no pair at or below it (no zeros: every pair observed) leaves
        # Delta_l free; 0, as for any other empty class, instead of 0 / 0
        delta[level] = en_by_class[level] / denom if en_by_class[level] > 0 else 0.0
    return delta
