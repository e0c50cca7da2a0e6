"""The on-disk block store: atomic writing, opening and block reads.

The layout, attributes and chunk inventory are specified in docs/store-format.md. A store is
complete or absent: it is written to ``OUT.tmp-<random>``, ``complete`` is set last, and the
directory is then renamed to OUT; a store at a URL is written to a local temporary directory,
then uploaded between the marks of :mod:`.files` (object stores cannot rename). Every array
records the size and CRC-32 of each of its chunk files (:mod:`ordnmf_dask.store.decode`),
because zarr reads a missing chunk file as zeros: ``open_store`` checks that every listed file
exists with its size, and every read checks the files it decodes, so a damaged store is an error
naming the file, never zeros.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
import zarr.codecs

from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.model.rowptr import expand_rows
from ordnmf_dask.runtime.abandoned import abandoned, forget
from ordnmf_dask.store import locations, nodes, writelock
from ordnmf_dask.store.decode import (
    CHUNK,
    WRITE_ALL,
    ArrayFiles,
    ChunkFiles,
    record_inventory,
    thread_buffer,
)
from ordnmf_dask.store.grid import BlockedNonzeros, block_indptr, indptr_starts
from ordnmf_dask.store.header import (
    StoreHeader,
    check_arrays,
    check_bounds,
    check_offsets,
    prepared,
)
from ordnmf_dask.store.kinds import NAMES, STORE_MARK, is_store
from ordnmf_dask.store.outputs import check_place, check_replaceable, parent_problem

log = logging.getLogger(__name__)

FORMAT_VERSION = 3  # docs/store-format.md
SPLITS = ("train", "test")  # the subsets every store has
VALIDATION = "validation"  # the optional third subset (docs/store-format.md)
AXES = ("users", "items")
NONZERO_FIELDS = ("cols", "y", "raw")  # per-nonzero arrays of a split
BLOCK_ARRAYS = (*NONZERO_FIELDS, "indptr")  # every array of a split read by blocks
# Codec of every array: blosc lz4 with byte shuffle, which decompresses about twice as fast as
# zstd at about the same size (docs/performance.md, "Storage choices"); streamed fits decompress
# every block every pass. Readers need nothing: the codec is in each array's metadata.
COMPRESSORS = (zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)


@contextmanager
def read_as_one_version(check_unchanged: Callable[[], None]) -> Iterator[None]:
    """Run the block, then ``check_unchanged`` (a StoreError when the store or model read was
    replaced meanwhile); an error inside is reported as that change when there was one."""
    try:
        yield
    except Exception:
        check_unchanged()
        raise
    check_unchanged()


@dataclass(frozen=True, eq=False)
class StoreInfo:
    """Metadata of a complete store.

    One version per reader: the blocks read after opening a store (:func:`read_block`) are
    checked to come from the version it was opened from (:meth:`reading`, and
    :func:`read_block` itself), so that a store published at the same path meanwhile
    (``ingest --overwrite``) is an error saying it changed, never blocks of two stores.

    Attributes
    ----------
    path : str
        Absolute path of the store directory, or its URL.
    n_users, n_items, n_classes : int
        U, I and V.
    row_bounds : np.ndarray of int64, shape (n_r + 1,)
    col_bounds : np.ndarray of int64, shape (n_c + 1,)
    nnz_train, nnz_test : int
    hist_train, hist_test : np.ndarray of int64, shape (V + 1,)
        Class counts; index 0 is always 0.
    attrs : dict
        All group attributes, as recorded.
    header : StoreHeader
        The attributes typed and checked (:mod:`.header`): read fields from here.

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> store.n_users, store.n_items, store.n_classes, store.grid
    (200, 100, 10, (1, 1))
    """

    path: str
    n_users: int
    n_items: int
    n_classes: int
    row_bounds: np.ndarray
    col_bounds: np.ndarray
    nnz_train: int
    nnz_test: int
    hist_train: np.ndarray
    hist_test: np.ndarray
    attrs: dict
    header: StoreHeader
    version: tuple[Any, ...] = ()  # identity of the root zarr.json when opened

    def check_unchanged(self) -> None:
        """StoreError if the directory no longer holds the version this was opened from (the
        identity of its root ``zarr.json``, which every publish of a store there changes)."""
        if self.version and _current(self.path) != self.version:
            raise _changed(self.path)

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Within the block, what is read from the store must be of this version: checked on
        leaving, and an error inside (a chunk gone or not matching its inventory) is reported
        as the change it comes from when the version changed."""
        with read_as_one_version(self.check_unchanged):
            yield

    @property
    def splits(self) -> tuple[str, ...]:
        """The block subsets of the store: train, test, and validation when it has one."""
        return self.header.splits

    @property
    def nnz_validation(self) -> int:
        """Nonzeros of the validation subset (0 when there is none)."""
        return self.header.nnz_validation or 0

    @property
    def count_edges(self) -> np.ndarray | None:
        """The count thresholds of a count store (the count range of each class), else None."""
        h = self.header
        return np.asarray(h.thresholds) if h.value_kind == "counts" else None

    @property
    def grid(self) -> tuple[int, int]:
        """(n_r, n_c), the number of user-blocks and item-blocks."""
        return len(self.row_bounds) - 1, len(self.col_bounds) - 1

    def block_shape(self, r: int, c: int) -> tuple[int, int]:
        """(n_rows, n_cols) of block (r, c)."""
        n_r, n_c = self.grid
        if not (0 <= r < n_r and 0 <= c < n_c):
            raise IndexError(f"block ({r}, {c}) outside grid {n_r} x {n_c}")
        rb, cb = self.row_bounds, self.col_bounds
        return int(rb[r + 1] - rb[r]), int(cb[c + 1] - cb[c])


