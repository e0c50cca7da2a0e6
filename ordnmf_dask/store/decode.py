"""Slices of a store's 1-D arrays, decoded from their chunk files into caller-chosen buffers, and
the chunk inventory that makes a missing or damaged chunk file an error.

The per-nonzero arrays of a store (cols, y, raw) and the row pointers are 1-D zarr v3 arrays that
this package writes with one encoding: regular chunks, the ``bytes`` codec (little endian) then
``blosc``, default chunk keys (chunk i is the file ``<array>/c/<i>``). A streamed fit reads every
block in every pass. Through zarr, each read allocates every decoded chunk and the result afresh;
a Dask worker's glibc malloc (Dask sets MALLOC_TRIM_THRESHOLD_) hands each such allocation back to
the OS when it is freed, so every page is faulted in and zeroed again on the next read; decoding
into buffers the reading thread keeps (:func:`thread_buffer`) avoids that (docs/performance.md,
"Worker memory").

Chunk inventory: zarr reads an absent chunk file as the fill value (zeros), and by default does
not write a chunk that holds only the fill value, so a deleted chunk file cannot be told from an
empty one. Every array of a store is therefore written with all its chunk files
(:data:`WRITE_ALL`), and its attribute ``chunk_files`` (:data:`INVENTORY`) lists each file's size
and zlib CRC-32. Readers check a file's size on every read and its CRC-32 the first time a process
reads that version of the file (same inode, size, mtime and ctime), so the checksum costs nothing
on the later passes of a streamed fit; a missing, resized or changed file is a ``StoreError``
naming it. A store at a URL (:mod:`.files`) is read the same way through fsspec, one request per
chunk file, and every read is checked against the CRC-32 (an object's identity would cost a
request of its own).
"""

from __future__ import annotations

import os
import stat
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numcodecs import blosc

from ordnmf_dask.errors import StoreError
from ordnmf_dask.store import locations

if TYPE_CHECKING:
    from zarr.core.array_spec import ArrayConfigParams

CODECS = ("bytes", "blosc")
CHUNK = 2**20  # elements per chunk of a store's arrays (the last and small arrays: fewer)
INVENTORY = "chunk_files"  # array attribute: {"bytes": [...], "crc32": [...]}, one per chunk file
WRITE_ALL: ArrayConfigParams = {"write_empty_chunks": True}  # zarr array config of every writer


def chunk_key(i: int, grid: tuple[int, ...] = ()) -> str:
    """The file name of chunk ``i`` under the array's ``c/``: of a 1-D array, or of the
    ``i``-th chunk in C order of an N-D array's chunk ``grid`` (chunks per dimension)."""
    if len(grid) < 2:
        return str(i)
    return "/".join(str(int(x)) for x in np.unravel_index(i, grid))


def chunk_path(directory: str, i: int, grid: tuple[int, ...] = ()) -> str:
    """The file of chunk ``i`` of the array stored in ``directory`` (see :func:`chunk_key`)."""
    return os.path.join(directory, "c", chunk_key(i, grid))


