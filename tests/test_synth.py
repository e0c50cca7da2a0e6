"""Synthetic IG-OrdNMF generator: exact law of the classes, calibration, determinism, layout."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from ordnmf_dask.app.cli import main
from ordnmf_dask.datasets import synth as synth_mod
from ordnmf_dask.datasets.synth import (
    FACTOR_ROWS,
    SynthParams,
    class_probabilities,
    expected_density,
    sample_block,
    synth,
    true_factors,
)
from ordnmf_dask.errors import InputError
from ordnmf_dask.store.blocks import open_store, read_block

ARRAYS = ["row_bounds", "col_bounds", "users/ids", "items/ids"] + [
    f"{s}/{f}" for s in ("train", "test") for f in ("indptr", "cols", "y", "raw", "offsets")
]


def dense_expectation(info) -> tuple[np.ndarray, np.ndarray]:
    """E[#{y = v}] and Var[#{y = v}], v = 0..V, summed over all U x I pairs (dense oracle)."""
    params = SynthParams.from_attrs(info.attrs)
    w = true_factors(params, "users", 0, params.n_users)
    h = true_factors(params, "items", 0, params.n_items)
    p = class_probabilities(w @ h.T, params.theta)  # (U, I, V + 1)
    return p.sum(axis=(0, 1)), (p * (1 - p)).sum(axis=(0, 1))


@pytest.mark.parametrize(
    "nnz, shape, blocks",
    [(6000, 0.3, 1500), (36000, 1.0, 4000)],  # sparse (Poisson hits); dense (Bernoulli path too)
)
def test_classes_and_nnz_match_exact_expectation(tmp_path, nnz, shape, blocks):
    info = synth(tmp_path / "s", 300, 200, nnz, 3, 4, seed=11, shape=shape, nnz_per_block=blocks)
    assert info.grid[0] * info.grid[1] > 1
    hist = info.hist_train + info.hist_test
    mean, var = dense_expectation(info)
    sd = np.sqrt(var)
    z = (hist[1:] - mean[1:]) / sd[1:]
    assert np.all(np.abs(z) < 4), z
    nnz_sd = np.sqrt(var[0])  # #{y > 0} = U I - #{y = 0}
    assert abs(hist.sum() - (300 * 200 - mean[0])) < 4 * nnz_sd
    assert abs(info.attrs["synth"]["expected_nnz"] - nnz) < 1e-6 * nnz


def test_expected_density_against_monte_carlo():
    rng = np.random.default_rng(0)
    for theta0, a, k in [(0.02, 0.3, 5), (0.5, 1.0, 3), (0.003, 2.0, 20)]:
        w, h = rng.gamma(a, 1.0, (200_000, k)), rng.gamma(a, 1.0, (200_000, k))
        mc = -np.expm1(-theta0 * (w * h).sum(1))
        exact = expected_density(theta0, a, 1.0, 1.0, k)
        assert abs(mc.mean() - exact) < 4 * mc.std() / np.sqrt(len(mc))


def test_layout_attrs_and_calibrated_size(tmp_path):
    info = synth(tmp_path / "s", 3000, 1000, 60_000, 8, 5, seed=2, nnz_per_block=12_000)
    assert info.attrs["value_kind"] == "synthetic" and info.n_classes == 5
    assert info.attrs["synth"]["seed"] == 2 and len(info.attrs["synth"]["theta"]) == 6
    assert abs(info.nnz_train + info.nnz_test - 60_000) < 0.1 * 60_000
    assert abs(info.nnz_test / (info.nnz_train + info.nnz_test) - 0.2) < 0.01
    total = 0
    for split in ("train", "test"):
        for r in range(info.grid[0]):
            for c in range(info.grid[1]):
                b = read_block(info.path, split, r, c)
                key = b.rows.astype(np.int64) * b.shape[1] + b.cols
                assert np.all(np.diff(key) > 0)  # sorted, distinct
                assert b.cols.max() < b.shape[1] and b.rows.max() < b.shape[0]
                assert b.y.min() >= 1 and b.y.max() <= 5 and np.array_equal(b.raw, b.y)
                total += b.nnz
    assert total == info.nnz_train + info.nnz_test
    assert not list(tmp_path.glob("*.tmp-*"))


def test_same_store_on_cluster_and_in_process(tmp_path, client):
    kw = dict(seed=5, nnz_per_block=3000)
    synth(tmp_path / "a", 1500, 800, 20_000, 4, 3, **kw)
    synth(tmp_path / "b", 1500, 800, 20_000, 4, 3, client=client, **kw)
    ga, gb = zarr.open_group(tmp_path / "a", mode="r"), zarr.open_group(tmp_path / "b", mode="r")
    for name in ARRAYS:
        np.testing.assert_array_equal(ga[name][:], gb[name][:], err_msg=name)
    synth(tmp_path / "c", 1500, 800, 20_000, 4, 3, seed=6, nnz_per_block=3000)
    assert open_store(tmp_path / "c").nnz_train != open_store(tmp_path / "a").nnz_train


def test_complete_or_absent(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("worker died")

    monkeypatch.setattr(synth_mod, "_sample_block", boom)
    with pytest.raises(RuntimeError):
        synth(tmp_path / "s", 100, 100, 500, 2)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="nnz"):
        synth(tmp_path / "s", 10, 10, 100, 2)


def test_cli_synth(tmp_path, cluster, capsys):
    out = tmp_path / "cli"
    code = main(
        [
            "synth",
            "--out",
            str(out),
            "--users",
            "500",
            "--items",
            "300",
            "--nnz",
            "5e3",
            "-k",
            "4",
            "--classes",
            "3",
            "--seed",
            "1",
            "--nnz-per-block",
            "1000",
            "--scheduler",
            cluster.scheduler_address,
            "-q",
        ]
    )
    assert code == 0
    assert "synthetic" in capsys.readouterr().out
    assert open_store(out).attrs["synth"]["n_components"] == 4


@pytest.mark.parametrize(
    "shape, scale",
    [(0.3, 0.5), (0.5, 3.0)],  # sparse (Poisson hits, alias tables); ~30% dense (u, k): Bernoulli
)
def test_block_sampler_pair_law(shape, scale):
    """Per pair and class, the frequency over replicates matches P(y_ui = v | lambda_ui)."""
    gen = np.random.default_rng(123)
    w, h = gen.gamma(shape, 1.0, (30, 3)), gen.gamma(shape, 1.0, (20, 3))
    theta = scale * np.array([1.0, 0.6, 0.3, 0.1, 0.0])
    reps = 1500
    counts = np.zeros((30, 20, 5))
    n_test = n_all = 0
    for rep in range(reps):
        train, test = sample_block(np.random.default_rng(rep), w, h, theta, 0.25)
        for rows, cols, y in (train, test):
            assert np.all(np.diff(rows.astype(np.int64) * 20 + cols) > 0)  # sorted, distinct
            np.add.at(counts, (rows, cols, y), 1)
        n_test, n_all = n_test + len(test[2]), n_all + len(train[2]) + len(test[2])
    freq = counts / reps
    freq[..., 0] = 1.0 - freq[..., 1:].sum(axis=-1)
    p = class_probabilities(w @ h.T, theta)
    ok = p * (1 - p) * reps > 5
    z = (freq - p)[ok] / np.sqrt(p * (1 - p) / reps)[ok]
    assert ok.sum() > 1000
    assert 0.9 < np.mean(z**2) < 1.1 and np.abs(z).max() < 5.5, (np.mean(z**2), np.abs(z).max())
    assert abs(n_test / n_all - 0.25) < 5 * np.sqrt(0.1875 / n_all)


def test_block_sampler_buffers_and_passes_do_not_change_the_sample(monkeypatch):
    gen = np.random.default_rng(0)
    w, h = gen.gamma(0.5, 1.0, (200, 4)), gen.gamma(0.5, 1.0, (150, 4))
    theta = np.array([0.8, 0.4, 0.2, 0.0])
    default = sample_block(np.random.default_rng(9), w, h, theta, 0.2)
    grown = sample_block(np.random.default_rng(9), w, h, theta, 0.2, capacity=1)
    monkeypatch.setattr(synth_mod, "USERS_PER_PASS", 7)
    passes = sample_block(np.random.default_rng(9), w, h, theta, 0.2)
    assert len(default[0][0]) > 1000
    for other in (grown, passes):
        for a, b in zip(default, other, strict=True):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)
                assert x.dtype == y.dtype
    assert [x.dtype for x in default[0]] == [np.int32, np.int32, np.uint8]