@dataclass(frozen=True, eq=False)
class Block:
    """The nonzeros of one block, CSR-ordered (by local row, then local column).

    Attributes
    ----------
    indptr : np.ndarray of int64, shape (n_rows + 1,)
        CSR row pointer: local row j holds nonzeros [indptr[j], indptr[j + 1]).
    cols : np.ndarray of int32, shape (nnz,)
        Local column indices within the block.
    y : np.ndarray of uint8, shape (nnz,)
        Classes 1..V.
    raw : np.ndarray of float64, shape (nnz,)
        Raw values before quantization.
    (``y`` or ``raw`` is None when not read: see :func:`read_block`'s ``fields``.)
    shape : (int, int)
        (n_rows, n_cols) of the block.
    """

    indptr: np.ndarray
    cols: np.ndarray
    y: np.ndarray | None
    raw: np.ndarray | None
    shape: tuple[int, int]

    @property
    def classes(self) -> np.ndarray:
        """``y``, read (:func:`read_block` with ``"y"`` among its ``values``)."""
        if self.y is None:
            raise ValueError("the classes of this block were not read")
        return self.y

    @property
    def nnz(self) -> int:
        """Number of nonzeros in the block."""
        return len(self.cols)

    @property
    def rows(self) -> np.ndarray:
        """np.ndarray of int32, shape (nnz,): local row of each nonzero (from ``indptr``)."""
        return expand_rows(self.indptr)


# --------------------------------------------------------------------------- writing


def store_splits(attrs: dict[str, Any]) -> tuple[str, ...]:
    """The subsets a store with these attributes holds: a validation subset is recorded by its
    ``nnz_validation`` attribute (stores without one have none)."""
    return (*SPLITS, VALIDATION) if attrs.get("nnz_validation") is not None else SPLITS


def check_target(
    out: str | os.PathLike,
    overwrite: bool,
    kind: str = "zarr store written by ordnmf_dask",
    is_ours: Callable[[str], bool] = is_store,
    mark: str = STORE_MARK,
    inputs: Mapping[str, str | os.PathLike | None] | None = None,
) -> str:
    """Absolute output path (or URL), after checking it can be (over)written; raises InputError.

    The path obeys the rule of every output (:func:`.outputs.check_place`: not one
    of ``inputs``, not inside another directory of this package). An existing path is replaced
    only with ``overwrite``, only if ``is_ours(path)`` (it is a ``kind`` this package wrote),
    and only if it holds nothing else (:func:`.outputs.check_replaceable`), so data
    the package did not write is never removed. A local output another live process is
    writing (its lock, :mod:`.writelock`) is refused. At a URL, an unfinished write of a ``kind``
    (its pending marker records ``mark``) may be replaced too.
    """
    given = os.fspath(out)
    path = check_place(out, f"the {NAMES[mark]}", mark, inputs, itself=False)
    writelock.check_free(path)  # another writer of it: refused before any work
    if locations.is_url(path):
        locations.check_url_target(path, overwrite, kind, is_ours, mark)
        check_replaceable(path, NAMES[mark])
        return path
    parent = os.path.dirname(path)
    problem = parent_problem(parent)
    if problem is not None:
        raise InputError(f"{path}: parent directory {parent} {problem}")
    link = "://" not in given and os.path.islink(given)  # the path as given: its real one is not
    if os.path.lexists(path):
        if link:  # named by the link the user typed, with or without overwrite
            raise InputError(
                f"refusing to overwrite {path}: {os.path.abspath(given)} is a symbolic link to it"
            )
        if not overwrite:
            raise InputError(f"{path} already exists; pass overwrite=True to replace it")
        if not is_ours(path):
            raise InputError(f"refusing to overwrite {path}: it is not a {kind}")
        check_replaceable(path, NAMES[mark])
    return path


