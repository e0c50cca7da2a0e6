"""The one opener of the files a command reads besides stores and models (whose files
:func:`~ordnmf_dask.store.locations.open_regular` opens): ratings and pairs files, job files,
warm-start ``.npz`` files, lock files.

The rule: a regular file only, checked on the open descriptor (opened without blocking, so a
FIFO, socket or device is refused at once, naming it, instead of waiting or reading forever;
a link is followed to what it names, which must be a regular file), and, where the caller
bounds it, at most ``limit`` bytes, checked before anything is parsed. At a URL, fsspec's
``info`` must say it is a file. Every failure is an :class:`~ordnmf_dask.errors.InputError`
naming the path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import Any

import numpy as np

from ordnmf_dask.errors import InputError
from ordnmf_dask.store.locations import READ_ERRORS, file_kind, named

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

#: Bytes of a job file or a lock file: far above any real one, far below a memory bomb.
SMALL_FILE = 16 << 20

#: Bytes of an id file (``--users-from``): millions of ids, one batch held in memory with its
#: results; all the users of a model go through an export (``recommend --out``) instead.
ID_FILE = 64 << 20

#: Bytes of a Parquet file's footer metadata: far above a real one (a few MiB for thousands of
#: row groups), far below a memory bomb.
PARQUET_METADATA = 64 << 20


def _refuse(path: str, what: str, kind: str) -> InputError:
    if kind == "a directory":
        return InputError(f"{path}: is a directory, not a file")
    return InputError(f"{path}: is {kind}, not a regular file; refusing to read it ({what})")


def too_big(path: str, what: str, size: int | None, limit: int) -> InputError:
    """The refusal of the ``what`` at ``path`` of ``size`` bytes (None: unknown, more than
    read), over its ``limit``."""
    held = f"{size} bytes, more" if size is not None else "more"
    return InputError(f"{path}: {held} than the {limit} bytes {what}s may hold")


def open_input_file(path: str, what: str = "input file", limit: int | None = None) -> Any:
    """``path`` (local or a URL) opened for reading in binary, if it obeys the rule of this
    module; ``what`` names it in messages ("pairs file", "job file", ...). The caller closes it."""
    path = named(path)
    if "://" in path and not path.startswith("file://"):
        return _open_url(path, what, limit)
    local = path.split("://", 1)[1] if "://" in path else path
    try:
        fd = os.open(local, _FLAGS)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, which cannot be opened
            raise _refuse(path, what, "a socket") from None
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, what, file_kind(st.st_mode))
        if limit is not None and st.st_size > limit:
            raise too_big(path, what, st.st_size, limit)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _open_url(url: str, what: str, limit: int | None) -> Any:
    import fsspec

    try:
        fs, key = fsspec.core.url_to_fs(url)
        info = fs.info(key)
    except FileNotFoundError:
        raise InputError(f"{url}: no such file") from None
    except (ImportError, ValueError, OSError) as exc:
        raise InputError(f"{url}: cannot open ({exc})") from None
    if info.get("type") == "directory":
        raise InputError(f"{url}: is a directory, not a file")
    if info.get("type") != "file":
        raise _refuse(url, what, "not a regular file")
    size = info.get("size")
    if limit is not None and isinstance(size, int) and size > limit:
        raise too_big(url, what, size, limit)
    try:
        return fs.open(key, "rb")
    except OSError as exc:
        raise InputError(f"{url}: cannot open ({exc})") from None


def read_input_bytes(path: str, what: str, limit: int = SMALL_FILE) -> bytes:
    """The whole content of ``path`` (:func:`open_input_file`), at most ``limit`` bytes: a
    file that grows past it while read (its size said less) is refused too."""
    with open_input_file(path, what, limit) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise too_big(path, what, len(data), limit)
    return data


def read_npz(
    path: str, shapes: dict[str, tuple[int, ...]], what: str = "warm-start file"
) -> dict[str, np.ndarray]:
    """The arrays ``shapes`` names of the ``.npz`` file ``path`` (:func:`open_input_file`),
    each header read and checked first: a numeric dtype and exactly the expected shape, so a
    header claiming 10^12 rows is refused naming the file before anything is allocated. An
    array absent from the file is absent from the result."""
    import zipfile

    from numpy.lib import format as npy

    out: dict[str, np.ndarray] = {}
    with open_input_file(path, what) as fh:
        if fh.read(len(npy.MAGIC_PREFIX)) == npy.MAGIC_PREFIX:  # one .npy array: holds none
            return out
        fh.seek(0)
        try:
            with zipfile.ZipFile(fh) as zf:
                members = set(zf.namelist())
                for name, shape in shapes.items():
                    if f"{name}.npy" not in members:
                        continue
                    with zf.open(f"{name}.npy") as f:
                        version = npy.read_magic(f)
                        header = (
                            npy.read_array_header_1_0
                            if version == (1, 0)
                            else npy.read_array_header_2_0
                        )
                        found, _, dtype = header(f)
                        if dtype.kind not in "fiu" or dtype.hasobject:
                            raise InputError(f"{path}: array {name} has dtype {dtype}, not numbers")
                        if tuple(found) != shape:
                            raise InputError(
                                f"{path}: array {name} has shape {tuple(found)}, expected {shape}"
                            )
                        f.seek(0)
                        out[name] = npy.read_array(f, allow_pickle=False)
        except READ_ERRORS as exc:
            raise InputError(f"{path}: not a readable .npz file ({exc})") from None
    return out


def open_parquet(handle: Any, path: str) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` on the open, seekable ``handle`` of ``path`` (from
    :func:`open_input_file`), once its footer is checked before pyarrow reads it: the file
    ends with ``PAR1`` and the metadata length it claims fits both in the file and under
    :data:`PARQUET_METADATA`. InputError naming the file otherwise."""
    import pyarrow.parquet as pq

    try:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - 8))
        tail = handle.read(8)
        handle.seek(0)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    if size < 12 or tail[4:] != b"PAR1":
        raise InputError(f"{path}: not a readable Parquet file (no PAR1 footer at its end)")
    claimed = int.from_bytes(tail[:4], "little")
    if claimed > min(size - 12, PARQUET_METADATA):
        bound = "more than the file holds" if claimed > size - 12 else "more than any real one"
        raise InputError(
            f"{path}: not a readable Parquet file (its footer claims {claimed} bytes of "
            f"metadata, {bound}: {size} bytes in the file, at most {PARQUET_METADATA} read)"
        )
    try:
        return pq.ParquetFile(handle)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowException subclasses these
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None


def check_row_groups(metadata: Any, path: str) -> None:
    """InputError naming the file and row group whose metadata claims more bytes (uncompressed)
    than this process can allocate, or a negative size or row count, before any is read."""
    from ordnmf_dask.runtime.memory import memory_room, size_text

    room, what = memory_room()
    for group in range(metadata.num_row_groups):
        meta = metadata.row_group(group)
        if meta.num_rows < 0 or meta.total_byte_size < 0:
            raise InputError(
                f"{path}, row group {group}: its metadata claims {meta.num_rows} rows and "
                f"{meta.total_byte_size} bytes"
            )
        if meta.total_byte_size > room:
            raise InputError(
                f"{path}, row group {group}: claims {size_text(meta.total_byte_size)} "
                f"uncompressed, more than the {size_text(room)} {what}"
            )
