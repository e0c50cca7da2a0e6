"""Block reads decoded from the chunk files (store/decode.py) against zarr's own slicing."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from ordnmf_dask.errors import StoreError
from ordnmf_dask.sources import distributed_tasks as tasks_module
from ordnmf_dask.sources.ingest import ingest_arrays
from ordnmf_dask.store import blocks
from ordnmf_dask.store import staged as staged_module
from ordnmf_dask.store.blocks import COMPRESSORS, SPLITS, read_block
from ordnmf_dask.store.decode import WRITE_ALL, ArrayFiles, record_inventory, thread_buffer


def _array(path, data, chunk, **kw) -> zarr.Array:
    arr = zarr.create_array(
        path,
        shape=data.shape,
        dtype=data.dtype,
        chunks=(chunk,),
        **{"compressors": COMPRESSORS, "config": WRITE_ALL, **kw},
    )
    arr[:] = data
    record_inventory(arr)
    return arr


@pytest.mark.parametrize("dtype", ["int32", "uint8", "float64", "int64"])
def test_every_slice_matches_zarr(tmp_path, dtype):
    """Slices starting and ending inside, at the edges of, and across chunks, including a
    chunk that holds only the fill value (its file is written all the same) and the padded
    last chunk."""
    data = np.arange(1, 24).astype(dtype)
    data[5:10] = 0  # chunk 1 of 5 elements: all fill value
    arr = _array(tmp_path / "a", data, chunk=5)
    assert (tmp_path / "a" / "c" / "1").exists() and (tmp_path / "a" / "c" / "4").exists()
    files = ArrayFiles.of(zarr.open_array(tmp_path / "a", mode="r"), str(tmp_path / "a"))
    assert (files.size, files.chunk, files.dtype) == (23, 5, np.dtype(dtype))
    out = np.full(30, 99, dtype=dtype)
    for lo in range(24):
        for hi in range(lo, 24):
            got = files.read(lo, hi, out)
            assert got.base is out or got is out or np.shares_memory(got, out)
            np.testing.assert_array_equal(got, arr[lo:hi])
            np.testing.assert_array_equal(files.read(lo, hi, np.empty(hi - lo, dtype)), data[lo:hi])


def test_smaller_chunks_after_larger_ones(tmp_path):
    """The thread's chunk buffer, grown by an array with larger chunks, serves a partial read
    of an array with smaller ones."""
    big = _array(tmp_path / "big", np.arange(100, dtype=np.int64), 44)
    small = _array(tmp_path / "small", np.arange(50, dtype=np.int64) * 3, 21)
    for arr, name in ((big, "big"), (small, "small"), (big, "big")):
        files = ArrayFiles.of(arr, str(tmp_path / name))
        np.testing.assert_array_equal(files.read(3, 40, np.empty(37, np.int64)), arr[3:40])


def test_bad_slices_and_buffers(tmp_path):
    files = ArrayFiles.of(
        _array(tmp_path / "a", np.arange(10, dtype=np.int32), 4), str(tmp_path / "a")
    )
    with pytest.raises(ValueError, match=r"slice \[3, 11\)"):
        files.read(3, 11, np.empty(8, np.int32))
    with pytest.raises(ValueError, match="out must hold 5 int32"):
        files.read(0, 5, np.empty(4, np.int32))
    with pytest.raises(ValueError, match="out must hold"):
        files.read(0, 5, np.empty(5, np.int64))


def test_unsupported_encoding_and_damaged_chunk(tmp_path):
    plain = _array(tmp_path / "plain", np.arange(10, dtype=np.int32), 4, compressors=None)
    with pytest.raises(StoreError, match=r"plain: array stored with codecs \('bytes',\)"):
        ArrayFiles.of(plain, str(tmp_path / "plain"))
    zstd = _array(
        tmp_path / "z", np.arange(10, dtype=np.int32), 4, compressors=(zarr.codecs.ZstdCodec(),)
    )
    with pytest.raises(StoreError, match="'zstd'"):
        ArrayFiles.of(zstd, str(tmp_path / "z"))
    arr = _array(tmp_path / "a", np.arange(1, 11, dtype=np.int32), 4)
    files = ArrayFiles.of(arr, str(tmp_path / "a"))
    chunk = tmp_path / "a" / "c" / "1"
    chunk.write_bytes(chunk.read_bytes()[:-3])
    with pytest.raises(StoreError, match=r"a/c/1: chunk file has \d+ bytes, the store recorded"):
        files.read(0, 10, np.empty(10, np.int32))
    np.testing.assert_array_equal(files.read(0, 4, np.empty(4, np.int32)), np.arange(1, 5))
    assert files.read(5, 5, np.empty(0, np.int32)).shape == (0,)  # empty: chunk 1 is not read


def test_read_block_matches_zarr_with_many_chunks(tmp_path, monkeypatch):
    """With 7-element chunks every block spans several chunks: reading with and without the
    thread's reused buffers gives the slices zarr gives."""
    for module in (blocks, staged_module, tasks_module):  # every writer of store chunks
        monkeypatch.setattr(module, "CHUNK", 7)
    rng = np.random.default_rng(1)
    u, i = np.nonzero(rng.random((60, 45)) < 0.25)
    info = ingest_arrays(
        u, i, rng.integers(1, 6, len(u)), tmp_path / "s", grid=(3, 2), counts="paper"
    )
    group = zarr.open_group(info.path, mode="r")
    assert group["train/cols"].chunks == (7,) and group["train/cols"].nchunks > 20
    for split in SPLITS:
        offsets, pointers = group[f"{split}/offsets"][:], group[f"{split}/indptr"][:]
        start = 0
        for r in range(3):
            for c in range(2):
                b = r * 2 + c
                lo, hi = int(offsets[b]), int(offsets[b + 1])
                n_rows = info.block_shape(r, c)[0]
                owned = read_block(info.path, split, r, c)
                reused = read_block(info.path, split, r, c, reuse=True)
                for block in (owned, reused):
                    np.testing.assert_array_equal(
                        block.indptr, pointers[start : start + n_rows + 1]
                    )
                    for name in ("cols", "y", "raw"):
                        np.testing.assert_array_equal(
                            getattr(block, name), group[f"{split}/{name}"][lo:hi]
                        )
                start += n_rows + 1
    assert start == len(pointers)


def test_reused_blocks_share_the_threads_buffers(tmp_path):
    """A reusing read overwrites the previous one (what the streamed passes rely on being done
    with); a plain read owns its arrays."""
    rng = np.random.default_rng(2)
    u, i = np.nonzero(rng.random((40, 30)) < 0.3)
    info = ingest_arrays(u, i, rng.integers(1, 4, len(u)), tmp_path / "s", grid=(2, 2))
    first = read_block(info.path, "train", 0, 0, values=("y",), reuse=True)
    first_cols = first.cols.copy()
    second = read_block(info.path, "train", 1, 1, values=("y",), reuse=True)
    assert np.shares_memory(first.cols, second.cols) and np.shares_memory(first.y, second.y)
    assert np.shares_memory(second.cols, thread_buffer("cols", 1, np.dtype(np.int32)))
    owned = read_block(info.path, "train", 0, 0, values=("y",))
    np.testing.assert_array_equal(owned.cols, first_cols)
    assert not np.shares_memory(owned.cols, second.cols)
