"""Numerics of the SVD start (docs/design.md §2): a rank-K randomized SVD of the training matrix
computed block by block (Halko, Martinsson & Tropp 2011, subspace iteration), and its
nonnegative version NNDSVDa (Boutsidis & Gallopoulos 2008).

The orchestration (:mod:`ordnmf_dask.engine.svdstart`) runs these functions on the workers on
row chunks of U x L and I x L matrices, and on the client only on L x L or (K,) arrays. Dense
products use ``np.einsum`` (its own loops, not BLAS), so that a chunk's result does not depend
on how many BLAS threads the process running it has: a start is bitwise the same on any
cluster and in-process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.model.updates import FactorChunk

OVERSAMPLE = 10  # columns of the sketch beyond K (one of them the all-ones vector)
POWER_ITERATIONS = 2  # subspace iterations: each reads the data twice
DROP = 1e-12  # directions of a Gram matrix below DROP x its largest eigenvalue are dropped
ZERO_SINGULAR = 1e-6  # singular values below this fraction of the largest are taken as zero


def dense(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b without BLAS (bitwise the same whatever the process's BLAS threads)."""
    return np.einsum("ij,jk->ik", a, b)


def gram(a: np.ndarray) -> np.ndarray:
    """a^T a, without BLAS."""
    return np.einsum("ij,ik->jk", a, a)


def row_product(blocks: Iterable[CsrBlock], mats: Sequence[np.ndarray]) -> np.ndarray:
    """sum_c A_c @ M_c over the blocks of a row strip, in order (M_c: rows of item-block c)."""
    out = None
    for block, m in zip(blocks, mats, strict=True):
        part = np.asarray(block.matrix(block.y.astype(np.float64)) @ m)
        out = part if out is None else out + part
    assert out is not None
    return out


def col_product(blocks: Iterable[CsrBlock], mats: Sequence[np.ndarray]) -> np.ndarray:
    """sum_r A_r^T @ M_r over the blocks of a column strip, in order (M_r: rows of user-block r)."""
    out = None
    for block, m in zip(blocks, mats, strict=True):
        part = np.asarray(block.matrix(block.y.astype(np.float64)).T @ m)
        out = part if out is None else out + part
    assert out is not None
    return out


def orthonormalizer(g: np.ndarray) -> np.ndarray:
    """T such that Y T has orthonormal (or zero) columns, from G = Y^T Y (SVQB, Stathopoulos &
    Wu 2002): the eigen-decomposition of G scaled to unit diagonal; directions of (numerical)
    rank deficiency get zero columns instead of blowing up."""
    d = np.sqrt(np.diag(g))
    inv_d = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    lam, vec = np.linalg.eigh(g * inv_d[:, None] * inv_d[None, :])
    keep = lam > DROP * max(float(lam.max()), 0.0)
    inv_sqrt = np.divide(1.0, np.sqrt(np.where(keep, lam, 1.0)), where=keep, out=np.zeros_like(lam))
    return inv_d[:, None] * vec * inv_sqrt[None, :]


def top_singular(g: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rank-k SVD of B = Q^T A from G = B B^T (L x L): ``rot`` (L, k), the left singular
    vectors of B (U = Q rot); ``s`` (k,), the singular values (those below ZERO_SINGULAR x the
    largest set to 0); ``inv_s`` (k,), 1 / s, or 0 where s is 0 (V = A^T Q rot / s)."""
    lam, vec = np.linalg.eigh(g)
    order = np.argsort(lam)[::-1][:k]
    s = np.sqrt(np.maximum(lam[order], 0.0))
    s[s <= ZERO_SINGULAR * s[0]] = 0.0
    inv_s = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
    return vec[:, order], s, inv_s


def part_norms(x: np.ndarray) -> np.ndarray:
    """(2, K): per column, the squared norms of the positive and of the negative part of x."""
    pos, neg = np.maximum(x, 0.0), np.maximum(-x, 0.0)
    return np.stack([np.einsum("ij,ij->j", pos, pos), np.einsum("ij,ij->j", neg, neg)])


def choose_parts(
    s: np.ndarray, norms_u: np.ndarray, norms_v: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NNDSVD's choice per component j (from the (2, K) :func:`part_norms` of U and V summed
    over all rows): the positive parts of u_j, v_j when ||u_j+|| ||v_j+|| > ||u_j-|| ||v_j-||,
    else the negative parts; component j is then sqrt(s_j sigma_j) (p / ||p||) (q / ||q||)^T,
    sigma_j the larger product. Returns ``positive`` (K,) and the factors by which the chosen
    parts of U and V are multiplied (0 for a zero component)."""
    nu, nv = np.sqrt(norms_u), np.sqrt(norms_v)
    positive = nu[0] * nv[0] > nu[1] * nv[1]
    pu, pv = np.where(positive, nu[0], nu[1]), np.where(positive, nv[0], nv[1])
    size = np.sqrt(s * pu * pv)

    def coef(norm: np.ndarray) -> np.ndarray:
        return np.divide(size, norm, out=np.zeros_like(size), where=norm > 0)

    return positive, coef(pu), coef(pv)


def nonnegative(x: np.ndarray, positive: np.ndarray, coef: np.ndarray, fill: float) -> FactorChunk:
    """Rows of the NNDSVDa start: the chosen part of each column of x times its coefficient,
    every zero replaced by ``fill`` (the data's mean), so that each entry is > 0."""
    part = np.where(positive[None, :], np.maximum(x, 0.0), np.maximum(-x, 0.0)) * coef[None, :]
    return FactorChunk.initial(np.where(part > 0, part, fill))


def rescaled(chunk: FactorChunk, factor: float) -> FactorChunk:
    """The chunk times ``factor`` (both factors get sqrt(total / sum(W H^T)))."""
    return FactorChunk.initial(chunk.mean * factor)
