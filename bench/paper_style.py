"""Exact IG-OrdNMF CAVI written the way the paper's numpy code is: the comparison baseline.

Everything lives in one process: the training nonzeros as global coordinate arrays, the
variational parameters as dense (U, K) / (I, K) arrays, and every local quantity computed by
gathering factor rows at the nonzeros (``W[u, :] * H[i, :]``, an nnz x K array), with scipy sparse
matrices for the sums over items / users. One call of :meth:`PaperStyle.iteration` is one full
exact iteration of docs/design.md §2 (beta, Delta, W, H, local step, ELBO). Written from
docs/design.md for the benchmarks only; its peak memory grows as ~2 x nnz x K x 8 bytes.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.special import digamma, gammaln


class PaperStyle:
    """Dense-gather exact CAVI of IG-OrdNMF.

    rows, cols : (nnz,) int global indices; y : (nnz,) classes 1..V; shape : (U, I).
    """

    def __init__(
        self,
        rows: np.ndarray,
        cols: np.ndarray,
        y: np.ndarray,
        shape: tuple[int, int],
        k: int,
        n_classes: int,
        seed: int = 0,
        alpha: float = 0.3,
    ) -> None:
        self.u, self.i, self.y = rows.astype(np.int64), cols.astype(np.int64), y.astype(np.int64)
        self.shape, self.k, self.n_classes, self.alpha = shape, k, n_classes, alpha
        rng = np.random.default_rng(seed)
        self.ew = rng.gamma(1.0, 1.0, (shape[0], k))
        self.eh = rng.gamma(1.0, 1.0, (shape[1], k))
        self.gw, self.gh = self.ew.copy(), self.eh.copy()
        hist = np.bincount(self.y, minlength=n_classes + 1)
        self.delta = np.zeros(n_classes + 1)
        self.delta[1:] = hist[1:] / (len(self.y) + np.cumsum(hist[1:]))
        self.local()

    def _sparse(self, values: np.ndarray) -> sp.csr_matrix:
        return sp.csr_matrix((values, (self.u, self.i)), shape=self.shape)

    def local(self) -> None:
        """Local step: Lambda, E[n], SW, SH by dense gathers; Delta statistics; local ELBO."""
        prod = self.gw[self.u, :] * self.gh[self.i, :]  # nnz x K
        lam_geo = prod.sum(axis=1)
        x = lam_geo * self.delta[self.y]
        self.en = x / -np.expm1(-x)
        ratio = self._sparse(self.en / lam_geo)
        self.sw = self.gw * (ratio @ self.gh)
        self.sh = self.gh * (ratio.T @ self.gw)
        self.lam = (self.ew[self.u, :] * self.eh[self.i, :]).sum(axis=1)  # nnz x K again
        self.elbo_local = float((x + np.log(-np.expm1(-x))).sum())

    def _theta(self) -> np.ndarray:
        return np.append(np.cumsum(self.delta[1:][::-1])[::-1], 0.0)

    def _gap(self) -> np.ndarray:
        theta = self._theta()
        t = np.append(theta[0], theta[:-1])
        return theta[0] - t

    def _gamma(self, a: np.ndarray, b: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, ...]:
        mean, log_mean = a / b, digamma(a) - np.log(b)
        al = self.alpha
        term = (
            al * np.log(beta)
            - gammaln(al)
            + (al - 1) * log_mean
            - beta * mean
            - (a * np.log(b) - gammaln(a) + (a - 1) * log_mean - b * mean)
        )
        return mean, log_mean, float(term.sum())

    def iteration(self) -> float:
        """One full exact iteration; returns the ELBO."""
        al, n_classes = self.alpha, self.n_classes
        beta_w = al / self.ew.mean(axis=1, keepdims=True)
        beta_h = al / self.eh.mean(axis=1, keepdims=True)
        total = float(self.ew.sum(0) @ self.eh.sum(0))
        en_c = np.bincount(self.y, self.en, n_classes + 1)
        lam_c = np.bincount(self.y, self.lam, n_classes + 1)
        above = np.cumsum(lam_c[::-1])[::-1]  # sum of lambda over nonzeros with y >= l
        for level in range(1, n_classes + 1):
            upper = above[level + 1] if level < n_classes else 0.0
            self.delta[level] = en_c[level] / (total - upper)
        theta0, gap = self._theta()[0], self._gap()
        g = self._sparse(gap[self.y])
        rate_w = beta_w + theta0 * self.eh.sum(0) - g @ self.eh
        self.ew, log_w, term_w = self._gamma(al + self.sw, rate_w, beta_w)
        self.gw = np.exp(log_w)
        rate_h = beta_h + theta0 * self.ew.sum(0) - g.T @ self.ew
        self.eh, log_h, term_h = self._gamma(al + self.sh, rate_h, beta_h)
        self.gh = np.exp(log_h)
        self.local()
        total = float(self.ew.sum(0) @ self.eh.sum(0))
        lam_c = np.bincount(self.y, self.lam, n_classes + 1)
        return self.elbo_local - theta0 * total + float(gap @ lam_c) + term_w + term_h
