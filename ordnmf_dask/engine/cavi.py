"""The exact CAVI loop on a Dask cluster (DESIGN.md sections 2, 4 and 5).

One loop for every model family (:mod:`.families`). Per iteration, up to three passes over the
block grid, each a map over blocks followed by fixed-order tree reductions on the workers:

1. W-rate pass (ordinal models): ``sum_i G_y E[h_i]`` per user-block, with the new Delta and
   the current E[H];
2. H-rate pass (ordinal models): ``sum_u G_y E[w_u]`` per item-block, with the NEW E[W]
   (exact coordinate ascent);
3. local pass: E[n], SW, SH and the family's O(V) statistics (next Delta or p, local ELBO).

Factor chunks stay on the workers as futures; only O(K + V) numbers (column sums, per-class
sums, ELBO parts) are gathered by the client, once per iteration. Every ``checkpoint_every``
iterations (or ``checkpoint_minutes``) the state is checkpointed to zarr by the workers and read
back (:mod:`.checkpoint`), which cuts the task lineage so the scheduler's graph stays bounded
over long fits, and lets an interrupted fit resume where it stopped.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from distributed import Client, Future

from ..io.store import StoreInfo
from . import checkpoint, reduce, tasks
from .families import Family
from .reduce import tree_sum

log = logging.getLogger(__name__)

ROUNDOFF = 1e-10  # relative ELBO decrease tolerated as floating-point round-off


class ELBODecreaseError(RuntimeError):
    """The ELBO decreased by more than round-off: a bug, never silenced."""


@dataclass(frozen=True)
class CaviConfig:
    """Hyper-parameters of one fit (see :class:`ordnmf_dask.OrdNMF`)."""

    n_components: int
    alpha_W: float = 0.3
    alpha_H: float = 0.3
    tol: float = 1e-5
    max_iter: int = 1000
    min_iter: int = 0
    random_state: int = 0


@dataclass
class CaviState:
    """Futures of the factor chunks and the client-side small numbers after a fit.

    ``elbo`` is the reported bound (it drives the stopping rule, as in the published code);
    ``objective`` is the last value of the bound CAVI ascends, checked for monotonicity. They
    coincide except in approx mode (q(n) = delta_1), where the reported bound keeps the
    log(expm1(.)) local term and may decrease (a decrease then stops the fit: rel < tol).
    """

    w: list[Future]
    h: list[Future]
    params: Any  # the family's global parameters: Delta (V + 1,) or p
    elbo: list[float] = field(default_factory=list)
    objective: float = -math.inf
    converged: bool = False

    @property
    def n_iter(self) -> int:
        return len(self.elbo)


IterationCallback = Callable[[int, float, float, float, Any], None]


class CaviRunner:
    """Drives the CAVI iterations of one fit on ``client`` over the blocks of ``store``."""

    def __init__(
        self,
        client: Client,
        store: StoreInfo,
        family: Family,
        config: CaviConfig,
        checkpoint_dir: str,
        cache_blocks: bool,
        checkpoint_every: int = 10,
        checkpoint_minutes: float | None = None,
        fingerprint: str = "",
    ) -> None:
        if config.n_components < 1:
            raise ValueError(f"n_components must be >= 1, got {config.n_components}")
        self.client = client
        self.store = store
        self.family = family
        self.cfg = config
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.checkpoint_minutes = checkpoint_minutes
        self.fingerprint = fingerprint
        n_r, n_c = store.grid
        refs = [
            [tasks.BlockRef(store.path, "train", r, c, family.values) for c in range(n_c)]
            for r in range(n_r)
        ]
        if cache_blocks:
            load = tasks.materialize
            self.blocks = [[client.submit(load, ref) for ref in row] for row in refs]
        else:
            self.blocks = refs

    # -- initial state -------------------------------------------------------------------
    def random_init(self) -> tuple[list[Future], list[Future]]:
        """Gamma(1, 1) draws from ``random_state``, per block, independent of the grid."""
        k, seed, s = self.cfg.n_components, self.cfg.random_state, self.store
        w = [
            self.client.submit(tasks.random_chunk, seed, 0, int(a), int(b), k)
            for a, b in zip(s.row_bounds[:-1], s.row_bounds[1:], strict=True)
        ]
        h = [
            self.client.submit(tasks.random_chunk, seed, 1, int(a), int(b), k)
            for a, b in zip(s.col_bounds[:-1], s.col_bounds[1:], strict=True)
        ]
        return w, h

    def warm_init(self, w_path: str, h_path: str) -> tuple[list[Future], list[Future]]:
        """Initial E[W], E[H] read by the workers from zarr arrays of shape (U, K), (I, K)."""
        s = self.store
        w = [
            self.client.submit(tasks.rows_chunk, w_path, int(a), int(b))
            for a, b in zip(s.row_bounds[:-1], s.row_bounds[1:], strict=True)
        ]
        h = [
            self.client.submit(tasks.rows_chunk, h_path, int(a), int(b))
            for a, b in zip(s.col_bounds[:-1], s.col_bounds[1:], strict=True)
        ]
        return w, h

    # -- passes --------------------------------------------------------------------------
    def _local_pass(
        self, w: list[Future], h: list[Future], params: Any
    ) -> tuple[list[Future], list[Future], Future]:
        n_r, n_c = self.store.grid
        submit, kernel = self.client.submit, self.family.kernel
        args = self.family.kernel_args(params)
        stats = [
            [
                submit(tasks.local_block, self.blocks[r][c], w[r], h[c], kernel, *args)
                for c in range(n_c)
            ]
            for r in range(n_r)
        ]
        sw = [tree_sum(self.client, stats[r], "sw", lazy=True) for r in range(n_r)]
        sh = [
            tree_sum(self.client, [stats[r][c] for r in range(n_r)], "sh", lazy=True)
            for c in range(n_c)
        ]
        small = tree_sum(self.client, [s for row in stats for s in row], "small")
        return sw, sh, small

    def _row_corrections(self, gap: np.ndarray, h: list[Future]) -> list[Future]:
        submit = self.client.submit
        return [
            tree_sum(
                self.client,
                [submit(tasks.row_correction_block, b, gap, h[c]) for c, b in enumerate(row)],
                lazy=True,
            )
            for row in self.blocks
        ]

    def _col_corrections(self, gap: np.ndarray, w: list[Future]) -> list[Future]:
        submit, fn = self.client.submit, tasks.col_correction_block
        return [
            tree_sum(
                self.client,
                [submit(fn, row[c], gap, w[r]) for r, row in enumerate(self.blocks)],
                lazy=True,
            )
            for c in range(self.store.grid[1])
        ]

    def _views(self, chunks: list[Future]) -> list[Future]:
        """(mean, geo) of each chunk, made on its worker: the passes fetch these, not the
        whole chunk (no shape / prior rate over the network)."""
        return [self.client.submit(tasks.view, x) for x in chunks]

    def _rows(self) -> dict[str, list[int]]:
        rb, cb = np.diff(self.store.row_bounds).tolist(), np.diff(self.store.col_bounds).tolist()
        return {"W": rb, "H": cb, "SW": rb, "SH": cb}

    # -- the loop ------------------------------------------------------------------------
    def run(
        self,
        init: tuple[list[Future], list[Future]] | None,
        callback: IterationCallback | None = None,
        resume: bool = False,
    ) -> CaviState:
        """Iterate DESIGN.md section 2 steps 1-6 until the relative ELBO gain is below tol.

        The first local step uses the initial E[W], E[H] directly as geometric means. Each
        iteration: (1) empirical-Bayes prior rates (inside the chunk updates, from the current
        E[.]); (2) the family's global parameters from the previous local step; (3) W; (4) H
        with the new E[W]; (5) local step; (6) ELBO and the stopping rule. With ``resume``, the
        state is read from the newest valid checkpoint instead (``init`` is then only used when
        there is none), and the run continues exactly as the interrupted one would have.
        """
        cfg, client, submit, fam = self.cfg, self.client, self.client.submit, self.family
        k = cfg.n_components
        snap = None
        if resume:
            try:
                groups, snap, path = checkpoint.read_newest(
                    client, self.checkpoint_dir, self._rows(), self.fingerprint
                )
                log.info("resuming from %s (iteration %d)", path, snap.iteration)
            except checkpoint.CheckpointError as exc:
                log.warning("starting from scratch: %s", exc)
        if snap is not None:
            w, h, sw, sh = (groups[name] for name in checkpoint.GROUPS)
            params = fam.from_json(snap.params)
            small_v = np.asarray(snap.small)
            w_sum_v, h_sum_v = np.asarray(snap.w_sum), np.asarray(snap.h_sum)
            w_sum, h_sum = tree_sum(client, w, "summary"), tree_sum(client, h, "summary")
            state = CaviState(w, h, params, list(snap.elbo), snap.objective)
            first = snap.iteration
        else:
            if init is None:
                raise ValueError("no initial state and nothing to resume from")
            checkpoint.clear(self.checkpoint_dir)
            w, h = init
            params = fam.init_params()
            sw, sh, small = self._local_pass(w, h, params)
            w_sum = tree_sum(client, w, "summary")
            h_sum = tree_sum(client, h, "summary")
            small_v, w_sum_v, h_sum_v = client.gather([small, w_sum, h_sum])
            state = CaviState(w, h, params)
            first = 0
        wv, hv = self._views(w), self._views(h)
        last_checkpoint = time.monotonic()
        for n in range(first, cfg.max_iter):
            start = time.perf_counter()
            params = fam.update_params(params, small_v, float(w_sum_v[:k] @ h_sum_v[:k]))
            scale, gap = fam.rate_scale(params), fam.gap(params)

            corr_w = self._row_corrections(gap, hv) if fam.uses_correction else [None] * len(w)
            w = [
                submit(tasks.update_factor, w[r], cfg.alpha_W, sw[r], scale, h_sum, corr_w[r])
                for r in range(len(w))
            ]
            wv = self._views(w)
            w_sum_lazy = tree_sum(client, w, "summary", lazy=True)
            corr_h = self._col_corrections(gap, wv) if fam.uses_correction else [None] * len(h)
            h = [
                submit(tasks.update_factor, h[c], cfg.alpha_H, sh[c], scale, w_sum_lazy, corr_h[c])
                for c in range(len(h))
            ]
            hv = self._views(h)
            w_sum = tree_sum(client, w, "summary")
            h_sum = tree_sum(client, h, "summary")
            sw, sh, small = self._local_pass(wv, hv, params)
            small_v, w_sum_v, h_sum_v = client.gather([small, w_sum, h_sum])

            gamma_terms = float(w_sum_v[k] + h_sum_v[k])
            local, ascended = fam.elbo(params, small_v, float(w_sum_v[:k] @ h_sum_v[:k]))
            elbo, objective = local + gamma_terms, ascended + gamma_terms
            state.w, state.h, state.params = w, h, params
            rate = math.inf if n == 0 else (elbo - state.elbo[-1]) / abs(state.elbo[-1])
            state.elbo.append(elbo)
            if callback is not None:
                callback(n + 1, elbo, rate, time.perf_counter() - start, params)
            if not np.isfinite(objective):
                raise FloatingPointError(f"ELBO is {elbo} at iteration {n + 1}")
            if n > 0 and objective < state.objective - ROUNDOFF * abs(state.objective):
                raise ELBODecreaseError(
                    f"ELBO decreased at iteration {n + 1}: {state.objective!r} -> {objective!r}"
                )
            state.objective = objective
            if rate < cfg.tol and n >= cfg.min_iter:
                state.converged = True
                break
            due = self.checkpoint_every and (n + 1) % self.checkpoint_every == 0
            late = self.checkpoint_minutes is not None and (
                time.monotonic() - last_checkpoint >= 60 * self.checkpoint_minutes
            )
            if due or late:
                snap = checkpoint.Snapshot(
                    n + 1, fam.to_json(params), list(state.elbo), state.objective,
                    small_v.tolist(), w_sum_v.tolist(), h_sum_v.tolist(),
                )
                groups = {
                    "W": w, "H": h,
                    "SW": [submit(reduce.resolve, x) for x in sw],
                    "SH": [submit(reduce.resolve, x) for x in sh],
                }
                path = checkpoint.write(
                    client, self.checkpoint_dir, groups, snap, self.fingerprint
                )
                groups, _ = checkpoint.read(client, path, self._rows(), self.fingerprint)
                w, h, sw, sh = (groups[name] for name in checkpoint.GROUPS)
                w_sum, h_sum = tree_sum(client, w, "summary"), tree_sum(client, h, "summary")
                wv, hv = self._views(w), self._views(h)
                state.w, state.h = w, h
                last_checkpoint = time.monotonic()
                log.debug("checkpoint %s", path)
        return state
