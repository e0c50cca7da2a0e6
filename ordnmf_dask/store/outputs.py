"""Where a command may write: one rule for every output path (a store, model or export
directory, a checkpoint directory, a JSON results or log file), checked before any work.

An output is never a store, model, checkpoint, checkpoint directory or export of this package,
nor inside one, except a directory of the very kind the command writes (whose replacement
:func:`.blocks.check_target` then decides); never an input, inside one or containing one;
never another output of the same command, inside it or containing it. These directories are
recognised by what this package writes in them (:mod:`.kinds`), on the local file system. A
directory of ours is replaced only when it holds nothing else (:func:`foreign`): a file a user
put there is not ours to remove.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import IO, Any

from ordnmf_dask.errors import InputError
from ordnmf_dask.store import locations
from ordnmf_dask.store.kinds import NAMES, export_keys, kind_of

#: names zarr reads as a directory's metadata: an output by such a name would turn its parent
#: into a (broken) zarr hierarchy
ZARR_METADATA = frozenset({"zarr.json", ".zgroup", ".zarray", ".zattrs", ".zmetadata"})


def _relation(outer: str, inner: str) -> str | None:
    """How the location ``inner`` relates to ``outer``: "is", "is inside", "contains" or None."""
    if locations.contains(outer, inner):
        return "is" if locations.contains(inner, outer) else "is inside"
    return "contains" if locations.contains(inner, outer) else None


def check_place(
    path: str | os.PathLike,
    what: str,
    writes: str | None = None,
    inputs: Mapping[str, str | os.PathLike | None] | None = None,
    itself: bool = True,
) -> str:
    """The location of the output ``path`` (``what``: how to name it), after checking it is
    not an input (``inputs``: label -> path), inside one or containing one, and not inside or
    (unless not ``itself``, left to the caller) equal to a directory of this package other
    than one of the kind ``writes``. Raises InputError naming both."""
    loc = locations.location(path)
    shown = _shown(path, loc)
    typed = os.fspath(path)
    if not locations.is_url(loc) and os.path.islink(typed) and not os.path.exists(typed):
        raise InputError(
            f"refusing to write {what} to {os.path.abspath(typed)}: a symbolic link to "
            f"{os.readlink(typed)}, which does not exist (or a loop of links)"
        )
    for label, given in (inputs or {}).items():
        if given is None:
            continue
        source = locations.location(given)
        where = _relation(source, loc)
        if where is not None:
            raise InputError(
                f"refusing to write {what} to {shown}: it {where} the {label} {source}"
            )
    if locations.is_url(loc):
        locations.check_no_writer(loc)  # at a URL, the pending marker is the lock
    here = None if locations.is_url(loc) else loc if itself else os.path.dirname(loc)
    while here is not None:
        kind = kind_of(here)
        if kind is not None and not (here == loc and kind == writes):
            where = "it is a" if here == loc else f"it is inside {here}, a"
            raise InputError(
                f"refusing to write {what} to {shown}: {where} {NAMES[kind]} written by ordnmf_dask"
            )
        parent = os.path.dirname(here)
        here = None if parent == here else parent
    if loc.rstrip("/").rsplit("/", 1)[-1] in ZARR_METADATA:
        raise InputError(
            f"refusing to write {what} to {shown}: a zarr metadata file's name, which would "
            "make its directory look like a zarr group"
        )
    return loc


def _shown(path: str | os.PathLike, loc: str) -> str:
    """How a refusal names the output: its real location, after the path the user typed when
    a link leads elsewhere (``typed (a link to real)``)."""
    typed = os.fspath(path)
    if locations.is_url(loc):
        return loc
    local = os.path.abspath(typed.split("://", 1)[1] if "://" in typed else typed)
    return loc if local == loc else f"{typed if '://' in typed else local} (a link to {loc})"


def check_apart(outputs: Mapping[str, str | os.PathLike | None]) -> None:
    """InputError if two outputs of one command (name -> path) are the same path or one is
    inside the other."""
    given = [(name, locations.location(p)) for name, p in outputs.items() if p is not None]
    for (a, pa), (b, pb) in itertools.combinations(given, 2):
        where = _relation(pa, pb)
        if where is not None:
            where = "is the same path as" if where == "is" else where
            raise InputError(f"{b} ({pb}) {where} {a} ({pa}): give each output its own path")


def check_outputs(
    outputs: Mapping[str, str | os.PathLike | None],
    inputs: Mapping[str, str | os.PathLike | None],
    writes: Mapping[str, str | None],
    files: Collection[str] = (),
) -> None:
    """The whole rule for one command: its outputs (name -> path) apart, and each checked
    against ``inputs`` by :func:`check_place` (a directory of the kind ``writes[name]``, so
    nothing but a directory where it exists) or, for the names in ``files``, by
    :func:`check_file`. A path that names no file (:func:`~.locations.named`) is refused
    naming its option."""
    for name, path in {**inputs, **outputs}.items():
        try:
            if path is not None:
                locations.named(path)
        except InputError as exc:
            raise InputError(f"{name} {exc}") from None
    check_apart(outputs)
    for name, path in outputs.items():
        if path is not None and name in files:
            check_file(path, name, inputs)
        elif path is not None:
            loc = check_place(path, name, writes.get(name), inputs)
            if not locations.is_url(loc) and os.path.exists(loc) and not os.path.isdir(loc):
                kind = locations.file_kind(os.stat(loc).st_mode).replace("not a regular", "a")
                raise InputError(
                    f"cannot write {name} to {_shown(path, loc)}: it is {kind}, not a directory"
                )


def foreign(path: str) -> list[str]:
    """Files under the directory ``path`` (local or a URL) that this package did not write
    there (relative paths, sorted): for a store, model or checkpoint, those outside its zarr
    hierarchy; for an export, those its manifest or pending marker does not list."""
    if locations.is_url(path):
        try:
            present = set(locations.sizes(path))
        except FileNotFoundError:
            return []
    elif os.path.isdir(path) and not os.path.islink(path):
        present = {
            os.path.relpath(os.path.join(d, n), path).replace(os.sep, "/")
            for d, _, names in os.walk(path)
            for n in names
        }
    else:
        return []
    listing = export_keys(path)
    ours = set(listing) if listing is not None else set(locations.zarr_keys(path))
    return sorted(present - ours - {locations.PENDING})


def check_replaceable(path: str, what: str) -> None:
    """InputError if the directory ``path`` (about to be replaced) holds a file this package did
    not write (:func:`foreign`), naming it."""
    extra = foreign(path)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise InputError(
            f"refusing to overwrite {path}: it holds {locations.join(path, extra[0])}"
            f"{more}, which ordnmf_dask did not write; move it to replace the "
            f"{what}"
        )


# ------------------------------------------------------------------- files a command writes


def parent_problem(parent: str) -> str | None:
    """Why nothing can be created in the local directory ``parent`` ("does not exist", "is
    not a directory", "is not writable"), or None."""
    if not os.path.isdir(parent):
        return "is not a directory" if os.path.lexists(parent) else "does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return "is not writable"
    return None


def check_file(
    path: str | os.PathLike,
    what: str,
    inputs: Mapping[str, str | os.PathLike | None] | None = None,
) -> str:
    """The rule of :func:`check_place` for an output that is one file (a JSON results file, a
    figure, a log), and what makes writing it fail later: a stream (a FIFO, a device) is
    opened and tried now (:func:`_hold_stream`), else its directory exists and is writable
    and nothing but a regular file is there. Checked before any work; its real location, for
    :func:`write_file` or :func:`open_log`."""
    loc = check_place(path, what, None, inputs)
    if locations.is_url(loc):
        return loc
    shown = _shown(path, loc)
    if loc in _STREAMS or (os.path.exists(loc) and _stream(os.stat(loc).st_mode)):
        _hold_stream(loc, what, shown)
        return loc
    parent = os.path.dirname(loc)
    problem = parent_problem(parent)
    if problem is not None:
        raise InputError(f"cannot write {what} to {shown}: its directory {parent} {problem}")
    if os.path.lexists(loc):
        st = os.lstat(loc)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(
                f"cannot write {what} to {shown}: it is {locations.file_kind(st.st_mode)}, not "
                "a regular file"
            )
        _check_one_name(st, f"cannot write {what} to {shown}")
    return loc


def _check_one_name(st: os.stat_result, refusal: str) -> None:
    """InputError (``refusal``: its start) if a file output that exists has other names (hard
    links): one may be a store's or model's file or an input, which a log appended to it
    would damage, and no check of paths sees it."""
    if st.st_nlink > 1:
        raise InputError(
            f"{refusal}: it has {st.st_nlink} hard links, so another name of it may be a "
            "store's, a model's or an input's file; give a file of its own"
        )


def _stream(mode: int) -> bool:
    """Whether a file of this mode is a stream a file output may be written to as it is
    (``/dev/null``, ``/dev/stdout``, a pipe): a character device or a FIFO."""
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


#: the streams :func:`check_file` opened (location -> descriptor), each kept open until
#: :func:`write_file` or :func:`open_log` writes it: a FIFO's reader sees no end of file
#: between the check and the write (:func:`streams_kept` closes those never written)
_STREAMS: dict[str, int] = {}


def _hold_stream(loc: str, what: str, shown: str) -> None:
    """Open the stream ``loc`` for writing, without blocking, and try it with a write of no
    bytes, before any work: a FIFO nobody reads is refused, never waited for, and so is a
    device that takes nothing (``/dev/full``); kept in :data:`_STREAMS`."""
    if loc in _STREAMS:
        return
    try:
        fd = os.open(loc, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        reason = exc.strerror  # ENXIO: a FIFO nobody reads, or a device absent (/dev/tty)
        with contextlib.suppress(OSError):
            if exc.errno == errno.ENXIO and stat.S_ISFIFO(os.stat(loc).st_mode):
                reason = "a FIFO that nobody reads"
        raise InputError(f"cannot write {what} to {shown}: {reason}") from None
    try:
        if not _stream(os.fstat(fd).st_mode):  # replaced since it was looked at
            raise InputError(f"cannot write {what} to {shown}: it changed while it was checked")
        os.write(fd, b"")
        os.set_blocking(fd, True)
    except OSError as exc:
        os.close(fd)
        raise InputError(f"cannot write {what} to {shown}: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    _STREAMS[loc] = fd


@contextlib.contextmanager
def streams_kept() -> Iterator[None]:
    """The block of a command whose file outputs :func:`check_file` checked: the streams it
    opened and nothing wrote are closed on leaving."""
    try:
        yield
    finally:
        while _STREAMS:
            with contextlib.suppress(OSError):
                os.close(_STREAMS.popitem()[1])


def write_file(path: str, write: Callable[[IO[bytes]], Any], what: str = "the output") -> str:
    """Write one file whole or not at all: ``write(fh)`` fills ``PATH.tmp-<random>`` (created
    anew, never through a link), which then replaces ``path`` (a URL is written in one put, a
    stream such as ``/dev/stdout`` as it is, on the descriptor its check opened).
    Any failure or signal removes the temporary file; ``path`` is checked by
    :func:`check_file` first. Every file output of a command goes through here (or
    :func:`open_log`)."""
    loc = check_file(path, what)
    if locations.is_url(loc):
        with locations.open_file(loc, "wb") as fh:
            write(fh)
        return loc
    stream = _STREAMS.pop(loc, None)
    if stream is not None:  # written as it is
        with os.fdopen(stream, "wb") as fh:
            write(fh)
        return loc
    tmp = f"{loc}.tmp-{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, loc)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return loc


def _open_file(loc: str, flags: int) -> int:
    """The log ``loc`` opened with ``flags`` without blocking (a FIFO nobody reads is refused,
    never waited for): a regular file or a stream."""
    try:
        fd = os.open(loc, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise InputError(f"cannot write to {loc}: a FIFO that nobody reads") from None
        raise
    st = os.fstat(fd)
    try:
        if not (stat.S_ISREG(st.st_mode) or _stream(st.st_mode)):
            raise InputError(
                f"cannot write to {loc}: it is {locations.file_kind(st.st_mode)}, not a "
                "regular file"
            )
        if stat.S_ISREG(st.st_mode):  # linked there since its check
            _check_one_name(st, f"cannot write to {loc}")
    except InputError:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd


def open_log(path: str) -> IO[str]:
    """The log file ``path`` (checked by :func:`check_file`) opened for appending text: never
    through a link at its name, never anything but a regular file or a stream (a FIFO
    nobody reads is refused, not waited for)."""
    loc = locations.location(path)
    stream = _STREAMS.pop(loc, None)
    if stream is not None:  # a stream its check opened
        return os.fdopen(stream, "a", encoding="utf-8")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    try:
        fd = _open_file(loc, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # a link put there since the check
            raise InputError(f"cannot write the log to {loc}: it is a symbolic link") from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")
