"""The store contract: layout, attributes, open_store, read_block, read_ids, overwrite."""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest
import zarr

from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.sources.ingest import ingest_arrays
from ordnmf_dask.store.blocks import Block, StoreInfo, open_store, read_block, read_ids

REQUIRED_ATTRS = {
    "format_version",
    "complete",
    "n_users",
    "n_items",
    "n_classes",
    "value_kind",
    "thresholds",
    "binarize",
    "min_count",
    "filter_mode",
    "duplicates",
    "split",
    "test_fraction",
    "seed",
    "nnz_train",
    "nnz_test",
    "hist_train",
    "hist_test",
    "grid",
    "source",
    "created",
}


def make_store(path, seed: int = 0, grid=(2, 3), **kw) -> StoreInfo:
    rng = np.random.default_rng(seed)
    u, i = np.nonzero(rng.random((50, 40)) < 0.3)
    values = rng.integers(1, 4, len(u))
    return ingest_arrays(u * 10, i, values, path, grid=grid, counts="paper", **kw)


def test_layout_and_attrs(tmp_path):
    info = make_store(tmp_path / "s.zarr")
    assert info.path == os.path.abspath(tmp_path / "s.zarr")
    assert not list(tmp_path.glob("*.tmp-*")) and not list(tmp_path.glob("*.old-*"))
    attrs = json.loads((tmp_path / "s.zarr" / "zarr.json").read_text())["attributes"]
    assert REQUIRED_ATTRS <= set(attrs)
    assert attrs["format_version"] == 3 and attrs["complete"] is True
    assert attrs["grid"] == [2, 3] and attrs["split"] == "random"
    assert attrs["value_kind"] == "counts"
    assert len(attrs["hist_train"]) == info.n_classes + 1 == 11 and attrs["hist_train"][0] == 0
    group = zarr.open_group(info.path, mode="r")
    expected = {
        "row_bounds": ("int64", (3,)),
        "col_bounds": ("int64", (4,)),
        "train/offsets": ("int64", (7,)),
        "test/offsets": ("int64", (7,)),
        "train/indptr": ("int64", (3 * (info.n_users + 2),)),  # n_c blocks x (rows_r + 1)
        "train/cols": ("int32", (info.nnz_train,)),
        "train/y": ("uint8", (info.nnz_train,)),
        "train/raw": ("float64", (info.nnz_train,)),
        "test/y": ("uint8", (info.nnz_test,)),
        "users/ids": ("int64", (info.n_users,)),
    }
    for name, (dtype, shape) in expected.items():
        assert (str(group[name].dtype), group[name].shape) == (dtype, shape), name
    offsets = group["train/offsets"][:]
    assert offsets[0] == 0 and offsets[-1] == info.nnz_train and np.all(np.diff(offsets) >= 0)
    assert info.grid == (2, 3)
    assert sum(info.block_shape(r, 0)[0] for r in range(2)) == info.n_users
    assert sum(info.block_shape(0, c)[1] for c in range(3)) == info.n_items
    with pytest.raises(IndexError):
        info.block_shape(2, 0)


def test_read_block_and_ids(tmp_path):
    info = make_store(tmp_path / "s")
    block = read_block(info.path, "test", 1, 2)
    assert isinstance(block, Block) and block.shape == info.block_shape(1, 2)
    assert block.nnz == len(block.rows) == len(block.raw)
    users = read_ids(tmp_path / "s", "users")
    assert users.dtype == np.int64 and np.all(users % 10 == 0)
    assert read_ids(info.path, "items").tolist() == list(range(40))
    with pytest.raises(ValueError, match="split"):
        read_block(info.path, "valid", 0, 0)
    with pytest.raises(IndexError):
        read_block(info.path, "train", 0, 3)
    with pytest.raises(ValueError, match="axis"):
        read_ids(info.path, "rows")


def test_string_ids_round_trip(tmp_path):
    users = np.array(["ü-1", "a", "bb" * 30, "a"])
    info = ingest_arrays(
        users, ["x", "y", "x", "x"], [1, 1, 1, 1], tmp_path / "s", test_fraction=0.0
    )
    ids = read_ids(info.path, "users")
    assert ids.dtype.kind == "U" and ids.tolist() == sorted({"ü-1", "a", "bb" * 30})


def _all_blocks(path: str) -> list[tuple]:
    info = open_store(path)
    out = []
    for r in range(info.grid[0]):
        for c in range(info.grid[1]):
            b = read_block(path, "train", r, c)
            out.append((r, c, b.rows.tolist(), b.cols.tolist(), b.y.tolist()))
    return out


def _one_block(args: tuple[str, int, int]) -> tuple:
    path, r, c = args
    b = read_block(path, "train", r, c)
    return (r, c, b.rows.tolist(), b.cols.tolist(), b.y.tolist())