def write_store(
    out: str | os.PathLike,
    attrs: dict[str, Any],
    row_bounds: np.ndarray,
    col_bounds: np.ndarray,
    train: BlockedNonzeros,
    test: BlockedNonzeros,
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    *,
    overwrite: bool = False,
    validation: BlockedNonzeros | None = None,
) -> StoreInfo:
    """Write a complete store atomically and return its ``StoreInfo``.

    ``validation``: the optional validation subset, written as a third group when given (then
    ``attrs`` must record ``nnz_validation``).

    Everything goes to a temporary directory (:func:`temporary_path`); ``complete = true`` is
    set last and the directory published to OUT (an existing OUT is replaced only if
    ``overwrite``, and only once the new store is complete). On any error the temporary
    directory is removed.
    """
    path = check_target(out, overwrite)
    tmp, scratch = temporary_path(path)
    try:
        group = zarr.open_group(tmp, mode="w-", zarr_format=3)
        attrs = prepared(attrs, path)
        group.update_attributes({**attrs, "format_version": FORMAT_VERSION, "complete": False})
        write_array(group, "row_bounds", np.asarray(row_bounds, np.int64))
        write_array(group, "col_bounds", np.asarray(col_bounds, np.int64))
        parts = {"train": train, "test": test, VALIDATION: validation}
        for name in store_splits(attrs):
            part = parts[name]
            assert part is not None, f"attrs record a {name} subset but none was given"
            sub = group.create_group(name)
            for field in (*NONZERO_FIELDS, "offsets"):
                write_array(sub, field, getattr(part, field))
            write_array(sub, "indptr", block_indptr(part, row_bounds, len(col_bounds) - 1))
        for name, ids in (("users", user_ids), ("items", item_ids)):
            write_array(group.create_group(name), "ids", ids_for_zarr(ids))
        group.attrs["complete"] = True
        publish(tmp, path, lambda p: check_target(p, overwrite))
    finally:
        discard_temporary(scratch)
    return open_store(path)


def write_array(group: zarr.Group, name: str, data: np.ndarray) -> None:
    chunks = (max(1, min(len(data), CHUNK)),)
    arr = group.create_array(
        name,
        shape=data.shape,
        dtype=data.dtype,
        chunks=chunks,
        compressors=COMPRESSORS,
        config=WRITE_ALL,
    )
    if data.size:
        arr[:] = data
    record_inventory(arr)


def ids_for_zarr(ids: np.ndarray) -> np.ndarray:
    return ids.astype(zarr_id_dtype(ids.dtype.kind))


def zarr_id_dtype(kind: str) -> np.dtype:
    """The dtype of a store's raw ids given as numpy dtype kind ``kind``: int64 or str."""
    return np.dtype(np.int64) if kind in "iu" else np.dtypes.StringDType()


TMP_MARK = "_ORDNMF_TMP"  # in a local temporary directory: whose it is and for where
TMP_KIND = "ordnmf_dask.tmp"


