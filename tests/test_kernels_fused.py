"""The compiled (numba) block kernels against the dense oracle and a direct numpy dcPF step.

Edge cases: empty rows and columns, a single nonzero, an empty block, K = 1, approx on / off,
V = 1 and V = 10, several column tiles, non-contiguous / non-float64 factor inputs.
"""

from __future__ import annotations

import numpy as np
import oracle
import pytest
from scipy.special import digamma, gammaln

from ordnmf_dask.model import dcpf, kernels, thresholds


def _block(y: np.ndarray) -> kernels.CsrBlock:
    rows, cols = np.nonzero(y)
    return kernels.CsrBlock.from_coo(rows, cols, y[rows, cols].astype(np.uint8), y.shape)


def _classes(shape: tuple[int, int], n_classes: int, density: float, seed: int) -> np.ndarray:
    """Random classes with an empty first row, empty last column and every class present."""
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(shape) < density, rng.integers(1, n_classes + 1, shape), 0)
    y[0, :] = 0
    y[:, -1] = 0
    y[1, :n_classes] = np.arange(1, n_classes + 1)[: shape[1] - 1]
    return y


def _factors(shape: tuple[int, int], k: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    u, i = shape
    return tuple(rng.gamma(1.0, 1.0, (n, k)) for n in (u, i, u, i))


def _check_local(y: np.ndarray, k: int, approx: bool, seed: int = 0) -> None:
    n_classes = int(y.max())
    gw, gh, ew, eh = _factors(y.shape, k, seed)
    delta = oracle.init_delta(y, n_classes)
    got = kernels.local_step(_block(y), gw, gh, ew, eh, delta, approx)
    want = oracle.local_step(y, gw, gh, delta, approx)
    np.testing.assert_allclose(got.sw, want["SW"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(got.sh, want["SH"], rtol=1e-12, atol=0)
    en_c, lam_c, elbo, bound = kernels.split_ordinal_small(got.small)
    assert elbo == pytest.approx(want["elbo_local"], rel=1e-12)
    assert bound == pytest.approx(want["bound_local"], rel=1e-12)
    lam = ew @ eh.T
    assert en_c[0] == 0.0 and lam_c[0] == 0.0
    for v in range(1, n_classes + 1):
        assert en_c[v] == pytest.approx(want["En"][y == v].sum(), rel=1e-12)
        assert lam_c[v] == pytest.approx(lam[y == v].sum(), rel=1e-12)


@pytest.mark.parametrize("approx", [False, True])
@pytest.mark.parametrize("n_classes", [1, 10])
@pytest.mark.parametrize("k", [1, 5])
def test_local_step_matches_oracle(approx, n_classes, k):
    _check_local(_classes((23, 17), n_classes, 0.35, seed=n_classes + k), k, approx)


@pytest.mark.parametrize("k", [1, 7])
def test_local_step_over_many_column_tiles(monkeypatch, k):
    monkeypatch.setattr(kernels, "_L3_BYTES", 0)  # tables never "fit": tiled
    monkeypatch.setattr(kernels, "_TILE_BYTES", 8)  # tiles of 64 columns
    y = _classes((9, 200), 10, 0.2, seed=3)
    rows, cols = np.nonzero(y)
    block = kernels.CsrBlock.from_coo(rows, cols, y[rows, cols].astype(np.uint8), y.shape)
    assert kernels._tile_cols(k, block) == 50  # 4 tiles of 50 columns
    _check_local(y, k, approx=False)


@pytest.mark.parametrize("approx", [False, True])
@pytest.mark.parametrize("tiled", [False, True])
def test_local_step_over_rows_longer_than_a_chunk(monkeypatch, approx, tiled):
    """Rows (and, tiled, a row's run in one tile) of several chunks and a partial last chunk."""
    if tiled:
        monkeypatch.setattr(kernels, "_L3_BYTES", 0)
        monkeypatch.setattr(kernels, "_TILE_BYTES", 8 * 3 * 160)  # tiles of 160 columns
    y = _classes((6, 3 * kernels._CHUNK * 5 + 7), 10, 0.8, seed=5)
    y[2, :] = 0  # an empty row between long ones
    assert np.count_nonzero(y, axis=1).max() > 2 * kernels._CHUNK
    block = _block(y)
    assert (kernels._tile_cols(3, block) < y.shape[1]) == tiled
    _check_local(y, 3, approx)


def test_one_minus_exp_neg_against_expm1():
    """1 - exp(-x) of the vectorized local step: within 1.5 ulp of the true value (measured:
    1.39) from denormals to where it rounds to 1, exact at 0, NaN below 0 and for NaN. The truth
    is -expm1(-x) in extended precision, not float64's expm1, which is itself up to 0.73 ulp off
    at places that differ between numpy versions."""
    x = np.concatenate(
        [
            [0.0, 5e-324, 1e-300, 1e-200],
            np.geomspace(1e-20, 1e-3, 2000),
            np.geomspace(1e-3, 60.0, 20000),
            np.linspace(0.0, 3.0, 3001),
            np.arange(1, 60) * np.log(2.0),
            [37.9, 38.5, 39.99, 40.0, 40.01, 700.0, 1e300, np.inf],
        ]
    )
    got = np.array([kernels._one_minus_exp_neg(v) for v in x])
    assert np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant  # x86's 80-bit
    truth = -np.expm1(-x.astype(np.longdouble))
    err = np.abs(got.astype(np.longdouble) - truth)
    ulps = err / np.spacing(truth.astype(np.float64))
    assert np.max(ulps) <= 1.5, x[np.argmax(ulps)]
    assert got[0] == 0.0
    for v in (-1e-300, -1.0, -np.inf, np.nan):
        assert np.isnan(kernels._one_minus_exp_neg(v))


def test_blocks_whose_item_tables_fit_the_cache_are_not_tiled():
    block = kernels.CsrBlock.from_coo(
        np.repeat(np.arange(100), 50),
        np.tile(np.arange(0, 5000, 100), 100),
        np.ones(5000, np.uint8),
        (100, 5000),
    )
    assert kernels._tile_cols(50, block) == 5000  # 3 x 2 MB tables, 50 nonzeros per row


def test_sparse_blocks_get_one_tile():
    """Tiles visit every row: with ~1 nonzero per row a block is one tile."""
    rows = np.arange(1000)
    cols = (rows * 7919) % 100_000
    order = np.lexsort((cols, rows))
    block = kernels.CsrBlock.from_coo(
        rows[order], cols[order], np.ones(1000, np.uint8), (1000, 100_000)
    )
    assert kernels._tile_cols(50, block) == 100_000


def test_single_nonzero_and_empty_block():
    y = np.zeros((4, 6), dtype=np.int64)
    y[2, 3] = 1
    _check_local(y, 3, approx=False)
    _check_local(y, 3, approx=True)
    empty = kernels.CsrBlock.from_coo(
        np.array([], np.int64), np.array([], np.int64), np.array([], np.uint8), (5, 4)
    )
    gw, gh, ew, eh = _factors((5, 4), 2, 0)
    delta = np.array([0.0, 0.5, 0.2])
    got = kernels.local_step(empty, gw, gh, ew, eh, delta, False)
    assert got.sw.shape == (5, 2) and got.sh.shape == (4, 2)
    assert not got.sw.any() and not got.sh.any() and not got.small.any()
    assert got.small.shape == (2 * 3 + 2,)
    gap = np.array([0.0, 0.0, 0.5])
    assert not kernels.row_correction(empty, gap, eh).any()
    assert kernels.col_correction(empty, gap, ew).shape == (4, 2)


def test_inputs_of_other_layouts_and_dtypes():
    y = _classes((11, 13), 4, 0.4, seed=8)
    gw, gh, ew, eh = _factors(y.shape, 4, 1)
    delta = oracle.init_delta(y, 4)
    want = kernels.local_step(_block(y), gw, gh, ew, eh, delta, False)
    got = kernels.local_step(
        _block(y),
        np.asfortranarray(gw),
        np.repeat(gh, 2, axis=1)[:, ::2],
        ew,
        np.asfortranarray(eh),
        delta.tolist(),
        False,
    )
    np.testing.assert_array_equal(got.sw, want.sw)
    np.testing.assert_array_equal(got.small, want.small)


def test_class_above_v_is_rejected():
    y = _classes((6, 5), 3, 0.5, seed=0)
    gw, gh, ew, eh = _factors(y.shape, 2, 0)
    with pytest.raises(ValueError, match="class 3"):
        kernels.local_step(_block(y), gw, gh, ew, eh, np.array([0.0, 0.3, 0.2]), False)


@pytest.mark.parametrize("n_classes", [1, 10])
@pytest.mark.parametrize("k", [1, 4])
def test_rate_corrections_match_dense_rates(n_classes, k):
    y = _classes((19, 14), n_classes, 0.4, seed=k)
    rng = np.random.default_rng(k)
    ew, eh = rng.gamma(1, 1, (19, k)), rng.gamma(1, 1, (14, k))
    delta = oracle.init_delta(y, n_classes)
    theta = oracle.thresholds(delta)
    gap = thresholds.gap_from_delta(delta)
    beta_w, beta_h = rng.random((19, 1)), rng.random((14, 1))
    block = _block(y)
    got_w = beta_w + (theta[0] * eh.sum(0) - kernels.row_correction(block, gap, eh))
    got_h = beta_h + (theta[0] * ew.sum(0) - kernels.col_correction(block, gap, ew))
    np.testing.assert_allclose(got_w, oracle.rate_W(y, eh, beta_w[:, 0], theta), rtol=1e-12)
    np.testing.assert_allclose(got_h, oracle.rate_H(y, ew, beta_h[:, 0], theta), rtol=1e-12)


def test_sddmm_and_spmm_pair_against_dense():
    rng = np.random.default_rng(4)
    y = _classes((15, 12), 3, 0.3, seed=4)
    block = _block(y)
    gw, gh = rng.random((15, 6)), rng.random((12, 6))
    dense = gw @ gh.T
    np.testing.assert_allclose(
        kernels.sddmm(block.rows, block.cols, gw, gh), dense[y > 0], rtol=1e-14
    )
    ratio = rng.random(block.nnz)
    r = np.zeros(y.shape)
    r[y > 0] = ratio
    start = rng.random((15, 6))
    sw = start.copy()
    sh = kernels.spmm_pair(block, ratio, gw, gh, sw)  # adds into sw, unscaled
    np.testing.assert_allclose(sw, start + r @ gh, rtol=1e-13)
    np.testing.assert_allclose(sh, r.T @ gw, rtol=1e-13)


def _dcpf_direct(y: np.ndarray, gw: np.ndarray, gh: np.ndarray, p: float, t: float):  # noqa: ANN202
    """dcPF-Log local step written directly from docs/design.md §5 on dense arrays."""
    mask = y > 0
    lam = gw @ gh.T
    s = t * lam[mask]
    yv = y[mask].astype(np.float64)
    if p == 0.0:
        en, bound = yv, -gammaln(yv + 1).sum() + (yv * np.log(s)).sum()
    elif p == 1.0:
        en, bound = np.ones_like(yv), np.log(s).sum()
    else:
        r = s / -np.log(1.0 - p)
        en = np.where(yv == 1, 1.0, r * (digamma(yv + r) - digamma(r)))
        bound = -gammaln(yv + 1).sum() + yv.sum() * np.log(p) + (gammaln(yv + r) - gammaln(r)).sum()
    ratio = np.zeros(y.shape)
    ratio[mask] = en / lam[mask]
    return gw * (ratio @ gh), gh * (ratio.T @ gw), np.array([en.sum(), yv.sum(), bound])


@pytest.mark.parametrize("p", [0.0, 0.4, 0.9, 1.0])
@pytest.mark.parametrize("k", [1, 3])
def test_dcpf_local_step_matches_direct(monkeypatch, p, k):
    monkeypatch.setattr(dcpf, "SLAB", 17)  # several slabs of nonzeros
    rng = np.random.default_rng(int(p * 10) + k)
    y = np.where(rng.random((16, 13)) < 0.4, rng.geometric(0.3, (16, 13)), 0)
    y[0, :] = 0
    rows, cols = np.nonzero(y)
    block = kernels.CsrBlock.from_coo(rows, cols, y[rows, cols].astype(np.float64), y.shape)
    gw, gh, ew, eh = _factors(y.shape, k, 2)
    got = dcpf.local_step(block, gw, gh, ew, eh, p, 1.3)
    sw, sh, small = _dcpf_direct(y, gw, gh, p, 1.3)
    np.testing.assert_allclose(got.sw, sw, rtol=1e-12)
    np.testing.assert_allclose(got.sh, sh, rtol=1e-12)
    np.testing.assert_allclose(got.small, small, rtol=1e-12)


def _row_strip(y: np.ndarray, cuts: list[int], values: type = np.uint8) -> list[kernels.CsrBlock]:
    """The blocks (one user-block, item-blocks cut at ``cuts``) of a dense class matrix."""
    edges = [0, *cuts, y.shape[1]]
    out = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        part = y[:, a:b]
        rows, cols = np.nonzero(part)
        vals = part[rows, cols].astype(values)
        out.append(kernels.CsrBlock.from_coo(rows, cols, vals, part.shape))
    return out


@pytest.mark.parametrize("approx", [False, True])
def test_local_step_row_sums_its_blocks(approx):
    """One accumulator over several item-blocks (one with no nonzeros) equals the oracle on the
    whole user-block; SH comes back per block."""
    y = _classes((30, 40), 4, 0.3, seed=7)
    y[:, 10:14] = 0  # an empty item-block
    cuts = [10, 14, 31]
    gw, gh, ew, eh = _factors(y.shape, 5, 8)
    delta = oracle.init_delta(y, 4)
    edges = [0, *cuts, 40]
    parts = [slice(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    got = kernels.local_step_row(
        _row_strip(y, cuts), gw, [gh[s] for s in parts], ew, [eh[s] for s in parts], delta, approx
    )
    want = oracle.local_step(y, gw, gh, delta, approx)
    np.testing.assert_allclose(got.sw, want["SW"], rtol=1e-12, atol=0)
    assert len(got.sh) == 4 and not got.sh[1].any()
    np.testing.assert_allclose(np.concatenate(got.sh), want["SH"], rtol=1e-12, atol=0)
    en_c, _, elbo, _ = kernels.split_ordinal_small(got.small)
    assert elbo == pytest.approx(want["elbo_local"], rel=1e-12)
    assert en_c.sum() == pytest.approx(want["En"][y > 0].sum(), rel=1e-12)
    gap = thresholds.gap_from_delta(delta)
    corr = kernels.row_correction_row(_row_strip(y, cuts), gap, [eh[s] for s in parts])
    dense = np.where(y > 0, gap[y], 0.0)
    np.testing.assert_allclose(corr, dense @ eh, rtol=1e-12)
    # the transposed strip: one item-block, user-blocks cut at rows 7 and 19
    row_parts = [slice(0, 7), slice(7, 19), slice(19, 30)]
    col_blocks = [
        kernels.CsrBlock.from_coo(
            *np.nonzero(y[s]), y[s][np.nonzero(y[s])].astype(np.uint8), y[s].shape
        )
        for s in row_parts
    ]
    corr_h = kernels.col_correction_col(col_blocks, gap, [ew[s] for s in row_parts])
    np.testing.assert_allclose(corr_h, dense.T @ ew, rtol=1e-12)


def test_dcpf_local_step_row_sums_its_blocks():
    rng = np.random.default_rng(9)
    y = np.where(rng.random((16, 21)) < 0.4, rng.geometric(0.3, (16, 21)), 0)
    gw, gh, ew, eh = _factors(y.shape, 3, 2)
    parts = [slice(0, 8), slice(8, 21)]
    got = dcpf.local_step_row(
        _row_strip(y, [8], np.float64),
        gw,
        [gh[s] for s in parts],
        ew,
        [eh[s] for s in parts],
        0.4,
        1.3,
    )
    sw, sh, small = _dcpf_direct(y, gw, gh, 0.4, 1.3)
    np.testing.assert_allclose(got.sw, sw, rtol=1e-12)
    np.testing.assert_allclose(np.concatenate(got.sh), sh, rtol=1e-12)
    np.testing.assert_allclose(got.small, small, rtol=1e-12)


def test_take_rows_keeps_those_rows_renumbered():
    y = _classes((12, 9), 3, 0.4, seed=11)
    keep = np.array([0, 2, 3, 7, 11])
    got = _block(y).take_rows(keep)
    want = _block(y[keep])
    assert got.shape == (5, 9)
    for name in ("indptr", "rows", "cols", "y"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    assert _block(y).take_rows(np.array([], dtype=np.int64)).nnz == 0
