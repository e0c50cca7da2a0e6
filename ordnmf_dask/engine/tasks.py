"""Functions that run on the workers. Module-level, small arguments, no closures."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ordnmf_dask.model import extrapolation, kernels
from ordnmf_dask.model.families import Family
from ordnmf_dask.model.kernels import CsrBlock, RowStats
from ordnmf_dask.model.updates import FactorChunk, update_chunk
from ordnmf_dask.runtime import inprocess
from ordnmf_dask.runtime.reduce import resolve
from ordnmf_dask.store.csr import load_block

INIT_ROWS = 4096  # rows per random-initialization seed: the init does not depend on the grid


@dataclass(frozen=True)
class BlockRef:
    """Where to read a block from when it is not cached on the workers (streaming mode)."""

    path: str
    split: str
    r: int
    c: int
    values: str = "class"


def materialize(block: CsrBlock | BlockRef, reuse: bool = False) -> CsrBlock:
    """A cached block as is, or a streamed block read now (into the thread's reused buffers
    with ``reuse``: then valid until its next reusing read)."""
    if isinstance(block, BlockRef):
        return load_block(block.path, block.split, block.r, block.c, block.values, reuse)
    return block


def grid_free_rows(
    seed: int, which: int, start: int, stop: int, draw: Callable[[np.random.Generator], np.ndarray]
) -> np.ndarray:
    """Random rows [start, stop) independent of the block grid: rows are drawn in fixed groups
    of INIT_ROWS, group g by ``draw`` from its own stream ``SeedSequence([seed, which, g])``."""
    first, last = start // INIT_ROWS, (stop - 1) // INIT_ROWS
    parts = []
    for group in range(first, last + 1):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, which, group])))
        parts.append(draw(rng))
    rows = np.concatenate(parts)
    offset = first * INIT_ROWS
    return rows[start - offset : stop - offset].copy()


def random_chunk(seed: int, which: int, start: int, stop: int, k: int) -> FactorChunk:
    """Gamma(1, 1) draws for global rows [start, stop) (``which``: 0 for W, 1 for H)."""
    draw = lambda rng: rng.gamma(1.0, 1.0, size=(INIT_ROWS, k))  # noqa: E731
    return FactorChunk.initial(grid_free_rows(seed, which, start, stop, draw))


def sketch_rows(seed: int, start: int, stop: int, width: int) -> np.ndarray:
    """Rows [start, stop) of the SVD start's (I, width) test matrix: standard normal draws and,
    last, a column of ones (whose product with the data gives the row sums)."""
    draw = lambda rng: rng.standard_normal(size=(INIT_ROWS, width - 1))  # noqa: E731
    rows = grid_free_rows(seed, 2, start, stop, draw)
    return np.hstack([rows, np.ones((stop - start, 1))])


def rows_chunk(path: str, start: int, stop: int) -> FactorChunk:
    """Warm-start rows [start, stop) of a zarr array at ``path``."""
    import zarr

    return FactorChunk.initial(zarr.open_array(path, mode="r")[start:stop])


def _read(blocks: Sequence[CsrBlock | BlockRef]) -> Iterator[CsrBlock]:
    """The blocks one at a time: a streamed strip holds one block, decoded into the worker
    thread's reused buffers (each block is done with before the next is read)."""
    return (materialize(b, reuse=True) for b in blocks)


def pass_view(chunk: FactorChunk) -> FactorChunk:
    """What the passes read of ``chunk``: its ``mean`` and ``geo`` (the same arrays, no copy).
    Made on the chunk's worker, so that a strip elsewhere receives these two (n, K) arrays and
    not the shape and prior rate besides."""
    return FactorChunk(chunk.mean, chunk.geo)


def local_strip(
    blocks: Sequence[CsrBlock | BlockRef],
    w: FactorChunk,
    hs: Sequence[FactorChunk],
    family: Family,
    params: Any,
) -> RowStats:
    """Local step of a row strip (blocks (r, c) for a run of c): the family's kernel with
    (mean, geo) of W_r and of each H_c; SW summed in one accumulator, SH per block."""
    return family.kernel(
        _read(blocks),
        w.geo,
        [h.geo for h in hs],
        w.mean,
        [h.mean for h in hs],
        *family.kernel_args(params),
    )


