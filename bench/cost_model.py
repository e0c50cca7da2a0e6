"""Cost model of one exact CAVI iteration on P single-thread workers (docs/design.md, "Cost of
one iteration").

The task graph of an iteration is rebuilt from the engine's own placement rules
(``engine.cavi.runs`` and ``engine.cavi.homes``: strips, preferred workers), without running
anything. Per pass, each worker's kernel seconds are the sum of its tasks' (nonzeros x ns per
nonzero, factor entries x ns per entry); a pass lasts as long as its busiest worker, plus the
bytes that worker receives over the bandwidth B, plus the dependent task hops of the pass, each
costing h. The scheduler handles the iteration's tasks one after the other (s per task): when
that exceeds the workers' time, it is the iteration's time. Tasks stay where the placement puts
them (no work stealing): with cached blocks a task's blocks live on its preferred worker.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from ordnmf_dask.engine import cavi
from ordnmf_dask.engine.cavi import MAX_STRIP_COLS, MAX_STRIP_ROWS, STRIPS_PER_TASK, homes, runs
from ordnmf_dask.runtime import reduce

F64 = 8


@dataclass(frozen=True)
class Rates:
    """Machine parameters: one thread's kernel costs, bytes/s into one worker, seconds per
    dependent task hop, scheduler seconds per task."""

    local_ns: float  # local step, per nonzero
    corr_ns: float  # both rate corrections, per nonzero (each pass takes half)
    gamma_ns: float  # Gamma update, per factor entry
    bandwidth: float = 1e9  # bytes/s received by one worker
    hop_s: float = 2e-3  # one dependent task hop: finish -> scheduler -> next task starts
    sched_s: float = 0.3e-3  # scheduler CPU per task


@dataclass(frozen=True)
class Grid:
    """The block grid of a store: row and column bounds, nonzeros per block (R x C), K."""

    row_bounds: np.ndarray
    col_bounds: np.ndarray
    nnz: np.ndarray  # (R, C)
    k: int

    @classmethod
    def balanced(cls, n_users: int, n_items: int, nnz: float, r: int, c: int, k: int) -> Grid:
        """Equal rows per user-block, equal columns per item-block, nonzeros spread evenly
        (what the degree-quantile cuts give on the synthetic stores)."""
        rb = np.linspace(0, n_users, r + 1).round().astype(np.int64)
        cb = np.linspace(0, n_items, c + 1).round().astype(np.int64)
        return cls(rb, cb, np.full((r, c), nnz / (r * c)), k)


@dataclass
class Prediction:
    """Predicted seconds of one iteration and its parts."""

    seconds: float
    kernel: dict[str, float]  # pass -> busiest worker's kernel seconds
    transfer_s: float  # bytes into the busiest receiver of each pass / B, summed over passes
    hops: int
    hop_s: float
    n_tasks: int
    sched_s: float
    bytes_moved: float  # between workers, whole iteration
    workers_used: dict[str, int]  # pass -> workers that get tasks
    kernel_total: float  # one thread's kernel seconds of the iteration


def _depth(n: int) -> int:
    """Dependent combining tasks of a reduction over n inputs (``reduce.LEVELS`` levels of the
    tree per task)."""
    return -(-(math.ceil(math.log2(n)) if n > 1 else 0) // reduce.LEVELS)


def _adds(n: int) -> int:
    """Combining tasks of a reduction over n inputs (the nodes of ``reduce.fold_grouped``)."""
    nodes: list[None] = []
    reduce.fold_grouped(n, lambda j: None, lambda *node: nodes.append(None), reduce.LEVELS)
    return len(nodes)


def _pass_tasks(locs: list[str], several: bool) -> int:
    """Tasks of a pass whose strips run on the workers ``locs``: one per strip, or on several
    workers one per worker for each ``STRIPS_PER_TASK`` of its strips
    (``engine.cavi.CaviRunner._strips``)."""
    if not (several and cavi.ONE_TASK_PER_WORKER):
        return len(locs)
    return sum(-(-n // STRIPS_PER_TASK) for n in Counter(locs).values())


def predict(
    grid: Grid,
    p: int,
    rates: Rates,
    views: bool | None = None,
    h_rate_by_rows: bool = False,
    threads: int = 1,
) -> Prediction:
    """The iteration's predicted seconds on ``p`` workers of ``threads`` threads each (a
    worker's tasks of a pass spread over its threads: it takes its kernel seconds / threads,
    or its longest task if that is longer; threads share the worker's chunks).

    ``views``: strips read factor chunks through views made on the chunks' workers (mean and geo
    only: 2 (n, K) arrays sent, R + C more tasks and 2 more hops per iteration), as the engine
    does on more than one worker (None: p > 1); False: chunks sent whole (mean, geo, shape and
    the (n, 1) prior rate). A variant the engine does not do, to size a design change:
    ``h_rate_by_rows``: the H-rate pass run on the row strips, where the new W already is (each
    strip emits its items' partial sums, added along a tree over the user-blocks as SH is), so
    no W chunk moves (its per-item partial sums do instead, to the H chunks' workers).
    """
    n_r, n_c = grid.nnz.shape
    k = grid.k
    rows, cols = np.diff(grid.row_bounds), np.diff(grid.col_bounds)
    groups = runs(cols, n_r, MAX_STRIP_COLS)
    row_runs = runs(rows, n_c, MAX_STRIP_ROWS)
    names = [f"w{j}" for j in range(p)]
    home = homes(names, n_r, groups, row_runs)

    def at(h: dict) -> str:
        return h["workers"][0] if h else "w0"

    strip = [[at(home["strip"][r][g]) for g in range(len(groups))] for r in range(n_r)]
    w_home = [at(h) for h in home["row"]]
    h_home = [at(h) for h in home["col"]]
    views = p > 1 if views is None else views
    # a view: mean and geo; a whole chunk: mean, geo, shape and the prior rate (n, 1)
    chunk_w = 2 * F64 * k * rows if views else 3 * F64 * k * rows + F64 * rows
    chunk_h = 2 * F64 * k * cols if views else 3 * F64 * k * cols + F64 * cols
    col_strip = [[at(h) for h in line] for line in home["colstrip"]]

    load: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    longest: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def add(pass_: str, worker: str, seconds: float) -> None:
        load[pass_][worker] += seconds
        longest[pass_][worker] = max(longest[pass_][worker], seconds)

    recv: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    held: set[tuple[str, str]] = set()  # (object, worker): replicas made this iteration

    def fetch(pass_: str, obj: str, size: float, src: str, dst: str) -> None:
        if src != dst and (obj, dst) not in held:
            held.add((obj, dst))
            recv[pass_][dst] += size

    def tree(pass_: str, locs: list[str], size: float, dst: str | None) -> str:
        """The fixed tree of adds over partials at ``locs`` (``reduce.fold_grouped`` with the
        inputs' homes: a subtree of one worker's partials added there, any other combining task
        where its first input is, the others sent there), then to ``dst``; returns where the
        sum ends."""

        def node(shape: reduce.Shape, values: list[str], where: object) -> str:
            recv[pass_][values[0]] += size * sum(v != values[0] for v in values[1:])
            return values[0]

        end = reduce.fold_grouped(
            len(locs), locs.__getitem__, node, reduce.LEVELS, locs.__getitem__
        )
        if dst is not None and end != dst:
            recv[pass_][dst] += size
        return end

    def owner_sum(pass_: str, locs: list[str], c: int) -> None:
        """The partials of item-block c at ``locs`` added on its H chunk's worker: each one not
        already there is sent there."""
        away = sum(loc != h_home[c] for loc in locs)
        recv[pass_][h_home[c]] += away * F64 * k * cols[c]

    def item_sums(pass_: str, g: int, group: list[int]) -> None:
        """Per-item partial sums of the row strips of run g, to each item-block's H chunk."""
        for c in group:
            owner_sum(pass_, [strip[r][g] for r in range(n_r)], c)

    n_g = len(groups)
    n_tasks = 1 + (n_r + n_c if views else 0)  # next_params, the views
    # W-rate pass: row strips, old H (replicated in the previous local pass: no fetch)
    for r in range(n_r):
        for g, group in enumerate(groups):
            add("W-rate", strip[r][g], rates.corr_ns / 2 * 1e-9 * grid.nnz[r, group].sum())
        n_tasks += _adds(len(groups))
        tree("W-rate", strip[r], F64 * k * rows[r], w_home[r])
    row_strips = [j for line in strip for j in line]
    n_tasks += _pass_tasks(row_strips, p > 1)
    # W update, column sums of W
    for r in range(n_r):
        add("W update", w_home[r], rates.gamma_ns * 1e-9 * rows[r] * k)
    n_tasks += n_r + n_r + _adds(n_r)
    if h_rate_by_rows:  # H-rate pass on the row strips: partial sums of items move, not W
        for r in range(n_r):
            for g, group in enumerate(groups):
                add("H-rate", strip[r][g], rates.corr_ns / 2 * 1e-9 * grid.nnz[r, group].sum())
        for g, group in enumerate(groups):
            item_sums("H-rate", g, group)
        n_tasks += _pass_tasks(row_strips, p > 1) + n_c * (n_r + _adds(n_r))
    else:  # column strips need the new W of their run
        for i, run in enumerate(row_runs):
            for c in range(n_c):
                dst = col_strip[i][c]
                add("H-rate", dst, rates.corr_ns / 2 * 1e-9 * grid.nnz[run, c].sum())
                for r in run:
                    fetch("H-rate", f"W{r}", chunk_w[r], w_home[r], dst)
        for c in range(n_c):
            locs = [col_strip[i][c] for i in range(len(row_runs))]
            owner_sum("H-rate", locs, c)
        n_tasks += n_c * _adds(len(row_runs))
        n_tasks += _pass_tasks([j for line in col_strip for j in line], p > 1)
    # H update, column sums of H
    for c in range(n_c):
        add("H update", h_home[c], rates.gamma_ns * 1e-9 * cols[c] * k)
    n_tasks += n_c + n_c + _adds(n_c)
    # local pass: row strips need W_r and the new H of their group
    for r in range(n_r):
        for g, group in enumerate(groups):
            dst = strip[r][g]
            add("local", dst, rates.local_ns * 1e-9 * grid.nnz[r, group].sum())
            fetch("local", f"W{r}", chunk_w[r], w_home[r], dst)
            for c in group:
                fetch("local", f"H{c}", chunk_h[c], h_home[c], dst)
        tree("local", strip[r], F64 * k * rows[r], w_home[r])  # SW to the next W update
    for g, group in enumerate(groups):
        item_sums("local", g, group)
    n_tasks += _pass_tasks(row_strips, p > 1)  # the strips
    n_tasks += n_r * (n_g if n_g > 1 else 1) + n_r * _adds(n_g)  # SW trees
    n_tasks += (n_c + 1) * (n_r + _adds(n_r)) + 1  # SH trees, per-class sums, result
    kernel = {
        name: max(max(sec / threads, longest[name][j]) for j, sec in per.items())
        for name, per in load.items()
    }
    transfer = sum(max(per.values(), default=0.0) for per in recv.values()) / rates.bandwidth
    # one chain of dependent hops (docs/design.md): params, W-rate strip and tree, W update,
    # W column sums, H update, local strip, SW/small trees back to the next params
    hops = 8 + 2 * _depth(n_g) + 2 * _depth(n_r) + (0 if n_g == 1 else 1) + (2 if views else 0)
    workers = sum(kernel.values()) + transfer + hops * rates.hop_s
    sched = n_tasks * rates.sched_s
    total_kernel = sum(sum(per.values()) for per in load.values())
    return Prediction(
        max(workers, sched),
        kernel,
        transfer,
        hops,
        rates.hop_s,
        n_tasks,
        sched,
        sum(sum(per.values()) for per in recv.values()),
        {name: len(per) for name, per in load.items()},
        total_kernel,
    )
