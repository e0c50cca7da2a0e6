"""The SVD start of a fit (``start="svd"``, docs/design.md §2): initial E[W], E[H] from a rank-K
randomized SVD of the training matrix (the family's values), made nonnegative by NNDSVDa.

Everything of the size of a factor matrix stays on the workers, one chunk per user-block or
item-block: the passes over the data are strips of blocks (the engine's, cached or streamed)
folded into one chunk each, summed by fixed-order trees; the client sees L x L Gram matrices
(L = K + OVERSAMPLE) and (K,) vectors only. The test matrix comes from the fit's seed, drawn
per fixed group of rows (not per block), so that a start depends on the data and the seed
only: not on the grid's chunking of the random draws, nor on the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.engine import tasks
from ordnmf_dask.model import nndsvd
from ordnmf_dask.runtime.reduce import tree_sum

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Future

    from ordnmf_dask.engine.cavi import CaviRunner


def row_strip(blocks: Sequence[Any], mats: Sequence[np.ndarray]) -> np.ndarray:
    """A @ M over a row strip's blocks (read one at a time)."""
    return nndsvd.row_product((tasks.materialize(b, reuse=True) for b in blocks), mats)


def col_strip(blocks: Sequence[Any], mats: Sequence[np.ndarray]) -> np.ndarray:
    """A^T @ M over a column strip's blocks (read one at a time)."""
    return nndsvd.col_product((tasks.materialize(b, reuse=True) for b in blocks), mats)


def last_column_sum(y: np.ndarray) -> np.ndarray:
    """(1,) sum of the last column of a chunk (of A @ [G, 1]: the data's row sums)."""
    return y[:, -1:].sum(axis=0)


class _Passes:
    """The products of one runner's training matrix with chunked matrices, on the workers."""

    def __init__(self, runner: CaviRunner) -> None:
        self.client, self.blocks = runner.client, runner.blocks
        self.groups, self.row_runs = runner.groups, runner.row_runs

    def times(self, m: list[Future]) -> list[Future]:
        """A @ M (M: one chunk per item-block) -> one chunk per user-block."""
        submit = self.client.submit
        return [
            tree_sum(
                self.client,
                [
                    submit(row_strip, [row[c] for c in g], [m[c] for c in g], pure=False)
                    for g in self.groups
                ],
            )
            for row in self.blocks
        ]

    def times_t(self, m: list[Future]) -> list[Future]:
        """A^T @ M (M: one chunk per user-block) -> one chunk per item-block."""
        submit, blocks = self.client.submit, self.blocks
        return [
            tree_sum(
                self.client,
                [
                    submit(col_strip, [blocks[r][c] for r in run], [m[r] for r in run], pure=False)
                    for run in self.row_runs
                ],
            )
            for c in range(len(blocks[0]))
        ]

    def small_sum(self, fn: Callable[[Any], np.ndarray], chunks: list[Future]) -> np.ndarray:
        """sum over the chunks of ``fn(chunk)`` (a small array), gathered."""
        parts = [self.client.submit(fn, x, pure=False) for x in chunks]
        return np.asarray(self.client.gather(tree_sum(self.client, parts)))

    def orthonormal(self, y: list[Future]) -> list[Future]:
        """Chunks of Y T, whose columns are orthonormal (or zero)."""
        t = nndsvd.orthonormalizer(self.small_sum(nndsvd.gram, y))
        return [self.client.submit(nndsvd.dense, x, t, pure=False) for x in y]


def svd_start(runner: CaviRunner) -> tuple[list[Future], list[Future]]:
    """The initial W and H chunks of ``runner``'s fit (submitted, placed as the engine's)."""
    client, store, cfg = runner.client, runner.store, runner.cfg
    k, submit = cfg.n_components, client.submit
    cols = store.col_bounds.tolist()
    width = min(k + nndsvd.OVERSAMPLE, store.n_users, store.n_items)
    passes = _Passes(runner)
    omega = [
        submit(tasks.sketch_rows, cfg.seed, lo, hi, width, pure=False)
        for lo, hi in zip(cols[:-1], cols[1:], strict=True)
    ]
    y = passes.times(omega)
    total = float(passes.small_sum(last_column_sum, y)[0])  # 1^T A 1: the ones column
    q = passes.orthonormal(y)
    for _ in range(nndsvd.POWER_ITERATIONS):
        q = passes.orthonormal(passes.times(passes.orthonormal(passes.times_t(q))))
    z = passes.times_t(q)  # B^T = A^T Q
    rot, s, inv_s = nndsvd.top_singular(passes.small_sum(nndsvd.gram, z), k)
    u = [submit(nndsvd.dense, x, rot, pure=False) for x in q]
    v = [submit(nndsvd.dense, x, rot * inv_s[None, :], pure=False) for x in z]
    positive, coef_u, coef_v = nndsvd.choose_parts(
        s, passes.small_sum(nndsvd.part_norms, u), passes.small_sum(nndsvd.part_norms, v)
    )
    fill = total / (store.n_users * store.n_items)  # NNDSVDa: zeros become the data's mean
    w = [submit(nndsvd.nonnegative, x, positive, coef_u, fill, pure=False) for x in u]
    h = [submit(nndsvd.nonnegative, x, positive, coef_v, fill, pure=False) for x in v]
    sum_w = client.gather(tree_sum(client, w, "summary"))[:k]
    sum_h = client.gather(tree_sum(client, h, "summary"))[:k]
    factor = float(np.sqrt(total / float(sum_w @ sum_h)))  # sum(W H^T) = sum(A)
    return runner.submit_initial(
        nndsvd.rescaled, [(x, factor) for x in w], [(x, factor) for x in h]
    )
