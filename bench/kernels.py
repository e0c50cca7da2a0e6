"""Per-pass time of the block kernels: numba fused (the package) vs numpy/scipy (the baseline).

Usage: ``python bench/kernels.py [--k 50] [--repeat 3]``. Prints, for each block size, the
best-of-``repeat`` CPU seconds per pass (process time: robust on a loaded machine) of the
ordinal local step, the two rate corrections, the dcPF local step and the Gamma update of the
block's user rows (with a rate correction), the numpy/scipy baseline (``bench/baseline_numpy.py``,
the implementation before numba; for the Gamma update the textbook scipy formulas) next to the
fused kernels, their ratio, the nanoseconds per nonzero (per factor entry for the Gamma update)
of the fused kernel, and the max relative difference of the results. Also the first-call
(compile or cache-load) time of the numba kernels in this process.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import baseline_numpy as base  # noqa: E402
from common import best_of, fmt_table, random_block  # noqa: E402

from ordnmf_dask.model import dcpf, kernels  # noqa: E402
from ordnmf_dask.model.updates import FactorChunk, update_chunk  # noqa: E402

SIZES = [(50_000, 20_000, 1 << 21), (20_000, 12_000, 2_500_000)]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def gamma_update_scipy(
    old: np.ndarray, alpha: float, sw: np.ndarray, colsum: np.ndarray, corr: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """The Gamma update with numpy / scipy.special: (mean, exp(E[log x]), ELBO term)."""
    from scipy.special import digamma, gammaln

    beta = alpha / old.mean(axis=1, keepdims=True)
    a, b = alpha + sw, beta + colsum - corr
    psi, log_b = digamma(a), np.log(b)
    elbo = (alpha - a) * psi - beta * a / b + alpha * np.log(beta) - gammaln(alpha) + a
    elbo += gammaln(a) - alpha * log_b
    return a / b, np.exp(psi) / b, float(elbo.sum())


def _cases(block, counts, gw, gh, ew, eh, delta, gap):  # noqa: ANN001, ANN202
    """(baseline, fused) callables per kernel on one block."""
    old, sw = FactorChunk.initial(ew), kernels.local_step(block, gw, gh, ew, eh, delta, False).sw
    corr, colsum = kernels.row_correction(block, gap, eh), 0.5 * eh.sum(axis=0)
    return {
        "local (exact)": (
            lambda: base.local_step(block, gw, gh, ew, eh, delta, False),
            lambda: kernels.local_step(block, gw, gh, ew, eh, delta, False),
        ),
        "row+col corr": (
            lambda: (base.row_correction(block, gap, eh), base.col_correction(block, gap, ew)),
            lambda: (
                kernels.row_correction(block, gap, eh),
                kernels.col_correction(block, gap, ew),
            ),
        ),
        "dcPF local": (
            lambda: base.dcpf_local_step(counts, gw, gh, ew, eh, 0.5, 1.0),
            lambda: dcpf.local_step(counts, gw, gh, ew, eh, 0.5, 1.0),
        ),
        "Gamma update": (
            lambda: gamma_update_scipy(old.mean, 0.3, sw, colsum, corr),
            lambda: update_chunk(old, 0.3, sw, colsum, corr),
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()
    k, v = args.k, args.classes
    rng = np.random.default_rng(1)
    delta = np.r_[0.0, rng.uniform(0.05, 0.3, v)]
    gap = np.r_[0.0, 0.0, np.cumsum(delta[1:])[:-1]]  # any G with G_0 = G_1 = 0 will do

    tiny = random_block(50, 40, 300, v)
    g = rng.gamma(1.0, 1.0, (50, k)), rng.gamma(1.0, 1.0, (40, k))
    start = time.perf_counter()
    kernels.local_step(tiny, *g, *g, delta, False)
    kernels.row_correction(tiny, gap, g[1])
    kernels.col_correction(tiny, gap, g[0])
    tiny_counts = kernels.CsrBlock(tiny.indptr, tiny.cols, tiny.y.astype(np.float64), tiny.shape)
    dcpf.local_step(tiny_counts, *g, *g, 0.5, 1.0)
    print(
        f"first calls of the numba kernels (compile or cache load): "
        f"{time.perf_counter() - start:.2f} s"
    )

    rows = []
    for n_rows, n_cols, nnz in SIZES:
        block = random_block(n_rows, n_cols, nnz, v, seed=2)
        counts = kernels.CsrBlock(block.indptr, block.cols, block.y.astype(np.float64), block.shape)
        gw, gh = rng.gamma(1.0, 0.3, (n_rows, k)), rng.gamma(1.0, 0.3, (n_cols, k))
        ew, eh = rng.gamma(1.0, 0.3, (n_rows, k)), rng.gamma(1.0, 0.3, (n_cols, k))
        cases = _cases(block, counts, gw, gh, ew, eh, delta, gap)
        for name, (slow, fast) in cases.items():
            a, b = slow(), fast()
            if name == "row+col corr":
                err = max(_rel(b[0], a[0]), _rel(b[1], a[1]))
            elif name == "Gamma update":
                err = max(_rel(b.mean, a[0]), _rel(b.geo, a[1]), _rel(b.elbo, a[2]))
            else:
                err = max(_rel(b.sw, a.sw), _rel(b.sh, a.sh), _rel(b.small, a.small))
            t_slow = best_of(slow, args.repeat, time.process_time)
            t_fast = best_of(fast, args.repeat, time.process_time)
            per = n_rows * k if name == "Gamma update" else block.nnz
            rows.append(
                [
                    f"{n_rows}x{n_cols}",
                    block.nnz,
                    name,
                    t_slow,
                    t_fast,
                    t_slow / t_fast,
                    f"{t_fast / per * 1e9:.1f}",
                    f"{err:.1e}",
                ]
            )
    print(
        fmt_table(
            rows,
            [
                "block",
                "nnz",
                "kernel",
                "numpy cpu s",
                "numba cpu s",
                "speed-up",
                "numba ns/unit",
                "max rel diff",
            ],
        )
    )


if __name__ == "__main__":
    main()
