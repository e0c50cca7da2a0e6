"""Reused memory for the large arrays a fit makes every iteration (the (n, K) float64 partials).

A Dask worker's glibc malloc returns every freed block larger than 64 KiB to the OS (Dask sets
MALLOC_TRIM_THRESHOLD_ so that worker memory shrinks), so each (n, K) array a task makes is a
fresh mapping that the kernel faults in and zeroes 4 KiB page by page. On this machine kind a
fault costs ~8 us: on the 2.5M-nonzero benchmark that was ~22k faults and ~70 ms of system time
per worker per iteration (a fifth of its CPU), and allocating a correction's 4 MB accumulator
cost as much as half its kernel.

Arrays of at least :data:`MIN_BYTES` come from mappings that this module keeps: when the last
view of an array is gone, its mapping goes to a free list and the next request of the same
(page-rounded) size reuses it, already faulted in. The free list holds at most
:data:`KEEP_BYTES` (the least recently freed mappings are unmapped first), so what a worker
keeps beyond the arrays in use stays bounded. Each mapping starts on a 2 MiB boundary and its
whole 2 MiB pages are advised MADV_HUGEPAGE (transparent huge pages where the system allows
them: fewer faults and TLB misses on first use). Smaller arrays come from numpy as usual.
Thread safe; per process.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import weakref
from math import prod

import numpy as np

MIN_BYTES = 1 << 20  # arrays from this size up are served from reused mappings
KEEP_BYTES = 64 << 20  # at most this much of unused mappings kept per process
_PAGE = mmap.PAGESIZE
_HUGE = 2 << 20


class _Owner:
    """Owner of one served array's memory: every numpy view of the array refers to it (as
    ``base``), and the mapping goes back to the free list when the owner dies."""

    __slots__ = ("__array_interface__", "__weakref__")


class _Pool:
    def __init__(self) -> None:
        # re-entrant: a garbage collection inside a locked section may run a finalizer (give)
        self.lock = threading.RLock()
        self.free: list[tuple[int, mmap.mmap, int]] = []  # (size, mapping, address), oldest first
        self.free_bytes = 0

    def take(self, size: int) -> tuple[mmap.mmap, int, bool]:
        """A mapping of ``size`` bytes (a multiple of the page size): a free one (most recently
        freed first) or a new one; the flag says whether it is new (so still zero)."""
        with self.lock:
            for j in range(len(self.free) - 1, -1, -1):
                if self.free[j][0] == size:
                    _, m, addr = self.free.pop(j)
                    self.free_bytes -= size
                    return m, addr, False
        m = mmap.mmap(-1, size + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        start = ctypes.addressof(ctypes.c_char.from_buffer(m))  # the export ends with the temp
        offset = -start % _HUGE
        whole = size // _HUGE * _HUGE
        if whole and hasattr(mmap, "MADV_HUGEPAGE"):
            m.madvise(mmap.MADV_HUGEPAGE, offset, whole)
        return m, start + offset, True

    def give(self, size: int, m: mmap.mmap, addr: int) -> None:
        """Return a mapping whose array is gone; unmap the oldest beyond KEEP_BYTES."""
        entry = (size, m, addr)
        with self.lock:
            self.free.append(entry)
            self.free_bytes += size
            while self.free_bytes > KEEP_BYTES:
                self.free_bytes -= self.free.pop(0)[0]


_POOL = _Pool()


def empty(shape: tuple[int, ...], dtype: np.dtype | type = np.float64) -> np.ndarray:
    """An uninitialized C-contiguous array, as ``np.empty`` (from a reused mapping when large)."""
    return _array(shape, np.dtype(dtype), zero=False)


def zeros(shape: tuple[int, ...], dtype: np.dtype | type = np.float64) -> np.ndarray:
    """A zeroed C-contiguous array, as ``np.zeros`` (from a reused mapping when large)."""
    return _array(shape, np.dtype(dtype), zero=True)


def _array(shape: tuple[int, ...], dtype: np.dtype, zero: bool) -> np.ndarray:
    shape = tuple(int(n) for n in shape)
    nbytes = prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
    size = -(-nbytes // _PAGE) * _PAGE
    m, addr, new = _POOL.take(size)
    owner = _Owner()
    owner.__array_interface__ = {
        "shape": shape, "typestr": dtype.str, "data": (addr, False), "version": 3,
    }  # fmt: skip
    done = weakref.finalize(owner, _POOL.give, size, m, addr)
    done.atexit = False
    out = np.asarray(owner)
    if zero and not new:  # a new mapping is zero already
        out.fill(0)
    return out


def kept_bytes() -> int:
    """Bytes of unused mappings this process keeps for reuse (at most KEEP_BYTES)."""
    return _POOL.free_bytes