def temporary_path(path: str) -> tuple[str, str]:
    """Where to write what will be published to ``path``, and the directory to remove
    afterwards: ``OUT.tmp-<random>/out`` beside ``path``, or for a URL a new local temporary
    directory.

    The local ``OUT.tmp-<random>`` carries a marker naming ``path`` and this process, written
    before anything else: what a run killed before it could clean up leaves behind, the next
    write to ``path`` removes (:func:`remove_leftovers`).

    Every writer of a local output passes here first, so here it takes the lock of ``path``
    (:mod:`.writelock`: a second writer of it is refused, naming the first, before anything
    is written), held until :func:`discard_temporary` removes ``scratch``."""
    if locations.is_url(path):
        scratch = tempfile.mkdtemp(prefix="ordnmf-upload-")
        return os.path.join(scratch, "out.zarr"), scratch
    lock = writelock.take(path)
    try:
        remove_leftovers(path)
        scratch = f"{path}.tmp-{secrets.token_hex(6)}"
        os.mkdir(scratch)
    except BaseException:
        writelock.give_back(lock)
        raise
    _LOCKS[scratch] = lock
    try:  # a signal before the marker is in place: the directory goes, nothing else would
        doc = {"kind": TMP_KIND, "for": path, "host": socket.gethostname(), "pid": os.getpid()}
        mark = os.path.join(scratch, TMP_MARK)
        with open(f"{mark}.part", "w") as fh:  # whole or absent
            json.dump(doc, fh)
        os.replace(f"{mark}.part", mark)
    except BaseException:
        discard_temporary(scratch)
        raise
    return os.path.join(scratch, "out"), scratch


_LOCKS: dict[str, str | None] = {}  # scratch directory -> the output lock its writer holds


def remove_leftovers(path: str) -> list[str]:
    """Remove the temporary directories of writes to the local ``path`` whose process is gone
    (killed before it could clean up): ``OUT.tmp-*`` beside it whose marker names ``path`` and
    a process that no longer runs on this host, or another host. Returns what was removed;
    anything else is left alone."""
    parent, name = os.path.split(path)
    removed = []
    for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        tmp = os.path.join(parent, entry)
        if not entry.startswith(f"{name}.tmp-") or os.path.islink(tmp):
            continue
        try:
            with open(os.path.join(tmp, TMP_MARK)) as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            if _unmarked(tmp, name):
                shutil.rmtree(tmp, ignore_errors=True)
                log.info("removed %s, left by a write to %s killed as it began", tmp, path)
                removed.append(tmp)
            continue
        if not isinstance(doc, dict) or doc.get("kind") != TMP_KIND or doc.get("for") != path:
            continue
        if doc.get("host") == socket.gethostname() and _running(doc.get("pid")):
            continue
        _put_back(tmp, path)
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("removed %s, left by an interrupted write to %s", tmp, path)
        removed.append(tmp)
    return removed


ASIDE = "old"  # in a temporary directory: the version of the output that :func:`publish` replaces


def _put_back(scratch: str, path: str) -> None:
    """Move the earlier version of ``path`` back in place when the writer publishing over it
    was killed between its two renames (:func:`publish`), so that it is never lost."""
    aside = os.path.join(scratch, ASIDE)
    if os.path.isdir(aside) and not os.path.islink(aside) and not os.path.lexists(path):
        os.rename(aside, path)
        log.warning("put %s back: the write replacing it was killed half way", path)


_UNMARKED_AGE = 60.0  # seconds: a live writer puts its marker in place within microseconds


def _unmarked(tmp: str, name: str) -> bool:
    """Whether ``tmp`` is what a write to ``name`` killed before its marker was in place left:
    named as :func:`temporary_path` names them, holding nothing but the marker being written,
    and older than a live writer can be at that point."""
    if not re.fullmatch(rf"{re.escape(name)}\.tmp-[0-9a-f]{{12}}", os.path.basename(tmp)):
        return False
    try:
        if not set(os.listdir(tmp)) <= {f"{TMP_MARK}.part"}:
            return False
        return time.time() - os.lstat(tmp).st_mtime > _UNMARKED_AGE
    except OSError:
        return False


def discard_temporary(scratch: str, settled: bool = True) -> None:
    """Remove the directory ``scratch`` of :func:`temporary_path`. While a task may still write
    there (not ``settled``: an interrupted write), its marker stays, so that what the task
    writes later is in a directory the next write to the same destination removes. The lock
    :func:`temporary_path` took is given back either way."""
    try:
        _discard(scratch, settled)
    finally:
        writelock.give_back(_LOCKS.pop(scratch, None))


def _discard(scratch: str, settled: bool) -> None:
    if settled or locations.is_url(scratch) or not os.path.isdir(scratch):
        shutil.rmtree(scratch, ignore_errors=True)
        forget(scratch)
        return
    abandoned(scratch)
    for entry in os.scandir(scratch):
        if entry.name == TMP_MARK:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.remove(entry.path)