def chunk_grid(array: Any) -> tuple[int, ...]:
    """Chunks per dimension of a ``zarr.Array`` (its chunk files are listed in C order)."""
    return tuple(
        -(-int(n) // max(int(c), 1)) for n, c in zip(array.shape, array.chunks, strict=True)
    )


def chunk_record(path: str) -> tuple[int, int]:
    """(size in bytes, zlib CRC-32) of a chunk file just written (a local path or a URL)."""
    with locations.open_file(path) as f:
        data = f.read()
    return len(data), zlib.crc32(data)


def inventory(records: Sequence[tuple[int, int]]) -> dict[str, list[int]]:
    """The value of the :data:`INVENTORY` attribute for ``records``: (size, CRC-32) of chunk
    file 0, 1, ..."""
    return {"bytes": [int(n) for n, _ in records], "crc32": [int(c) for _, c in records]}


def set_inventory(array: Any, records: Sequence[tuple[int, int]]) -> None:
    """Record ``records`` (``chunk_record`` of chunk 0, 1, ...) as the inventory of ``array``
    (a ``zarr.Array``)."""
    array.attrs[INVENTORY] = inventory(records)


def record_inventory(array: Any) -> None:
    """Record the inventory of a ``zarr.Array`` of a local store or one at a URL (fsspec), once
    all its chunks are written (with :data:`WRITE_ALL`)."""
    store = array.store_path.store
    if hasattr(store, "root"):  # a LocalStore
        directory = os.path.join(str(store.root), array.path)
    else:  # an FsspecStore
        directory = store.fs.unstrip_protocol(f"{store.path.rstrip('/')}/{array.path}")
    grid = chunk_grid(array)
    set_inventory(
        array, [chunk_record(chunk_path(directory, i, grid)) for i in range(array.nchunks)]
    )


@dataclass(frozen=True)
class ChunkFiles:
    """The chunk files of one array as its inventory lists them.

    directory : the array's directory; nbytes, crc32 : size and CRC-32 of chunk file 0, 1, ...
    (crc32 None: sizes only, for arrays written before inventories whose sizes follow from
    their shape); grid : chunks per dimension of an N-D array (chunk i is the i-th in C order),
    () for 1-D; owner : what holds the array, for messages ("store", "model", ...).
    """

    directory: str
    nbytes: tuple[int, ...]
    crc32: tuple[int, ...] | None
    grid: tuple[int, ...] = ()
    owner: str = "store"

    @classmethod
    def of(cls, array: Any, directory: str, owner: str = "store") -> ChunkFiles:
        """The inventory of an opened ``zarr.Array`` stored in ``directory``.

        Raises StoreError when the array has no inventory or it does not list one file per
        chunk of the array's shape.
        """
        inv = array.attrs.get(INVENTORY)
        if not isinstance(inv, dict):
            raise StoreError(
                f"{directory}: no chunk inventory (attribute {INVENTORY}): written by an "
                "ordnmf_dask version that did not record one, so a missing chunk file could not "
                "be told from an empty chunk, or damaged; make the store again with "
                "`ordnmf-dask ingest` (or `synth`)"
            )
        nbytes, crc = inv.get("bytes"), inv.get("crc32")
        n = int(array.nchunks)
        if not (
            isinstance(nbytes, list)
            and isinstance(crc, list)
            and len(nbytes) == len(crc) == n
            and all(isinstance(x, int) for x in (*nbytes, *crc))
        ):
            raise StoreError(
                f"{directory}: chunk inventory (attribute {INVENTORY}) does not list the size "
                f"and CRC-32 of each of the array's {n} chunk files"
            )
        return cls(directory, tuple(nbytes), tuple(crc), chunk_grid(array), owner)

    def path(self, i: int) -> str:
        """The file of chunk ``i``."""
        return chunk_path(self.directory, i, self.grid)

    def check_present(self) -> None:
        """Raise StoreError unless every chunk file exists with its recorded size."""
        listed = (
            locations.sizes(locations.join(self.directory, "c"))
            if locations.is_url(self.directory)
            else None
        )
        for i, n in enumerate(self.nbytes):
            path = self.path(i)
            size = _local_size(path) if listed is None else listed.get(chunk_key(i, self.grid))
            if size is None:
                raise StoreError(f"{path}: chunk file missing (the {self.owner} is damaged)")
            self._check_size(path, size, n)

    def verify(self) -> None:
        """Raise StoreError unless every chunk file exists and matches its size and CRC-32."""
        for i in range(len(self.nbytes)):
            self.load(i)

    def load(self, i: int, into: memoryview | None = None) -> memoryview:
        """The bytes of chunk file ``i`` in the thread's reusable buffer (or in ``into``, bytes
        that must match the file's recorded size), after checking them against the
        inventory."""
        path = self.path(i)
        if into is not None and into.nbytes != self.nbytes[i]:
            raise StoreError(
                f"{path}: the {self.owner} records {self.nbytes[i]} bytes for the "
                f"chunk file, whose values take {into.nbytes} (the {self.owner} is "
                "damaged)"
            )
        if locations.is_url(path):
            view = self._load_url(path, i)
            if into is not None:
                into[:] = view
            return view if into is None else into
        try:
            f = locations.open_regular(path)  # never a link, a FIFO or a device
        except FileNotFoundError:
            raise StoreError(f"{path}: chunk file missing (the {self.owner} is damaged)") from None
        with f:
            st = os.fstat(f.fileno())
            self._check_size(path, st.st_size, self.nbytes[i])
            size = st.st_size
            if into is None and len(_BUFFERS.packed) < size:
                _BUFFERS.packed = bytearray(size)
            view = memoryview(_BUFFERS.packed)[:size] if into is None else into
            got = 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
        if got != size:
            raise StoreError(f"{path}: chunk file shorter than its size ({got} of {size} bytes)")
        if self.crc32 is None:
            return view
        key = (path, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns, self.crc32[i])
        if key not in _VERIFIED:
            self._check_crc(path, view, i)
            if len(_VERIFIED) >= _VERIFIED_MAX:
                _VERIFIED.clear()
            _VERIFIED.add(key)
        return view

    def _load_url(self, path: str, i: int) -> memoryview:
        """:meth:`load` of a chunk file at a URL: one request for at most one byte more than
        recorded (a larger file is never read whole), the CRC-32 checked every time."""
        try:
            data = locations.read_head(path, self.nbytes[i])
        except FileNotFoundError:
            raise StoreError(f"{path}: chunk file missing (the {self.owner} is damaged)") from None
        self._check_size(path, len(data), self.nbytes[i], whole=len(data) <= self.nbytes[i])
        if self.crc32 is not None:
            self._check_crc(path, data, i)
        return memoryview(data)

    def _check_size(self, path: str, size: int, recorded: int, whole: bool = True) -> None:
        """StoreError unless the file of ``size`` bytes (``whole``: all of it; else the part
        read, which is more than ``recorded``) has the size recorded."""
        if size != recorded:
            source = (
                f"the {self.owner} recorded"
                if self.crc32 is not None
                else "the array's shape takes"
            )
            raise StoreError(
                f"{path}: chunk file has {size if whole else f'more than {recorded}'} bytes, "
                f"{source} {recorded} "
                f"(the {self.owner} is damaged)"
            )

    def _check_crc(self, path: str, data: bytes | memoryview, i: int) -> None:
        assert self.crc32 is not None
        if zlib.crc32(data) != self.crc32[i]:
            raise StoreError(
                f"{path}: chunk file does not match the CRC-32 the {self.owner} "
                f"recorded for it (the {self.owner} is damaged)"
            )


_VERIFIED: set[tuple[str, int, int, int, int, int]] = set()  # file versions whose CRC matched
_VERIFIED_MAX = 1 << 16


def _local_size(path: str) -> int | None:
    """Size of the regular file ``path`` (None if absent); StoreError for a link or anything
    but a regular file (:func:`locations.open_regular` would refuse to read it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(
            f"{path}: not a regular file (a link, FIFO or device where a chunk file "
            "belongs); refusing to read it"
        )
    return st.st_size


@dataclass(frozen=True)
class ArrayFiles:
    """The chunk files of one 1-D array of a store.

    directory : the array's directory; dtype : its element type; size : elements;
    chunk : elements per chunk (the last chunk's file is full size, padded); files : its
    chunk files as its inventory lists them.
    """

    directory: str
    dtype: np.dtype
    size: int
    chunk: int
    files: ChunkFiles

    @classmethod
    def of(cls, array: object, directory: str) -> ArrayFiles:
        """Layout of an opened zarr v3 array (``zarr.Array``) stored in ``directory``.

        Raises StoreError when the array is not encoded the way this package writes it or has
        no valid chunk inventory.
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
        if not 1 <= chunk <= CHUNK:  # a decode buffer is a chunk: bounded before it is made
            raise StoreError(
                f"{directory}: chunks of {chunk} elements, but a store's arrays have chunks of "
                f"1..{CHUNK} (the store is damaged)"
            )
        dtype = np.dtype(array.dtype)  # type: ignore[attr-defined]
        return cls(directory, dtype, shape[0], chunk, ChunkFiles.of(array, directory))

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
            packed = self.files.load(i)
            if (a, b) == (start, start + self.chunk):
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
