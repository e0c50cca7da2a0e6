"""The subsample start of a fit (``start="subsample"``, docs/design.md §2): the same model fitted
by plain CAVI on a subsample of the users and of the items, extended to every user and item by
fold-in.

1. Each user and each item enters the subsample with the probability of
   :func:`~ordnmf_dask.model.subsample.fractions`, by a uniform draw from the fit's seed for its
   global index (drawn per fixed group of rows, as the random start's): the subsample depends on
   the data and the seed only, not on the grid.
2. One pass over the blocks, on the workers, keeps of each block its nonzeros with a sampled
   item, those with a sampled user, and those with both; only the last, the sub-matrix (of
   bounded size), comes to the client.
3. The sub-fit runs in this process (an in-process executor): CAVI from the Gamma(1, 1) draws
   of the seed, at most SUB_MAX_ITER iterations or until the fit's tol; it gives q(W), q(H) of
   the users and items with a nonzero in the sub-matrix, and the global parameters.
4. Every user is folded in against the sub-fit's q(H) from its nonzeros with those items, and
   every item against the sub-fit's q(W) from its nonzeros with those users, with the sub-fit's
   global parameters (:func:`~ordnmf_dask.model.foldin_rows.fold_in_rows`); one task per user-block
   and per item-block, on the worker its chunk lives on. The two fold-ins read only the small
   sub-fit factors, so they run side by side and each task holds one chunk's rows, its kept
   nonzeros and the sub-fit's factors; each side is fitted on a subsample of the other of the
   same fraction as the sub-fit, so the scales of W and H agree.

The fit then starts from these E[W], exp(E[log W]), E[H], exp(E[log H]) and global parameters.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.engine import tasks, warmstart
from ordnmf_dask.engine.cavi import CaviRunner
from ordnmf_dask.errors import InputError
from ordnmf_dask.model import subsample
from ordnmf_dask.model.foldin_rows import Likelihood, fold_in_rows
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.model.subsample import Part
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.runtime.inprocess import InProcessClient

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Future

log = logging.getLogger("ordnmf_dask")

DRAWS = {"users": 3, "items": 4}  # streams of the seed (0, 1: the random start; 2: the SVD's)


def sampled(seed: int, which: int, start: int, stop: int, p: float) -> np.ndarray:
    """Boolean mask of the global rows [start, stop) of one side in the subsample."""
    draw = lambda rng: rng.random(tasks.INIT_ROWS)  # noqa: E731
    return tasks.grid_free_rows(seed, which, start, stop, draw) < p


def parts_of(
    block: Any, r0: int, c0: int, users: np.ndarray, items: np.ndarray
) -> tuple[Part, Part, Part]:
    """:func:`~ordnmf_dask.model.subsample.block_parts` of a cached or streamed block."""
    return subsample.block_parts(tasks.materialize(block, reuse=True), r0, c0, users, items)


def folded_chunk(
    parts: list[Part],
    n_own: int,
    fitted: np.ndarray,
    other: FactorChunk,
    colsum: np.ndarray,
    alpha: float,
    likelihood: Likelihood,
) -> FactorChunk:
    """The initial chunk of one user-block (item-block): its rows folded in against the
    sub-fit's ``other`` side (rows ``fitted``, global, increasing; ``colsum``: their column sums
    of E[.]) from its nonzeros with them."""
    fold = fold_in_rows(
        subsample.fold_matrix(parts, n_own, fitted),
        other.mean,
        np.log(other.geo),
        colsum,
        alpha,
        likelihood,
        max_iter=warmstart.FOLDIN_MAX_ITER,
        tol=warmstart.FOLDIN_TOL,
    )
    return FactorChunk(fold.mean, np.exp(fold.log_mean))


def sub_fit(runner: CaviRunner, block: CsrBlock) -> tuple[FactorChunk, FactorChunk, Any]:
    """q(W), q(H) and the global parameters of the sub-fit on ``block`` (the sub-matrix), by
    the fit's engine on an in-process executor: one block, the same family and settings, plain
    CAVI for at most SUB_MAX_ITER iterations, from the seed's Gamma(1, 1) draws."""
    n_u, n_i = block.shape
    info = replace(  # the runner reads the grid of its store; the blocks are given
        runner.store,
        n_users=n_u,
        n_items=n_i,
        row_bounds=np.array([0, n_u], dtype=np.int64),
        col_bounds=np.array([0, n_i], dtype=np.int64),
        nnz_train=block.nnz,
        nnz_test=0,
    )
    cfg = replace(
        runner.cfg, max_iter=subsample.SUB_MAX_ITER, min_iter=0, optimizer="cavi", anneal=0
    )
    with InProcessClient() as client:
        sub = CaviRunner(client, info, runner.family, cfg, "", True, 0, None, held=[[block]])
        state = sub.run(sub.random_init)
        w, h = client.gather([state.w[0], state.h[0]])
    log.info(
        "subsample start: sub-fit of %d users x %d items (%d nonzeros), ELBO %.10e after %d "
        "iterations",
        n_u,
        n_i,
        block.nnz,
        state.elbo[-1],
        state.n_iter,
    )
    return w, h, state.params