def _running(pid: object) -> bool:
    """Whether a process ``pid`` exists on this host (True when that cannot be told)."""
    if not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def publish(tmp: str, path: str, recheck: Callable[[str], object], mark: str = STORE_MARK) -> None:
    """Rename the finished directory ``tmp`` (of :func:`temporary_path`) to ``path``. An
    existing ``path`` is checked again with ``recheck`` (it may have appeared since the first
    check), moved aside into ``tmp``'s marked directory, and removed only once ``tmp`` is in
    place, so a failure at any point leaves the old one: a process killed between the two
    renames too, the next write to ``path`` putting it back (:func:`remove_leftovers`).

    At a URL (object stores cannot rename), ``tmp`` is uploaded between the marks of
    :mod:`.files` (pending marker ``mark``): the previous one of ours there is removed first, and
    a failed upload removes what it wrote.
    """
    if locations.is_url(path):
        recheck(path)
        locations.begin(path, mark)
        try:
            locations.upload(tmp, path)
            locations.finish(path)
        except BaseException:
            locations.remove(path)
            raise
        return
    if not os.path.lexists(path):
        os.rename(tmp, path)
        return
    recheck(path)
    # beside the new version, in its writer's marked directory: a writer killed between the two
    # renames leaves the old version where the next write to ``path`` puts it back
    aside = os.path.join(os.path.dirname(tmp), ASIDE)
    os.rename(path, aside)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(aside, path)
        raise
    try:
        shutil.rmtree(aside, ignore_errors=True)
    except BaseException:  # a signal half way: the rest goes too, then the signal
        shutil.rmtree(aside, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- reading


def open_store(path: str | os.PathLike) -> StoreInfo:
    """Open a complete store and return its metadata.

    Every chunk file the arrays' inventories list must exist with its recorded size (a stat
    each); the small arrays read here are also checked against their CRC-32s.

    Raises
    ------
    StoreError
        Missing path, not a zarr group, a model, written by a newer format, not complete, or
        a chunk file missing or of the wrong size (named).

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import open_store
    >>> info = open_store("ratings.zarr")
    >>> info.nnz_train == store.nnz_train
    True
    """
    return _handle(path, fresh=True).info


def verify_store(path: str | os.PathLike) -> StoreInfo:
    """Open a store and check every chunk file of every array against its recorded size and
    CRC-32 (reads the whole store once); StoreError naming the first damaged file."""
    info = open_store(path)
    group = zarr.open_group(info.path, mode="r")
    names = ["row_bounds", "col_bounds", *(f"{a}/ids" for a in AXES)]
    names += [f"{s}/{f}" for s in info.splits for f in ("offsets", *BLOCK_ARRAYS)]
    for name in names:
        ChunkFiles.of(group[name], locations.join(info.path, name)).verify()
    return info


def read_block(
    path: str | os.PathLike,
    split: str,
    r: int,
    c: int,
    values: Sequence[str] = ("y", "raw"),
    reuse: bool = False,
) -> Block:
    """Nonzeros of block (r, c) of ``split`` ("train", "test", or "validation" when the store
    has that subset).

    ``values``: which of "y" (classes) and "raw" to read; the other is None in the result
    (streamed fits read only what their model uses).

    ``reuse``: decode into buffers that the calling thread keeps and reuses
    (:func:`~ordnmf_dask.store.decode.thread_buffer`) instead of new arrays. The block is then
    valid only until the same thread's next ``reuse`` read: for passes that are done with a
    block before they read the next (the streamed passes), never for a block that is kept.

    Cheap and safe to call concurrently from many threads or processes: it reads only the
    block's slice; opened stores are kept in a small per-process cache keyed by the store's
    identity on disk. A store replaced since this process opened it (:func:`open_store`) is a
    StoreError saying it changed.

    Examples
    --------
    >>> from ordnmf_dask.datasets.synth import synth
    >>> store = synth("ratings.zarr", 200, 100, 4000, 3, seed=0)  # drawn from the model, K = 3
    >>> from ordnmf_dask import read_block
    >>> block = read_block("ratings.zarr", "train", 0, 0)  # the one block of this store
    >>> len(block.rows) == store.nnz_train
    True
    """
    handle = _handle(path)  # of the version this process opened, or an error saying it changed
    if split not in handle.files:
        raise ValueError(f"split must be one of {tuple(handle.files)}, got {split!r}")
    unknown = set(values) - {"y", "raw"}
    if unknown:
        raise ValueError(f"values must be among ('y', 'raw'), got {sorted(unknown)}")
    try:
        return _read_block(handle, split, r, c, values, reuse)
    except Exception:  # replaced while read (a chunk gone or another's): said so
        handle.info.check_unchanged()
        raise


def _read_block(
    handle: _Handle, split: str, r: int, c: int, values: Sequence[str], reuse: bool
) -> Block:
    shape = handle.info.block_shape(r, c)
    b = r * handle.info.grid[1] + c
    files = handle.files[split]

    def read(name: str, lo: int, hi: int) -> np.ndarray:
        f = files[name]
        out = thread_buffer(name, hi - lo, f.dtype) if reuse else np.empty(hi - lo, f.dtype)
        return f.read(lo, hi, out)

    lo, hi = (int(x) for x in handle.offsets[split][b : b + 2])
    wanted = ("cols", *values)
    data = {name: read(name, lo, hi) if name in wanted else None for name in NONZERO_FIELDS}
    start = int(handle.indptr_starts[b])
    indptr = read("indptr", start, start + shape[0] + 1)
    cols = data["cols"]
    assert cols is not None  # always read
    return Block(indptr, cols, data["y"], data["raw"], shape)


def read_ids(path: str | os.PathLike, axis: str) -> np.ndarray:
    """Raw ids of ``axis`` ("users" or "items") in index order: int64, or str (``<U``)."""
    if axis not in AXES:
        raise ValueError(f"axis must be one of {AXES}, got {axis!r}")
    handle = _handle(path)
    array = handle.group[f"{axis}/ids"]
    assert isinstance(array, zarr.Array), axis  # the store was checked when opened
    ChunkFiles.of(array, locations.join(handle.info.path, axis, "ids")).verify()
    ids = np.asarray(array[:])
    if ids.dtype.kind in "iu":
        return ids
    width = int(np.strings.str_len(ids).max()) if ids.size else 1
    return ids.astype(f"<U{max(width, 1)}")


@dataclass(frozen=True, eq=False)
class _Handle:
    info: StoreInfo
    group: zarr.Group
    files: dict[str, dict[str, ArrayFiles]]  # split -> field -> its chunk files
    offsets: dict[str, np.ndarray]
    indptr_starts: np.ndarray  # (n_r n_c + 1,) where each block's row pointer starts


_CACHE: OrderedDict[tuple, _Handle] = OrderedDict()
# (pid, path) -> the version open_store opened there last in this process: reads by path after
# a publish replaced it are refused, until open_store opens it again (workers that never open
# a store are checked by their driver's StoreInfo.reading)
_PINNED: dict[tuple, tuple] = {}
_CACHE_SIZE = 8
_LOCK = threading.Lock()


def _handle(path: str | os.PathLike, fresh: bool = False) -> _Handle:
    full = locations.location(path)
    try:
        identity = locations.identity(locations.join(full, "zarr.json"))
    except OSError as exc:
        url = locations.is_url(full)
        if url and not isinstance(exc, FileNotFoundError):
            raise StoreError(f"{full}: cannot be read ({exc})") from None
        if not (locations.exists(full) if url else os.path.exists(full)):
            raise StoreError(f"{full}: no store here (path does not exist)") from None
        locations.check_not_pending(full, "store")
        if not url:
            locations.check_directory(full, "store")
        raise StoreError(f"{full}: not a zarr group (no zarr.json)") from None
    key = (os.getpid(), full, *identity)
    with _LOCK:
        pinned = _PINNED.get(key[:2])
        if pinned is not None and pinned != identity and not fresh:
            raise _changed(full)
        if key in _CACHE and not fresh:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    handle = _open(full, identity)
    if _current(full) != identity:  # replaced while its attributes were read
        raise _changed(full)
    with _LOCK:
        if fresh:
            _PINNED[key[:2]] = identity
        _CACHE[key] = handle
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return handle


def _current(path: str) -> tuple[Any, ...] | None:
    """The version of the store at ``path`` now (None when it has no root zarr.json)."""
    try:
        return locations.identity(locations.join(path, "zarr.json"))
    except OSError:
        return None


def _changed(path: str) -> StoreError:
    return StoreError(
        f"{path}: the store changed while it was read (another write replaced it since it "
        "was opened); open it again"
    )


def _open(path: str, identity: tuple[Any, ...]) -> _Handle:
    locations.check_tree(path, "store")
    found = nodes.read_nodes(path, "store")  # every node's metadata, before zarr reads any
    try:
        group = zarr.open_group(path, mode="r")
    except Exception as exc:
        raise StoreError(f"{path}: not a readable zarr group ({exc})") from None
    attrs = dict(group.attrs.asdict())
    if {"params", "elbo"} <= attrs.keys():
        raise StoreError(f"{path}: is an ordnmf_dask model, not a store")
    version = attrs.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise StoreError(f"{path}: not an ordnmf_dask store (no integer format_version)")
    if version > FORMAT_VERSION:
        raise StoreError(
            f"{path}: written by a newer ordnmf_dask format {version}; "
            f"this version reads {FORMAT_VERSION}"
        )
    if version < FORMAT_VERSION:
        raise StoreError(
            f"{path}: written in ordnmf_dask store format {version}; this version reads format "
            f"{FORMAT_VERSION} (with a chunk inventory): make the store again with "
            "`ordnmf-dask ingest` (or `synth`)"
        )
    if attrs.get("complete") is not True:
        raise StoreError(f"{path}: incomplete store (attribute complete is not true)")
    locations.check_not_pending(path, "store")
    header = StoreHeader.from_attrs(attrs, path)
    nodes.check_layout(path, found, *_layout(header), "store")
    try:
        splits = header.splits
        check_arrays(header, _shapes(group, header), path)
        files = {
            s: {f: _array_files(group, path, f"{s}/{f}") for f in BLOCK_ARRAYS} for s in splits
        }
        small = {
            name: _array_files(group, path, name)
            for name in ("row_bounds", "col_bounds", *(f"{s}/offsets" for s in splits))
        }
        ids = [ChunkFiles.of(group[f"{a}/ids"], locations.join(path, a, "ids")) for a in AXES]
        for chunks in (
            *ids,
            *(f.files for f in small.values()),
            *(f.files for split in files.values() for f in split.values()),
        ):
            chunks.check_present()
        offsets = {s: _read_all(small[f"{s}/offsets"]) for s in splits}
        row_bounds, col_bounds = _read_all(small["row_bounds"]), _read_all(small["col_bounds"])
    except StoreError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable store ({type(exc).__name__}: {exc})") from None
    check_bounds(header, row_bounds, col_bounds, path)
    for s in splits:
        check_offsets(header, s, offsets[s], path)
    info = StoreInfo(
        path=path,
        n_users=header.n_users,
        n_items=header.n_items,
        n_classes=header.n_classes,
        row_bounds=row_bounds,
        col_bounds=col_bounds,
        nnz_train=header.nnz_train,
        nnz_test=header.nnz_test,
        hist_train=np.asarray(header.hist_train, dtype=np.int64),
        hist_test=np.asarray(header.hist_test, dtype=np.int64),
        attrs=attrs,
        header=header,
        version=identity,
    )
    return _Handle(info, group, files, offsets, indptr_starts(info.row_bounds, info.grid[1]))


#: the data types of a store's arrays (zarr's names), by name in a split or at the root
STORE_TYPES = {
    "cols": {"int32"},
    "y": {"uint8"},
    "raw": {"float64"},
    "indptr": {"int64"},
    "offsets": {"int64"},
    "row_bounds": {"int64"},
    "col_bounds": {"int64"},
    "ids": {"int64", "string"},
}


def _layout(header: StoreHeader) -> tuple[set[str], dict[str, nodes.ArraySpec]]:
    """The groups and arrays of a store of header ``h`` (docs/store-format.md): the root, the
    id maps' and the splits' groups; each array of the shape the header gives, of its data
    type, in regular chunks no larger than itself."""
    arrays = {
        name: nodes.ArraySpec(shape, STORE_TYPES[name.rpartition("/")[2]], one_chunk=False)
        for name, shape in header.expected_shapes().items()
    }
    return {"", *AXES, *header.splits}, arrays


def _shapes(group: zarr.Group, header: StoreHeader) -> dict[str, tuple[int, ...]]:
    """The recorded shape of every array the header gives one for (its metadata only)."""
    shapes = {}
    for name in header.expected_shapes():
        node = group[name]
        if not isinstance(node, zarr.Array):
            raise StoreError(f"{group.store_path}: {name} is a group, not an array")
        shapes[name] = tuple(node.shape)
    return shapes


def _array_files(group: zarr.Group, path: str, name: str) -> ArrayFiles:
    return ArrayFiles.of(group[name], locations.join(path, name))


def _read_all(files: ArrayFiles) -> np.ndarray:
    return files.read(0, files.size, np.empty(files.size, files.dtype))
