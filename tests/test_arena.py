"""Reused memory (``ordnmf_dask.model.arena``): lifetimes, zeroing, the bound, and kernels on it."""

from __future__ import annotations

import mmap
import pickle
import threading

import numpy as np

from ordnmf_dask.model import arena, kernels
from ordnmf_dask.model.kernels import CsrBlock

BIG = (6000, 50)  # 2.4 MB: served from the pool


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_large_arrays_are_reused_and_zeroed_small_ones_are_numpy():
    a = arena.empty(BIG)
    assert a.shape == BIG and a.dtype == np.float64 and a.flags.c_contiguous
    assert a.flags.writeable
    a.fill(7.0)
    where = _address(a)
    del a
    b = arena.zeros(BIG)
    assert _address(b) == where  # the freed mapping, not a new one
    assert not b.any()  # zeroed although the memory held 7s
    small = arena.zeros((10, 5))
    assert small.base is None and not small.any()


def test_memory_is_not_reused_while_a_view_lives():
    a = arena.empty(BIG)
    a.fill(1.0)
    view = a[100:200]
    del a
    b = arena.zeros(BIG)
    b.fill(2.0)
    assert np.all(view == 1.0)  # still its own memory
    where = _address(view) - 100 * BIG[1] * 8
    del view
    c = arena.empty(BIG)
    assert _address(c) == where  # freed once the last view went
    del b, c


def test_kept_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(arena, "KEEP_BYTES", 3 * (4 << 20))
    arrays = [arena.empty((1 << 19,)) for _ in range(8)]  # 4 MiB each
    assert arena.kept_bytes() <= arena.KEEP_BYTES
    del arrays
    assert 0 < arena.kept_bytes() <= arena.KEEP_BYTES


def test_other_dtypes_and_pickling():
    a = arena.zeros((1 << 18,), np.int64)
    a[:] = np.arange(a.size)
    b = pickle.loads(pickle.dumps(a, protocol=5))
    assert b.dtype == np.int64
    np.testing.assert_array_equal(a, b)


def test_threads_never_share_live_memory():
    errors: list[str] = []

    def work(tag: float) -> None:
        for _ in range(50):
            a = arena.empty(BIG)
            a.fill(tag)
            b = arena.zeros((BIG[0] + 1000, BIG[1]))
            if not np.all(a == tag) or b.any():
                errors.append(f"thread {tag}: memory shared with another live array")
            del a, b

    threads = [threading.Thread(target=work, args=(float(t),)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def _block(rng: np.random.Generator, n_rows: int, n_cols: int, nnz: int, v: int) -> CsrBlock:
    flat = np.sort(rng.choice(n_rows * n_cols, nnz, replace=False))
    rows, cols = np.divmod(flat, n_cols)
    y = rng.integers(1, v + 1, nnz).astype(np.uint8)
    return CsrBlock.from_coo(rows.astype(np.int32), cols.astype(np.int32), y, (n_rows, n_cols))


def test_kernels_on_dirty_reused_memory_give_the_same_results(monkeypatch):
    """Every array of the kernels from the pool (threshold 0), over memory left full of NaNs by
    earlier arrays: the results are bitwise those of plain numpy memory."""
    rng = np.random.default_rng(3)
    v, k = 4, 7
    blocks = [_block(rng, 60, 40, 600, v), _block(rng, 60, 30, 500, v)]
    gw, ew = rng.gamma(1.0, 0.5, (60, k)), rng.gamma(1.0, 0.5, (60, k))
    ghs = [rng.gamma(1.0, 0.5, (b.shape[1], k)) for b in blocks]
    ehs = [rng.gamma(1.0, 0.5, (b.shape[1], k)) for b in blocks]
    delta = np.array([0.0, 0.3, 0.5, 0.8, 1.1])
    gap = rng.random(v + 1)

    def run() -> list[np.ndarray]:
        row = kernels.local_step_row(blocks, gw, ghs, ew, ehs, delta, False)
        return [
            row.sw, *row.sh, row.small,
            kernels.row_correction_row(blocks, gap, ghs),
            kernels.col_correction(blocks[0], gap, ew),
        ]  # fmt: skip

    plain = run()
    monkeypatch.setattr(arena, "MIN_BYTES", 0)
    monkeypatch.setattr(arena, "KEEP_BYTES", 1 << 20)
    dirty = [arena.empty((60, k)) for _ in range(20)]  # all one page each
    for a in dirty:
        a.fill(np.nan)
    del dirty, a
    assert arena.kept_bytes() == 20 * mmap.PAGESIZE  # 60 x 7 float64 fit in one page
    got = run()
    for a, b in zip(got, plain, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_array_freed_while_the_pool_is_locked_does_not_deadlock():
    """A garbage collection inside the pool's locked section may free an array: its finalizer
    takes the lock again in the same thread (a plain lock would hang here for ever)."""

    def free_under_lock(a: list[np.ndarray]) -> None:
        with arena._POOL.lock:
            a.clear()  # the array's last reference: the finalizer runs here

    held = [arena.empty(BIG)]
    t = threading.Thread(target=free_under_lock, args=(held,), daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive()
    assert arena.kept_bytes() > 0