def subsample_start(runner: CaviRunner) -> tuple[list[Future], list[Future], Any]:
    """The initial W and H chunks of ``runner``'s fit (submitted, placed as the engine's) and
    its starting global parameters; InputError when the subsample is too small for K."""
    client, store, cfg = runner.client, runner.store, runner.cfg
    submit, k = client.submit, cfg.n_components
    rows, cols = store.row_bounds.tolist(), store.col_bounds.tolist()
    p_u, p_i = subsample.fractions(store.n_users, store.n_items, store.nnz_train, k)
    users = [
        submit(sampled, cfg.seed, DRAWS["users"], lo, hi, p_u, pure=False)
        for lo, hi in zip(rows[:-1], rows[1:], strict=True)
    ]
    items = [
        submit(sampled, cfg.seed, DRAWS["items"], lo, hi, p_i, pure=False)
        for lo, hi in zip(cols[:-1], cols[1:], strict=True)
    ]
    parts = [
        [
            submit(parts_of, b, rows[r], cols[c], users[r], items[c], pure=False)
            for c, b in enumerate(line)
        ]
        for r, line in enumerate(runner.blocks)
    ]
    toward_items, toward_users, both = (
        [[submit(operator.getitem, x, j, pure=False) for x in line] for line in parts]
        for j in range(3)
    )
    del parts  # each part is held by the one task that reads it
    gathered = client.gather([x for line in both for x in line])
    block, sub_users, sub_items = subsample.sub_matrix(gathered)
    if min(block.shape) < k:
        raise InputError(
            f"start='subsample': the subsample of {store.path} has {block.shape[0]} users and "
            f"{block.shape[1]} items with a nonzero between them, fewer than K = {k}: use "
            "start='random' or 'svd'"
        )
    w_sub, h_sub, params = sub_fit(runner, block)
    likelihood = warmstart.likelihood(runner.family, params)
    fitted = {
        "W": [client.scatter(x, hash=False) for x in (sub_users, w_sub)],
        "H": [client.scatter(x, hash=False) for x in (sub_items, h_sub)],
    }
    colsum = {"W": w_sub.mean.sum(axis=0), "H": h_sub.mean.sum(axis=0)}
    w_args = [
        (line, hi - lo, *fitted["H"], colsum["H"], cfg.alpha_W, likelihood)
        for line, lo, hi in zip(toward_items, rows[:-1], rows[1:], strict=True)
    ]
    h_args = [
        (
            [line[c] for line in toward_users],
            hi - lo,
            *fitted["W"],
            colsum["W"],
            cfg.alpha_H,
            likelihood,
        )
        for c, (lo, hi) in enumerate(zip(cols[:-1], cols[1:], strict=True))
    ]
    w, h = runner.submit_initial(folded_chunk, w_args, h_args)
    return w, h, params
