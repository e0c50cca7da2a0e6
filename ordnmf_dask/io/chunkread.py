"""Slices of a store's 1-D arrays, decoded from their chunk files into caller-chosen buffers.

The per-nonzero arrays of a store (cols, y, raw) and the row pointers are 1-D zarr v3 arrays that
this package writes with one encoding: regular chunks, the ``bytes`` codec (little endian) then
``blosc``, default chunk keys (chunk i is the file ``<array>/c/<i>``, absent when the chunk holds
only the fill value). A streamed fit reads every block in every pass. Through zarr, each read
allocates every decoded chunk and the result afresh; a Dask worker's glibc malloc (Dask sets
MALLOC_TRIM_THRESHOLD_) hands each such allocation back to the OS when it is freed, so every
page is faulted in and zeroed again on the next read. On a block of the 1e9 store with Dask's
malloc setting that made cols + y cost ~11 ns per nonzero, against ~3 ns decoded here into
buffers the reading thread keeps (:func:`thread_buffer`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np
from numcodecs import blosc

from .errors import StoreError

CODECS = ("bytes", "blosc")


@dataclass(frozen=True)
class ArrayFiles:
    """The chunk files of one 1-D array of a store.

    directory : the array's directory; dtype : its element type; size : elements;
    chunk : elements per chunk (the last chunk's file is full size, padded); fill : the value
    of the elements of a chunk that has no file.
    """

    directory: str
    dtype: np.dtype
    size: int
    chunk: int
    fill: int | float

    @classmethod
    def of(cls, array: object, directory: str) -> ArrayFiles:
        """Layout of an opened zarr v3 array (``zarr.Array``) stored in ``directory``.

        Raises StoreError when the array is not encoded the way this package writes it.
        """
        meta = array.metadata.to_dict()  # type: ignore[attr-defined]
        codecs = meta.get("codecs", ())
        names = tuple(c["name"] for c in codecs)
        endian = (codecs[0].get("configuration") or {}).get("endian", "little") if codecs else None
        keys = meta.get("chunk_key_encoding", {})
        separator = (keys.get("configuration") or {}).get("separator", "/")
        shape = tuple(array.shape)  # type: ignore[attr-defined]
        if (
            names != CODECS
            or endian != "little"
            or keys.get("name") != "default"
            or (separator != "/" or len(shape) != 1)
        ):
            raise StoreError(
                f"{directory}: array stored with codecs {names}, endian {endian}, chunk keys "
                f"{keys.get('name')!r} '{separator}', {len(shape)} dimension(s); this version "
                "reads 1-D arrays with codecs ('bytes' little endian, 'blosc') and default '/' keys"
            )
        chunk = int(array.chunks[0])  # type: ignore[attr-defined]
        dtype = np.dtype(array.dtype)  # type: ignore[attr-defined]
        return cls(directory, dtype, shape[0], chunk, meta["fill_value"])

    def read(self, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        """Elements ``[lo, hi)`` decoded into ``out[: hi - lo]``, which is returned.

        ``out``: a C-contiguous array of ``self.dtype`` with at least ``hi - lo`` elements.
        """
        if not 0 <= lo <= hi <= self.size:
            raise ValueError(f"{self.directory}: slice [{lo}, {hi}) of an array of {self.size}")
        if out.dtype != self.dtype or out.shape[0] < hi - lo or not out.flags.c_contiguous:
            raise ValueError(f"{self.directory}: out must hold {hi - lo} {self.dtype}")
        res = out[: hi - lo]
        if hi == lo:  # an empty block: no chunk to decode
            return res
        for i in range(lo // self.chunk, -(-hi // self.chunk)):
            start = i * self.chunk
            a, b = max(lo, start), min(hi, start + self.chunk)
            packed = _packed(os.path.join(self.directory, "c", str(i)))
            if packed is None:
                res[a - lo : b - lo] = self.fill
            elif (a, b) == (start, start + self.chunk):
                _decompress(packed, res[a - lo : b - lo], self.directory, i)
            else:
                whole = thread_buffer(f"chunk:{self.dtype.str}", self.chunk, self.dtype)
                _decompress(packed, whole, self.directory, i)
                res[a - lo : b - lo] = whole[a - start : b - start]
        return res


class _Buffers(threading.local):
    def __init__(self) -> None:
        self.packed = bytearray()
        self.arrays: dict[str, np.ndarray] = {}


_BUFFERS = _Buffers()


def thread_buffer(name: str, n: int, dtype: np.dtype) -> np.ndarray:
    """``n`` elements of ``dtype``: a view of the calling thread's buffer ``name``, reused by
    every later call with that name (grown when too small, never shrunk). Its contents are
    valid until the next use of the name by the same thread."""
    buf = _BUFFERS.arrays.get(name)
    if buf is None or buf.dtype != dtype or buf.shape[0] < n:
        buf = _BUFFERS.arrays[name] = np.empty(max(n, 1), dtype=dtype)
    return buf[:n]


def _packed(path: str) -> memoryview | None:
    """The bytes of a chunk file in the thread's reusable buffer, or None when it has no file."""
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed below, after readinto)
    except FileNotFoundError:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        if len(_BUFFERS.packed) < size:
            _BUFFERS.packed = bytearray(size)
        view = memoryview(_BUFFERS.packed)[:size]
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
    if got != size:
        raise StoreError(f"{path}: chunk file shorter than its size ({got} of {size} bytes)")
    return view


def _decompress(packed: memoryview, into: np.ndarray, directory: str, i: int) -> None:
    """Decode one blosc frame into ``into``, which it must fill exactly. The header's sizes
    are checked first (blosc itself does not notice a truncated frame): bytes 4-7 hold the
    decoded size, 12-15 the frame's size (blosc 1 format, little endian)."""
    where = f"{directory}/c/{i}"
    if len(packed) < blosc.MAX_OVERHEAD:
        raise StoreError(f"{where}: unreadable chunk ({len(packed)} bytes, no blosc header)")
    header = packed[:16].tobytes()
    nbytes, cbytes = int.from_bytes(header[4:8], "little"), int.from_bytes(header[12:16], "little")
    if cbytes != len(packed) or nbytes != into.nbytes:
        raise StoreError(
            f"{where}: unreadable chunk (frame of {cbytes} bytes decoding to {nbytes}; the file "
            f"has {len(packed)} bytes and the chunk holds {into.nbytes})"
        )
    try:
        blosc.decompress(packed, into)
    except (RuntimeError, ValueError) as exc:
        raise StoreError(f"{where}: unreadable chunk ({exc})") from None