def test_blocks_use_the_true_factor_rows(tmp_path, monkeypatch):
    """Block rows not aligned to FACTOR_ROWS: the staged factors are exactly ``true_factors``."""
    monkeypatch.setattr(synth_mod, "FACTOR_ROWS", 64)
    monkeypatch.setattr(synth_mod, "USERS_PER_PASS", 50)  # several passes, from a file
    n_u, n_i = 700, 300
    info = synth(tmp_path / "s", n_u, n_i, 8000, 3, 3, seed=4, nnz_per_block=900)
    assert info.grid[0] > 2 and info.row_bounds[1] % 64 != 0
    params = SynthParams.from_attrs(info.attrs)
    theta = np.asarray(params.theta)
    for r, c in [(0, 0), (1, info.grid[1] - 1), (info.grid[0] - 1, 1)]:
        (r0, r1), (c0, c1) = info.row_bounds[r : r + 2], info.col_bounds[c : c + 2]
        w, h = true_factors(params, "users", r0, r1), true_factors(params, "items", c0, c1)
        seq = np.random.SeedSequence(params.seed, spawn_key=(2, r, c))
        train, test = sample_block(np.random.Generator(np.random.PCG64(seq)), w, h, theta, 0.2)
        for split, (rows, cols, y) in (("train", train), ("test", test)):
            b = read_block(info.path, split, r, c)
            np.testing.assert_array_equal(b.rows, rows)
            np.testing.assert_array_equal(b.cols, cols)
            np.testing.assert_array_equal(b.y, y)
    assert FACTOR_ROWS == 4096  # the module constant itself is untouched


def test_cli_synth_of_one_block_runs_in_this_process(tmp_path, capsys):
    """No cluster named and one block to sample: the command starts no cluster (this test is not
    marked ``cluster``, so a scheduler started here would fail it) and writes the store the API
    writes in-process."""
    args = ["--users", "200", "--items", "100", "--nnz", "2e3", "-k", "3", "--seed", "2"]
    assert main(["synth", "--out", str(tmp_path / "cli"), *args, "-q"]) == 0
    assert "1 x 1 blocks" in capsys.readouterr().out
    api = synth(tmp_path / "api", 200, 100, 2000, 3, seed=2)
    for split in ("train", "test"):
        got, want = read_block(tmp_path / "cli", split, 0, 0), read_block(api.path, split, 0, 0)
        for key in ("indptr", "cols", "y"):
            np.testing.assert_array_equal(getattr(got, key), getattr(want, key), err_msg=key)
