"""Write a block store from per-block pieces staged as files, in bounded memory per task.

Writers that learn each block's nonzero count only after producing it (the synthetic generator,
the out-of-core ingest) save every piece ("segment") of every block as ``.npy`` files (plain
arrays, no pickle) under ``TMP/_staging``, where ``TMP`` is the store's temporary directory.
``assemble_store`` then

1. computes the offsets from the segment lengths (block b = the concatenation of its segments,
   in the order given),
2. creates the 1-D arrays ``train/``, ``test/`` ``{cols, y, raw, indptr}`` with the same chunking
   as ``write_store`` (``CHUNK`` entries), and
3. fills them with one task per output chunk: a task reads only the slices of the staged pieces
   that overlap its chunk (:class:`NpyRows`; for ``indptr``, the rows of the blocks whose row
   pointers overlap it, counted there: :class:`RowPointer`) and writes exactly one zarr chunk,
   so tasks never write the same chunk and each holds at most ``CHUNK`` entries (~13 MB) at a
   time; raw ids given as :class:`StagedIds` (the out-of-core ingest's id ranges) are written
   the same way, chunk by chunk, by tasks that gather them from the staged files. Every chunk
   file is written, even one of zeros, and the task returns its size and CRC-32, which the
   client records as the array's chunk inventory (see ``ordnmf_dask.store.blocks``): the files
   are checksummed where they are written, not read again by the client.

The staging directory is removed, ``complete`` is set last and ``TMP`` is published to the final
path, as in ``write_store``: a store is complete or absent. A store at a URL is written in place
instead (object stores cannot rename), between the marks of :mod:`.files`: ``TMP`` is the URL
itself and ``TMP/_staging`` a prefix under it, so the workers need no filesystem in common, only
the object store. Staged data take as much space as the store itself (uncompressed; values in
float32 where exact, see ``compact``); at 1e9 nonzeros ~13 GB, freed before the store is marked
complete.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ordnmf_dask.errors import StoreError
from ordnmf_dask.model.rowptr import row_pointer
from ordnmf_dask.runtime.runner import Runner
from ordnmf_dask.store import locations
from ordnmf_dask.store.blocks import (
    CHUNK,
    COMPRESSORS,
    FORMAT_VERSION,
    NONZERO_FIELDS,
    StoreInfo,
    check_target,
    discard_temporary,
    ids_for_zarr,
    open_store,
    publish,
    temporary_path,
    write_array,
)
from ordnmf_dask.store.decode import WRITE_ALL, chunk_path, chunk_record, set_inventory
from ordnmf_dask.store.grid import indptr_starts
from ordnmf_dask.store.header import prepared
from ordnmf_dask.store.kinds import STORE_MARK

FIELDS: dict[str, np.dtype] = {  # the staged arrays of a segment
    "rows": np.dtype(np.int32),
    "cols": np.dtype(np.int32),
    "y": np.dtype(np.uint8),
    "raw": np.dtype(np.float64),
}
STAGING = "_staging"


@dataclass(frozen=True)
class Segment:
    """A staged piece of one block: entries ``[start, start + length)`` of the
    ``prefix + "." + field + ".npy"`` files (a writer stages many blocks' pieces in one file)."""

    prefix: str
    length: int
    start: int = 0


_HELD: dict[str, np.ndarray] = {}  # staged arrays held in memory, by their file path
_HELD_ROOTS: set[str] = set()  # the staging directories whose arrays are held


@contextmanager
def held_staging(tmp: str) -> Iterator[None]:
    """Within the block, arrays staged under ``TMP/_staging`` are held in this process's memory
    (by path, as they would be saved) instead of written as ``.npy`` files: for an ingest whose
    tasks all run in this process and whose input fits in memory. Dropped on leaving."""
    root = locations.join(tmp, STAGING)
    _HELD_ROOTS.add(root)
    try:
        yield
    finally:
        _HELD_ROOTS.discard(root)
        for key in [k for k in _HELD if _is_under(k, root)]:
            del _HELD[key]


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _held(path: str) -> bool:
    return any(_is_under(path, root) for root in _HELD_ROOTS)


def staging_dir(tmp: str, *parts: str) -> str:
    """``TMP/_staging/<parts...>`` (a local directory, created if needed, or a URL prefix)."""
    path = locations.join(tmp, STAGING, *parts)
    if not locations.is_url(path) and not _held(path):
        os.makedirs(path, exist_ok=True)
    return path


def remove_staging(tmp: str, *parts: str) -> None:
    """Remove the ``.npy`` files staged under ``TMP/_staging/<parts...>`` (all staging writes;
    at a URL anything else found under the prefix is left alone)."""
    root = locations.join(tmp, STAGING, *parts)
    if _held(root):
        for key in [k for k in _HELD if _is_under(k, root)]:
            del _HELD[key]
        return
    locations.remove_tree(root, ".npy")


def save_segment(prefix: str, arrays: dict[str, np.ndarray]) -> Segment:
    """Save one block piece (``FIELDS`` arrays of equal length) as ``.npy`` files."""
    return save_segments(prefix, arrays, [0], [len(arrays["y"])])[0]


def save_segments(
    prefix: str,
    arrays: dict[str, np.ndarray],
    starts: Sequence[int] | np.ndarray,
    stops: Sequence[int] | np.ndarray,
) -> list[Segment]:
    """Save the pieces of several blocks, ``FIELDS`` arrays holding piece j at ``[starts[j],
    stops[j])``, as one ``.npy`` file per field; their segments. One file per field, not per
    piece: at 10^9 nonzeros a partition holds ~500 pieces."""
    save_arrays(prefix, {f: np.asarray(arrays[f], dtype=dtype) for f, dtype in FIELDS.items()})
    return [
        Segment(prefix, int(hi) - int(lo), int(lo)) for lo, hi in zip(starts, stops, strict=True)
    ]


def compact(arr: np.ndarray) -> np.ndarray:
    """The staged form of an array: str ids that are all ASCII as bytes, float64 values that
    are all exact in float32 as float32 (4x and 2x less to write); ``widen`` restores them
    exactly."""
    if arr.dtype.kind == "U" and arr.size:
        codes = np.ascontiguousarray(arr).view(np.uint32)
        if codes.max() < 128:
            return codes.astype(np.uint8).view(f"S{arr.dtype.itemsize // 4}")
    elif arr.dtype == np.float64:
        small = arr.astype(np.float32)
        if np.array_equal(small, arr):
            return small
    return arr


def widen(arr: np.ndarray) -> np.ndarray:
    """Inverse of ``compact`` (staged arrays are never bytes or float32 otherwise)."""
    if arr.dtype.kind == "S":
        return arr.view(np.uint8).astype(np.uint32).view(f"U{arr.dtype.itemsize}")
    if arr.dtype == np.float32:
        return arr.astype(np.float64)
    return arr


def save_arrays(prefix: str, arrays: dict[str, np.ndarray]) -> None:
    """Save named plain arrays as ``prefix.<name>.npy`` (no pickle, compacted), locally or at
    a URL."""
    for name, arr in arrays.items():
        arr = compact(arr)
        path = f"{prefix}.{name}.npy"
        if _held(path):
            _HELD[path] = np.array(arr, copy=True)  # the caller may change its array later
        elif locations.is_url(path):
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            locations.write_bytes(path, buf.getbuffer())
        else:
            np.save(path, arr, allow_pickle=False)


def remove_arrays(prefix: str, names: Sequence[str]) -> None:
    """Remove the staged arrays ``prefix.<name>.npy``."""
    for n in names:
        path = f"{prefix}.{n}.npy"
        if _held(path):
            del _HELD[path]
        elif locations.is_url(path):
            fs, key = locations.filesystem(path)
            fs.rm_file(key)
        else:
            os.remove(path)


def load_arrays(prefix: str, names: Sequence[str], staged: bool = False) -> dict[str, np.ndarray]:
    """Inverse of ``save_arrays`` (``staged``: as staged, ``compact``, not widened)."""
    out = {}
    for n in names:
        path = f"{prefix}.{n}.npy"
        if _held(path):
            arr = _held_array(path).copy()
        elif locations.is_url(path):
            arr = np.load(io.BytesIO(locations.read_bytes(path)), allow_pickle=False)
        else:
            arr = np.load(path, allow_pickle=False)
        out[n] = arr if staged else widen(arr)
    return out


class NpyRows:
    """Row slices ``[lo:hi]`` of a C-order ``.npy`` file (1-D or 2-D, local or at a URL), read
    on demand: only the requested bytes are read, and no memory map enters the RSS. Staged
    arrays come back as saved (``widen``)."""

    def __init__(self, path: str, f: Any = None) -> None:
        """``f``: the file already open (its header is read from it, and the caller keeps it
        for :meth:`read`); by default the file is opened for the header and for each read."""
        self.path = path
        with contextlib.nullcontext(f) if f is not None else locations.open_file(path) as fh:
            version = np.lib.format.read_magic(fh)
            shape, fortran, dtype = (
                np.lib.format.read_array_header_1_0(fh)
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0(fh)
            )
            self.offset = fh.tell()
        if fortran or dtype.hasobject or len(shape) not in (1, 2):
            raise ValueError(f"{path}: expected a C-order 1-D or 2-D array of numbers")
        self.shape, self.dtype = shape, dtype
        self.row_bytes = dtype.itemsize * (shape[1] if len(shape) == 2 else 1)

    def __getitem__(self, rows: slice) -> np.ndarray:
        lo, hi, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError(f"{self.path}: only contiguous row ranges are read, got {rows}")
        with locations.open_file(self.path) as f:
            return self.read(f, lo, hi)

    def read(self, f: Any, lo: int, hi: int, staged: bool = False) -> np.ndarray:
        """Rows ``[lo, hi)`` (within the shape) from the open file ``f`` (``staged``: not
        widened)."""
        n = max(hi - lo, 0)
        out = np.empty((n, *self.shape[1:]), dtype=self.dtype)
        f.seek(self.offset + lo * self.row_bytes)
        got = f.readinto(out.reshape(-1).view(np.uint8).data)
        if got != out.nbytes:
            raise StoreError(
                f"{self.path}: staged file cut short ({got} of {out.nbytes} bytes "
                f"at offset {self.offset + lo * self.row_bytes})"
            )
        return out if staged else widen(out)


def load_rows(prefix: str, name: str, lo: int, hi: int, staged: bool = False) -> np.ndarray:
    """Entries ``[lo, hi)`` of the staged array ``prefix.<name>.npy`` (see :class:`NpyRows`),
    header and rows read through one opening of the file; ``staged``: as staged (``compact``),
    not widened."""
    path = f"{prefix}.{name}.npy"
    if _held(path):
        arr = _held_array(path)
        if hi > len(arr):
            raise StoreError(f"{path}: staged array cut short ({len(arr)} of {hi} entries)")
        out = arr[lo:hi].copy()
        return out if staged else widen(out)
    with locations.open_file(path) as f:
        return NpyRows(path, f).read(f, lo, hi, staged)


def _held_array(path: str) -> np.ndarray:
    try:
        return _HELD[path]
    except KeyError:
        raise StoreError(f"{path}: staged array missing") from None


@contextmanager
def temporary_store(
    out: str | os.PathLike, overwrite: bool, runner: Runner | None = None
) -> Iterator[tuple[str, str]]:
    """Yield ``(final_path, tmp_path)``; the temporary directory is removed on leaving.

    At a URL, ``tmp_path`` is the URL itself, written in place after its pending marker (a
    store of ours there is removed first); on a failure what was written there is removed,
    and so is the marker unless a task of ``runner`` (the one writing there) may still be
    running: then the marker stays, and the store is refused as unfinished until ``overwrite``
    replaces it. The caller must call ``finish_store(tmp, path, overwrite)`` inside the block.
    """
    path = check_target(out, overwrite)
    if locations.is_url(path):
        locations.begin(path, STORE_MARK)
        try:
            yield path, path
        except BaseException:
            remove_staging(path)
            locations.remove(path, keep_pending=runner is not None and not runner.settled)
            raise
        return
    tmp, scratch = temporary_path(path)
    try:
        yield path, tmp
    finally:  # published by then (renamed away), or failed
        discard_temporary(scratch, settled=runner is None or runner.settled)


def _id_arrays(
    group: Any,
    tmp: str,
    ids_of: Mapping[str, np.ndarray | StagedIds],
    arrays: dict[tuple[str, str], Any],
) -> list[_CopyJob]:
    """The ``users/ids`` and ``items/ids`` arrays of the store group ``group`` at ``tmp``: ids
    in memory written here, staged ids created in ``arrays`` with the jobs that copy them."""
    jobs: list[_CopyJob] = []
    for name, ids in ids_of.items():
        sub = group.create_group(name)
        if isinstance(ids, np.ndarray):
            write_array(sub, "ids", ids_for_zarr(ids))
            continue
        chunks = (max(1, min(ids.length, CHUNK)),)
        arrays[locations.join(tmp, name), "ids"] = sub.create_array(
            "ids",
            shape=(ids.length,),
            dtype=ids.dtype,
            chunks=chunks,
            compressors=COMPRESSORS,
            config=WRITE_ALL,
        )
        jobs.extend(
            _copy_jobs(locations.join(tmp, name), ("ids",), ids.parts, ids.length, chunks[0])
        )
    return jobs


def assemble_store(
    tmp: str,
    runner: Runner,
    attrs: dict[str, Any],
    row_bounds: np.ndarray,
    col_bounds: np.ndarray,
    blocks: Mapping[str, Sequence[Sequence[Segment]]],
    user_ids: np.ndarray | StagedIds,
    item_ids: np.ndarray | StagedIds,
) -> None:
    """Write the store group at ``tmp`` from staged segments (``complete`` still false).

    Parameters
    ----------
    tmp : str
        Temporary store directory (holds ``_staging``).
    runner : Runner
    attrs : dict
        Store attributes (``format_version`` and ``complete`` are set here).
    row_bounds, col_bounds : np.ndarray of int64, shape (n_r + 1,), (n_c + 1,)
    blocks : {"train": [...], "test": [...]} (and "validation" when the store has one)
        For each split, ``n_r * n_c`` lists of segments, block ``b = r * n_c + c`` at index b.
    user_ids, item_ids : np.ndarray, shape (U,), (I,), or StagedIds
        The raw ids, in memory or staged (written by copy jobs like the nonzeros).
    """
    group = zarr.open_group(tmp, mode="a", zarr_format=3)
    attrs = prepared(attrs, tmp)  # written as its readers will check it
    group.update_attributes({**attrs, "format_version": FORMAT_VERSION, "complete": False})
    write_array(group, "row_bounds", np.asarray(row_bounds, np.int64))
    write_array(group, "col_bounds", np.asarray(col_bounds, np.int64))
    arrays: dict[tuple[str, str], Any] = {}  # (group directory, field) -> the array
    jobs = _id_arrays(group, tmp, {"users": user_ids, "items": item_ids}, arrays)
    n_c = len(col_bounds) - 1
    n_rows = np.diff(np.asarray(row_bounds, dtype=np.int64))
    for split in blocks:
        segments = [s for block in blocks[split] for s in block]
        sizes = np.asarray([len_block(b) for b in blocks[split]], dtype=np.int64)
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        sub = group.create_group(split)
        write_array(sub, "offsets", offsets)
        pointers = [
            RowPointer(tuple(segs), int(n_rows[b // n_c])) for b, segs in enumerate(blocks[split])
        ]
        for fields, parts, total in (
            (NONZERO_FIELDS, segments, int(offsets[-1])),
            (("indptr",), pointers, int(indptr_starts(row_bounds, n_c)[-1])),
        ):
            chunks = (max(1, min(total, CHUNK)),)
            for field in fields:
                arrays[locations.join(tmp, split), field] = sub.create_array(
                    field,
                    shape=(total,),
                    dtype=_DTYPES[field],
                    chunks=chunks,
                    compressors=COMPRESSORS,
                    config=WRITE_ALL,
                )
            jobs.extend(_copy_jobs(locations.join(tmp, split), fields, parts, total, chunks[0]))
    records: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    opened = arrays if runner.client is None else None  # in this process: no reopening
    for job, written in zip(jobs, runner.map(_copy_chunk, jobs, opened), strict=True):
        for field, record in zip(job.fields, written, strict=True):
            records[job.group, field].append(record)  # jobs come in chunk order
    for key, array in arrays.items():
        set_inventory(array, records[key])
    remove_staging(tmp)


def finish_store(tmp: str, path: str, overwrite: bool) -> StoreInfo:
    """Mark the store at ``tmp`` complete, publish it to ``path`` and open it (at a URL, where
    it was written in place, its pending marker goes last)."""
    group = zarr.open_group(tmp, mode="a", zarr_format=3)
    group.attrs["complete"] = True
    if locations.is_url(path):
        locations.finish(path)
    else:
        publish(tmp, path, lambda p: check_target(p, overwrite))
    return open_store(path)


def len_block(segments: Sequence[Segment]) -> int:
    """Number of nonzeros of a block given as segments."""
    return sum(s.length for s in segments)


_DTYPES = {**FIELDS, "indptr": np.dtype(np.int64)}


@dataclass(frozen=True)
class RowPointer:
    """A block's CSR row pointer (n_rows + 1,), counted from the rows of its segments by the
    copy jobs that write it (not staged: at 10^9 nonzeros and 5 x 10^7 users the row pointers
    of all blocks would take more disk than the nonzeros)."""

    segments: tuple[Segment, ...]
    n_rows: int

    @property
    def length(self) -> int:
        return self.n_rows + 1

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Entries ``[lo, hi)`` of the row pointer."""
        ptr = np.zeros(self.n_rows + 1, dtype=np.int64)
        for seg in self.segments:
            if seg.length:
                rows = load_rows(seg.prefix, "rows", seg.start, seg.start + seg.length)
                ptr += row_pointer(rows, self.n_rows)
        return ptr[lo:hi]


@dataclass(frozen=True)
class Gather:
    """Entries ``take`` (increasing; a ``range`` when contiguous, which pickles small) of the
    staged 1-D array ``prefix.<name>.npy``, read as one run of the file."""

    prefix: str
    name: str
    take: np.ndarray | range

    @property
    def length(self) -> int:
        return len(self.take)

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Entries ``[lo, hi)`` of the gathered ones."""
        sub = self.take[lo:hi]
        first = int(sub[0])
        rows = load_rows(self.prefix, self.name, first, int(sub[-1]) + 1)
        return rows if isinstance(sub, range) else rows[np.asarray(sub) - first]


@dataclass(frozen=True)
class StagedIds:
    """The raw ids of one side of a store, from staged files: ``parts`` in order, each within
    one output chunk (so a copy job carries only its own), and the store array's dtype (int64,
    or ``StringDType`` for str)."""

    parts: tuple[Gather, ...]
    dtype: np.dtype

    @property
    def length(self) -> int:
        return sum(p.length for p in self.parts)


@dataclass(frozen=True)
class _CopyJob:
    """Write entries [start, stop) of the arrays ``fields`` in ``group``: pieces (segment, row
    pointer or gathered ids, lo, hi) in order."""

    group: str
    fields: tuple[str, ...]
    start: int
    stop: int
    pieces: tuple[tuple[Segment | RowPointer | Gather, int, int], ...]


def _copy_jobs(
    group: str,
    fields: tuple[str, ...],
    parts: Sequence[Segment | RowPointer | Gather],
    total: int,
    chunk: int,
) -> list[_CopyJob]:
    lengths = np.asarray([p.length for p in parts], dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    jobs = []
    for start in range(0, total, chunk):
        stop = min(start + chunk, total)
        first = int(np.searchsorted(ends, start, side="right"))
        pieces = []
        k = first
        while k < len(parts) and starts[k] < stop:
            lo, hi = max(start, int(starts[k])), min(stop, int(ends[k]))
            if hi > lo:
                pieces.append((parts[k], lo - int(starts[k]), hi - int(starts[k])))
            k += 1
        jobs.append(_CopyJob(group, fields, start, stop, tuple(pieces)))
    return jobs


_OPEN_LOCK = threading.Lock()


def _open_writing_every_chunk(directory: str) -> zarr.Array:
    """An existing store array opened to write every chunk, zeros included (:data:`WRITE_ALL`).

    zarr takes an array's write config from its global config when the array is opened
    (``Array.with_config`` only exists from zarr 3.1.6); the lock keeps threads of one worker
    from opening arrays under each other's temporary setting.
    """
    setting = {f"array.{key}": value for key, value in WRITE_ALL.items()}
    with _OPEN_LOCK, zarr.config.set(setting):
        return zarr.open_array(directory, mode="r+")


def _runs(pieces: Sequence[tuple[Any, int, int]], field: str) -> list[tuple]:
    """The reads of a copy job's ``pieces``: segments that follow each other in one staged file
    (the pieces of consecutive blocks from one partition) merged into one read ``(path
    prefix, field, lo, hi)``; other parts as ``(part, lo, hi)``."""
    runs: list[tuple] = []
    for part, lo, hi in pieces:
        if not isinstance(part, Segment):
            runs.append((part, lo, hi))
            continue
        start, stop = part.start + lo, part.start + hi
        last = runs[-1] if runs else (None,)
        if isinstance(last[0], str) and last[0] == part.prefix and last[3] == start:
            runs[-1] = (part.prefix, field, last[2], stop)
        else:
            runs.append((part.prefix, field, start, stop))
    return runs


def _copy_chunk(
    job: _CopyJob, opened: dict[tuple[str, str], zarr.Array] | None = None
) -> list[tuple[int, int]]:
    """Write the job's chunk of each of its arrays; their ``chunk_record`` in field order.
    ``opened``: the arrays already open to write every chunk, by (group, field), when the
    job runs in the process that created them."""
    records = []
    for field in job.fields:
        parts = [
            load_rows(*piece) if isinstance(piece[0], str) else piece[0].read(*piece[1:])
            for piece in _runs(job.pieces, field)
        ]
        data = np.concatenate(parts) if len(parts) > 1 else np.asarray(parts[0])
        directory = locations.join(job.group, field)
        arr = opened[job.group, field] if opened else _open_writing_every_chunk(directory)
        arr[job.start : job.stop] = ids_for_zarr(data) if field == "ids" else data
        records.append(chunk_record(chunk_path(directory, job.start // arr.chunks[0])))
    return records


__all__: list[str] = [
    "FIELDS",
    "Gather",
    "NpyRows",
    "Segment",
    "StagedIds",
    "assemble_store",
    "finish_store",
    "held_staging",
    "load_arrays",
    "load_rows",
    "widen",
    "remove_arrays",
    "remove_staging",
    "save_arrays",
    "save_segment",
    "save_segments",
    "staging_dir",
    "temporary_store",
]