def row_correction_strip(
    blocks: Sequence[CsrBlock | BlockRef], family: Family, params: Any, hs: Sequence[FactorChunk]
) -> np.ndarray:
    """Sparse W-rate term of a row strip, shape (n_rows, K), with the family's G from params."""
    return kernels.row_correction_row(_read(blocks), family.gap(params), [h.mean for h in hs])


def col_correction_strip(
    blocks: Sequence[CsrBlock | BlockRef], family: Family, params: Any, ws: Sequence[FactorChunk]
) -> np.ndarray:
    """Sparse H-rate term of a column strip (blocks (r, c) for a run of r), shape (n_cols, K),
    with the family's G from params."""
    return kernels.col_correction_col(_read(blocks), family.gap(params), [w.mean for w in ws])


def part(parts: dict[str, Any], name: str, j: int | None = None) -> Any:
    """The value of one part of a step run as one task (``engine.cavi.run_step``):
    ``parts[name]``, or its item j, once the in-process tasks computing it have finished (a
    shape statistic taken out of its strip's result)."""
    value = inprocess.value(parts[name] if j is None else parts[name][j])
    return resolve(value) if name in ("sw", "sh") else value


def next_params(
    family: Family, params: Any, small: np.ndarray, w_sum: np.ndarray, h_sum: np.ndarray
) -> Any:
    """Step 2: the family's global parameters from the summed local statistics."""
    k = len(w_sum) - 1
    return family.update_params(params, small, float(w_sum[:k] @ h_sum[:k]))


def iteration_result(
    family: Family, params: Any, small: np.ndarray, w_sum: np.ndarray, h_sum: np.ndarray
) -> dict[str, Any]:
    """What the client gathers per iteration: the reported and the ascended bound, the global
    parameters and the O(K + V) sums a checkpoint records."""
    k = len(w_sum) - 1
    local, ascended = family.elbo(params, small, float(w_sum[:k] @ h_sum[:k]))
    gamma_terms = float(w_sum[k] + h_sum[k])
    return {
        "elbo": local + gamma_terms,
        "objective": ascended + gamma_terms,
        "params": params,
        "small": small,
        "w_sum": w_sum,
        "h_sum": h_sum,
    }


def update_factor(
    old: FactorChunk,
    alpha: float,
    shape_stat: np.ndarray,
    family: Family,
    params: Any,
    other_summary: np.ndarray,
    correction: np.ndarray | None,
) -> FactorChunk:
    """Gamma update of one chunk; ``other_summary[:K]`` is the other factor's column sum, scaled
    by the family's theta_0 (or t) from ``params``.

    ``shape_stat``, ``other_summary`` and ``correction`` may be lazy (see ``reduce.tree_sum``).
    """
    shape_stat, other_summary = resolve(shape_stat), resolve(other_summary)
    correction = None if correction is None else resolve(correction)
    k = old.mean.shape[1]
    theta0 = family.rate_scale(params)
    return update_chunk(old, alpha, shape_stat, theta0 * other_summary[:k], correction)


def _state(chunk: FactorChunk) -> tuple[np.ndarray, np.ndarray]:
    """What the next iteration reads of a chunk, in logs: (log E[x], E[log x])."""
    return np.log(chunk.mean), np.log(chunk.geo)


def extrapolation_norms(c0: FactorChunk, c1: FactorChunk, c2: FactorChunk) -> np.ndarray:
    """(2, K) ``[|r_k|^2, |v_k|^2]`` of one chunk over three successive states."""
    (m0, g0), (m1, g1), (m2, g2) = _state(c0), _state(c1), _state(c2)
    return extrapolation.squared_norms(m0, m1, m2) + extrapolation.squared_norms(g0, g1, g2)


def extrapolation_step(norms: np.ndarray, step_max: float) -> np.ndarray:
    """The (K,) steps of one extrapolation from the norms summed over every chunk of W and H."""
    return extrapolation.step_length(resolve(norms), step_max)


def extrapolated_chunk(
    c0: FactorChunk, c1: FactorChunk, c2: FactorChunk, step: np.ndarray
) -> FactorChunk:
    """The extrapolated state of one chunk: E[x] and exp(E[log x]) only, as at a start (the
    next iteration reads nothing else)."""
    s0, s1, s2 = _state(c0), _state(c1), _state(c2)
    mean, geo = (
        np.exp(extrapolation.extrapolate(a, b, c, step)) for a, b, c in zip(s0, s1, s2, strict=True)
    )
    return FactorChunk(mean=mean, geo=geo)