def test_concurrent_reads(tmp_path):
    info = make_store(tmp_path / "s", grid=(3, 3))
    expected = _all_blocks(info.path)
    jobs = [(info.path, r, c) for r in range(3) for c in range(3)] * 4
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(_one_block, jobs)) == expected * 4
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        assert list(pool.map(_one_block, jobs[:9])) == expected


def test_overwrite(tmp_path):
    out = tmp_path / "s"
    first = make_store(out, seed=0)
    before = _all_blocks(first.path)
    with pytest.raises(InputError, match="already exists"):
        make_store(out, seed=1)
    assert _all_blocks(first.path) == before
    second = make_store(out, seed=1, overwrite=True)
    assert second.nnz_train != first.nnz_train or _all_blocks(second.path) != before
    assert _all_blocks(second.path) != before  # the read cache sees the new store
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_refuses_to_overwrite_non_store(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("precious")
    with pytest.raises(InputError, match="not a zarr store"):
        make_store(tmp_path / "data", overwrite=True)
    assert (tmp_path / "data" / "keep.txt").read_text() == "precious"


def test_open_store_errors(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        open_store(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="not a zarr group"):
        open_store(tmp_path / "empty")
    zarr.open_group(tmp_path / "plain", mode="w")
    with pytest.raises(StoreError, match="not an ordnmf_dask store"):
        open_store(tmp_path / "plain")
    with pytest.raises(StoreError):
        read_block(tmp_path / "plain", "train", 0, 0)
    assert issubclass(StoreError, InputError)


def test_blocks_are_csr_with_row_pointers(tmp_path):
    """Every block's row pointer counts exactly its nonzeros per local row, and the nonzeros are
    CSR-ordered: re-expanding (row, col) gives back the input coordinates."""
    info = make_store(tmp_path / "s", test_fraction=0.0)
    rng = np.random.default_rng(0)
    u, i = np.nonzero(rng.random((50, 40)) < 0.3)
    seen = []
    for r in range(2):
        for c in range(3):
            b = read_block(info.path, "train", r, c)
            assert b.indptr.dtype == np.int64 and b.indptr.shape == (b.shape[0] + 1,)
            assert b.indptr[0] == 0 and b.indptr[-1] == b.nnz and np.all(np.diff(b.indptr) >= 0)
            key = b.rows.astype(np.int64) * b.shape[1] + b.cols
            assert np.all(np.diff(key) > 0)  # sorted by (row, col), no duplicates
            seen += zip(b.rows + info.row_bounds[r], b.cols + info.col_bounds[c], strict=True)
    users = read_ids(info.path, "users")
    assert sorted((int(users[a]) // 10, int(b)) for a, b in seen) == sorted(zip(u, i, strict=True))


def test_row_pointer_and_expand_rows_round_trip():
    """Rows with no nonzeros (first, middle, last) keep empty ranges; order of rows is free."""
    from ordnmf_dask.model.rowptr import expand_rows, row_pointer

    rows = np.array([3, 1, 1, 3, 3, 4], dtype=np.int32)
    ptr = row_pointer(rows, 6)
    assert ptr.tolist() == [0, 0, 2, 2, 5, 6, 6] and ptr.dtype == np.int64
    assert expand_rows(ptr).tolist() == sorted(rows.tolist())
    assert expand_rows(row_pointer(np.zeros(0, np.int32), 3)).tolist() == []


def test_staged_rows_are_read_by_range_and_a_cut_file_is_an_error_naming_it(tmp_path):
    """``staged.NpyRows`` (how staged pieces and synth's factor rows are read): any row range
    of a 1-D or 2-D ``.npy`` (format 1.0 or 2.0) equals numpy's slice; a file cut short is a
    StoreError naming it, never short data."""
    from ordnmf_dask.store.staged import NpyRows

    rng = np.random.default_rng(1)
    flat, table = rng.integers(-9, 9, 1000).astype(np.int32), rng.random((300, 7))
    np.save(tmp_path / "flat.npy", flat)
    with open(tmp_path / "table.npy", "wb") as f:
        np.lib.format.write_array(f, table, version=(2, 0))
    for name, arr in (("flat", flat), ("table", table)):
        rows = NpyRows(str(tmp_path / f"{name}.npy"))
        assert rows.shape == arr.shape
        for lo, hi in ((0, len(arr)), (3, 17), (len(arr) - 1, len(arr)), (5, 5), (10, 10**6)):
            np.testing.assert_array_equal(rows[lo:hi], arr[lo:hi])
    cut = tmp_path / "table.npy"
    cut.write_bytes(cut.read_bytes()[:-8])
    with pytest.raises(StoreError, match=f"^{cut}: staged file cut short"):
        NpyRows(str(cut))[290:300]
    np.testing.assert_array_equal(NpyRows(str(cut))[0:290], table[:290])
