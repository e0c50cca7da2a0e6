"""The exact CAVI loop on a Dask cluster (docs/design.md §2, §4 and §5).

One loop for every model family (:mod:`.families`). Per iteration, up to three passes over the
block grid, each a map over strips of blocks followed by fixed-order tree reductions on the
workers:

1. W-rate pass (ordinal models): ``sum_i G_y E[h_i]`` per user-block, with the new Delta and
   the current E[H], by row strips (a user-block and a run of item-blocks);
2. H-rate pass (ordinal models): ``sum_u G_y E[w_u]`` per item-block, with the NEW E[W]
   (exact coordinate ascent), by column strips (an item-block and a run of user-blocks);
3. local pass by row strips: E[n], SW, SH and the family's O(V) statistics (next Delta or p,
   local ELBO).

A strip task reads its blocks one at a time (streamed) and folds them into one (n, K)
accumulator: memory per task is bounded by MAX_STRIP_COLS / MAX_STRIP_ROWS factor rows and one
block, and there is one partial per strip, not per block, to move and add.

Factor chunks stay on the workers as futures; the global parameters (Delta or p) are computed
on a worker too, so the client submits iteration n + 1 while iteration n runs and gathers only
O(K + V) numbers (column sums, per-class sums, ELBO parts) per iteration: the workers never wait
for the client's round trip. Every ``checkpoint_every`` iterations (or ``checkpoint_minutes``),
except after the last, the state is checkpointed to zarr by the workers (each chunk written as
soon as the iteration has computed it) and read back (:mod:`.checkpoint`), which cuts the task
lineage so the scheduler's graph stays bounded over long fits, and lets an interrupted fit
resume where it stopped.

On a cluster of one worker each step (an iteration, the first local pass, SQUAREM's
extrapolated step) is one task, :func:`run_step`, which hands the same graph to that worker's
in-process executor: 2 tasks and one hop per iteration instead of the graph's tens of tasks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ordnmf_dask.engine import checkpoint, tasks
from ordnmf_dask.engine.control import (
    CheckpointPolicy,
    EarlyStopping,
    StopRule,
    Validation,
    mean_gain,
)
from ordnmf_dask.engine.flight import PARTS, Flight, chunks_of
from ordnmf_dask.engine.snapshot import Layout, Snapshot
from ordnmf_dask.engine.squarem import Squarem
from ordnmf_dask.errors import CheckpointError, InputError
from ordnmf_dask.model import anneal, extrapolation
from ordnmf_dask.model.families import Family
from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.params import DEFAULTS
from ordnmf_dask.runtime import reduce
from ordnmf_dask.runtime.inprocess import InProcessClient
from ordnmf_dask.runtime.reduce import PRIORITY, tree_sum
from ordnmf_dask.store.blocks import StoreInfo

if TYPE_CHECKING:  # distributed is imported where a cluster is used
    from distributed import Client, Future

log = logging.getLogger(__name__)

# on one worker, each step of a fit is one task (:func:`run_step`); off, its graph of tasks is
# submitted as on many workers (bench/executors.py measures both)
ONE_TASK_PER_STEP = True
# on several workers, the strips of a pass are one task per worker (:meth:`CaviRunner._strips`);
# off, a task per strip (bench/executors.py measures both)
ONE_TASK_PER_WORKER = True
FIRST_NOTICE_SECONDS = 10.0  # a first iteration running longer is explained in the log


@dataclass(frozen=True)
class CaviConfig:
    """Hyper-parameters of one run, validated by :func:`ordnmf_dask.params.validate` (their
    defaults and rules are the table's)."""

    n_components: int
    alpha_W: float = DEFAULTS["alpha_W"]
    alpha_H: float = DEFAULTS["alpha_H"]
    tol: float = DEFAULTS["tol"]
    max_iter: int = DEFAULTS["max_iter"]
    min_iter: int = DEFAULTS["min_iter"]
    seed: int = DEFAULTS["seed"]
    optimizer: str = DEFAULTS["optimizer"]
    anneal: int = DEFAULTS["anneal"]


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
    stop_reason: str = "max_iter"  # "tol", "max_iter", "patience" or "callback"
    best_iteration: int = 0  # the iteration whose state w, h, params hold
    validation: list[dict[str, Any]] = field(default_factory=list)  # one entry per evaluation
    passes: int = 0  # full passes over the training blocks, refused extrapolations included
    extrapolations: list[int] = field(default_factory=lambda: [0, 0])  # [kept, refused]

    @property
    def n_iter(self) -> int:
        return len(self.elbo)


@dataclass
class IterationInfo:
    """What a fit's callback receives after each iteration.

    ``rel_change``: the relative ELBO gain (inf at the first iteration); ``seconds``: this
    iteration's wall time, ``elapsed``: since the loop started; ``params``: Delta, or p for
    dcPF; ``validation``: this iteration's validation figures (None when it was not evaluated);
    ``best_iteration``: the best validated iteration so far (None without validation);
    ``passes``: full passes over the training blocks so far (:attr:`CaviState.passes`). A
    callback stops the fit by returning True or calling :meth:`stop`.
    """

    iteration: int
    max_iter: int
    elbo: float
    rel_change: float
    seconds: float
    elapsed: float
    params: Any
    validation: dict[str, Any] | None = None
    best_iteration: int | None = None
    passes: int = 0
    stop_requested: bool = False

    def stop(self) -> None:
        """Stop the fit after this iteration."""
        self.stop_requested = True


IterationCallback = Callable[[IterationInfo], bool | None]


class CaviRunner:
    """Drives the CAVI iterations of one fit on ``client`` over the blocks of ``store`` (or
    over ``held``, the blocks of its grid already in memory, with an in-process client)."""

    def __init__(
        self,
        client: Client,
        store: StoreInfo,
        family: Family,
        config: CaviConfig,
        checkpoint_dir: str,
        cache_blocks: bool,
        checkpoint_every: int = DEFAULTS["checkpoint_every"],
        checkpoint_minutes: float | None = DEFAULTS["checkpoint_minutes"],
        fingerprint: str = "",
        held: list[list[CsrBlock]] | None = None,
        checkpoint_tag: str = "",
    ) -> None:
        self.client = client
        self.store = store
        self.family = family
        self.cfg = config
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.checkpoint_minutes = checkpoint_minutes
        self.fingerprint = fingerprint
        self.checkpoint_tag = checkpoint_tag  # an ensemble member's (checkpoint.member_tag)
        n_r, n_c = store.grid
        refs = [
            [tasks.BlockRef(store.path, "train", r, c, family.values) for c in range(n_c)]
            for r in range(n_r)
        ]
        # row strips: user-block r x a run of item-blocks; column strips: the transpose
        self.groups = runs(np.diff(store.col_bounds), n_r, MAX_STRIP_COLS)
        self.row_runs = runs(np.diff(store.row_bounds), n_c, MAX_STRIP_ROWS)
        workers = sorted(client.scheduler_info()["workers"])
        self._home = homes(workers, n_r, self.groups, self.row_runs)
        # strips read factor chunks through views (:meth:`_views`) where chunks cross processes
        self._viewed = len(workers) > 1
        # on one worker a step is one task, its graph run on the worker's threads (:func:`run_step`)
        self.fused = (
            ONE_TASK_PER_STEP and not self._viewed and not isinstance(client, InProcessClient)
        )
        if held is not None:  # blocks in memory (the subsample start's sub-fit, in-process)
            self.blocks = held
        elif cache_blocks:
            load, home = tasks.materialize, self._home["block"]
            self.blocks = [
                [client.submit(load, refs[r][c], **home[r][c]) for c in range(n_c)]
                for r in range(n_r)
            ]
        else:
            self.blocks = refs
        self.cached = cache_blocks or held is not None
        # full passes over the blocks per iteration: the two rate passes and the local pass
        self.passes_per_iteration = 3 if family.uses_correction else 1
        # the stopping rule averages the gain over an optimizer's cycle: SQUAREM's steps gain
        # unevenly (an extrapolated one much more than the two plain ones after it)
        self.stop_window = 3 if config.optimizer == "squarem" else 1
        self.squarem = Squarem(self) if config.optimizer == "squarem" else None

    # -- initial state -------------------------------------------------------------------
    def random_init(self) -> tuple[list[Future], list[Future]]:
        """Gamma(1, 1) draws from ``seed``, per block, independent of the grid."""
        k, seed, s = self.cfg.n_components, self.cfg.seed, self.store
        submit, fn, rows, cols = self.client.submit, tasks.random_chunk, s.row_bounds, s.col_bounds
        w = [
            submit(fn, seed, 0, int(rows[r]), int(rows[r + 1]), k, **self._home["row"][r])
            for r in range(len(rows) - 1)
        ]
        h = [
            submit(fn, seed, 1, int(cols[c]), int(cols[c + 1]), k, **self._home["col"][c])
            for c in range(len(cols) - 1)
        ]
        return w, h

    def warm_init(self, w_path: str, h_path: str) -> tuple[list[Future], list[Future]]:
        """Initial E[W], E[H] read by the workers from zarr arrays of shape (U, K), (I, K)."""
        rows, cols = self.store.row_bounds.tolist(), self.store.col_bounds.tolist()
        return self.submit_initial(
            tasks.rows_chunk,
            [(w_path, lo, hi) for lo, hi in zip(rows[:-1], rows[1:], strict=True)],
            [(h_path, lo, hi) for lo, hi in zip(cols[:-1], cols[1:], strict=True)],
        )

    def submit_initial(
        self,
        fn: Callable[..., Any],
        w_args: list[tuple[Any, ...]],
        h_args: list[tuple[Any, ...]],
    ) -> tuple[list[Future], list[Future]]:
        """Initial chunks ``fn(*args)``, one per user-block and per item-block, each submitted
        to the worker its chunk will live on."""
        submit = self.client.submit
        w = [submit(fn, *a, pure=False, **self._home["row"][r]) for r, a in enumerate(w_args)]
        h = [submit(fn, *a, pure=False, **self._home["col"][c]) for c, a in enumerate(h_args)]
        return w, h

    # -- passes --------------------------------------------------------------------------
    def _views(self, chunks: list[Any], side: str) -> list[Any]:
        """The passes' views (:func:`~.tasks.pass_view`) of W (``side`` "row") or H ("col")
        chunks, each made on its chunk's worker; the chunks themselves on one worker, where
        nothing moves. Pure tasks: the views of a chunk asked for by two passes are one task."""
        if not self._viewed:
            return chunks
        home, submit = self._home[side], self.client.submit
        return [submit(tasks.pass_view, x, **home[j]) for j, x in enumerate(chunks)]

    def _strip(self, g: int, items: list[Any]) -> list[Any]:
        """``items`` (indexed by item-block) restricted to the item-blocks of group g."""
        return [items[c] for c in self.groups[g]]

    def _local_pass(
        self, w: list[Future], h: list[Future], params: Any
    ) -> tuple[list[reduce.Lazy], list[reduce.Lazy], Future]:
        """Local step by row strips; SW summed over a row's strips, SH over the user-blocks
        on the H chunks' workers (lazy parts of the sums), and the family's O(V) statistics
        summed over all strips."""
        client, fam, home, blocks = self.client, self.family, self._home["strip"], self.blocks
        w, h = self._views(w, "row"), self._views(h, "col")
        n_g = len(self.groups)
        calls = [
            ((self._strip(g, blocks[r]), w[r], self._strip(g, h), fam, params), home[r][g])
            for r in range(len(blocks))
            for g in range(n_g)
        ]
        n_r, by_item = (
            len(blocks),
            [(g, j, c) for g, grp in enumerate(self.groups) for j, c in enumerate(grp)],
        )
        sums: list[Sum] = [
            ([r * n_g + g for g in range(n_g)], ["sw", "small"], None) for r in range(n_r)
        ]
        sums += [
            ([r * n_g + g for r in range(n_r)], ("sh", j), self._home["col"][c])
            for g, j, c in by_item
        ]
        flat, local = self._strips(tasks.local_strip, calls, sums)
        stats = [flat[r * n_g : (r + 1) * n_g] for r in range(n_r)]
        # (SW, small) of each user-block, one tree per user-block; not lazy: a strip's result
        # also holds its SH parts (n_items x K over the strip), which must not stay in memory
        # until the next W update consumes SW
        rows = [
            tree_sum(client, row, ["sw", "small"], homes=home[r], local=local[r])
            for r, row in enumerate(stats)
        ]
        sw = [reduce.item(x, 0) for x in rows]
        # one tree per item-block, its adds on the H chunk's worker: each strip's part of an
        # item-block moves once, to where the next H update needs it (the same pairing, item
        # by item, as one tree over the tuples of a run's parts)
        sh = [
            tree_sum(
                client,
                [row[g] for row in stats],
                ("sh", j),
                lazy=True,
                at=self._home["col"][c],
                homes=[home[r][g] for r in range(n_r)],
                local=local[n_r + q],
            )
            for q, (g, j, c) in enumerate(by_item)
        ]
        if self._viewed and ONE_TASK_PER_WORKER:  # an SH left in its worker's pass task would
            # keep all that task's strips' results until the next H update: taken out where the
            # task ran (its strips' worker), so that only the sum moves to the H chunk
            sh = [
                client.submit(reduce.resolve, x, priority=PRIORITY, **home[0][g])
                if _in_pass_task(x)
                else x
                for x, (g, _, _) in zip(sh, by_item, strict=True)
            ]
        small = tree_sum(client, rows, 1)
        return sw, sh, small

    def _row_corrections(self, params: Any, h: list[Future]) -> list[Future]:
        """W-rate terms by row strips, summed over a row's strips."""
        client, fam, home = self.client, self.family, self._home["strip"]
        h, n_g = self._views(h, "col"), len(self.groups)
        calls = [
            ((self._strip(g, row), fam, params, self._strip(g, h)), home[r][g])
            for r, row in enumerate(self.blocks)
            for g in range(n_g)
        ]
        n_r = len(self.blocks)
        sums: list[Sum] = [([r * n_g + g for g in range(n_g)], None, None) for r in range(n_r)]
        flat, local = self._strips(tasks.row_correction_strip, calls, sums)
        return [
            tree_sum(
                client, flat[r * n_g : (r + 1) * n_g], lazy=True, homes=home[r], local=local[r]
            )
            for r in range(n_r)
        ]

    def _col_corrections(self, params: Any, w: list[Future]) -> list[Future]:
        """H-rate terms by column strips (item-block c, a run of user-blocks), summed over the
        runs on the worker of H chunk c; each strip on its home (:func:`homes`)."""
        client, fam, home, blocks = self.client, self.family, self._home["colstrip"], self.blocks
        w, n_c, n_q = self._views(w, "row"), self.store.grid[1], len(self.row_runs)
        calls = [
            (([blocks[r][c] for r in run], fam, params, [w[r] for r in run]), home[i][c])
            for c in range(n_c)
            for i, run in enumerate(self.row_runs)
        ]
        sums: list[Sum] = [
            ([c * n_q + i for i in range(n_q)], None, self._home["col"][c]) for c in range(n_c)
        ]
        flat, local = self._strips(tasks.col_correction_strip, calls, sums)
        out = [
            tree_sum(
                client,
                flat[c * n_q : (c + 1) * n_q],
                lazy=True,
                at=self._home["col"][c],
                homes=[home[i][c] for i in range(n_q)],
                local=local[c],
            )
            for c in range(n_c)
        ]
        # one column strip's part in a worker's pass task, for an H chunk elsewhere: taken out
        # there (the update would receive the task's whole result)
        return [
            client.submit(reduce.resolve, x, priority=PRIORITY, **home[0][c])
            if _in_pass_task(x) and home[0][c] != self._home["col"][c]
            else x
            for c, x in enumerate(out)
        ]

    def _strips(
        self,
        fn: Callable[..., Any],
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
        sums: list[Sum] | None = None,
    ) -> tuple[list[reduce.Lazy], list[Supplied | None]]:
        """The strips of a pass, ``fn(*args)`` for each ``(args, home)`` of ``calls``, and
        what each of the ``sums`` after the pass may take from them (``local`` of
        :func:`~ordnmf_dask.runtime.reduce.tree_sum`). A task each in one process (nothing
        supplied); on several workers one task per worker (:func:`run_strips`, up to
        STRIPS_PER_TASK of its strips in pass order) on its home, each strip's result an item of
        that task's result, which also adds the nodes of each sum's fixed tree whose leaves are
        all among its strips (``reduce.own_ranges``; the whole tree too when its adds may end
        there, the sum's ``at``). The same functions of the same inputs, the same trees: the
        sums do not change (docs/design.md §4, "One task per worker per pass")."""
        submit, sums = self.client.submit, sums or []
        if not (self._viewed and ONE_TASK_PER_WORKER):
            return [submit(fn, *args, **home) for args, home in calls], [None] * len(sums)
        mine: dict[tuple[str, ...], list[int]] = {}
        for j, (_, home) in enumerate(calls):
            mine.setdefault(tuple(home["workers"]), []).append(j)
        batches = [
            ids[lo : lo + STRIPS_PER_TASK]
            for ids in mine.values()
            for lo in range(0, len(ids), STRIPS_PER_TASK)
        ]
        spot = {j: (b, i) for b, batch in enumerate(batches) for i, j in enumerate(batch)}
        jobs: list[list[tuple[list[int], reduce.Field]]] = [[] for _ in batches]
        given: list[dict[tuple[int, int], tuple[int, int]]] = []
        for ids, taken, at in sums:
            where = [tuple(calls[j][1]["workers"]) for j in ids]
            ranges: dict[tuple[int, int], tuple[int, int]] = {}
            for lo, hi in reduce.own_ranges(len(ids), where.__getitem__, reduce.LEVELS):
                whole = (lo, hi) == (0, len(ids))
                (b, *other) = {spot[j][0] for j in ids[lo:hi]}
                if other or (whole and at is not None and tuple(at["workers"]) != where[0]):
                    continue  # over several of its tasks, or to end on another worker
                ranges[lo, hi] = (b, len(jobs[b]))
                jobs[b].append(([spot[j][1] for j in ids[lo:hi]], taken))
            given.append(ranges)
        name = f"{fn.__name__.replace('_', '-')}s"
        done = [  # a worker's one strip is its task as it stands (there is nothing to add)
            submit(fn, *calls[batch[0]][0], **calls[batch[0]][1])
            if len(batch) == 1
            else submit(
                run_strips,
                fn,
                [calls[j][0] for j in batch],
                jobs[b],
                key=f"{name}-{uuid.uuid4().hex}",
                pure=False,
                **calls[batch[0]][1],
            )
            for b, batch in enumerate(batches)
        ]
        parts: list[reduce.Lazy] = [
            done[b] if len(batches[b]) == 1 else (done[b], (0, i))
            for b, i in (spot[j] for j in range(len(calls)))
        ]
        return parts, [_supplied(done, ranges) for ranges in given]

    def _rows(self) -> dict[str, list[int]]:
        rb, cb = np.diff(self.store.row_bounds).tolist(), np.diff(self.store.col_bounds).tolist()
        return {"W": rb, "H": cb, "SW": rb, "SH": cb}

    # -- the loop ------------------------------------------------------------------------
    def iteration(self, st: Flight, number: int) -> Flight:
        """Submit iteration ``number`` of the fit (docs/design.md §2 steps 1-6) after ``st``;
        nothing waits. Its prior shapes follow the annealing schedule (:mod:`.anneal`).

        Every input is a future, the global parameters included (step 2 runs on a worker), so
        the client can submit iteration n + 1 before iteration n's bound has come back.
        """
        if self.fused:
            return self._fused("iteration", [st], number)
        cfg, client, submit, fam = self.cfg, self.client, self.client.submit, self.family
        scale = anneal.scale(number, cfg.anneal)  # exactly 1.0 outside the schedule
        alpha_w, alpha_h = cfg.alpha_W * scale, cfg.alpha_H * scale
        params = submit(tasks.next_params, fam, st.params, st.small, st.w_sum, st.h_sum)
        none = [None] * len(st.w)
        corr_w = self._row_corrections(params, st.h) if fam.uses_correction else none
        w = [
            submit(
                tasks.update_factor,
                st.w[r],
                alpha_w,
                st.sw[r],
                fam,
                params,
                st.h_sum,
                corr_w[r],
                **self._home["row"][r],
            )
            for r in range(len(st.w))
        ]
        w_sum = tree_sum(client, w, "summary", homes=self._home["row"])
        corr_h = self._col_corrections(params, w) if fam.uses_correction else [None] * len(st.h)
        h = [
            submit(
                tasks.update_factor,
                st.h[c],
                alpha_h,
                st.sh[c],
                fam,
                params,
                w_sum,
                corr_h[c],
                **self._home["col"][c],
            )
            for c in range(len(st.h))
        ]
        h_sum = tree_sum(client, h, "summary", homes=self._home["col"])
        sw, sh, small = self._local_pass(w, h, params)
        result = submit(tasks.iteration_result, fam, params, small, w_sum, h_sum)
        return Flight(
            w, h, sw, sh, params, small, w_sum, h_sum, result, passes=self.passes_per_iteration
        )

    @property
    def chunk_homes(self) -> dict[str, list[dict[str, Any]]]:
        """``submit`` keywords placing each W chunk ("row") and H chunk ("col") on its worker."""
        return {"row": self._home["row"], "col": self._home["col"]}

    def start_flight(self, w: list[Future], h: list[Future], params: Any) -> Flight:
        """The state a first iteration starts from: factor chunks ``w``, ``h`` (a start, or an
        extrapolation) with a local pass at them under ``params`` (one pass over the blocks)."""
        if self.fused:
            return self._fused("start", [{"w": w, "h": h, "params": params}], 0)
        sw, sh, small = self._local_pass(w, h, params)
        client = self.client
        w_sum = tree_sum(client, w, "summary", homes=self._home["row"])
        h_sum = tree_sum(client, h, "summary", homes=self._home["col"])
        return Flight(w, h, sw, sh, params, small, w_sum, h_sum, None)

    def extrapolation(
        self, s0: Flight, s1: Flight, s2: Flight, step_max: float, number: int
    ) -> Flight:
        """SQUAREM's extrapolated step from three successive states (its largest step
        ``step_max``), then iteration ``number``; ``s2`` is its fallback."""
        if self.fused:
            out = self._fused("extrapolation", [s0, s1, s2], number, step_max)
            out.step = self.client.submit(tasks.part, out.whole, "step")
        else:
            assert self.squarem is not None
            out = self.squarem.extrapolated(s0, s1, s2, step_max, number)
        out.fallback, out.passes = s2, self.passes_per_iteration + 1
        return out

    def _fused(self, kind: str, states: list[Any], number: int, step_max: float = 0.0) -> Flight:
        """Submit one step (:func:`run_step`) as one task after ``states`` (flights, or the
        initial chunks), and the pick of its result (:func:`~.tasks.part`): two tasks, one
        hop."""
        submit = self.client.submit
        given = [s.whole if isinstance(s, Flight) and s.whole is not None else s for s in states]
        given = [{n: getattr(s, n) for n in PARTS} if isinstance(s, Flight) else s for s in given]
        whole = submit(
            run_step,
            self.store,
            self.family,
            self.cfg,
            self.blocks,
            kind,
            given,
            number,
            step_max,
            pure=False,
            key=f"cavi-{kind}-{uuid.uuid4().hex}",
            priority=PRIORITY,  # before any pick, which waits: the step hands its work over first
        )
        result = None if kind == "start" else submit(tasks.part, whole, "result")
        out = Flight(None, None, None, None, None, None, None, None, result, whole=whole)
        out.passes = 0 if kind == "start" else self.passes_per_iteration
        return out

    def parts(self, st: Flight, stats: bool = False) -> Flight:
        """``st`` with its chunks (and with ``stats`` its shape statistics) as futures: those of
        a step run as one task picked from it (once; nothing is picked that no one reads)."""
        if st.whole is not None:
            submit, (n_r, n_c) = self.client.submit, self.store.grid

            def pick(name: str, n: int) -> list[Any]:
                return [submit(tasks.part, st.whole, name, j) for j in range(n)]

            if st.w is None:
                st.w, st.h = pick("w", n_r), pick("h", n_c)
            if stats and st.sw is None:
                st.sw, st.sh = pick("sw", n_r), pick("sh", n_c)
        return st

    def _advance(self, cur: Flight, number: int) -> Flight:
        """Submit the step after ``cur``, iteration ``number`` of the fit: one iteration, or
        what the SQUAREM optimizer makes of it."""
        if self.squarem is None:
            return self.iteration(cur, number)
        return self.squarem.advance(cur, number)

    def _start_checkpoint(self, st: Flight, n_done: int) -> checkpoint.Pending:
        """Submit the writes of iteration ``n_done``'s chunks (they run as the iteration does)."""
        submit, st = self.client.submit, self.parts(st, stats=True)
        assert st.w is not None and st.h is not None and st.sw is not None and st.sh is not None
        groups = {
            "W": st.w,
            "H": st.h,
            "SW": [submit(reduce.resolve, x) for x in st.sw],
            "SH": [submit(reduce.resolve, x) for x in st.sh],
        }
        return checkpoint.start(
            self.client,
            self.checkpoint_dir,
            n_done,
            groups,
            self.fingerprint,
            self.checkpoint_tag,
        )

    def _finish_checkpoint(
        self, pending: checkpoint.Pending, res: dict[str, Any], state: CaviState
    ) -> Flight:
        """Complete ``pending`` with the client's state and read it back (cutting the task
        lineage); the read-back futures are submitted, not waited for."""
        snap = Snapshot(
            pending.iteration,
            self.family.to_json(res["params"]),
            list(state.elbo),
            state.objective,
            np.asarray(res["small"]).tolist(),
            np.asarray(res["w_sum"]).tolist(),
            np.asarray(res["h_sum"]).tolist(),
            state.passes,
            extrapolation.STEP_MAX0 if self.squarem is None else self.squarem.step_max,
            (state.extrapolations[0], state.extrapolations[1]),
        )
        path, colsums = checkpoint.finish(pending, snap)
        log.debug("checkpoint %s", path)
        groups = checkpoint.reload(self.client, path, self._rows(), colsums)
        return self._restored(groups, res["params"], res["small"], res["w_sum"], res["h_sum"])

    def _restored(
        self, groups: dict[str, list[Future]], params: Any, small: Any, w_sum: Any, h_sum: Any
    ) -> Flight:
        """A state built from chunks read from a checkpoint and the O(K + V) values saved."""
        w, h, sw, sh = (groups[name] for name in checkpoint.GROUPS)
        return Flight(
            w,
            h,
            sw,
            sh,
            params,
            np.asarray(small),
            np.asarray(w_sum),
            np.asarray(h_sum),
            None,
        )

    def run(
        self,
        init: Callable[[], tuple[Any, ...]] | None,
        callback: IterationCallback | None = None,
        resume: bool = False,
        required: bool = False,
        init_params: Any = None,
        validation: Validation | None = None,
    ) -> CaviState:
        """Iterate docs/design.md §2 steps 1-6 until the relative ELBO gain is below tol.

        Iteration n + 1 is submitted before iteration n's bound is gathered (the workers never
        wait for the client); when n stops the fit, n + 1 is dropped and n's state is the
        result, exactly as in a one-at-a-time loop. ``init`` submits the initial E[W], E[H]
        chunks (e.g. ``self.random_init``), only when the run starts from scratch; the global
        parameters are its third item if it returns one, else ``init_params``, else the
        family's. With ``resume``, the state is read from the newest valid checkpoint of this
        run's fingerprint taken before max_iter (``init`` is used when there is none, or
        InputError if ``required``), and the run continues exactly as the interrupted one
        would have; other checkpoints in the directory are never touched.

        ``callback`` receives an :class:`IterationInfo` after each iteration and may stop the
        fit. With ``validation``, the state is scored every ``validation.every`` iterations
        (figures to the callback and ``CaviState.validation``), the fit stops early by
        :func:`~.control.early_stopping`, and the result is the state that rule keeps
        (``best_iteration``). The loop asks its components (:mod:`.control`) when to
        checkpoint (:class:`_Saves`) and whether to stop (:meth:`_stops`).
        """
        cfg, squarem = self.cfg, self.squarem
        cur, state, first = self._begin(init, resume, required, init_params)
        saves = _Saves(self, CheckpointPolicy(self.checkpoint_every, self.checkpoint_minutes))
        scorer = None if validation is None else EarlyStopping(validation, cfg.anneal)
        judge = _Judge(StopRule(cfg.tol, cfg.min_iter, cfg.anneal, self.stop_window), scorer)
        ahead: Flight | None = None  # iteration n + 1, submitted while n is gathered
        held: Flight | None = None  # the chunks of the state (:func:`chunks_of`)
        n = first
        try:
            while n < cfg.max_iter:
                cur = ahead if ahead is not None else self._advance(cur, n + 1)
                last = n + 1 >= cfg.max_iter
                saves.start(cur, n + 1, last, squarem is None or squarem.at_cycle_start())
                ahead = None if (saves.pending is not None or last) else self._advance(cur, n + 2)
                res = self._first_result(cur.result) if n == first else cur.result.result()
                state.passes += cur.passes
                if squarem is not None and not squarem.keep(cur, res, state):
                    cur, ahead = cur.fallback, None  # the next step goes on from the fallback
                    squarem.restart(cur, state.elbo)
                    saves.drop()
                    continue
                n, held, state.params = n + 1, chunks_of(cur), res["params"]
                if self._stops(n, res, state, cur, last, judge, callback):
                    break
                restored = saves.finish(res, state)
                if restored is not None:
                    cur, held = restored, chunks_of(restored)
                    if squarem is not None:
                        squarem.restart(cur, state.elbo)  # the same state, read back
        except BaseException:
            saves.abandon(finish_writes=False)
            raise
        saves.abandon(finish_writes=True)  # written for an iteration that ends the fit
        return self._result(state, held, scorer)

    def _stops(
        self,
        n: int,
        res: dict[str, Any],
        state: CaviState,
        cur: Flight,
        last: bool,
        judge: _Judge,
        callback: IterationCallback | None,
    ) -> bool:
        """Iteration ``n`` (its step ``cur``, its result ``res``; ``last``: max_iter's) told to
        the stop rule, validation and ``callback``: whether the fit stops after it (the reason
        in ``state.stop_reason``). An unsound bound is raised once the callback has seen it."""
        rule, scorer = judge.rule, judge.scorer
        failure = rule.record(state, n, res["elbo"], res["objective"])
        state.converged = rule.converged(state.elbo, n)
        stop = "tol" if state.converged else ("max_iter" if last else None)
        seconds, figures = time.perf_counter() - judge.clock, None
        if scorer is not None and failure is None and scorer.due(n, stop is not None):
            figures, early = scorer.score(n, self.parts(cur), state)
            stop = stop or ("patience" if early else None)
        judge.clock = time.perf_counter()  # validation counts in no iteration's seconds
        info = self._info(n, res, state, seconds, judge.clock - judge.start, figures, scorer)
        if callback is not None and callback(info):
            info.stop()
        if failure is not None:
            raise failure
        if stop or info.stop_requested:
            state.stop_reason = stop or "callback"
            return True
        return False

    def _info(
        self,
        n: int,
        res: dict[str, Any],
        state: CaviState,
        seconds: float,
        elapsed: float,
        figures: dict[str, Any] | None,
        scorer: EarlyStopping | None,
    ) -> IterationInfo:
        """What the callback is told of iteration ``n``, whose result is ``res``."""
        best = None if scorer is None or scorer.best is None else scorer.best[0]
        return IterationInfo(
            n,
            self.cfg.max_iter,
            res["elbo"],
            mean_gain(state.elbo, 1),
            seconds,
            elapsed,
            res["params"],
            figures,
            best,
            state.passes,
        )

    def _begin(
        self,
        init: Callable[[], tuple[Any, ...]] | None,
        resume: bool,
        required: bool,
        init_params: Any,
    ) -> tuple[Flight, CaviState, int]:
        """The state a run starts from (:meth:`run`'s ``init``, ``resume``, ``required`` and
        ``init_params``): its step, the fit's state and the iterations already done."""
        cfg, fam = self.cfg, self.family
        snap = None
        if resume or required:
            try:
                layout = Layout(self._rows(), cfg.n_components, fam, cfg.max_iter)
                groups, snap, path = checkpoint.read_newest(
                    self.client, self.checkpoint_dir, layout, self.fingerprint, self.checkpoint_tag
                )
                log.info("resuming from %s (iteration %d)", path, snap.iteration)
            except CheckpointError as exc:
                if required:
                    raise InputError(f"cannot resume: {exc}") from None
                log.warning("starting from scratch: %s", exc)
        if snap is not None:
            params = fam.from_json(snap.params)
            cur = self._restored(groups, params, snap.small, snap.w_sum, snap.h_sum)
            state = CaviState(cur.w, cur.h, params, list(snap.elbo), snap.objective)
            state.passes, state.extrapolations = snap.passes, list(snap.extrapolations)
            if self.squarem is not None:
                self.squarem.step_max = snap.step_max
            first = snap.iteration
        else:
            if init is None:
                raise ValueError("no initial state and nothing to resume from")
            w, h, *given = init()
            params = given[0] if given else init_params
            params = fam.init_params() if params is None else params
            cur = self.start_flight(w, h, params)
            state = CaviState(w, h, params, passes=1)
            del w, h  # the initial chunks live in ``cur`` and ``state`` until replaced
            first = 0
        if self.squarem is not None:
            self.squarem.restart(cur, state.elbo)
        return cur, state, first

    def _result(
        self, state: CaviState, held: Flight | None, scorer: EarlyStopping | None
    ) -> CaviState:
        """``state`` as the fit's result: the chunks of its last iteration (``held``), or of the
        state validation keeps, as futures. An iteration submitted ahead of a stop was dropped
        with the loop's ``ahead``: releasing its futures makes the scheduler forget its tasks
        (``Client.cancel`` on a graph whose dependencies the client also holds trips an
        assertion in the scheduler)."""
        state.best_iteration = state.n_iter
        if scorer is not None and scorer.best is not None:
            state.best_iteration, held, state.params = scorer.best
        if held is not None:
            held = self.parts(held)
            assert held.w is not None and held.h is not None
            state.w, state.h = held.w, held.h
        return state

    def _first_result(self, result: Future) -> dict[str, Any]:
        """The first iteration's result; says what the workers are doing if it is slow."""
        try:
            return result.result(timeout=FIRST_NOTICE_SECONDS)
        except TimeoutError:
            blocks = "to keep in memory" if self.cached else "streamed"
            if isinstance(self.client, InProcessClient):
                who = "this process reads the training blocks from the store (%s) and compiles"
                once = "once per machine: the compiled kernels are cached"
            else:
                who = "the workers read the training blocks from the store (%s) and compile"
                once = "once per worker"
            log.info(
                f"iteration 1 of %d still running after %.0f s: {who} the numba kernels "
                f"({once}); later iterations are faster",
                self.cfg.max_iter,
                FIRST_NOTICE_SECONDS,
                blocks,
            )
            return result.result()


@dataclass
class _Judge:
    """The loop's components that judge an iteration (:meth:`CaviRunner._stops`): the bound's
    checks and stopping rule, validation (None without), and the clock of the iterations'
    seconds (``start``: the loop's; ``clock``: the last iteration's end)."""

    rule: StopRule
    scorer: EarlyStopping | None
    start: float = field(default_factory=time.perf_counter)
    clock: float = 0.0

    def __post_init__(self) -> None:
        self.clock = self.start


@dataclass
class _Saves:
    """The loop's checkpoints: when to take one (``policy``) and the one being written
    (``pending``), submitted with an iteration and completed (read back, which cuts the task
    lineage) once that iteration has been judged, or abandoned."""

    runner: CaviRunner
    policy: CheckpointPolicy
    pending: checkpoint.Pending | None = None

    def start(self, cur: Flight, n_done: int, last: bool, cycle_start: bool) -> None:
        """The writes of iteration ``n_done``'s state (step ``cur``), if the policy takes one."""
        if self.policy.take(n_done, last, cycle_start):
            self.pending = self.runner._start_checkpoint(cur, n_done)

    def drop(self) -> None:
        """The step being written was refused (SQUAREM): its checkpoint is owed again."""
        if self.pending is not None:
            self.abandon(finish_writes=True)
            self.policy.dropped()

    def finish(self, res: dict[str, Any], state: CaviState) -> Flight | None:
        """The state read back from the checkpoint being written, now completed with ``res``
        and ``state``; None without one."""
        if self.pending is None:
            return None
        restored = self.runner._finish_checkpoint(self.pending, res, state)
        self.pending = None
        self.policy.taken()
        return restored

    def abandon(self, finish_writes: bool) -> None:
        """Give up the checkpoint being written, if any (``checkpoint.abandon``)."""
        if self.pending is not None:
            checkpoint.abandon(self.pending, finish_writes=finish_writes)
            self.pending = None


def run_step(
    store: StoreInfo,
    family: Family,
    config: CaviConfig,
    blocks: list[list[Any]],
    kind: str,
    states: list[dict[str, Any]],
    number: int,
    step_max: float,
) -> dict[str, Any]:
    """On the one worker of a cluster: one step of a fit, ``kind`` "start" (a local pass at the
    chunks of ``states[0]``), "iteration" or "extrapolation" (after the steps of ``states``,
    their parts), built by the same :class:`CaviRunner` code as on many workers and handed to
    this worker's executor of steps (:func:`steps_executor`; docs/design.md §4, "One task per
    step"). Returns at once the new state's parts, its result and step as in-process futures
    (or lazy parts of them), which the next step's tasks and the client's picks
    (:func:`~.tasks.part`) wait for."""
    runner = CaviRunner(steps_executor(), store, family, config, "", True, 0, None, held=blocks)
    if kind == "start":
        out = runner.start_flight(states[0]["w"], states[0]["h"], states[0]["params"])
    else:
        flights = [Flight(*(s[n] for n in PARTS), None) for s in states]
        if kind == "iteration":
            out = runner.iteration(flights[0], number)
        else:
            out = runner.extrapolation(*flights, step_max, number)
    return {**{n: getattr(out, n) for n in PARTS}, "result": out.result, "step": out.step}


Sum = tuple[list[int], reduce.Field, "dict[str, Any] | None"]
"""A sum after a pass (:meth:`CaviRunner._strips`): the strips it adds, in its tree's order,
the field it takes of each, and where its adds end (``at`` of ``reduce.tree_sum``)."""
Supplied = Callable[[int, int], "reduce.Lazy | None"]


def _in_pass_task(x: reduce.Lazy) -> bool:
    """Whether ``x`` is a part of a worker's pass task (:func:`run_strips`: its path starts at
    the task's list of results or of sums), not of one strip's task."""
    return isinstance(x, tuple) and isinstance(x[1], tuple) and isinstance(x[1][0], int)


def _supplied(done: list[Future], ranges: dict[tuple[int, int], tuple[int, int]]) -> Supplied:
    """``local`` of a sum: the node over leaves [lo, hi) that task ``done[b]`` added, its
    ``s``-th (``ranges[lo, hi] = (b, s)``), else None."""

    def local(lo: int, hi: int) -> reduce.Lazy | None:
        if (lo, hi) not in ranges:
            return None
        b, s = ranges[lo, hi]
        return (done[b], (1, s))

    return local


def run_strips(
    fn: Callable[..., Any],
    calls: list[tuple[Any, ...]],
    sums: list[tuple[list[int], reduce.Field]],
) -> list[list[Any]]:
    """On a worker of several: strips of one pass homed on this worker, ``fn(*args)`` for each
    of ``calls``, run on the worker's threads (its executor of steps: the kernels release the
    GIL), one task and one scheduler round trip for them all; returns their results in order
    and, for each of ``sums`` (strips by position, a field), that field of those strips added
    along the fixed tree (``reduce.sum_parts``: bitwise a node of the tree it stands for)."""
    pool = steps_executor()
    running = [pool.submit(fn, *args) for args in calls]
    results = [f.result() for f in running]
    return [results, [reduce.sum_parts([results[i] for i in at], field) for at, field in sums]]


_STEPS: dict[int, InProcessClient] = {}  # this process's executors of steps, by thread count
_STEPS_LOCK = threading.Lock()


def steps_executor() -> InProcessClient:
    """The in-process executor of this worker process's steps (:func:`run_step`), a thread per
    worker thread, made by the first step and kept: a step hands its tasks to it and returns,
    so the scheduler starts the next step (already submitted) at once, its tasks queue behind
    the running ones, and the iterations overlap as in an in-process fit; the task hop between
    steps is hidden behind their work (the worker's malloc setting is the fit's:
    :func:`~ordnmf_dask.runtime.mallocplugin.set_worker_malloc`)."""
    from distributed import get_worker

    threads = get_worker().state.nthreads
    with _STEPS_LOCK:
        if threads not in _STEPS:
            _STEPS[threads] = InProcessClient(threads)
        return _STEPS[threads]


MAX_STRIP_COLS = 2**18  # items per row strip: its E[H], GH and SH tables stay ~100 MB at K = 50
MAX_STRIP_ROWS = 2**18  # users per column strip: its E[W] tables stay ~100 MB at K = 50
MAX_STRIP_BLOCKS = 8  # blocks per strip: a pass has at least n_r n_c / 8 tasks to spread
MIN_STRIPS = 64  # strips per pass wanted (when there are that many blocks): work for 64 workers
# on several workers, strips of a pass one task runs on its worker's threads (:func:`run_strips`):
# its memory is that of as many strips' results
STRIPS_PER_TASK = 8


def runs(widths: np.ndarray, across: int, limit: int) -> list[list[int]]:
    """Indices 0..n-1 (block positions along one axis of the grid) cut into contiguous runs of
    about equal count: one strip per (run, block on the other axis).

    As few runs as keep every strip within MAX_STRIP_BLOCKS blocks and ``limit`` factor rows
    (``widths``: rows per block; a single wider block is its own run), and give at least
    MIN_STRIPS strips when there are that many blocks (``across``: blocks on the other axis).
    The cut depends on the grid only, never on the cluster: sums are bit-identical whatever the
    number of workers.
    """
    n = len(widths)
    count = max(
        -(-n // MAX_STRIP_BLOCKS),
        -(-MIN_STRIPS // max(across, 1)),
        -(-int(np.sum(widths)) // limit),
    )
    out: list[list[int]] = []
    todo = [list(map(int, a)) for a in np.array_split(np.arange(n), min(n, count))]
    while todo:  # halve a run of several blocks that is still too wide (uneven block sizes)
        run = todo.pop(0)
        if len(run) > 1 and int(np.sum(widths[run])) > limit:
            todo[:0] = [run[: len(run) // 2], run[len(run) // 2 :]]
        else:
            out.append(run)
    return out


def homes(
    workers: list[str], n_r: int, groups: list[list[int]], row_runs: list[list[int]]
) -> dict[str, list[Any]]:
    """Preferred workers (``submit`` keywords) of each row strip, block, column strip, W chunk
    and H chunk.

    Row strips go to the n workers in contiguous runs in grid order, about as many blocks to
    each (a strip whose middle is block b of B, in row-major order, on worker ``b * n // B``);
    the blocks of a strip live where it runs (cached blocks never move), and W chunk r with the
    first strip of user-block r (with one strip per user-block, W chunks, SW and the W-rate
    sums never cross the network). Column strip (run i of ``row_runs``, item-block c) goes to
    the worker of one of its blocks, in grid order to the one given the fewest blocks of column
    strips so far: the H-rate pass spreads over the workers that hold blocks (in practice all
    of them), and no cached block is copied to a worker holding none of a strip's blocks
    (Dask's memory manager would drop the copy, to be sent again every iteration). H chunk c
    prefers worker ``c * n // n_c``. The restrictions are loose (``allow_other_workers``): a
    lost worker's tasks run elsewhere. None with one worker, or none connected yet (a cluster
    still starting).
    """
    n = len(workers)
    sizes = [len(g) for g in groups]
    n_c = sum(sizes)

    def at(j: int) -> dict[str, Any]:
        return {"workers": [workers[j]], "allow_other_workers": True} if n > 1 else {}

    mid2 = 2 * np.cumsum([0, *sizes[:-1]]) + sizes  # twice a strip's middle in its row
    on = [[(2 * r * n_c + int(m)) * n // (2 * n_r * n_c) for m in mid2] for r in range(n_r)]
    where = [[on[r][g] for g, group in enumerate(groups) for _ in group] for r in range(n_r)]
    count = [0] * max(n, 1)
    colstrip = []
    for run in row_runs:
        line = []
        for c in range(n_c):
            j = min((where[r][c] for r in run), key=lambda x: count[x])
            count[j] += len(run)
            line.append(at(j))
        colstrip.append(line)
    strip = [[at(j) for j in row] for row in on]
    return {
        "strip": strip,
        "block": [[at(j) for j in row] for row in where],
        "colstrip": colstrip,
        "row": [strip[r][0] for r in range(n_r)],
        "col": [at(c * n // n_c) for c in range(n_c)],
    }
