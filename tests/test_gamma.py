"""The vectorizable special functions of the Gamma update and the local step against numpy."""

from __future__ import annotations

import numba
import numpy as np

from ordnmf_dask.model import gamma, kernels


@numba.njit
def _log(x: float) -> float:
    """log x through the Gamma update's three steps (input, bits, finish)."""
    buf = np.empty(2)
    bits = buf.view(np.int64)
    buf[0] = gamma._log_input(x)
    e, bits[1] = gamma._log_split(bits[0], x)
    return gamma._log_finish(e, buf[1], x)


@numba.njit
def _exp_neg(y: float) -> float:
    s, p = kernels.exp_neg_split(y)
    return s + s * p


def test_log_against_numpy():
    """~1 ulp from the smallest subnormal to the largest float, densely around 1 (where log x
    is small) and sqrt(2) (where the mantissa is halved); libm's values at 0, inf, < 0, NaN."""
    x = np.concatenate(
        [
            [5e-324, 1e-320, 2.2250738585072014e-308 * (1 - 2**-52), 2.2250738585072014e-308],
            np.geomspace(1e-307, 1e308, 20000),
            np.linspace(0.5, 2.0, 20001),
            1.0 + np.linspace(-1e-6, 1e-6, 2001),
            np.sqrt(2.0) * (1.0 + np.linspace(-1e-9, 1e-9, 201)),
            np.arange(1.0, 2000.0),
            [np.finfo(float).max],
        ]
    )
    got = np.array([_log(v) for v in x])
    want = np.log(x)
    np.testing.assert_allclose(got, want, rtol=3e-16, atol=0)
    assert _log(1.0) == 0.0
    assert _log(0.0) == -np.inf and _log(np.inf) == np.inf
    for v in (-0.5, -np.inf, np.nan):
        assert np.isnan(_log(v))


def test_exp_neg_against_numpy():
    """exp(-y): ~1 ulp for y from 0 to where it underflows to subnormals, and to the nearest
    subnormal below; 0 beyond; NaN for y < 0 or NaN."""
    y = np.concatenate(
        [
            [0.0, 5e-324, 1e-300, 1e-20],
            np.geomspace(1e-12, 708.0, 20000),
            np.linspace(0.0, 5.0, 5001),
            np.arange(1, 1022) * np.log(2.0),
        ]
    )
    got = np.array([_exp_neg(v) for v in y])
    np.testing.assert_allclose(got, np.exp(-y), rtol=3e-16, atol=0)
    sub = np.linspace(708.5, 745.0, 2000)  # subnormal results: within one unit of 2^-1074
    np.testing.assert_allclose(np.array([_exp_neg(v) for v in sub]), np.exp(-sub), atol=5e-324)
    for v in (745.2, 746.0, 800.0, 1e300, np.inf):
        assert _exp_neg(v) == 0.0
    for v in (-1e-300, -1.0, -np.inf, np.nan):
        assert np.isnan(_exp_neg(v))
