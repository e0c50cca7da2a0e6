"""One writer per output: a directory being written by a live process is locked, and a second
writer of it is refused before any work.

The lock of a local output ``PATH`` is the file ``PATH.lock`` beside it, created with
``O_EXCL`` (atomic on local file systems and on NFS v3 and later) and holding the writer's
host and pid as JSON. It is removed when the writer leaves, on an error or a signal too. A lock
left by a process that is gone (killed) is reclaimed when its host is this one and its pid no
longer runs; a lock of another host is never taken over (its process cannot be checked from
here): the message names the file to remove once that process is known to be gone. A process
may take a lock it already holds (a command's lock, then the fit or save it runs). Outputs at
a URL are not locked here (object stores have no exclusive create; their writes go between
pending markers, :mod:`.locations`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
from collections.abc import Iterable, Iterator
from typing import NoReturn

from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.store import locations

LOCK_KIND = "ordnmf_dask.lock"
SUFFIX = ".lock"
LOCK_BYTES = 1 << 16  # what is read of a lock file: ours hold a few dozen bytes

_HELD: dict[str, int] = {}  # lock file -> how many times this process holds it
_GUARD = threading.Lock()


def lock_path(path: str) -> str:
    """The lock file of the local output ``path``."""
    return f"{path.rstrip(os.sep)}{SUFFIX}"


@contextlib.contextmanager
def held(*paths: str | os.PathLike | None) -> Iterator[None]:
    """Hold the locks of the outputs ``paths`` (None and URLs skipped) within the block;
    InputError naming the writer when a live process holds one (then none is held)."""
    locks = sorted({lock_path(p) for p in _local(paths)})
    taken: list[str] = []
    try:
        for lock in locks:
            if _take(lock):
                taken.append(lock)
        yield
    finally:
        for lock in reversed(taken):
            _give_back(lock)


def check_free(path: str | os.PathLike) -> None:
    """Refuse, as :func:`take` would (InputError naming the writer), an output whose lock
    another live process holds: the check a writer makes as it plans, before any work
    (:func:`take`, when it starts writing, is the atomic one)."""
    for lock in (lock_path(p) for p in _local([path])):
        with _GUARD:
            if lock in _HELD:
                continue
        if os.path.lexists(lock):
            holder = _holder(lock)
            if holder is None or not _stale(holder):
                _refuse(lock, holder)


def take(path: str | os.PathLike) -> str | None:
    """Take the lock of the output ``path`` (None for a URL, or where it cannot be created);
    the lock to give back with :func:`give_back`. InputError naming the writer when a live
    process holds it."""
    local = _local([path])
    if not local:
        return None
    lock = lock_path(local[0])
    return lock if _take(lock) else None


def give_back(lock: str | None) -> None:
    """Give back a lock :func:`take` returned (None: nothing)."""
    if lock is not None:
        _give_back(lock)


def _local(paths: Iterable[str | os.PathLike | None]) -> list[str]:
    return [locations.location(p) for p in paths if p is not None and not locations.is_url(p)]


def _take(lock: str) -> bool:
    """Take ``lock`` (again, if this process holds it); False when it cannot be created (no
    such directory, not writable: the write itself then fails, with its own message)."""
    with _GUARD:
        if lock in _HELD:
            _HELD[lock] += 1
            return True
        if not _create(lock):
            return False
        _HELD[lock] = 1
        return True


def _give_back(lock: str) -> None:
    with _GUARD:
        _HELD[lock] -= 1
        if _HELD[lock]:
            return
        del _HELD[lock]
    with contextlib.suppress(FileNotFoundError):
        os.remove(lock)


def _create(lock: str) -> bool:
    """Create ``lock``, reclaiming it once from a process of this host that is gone; False
    when the file system refuses to create it."""
    doc = {"kind": LOCK_KIND, "host": socket.gethostname(), "pid": os.getpid()}
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            holder = _holder(lock)
            if holder is None or not _stale(holder):
                _refuse(lock, holder)
            _reclaim(lock)
            continue
        except OSError:
            return False
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(doc, fh)
        except BaseException:  # a signal or a full disk: no lock naming no one is left
            with contextlib.suppress(OSError):
                os.remove(lock)
            raise
        return True
    _refuse(lock, _holder(lock))


def _holder(lock: str) -> dict | None:
    """The writer the lock file names, or None (unreadable, or being written right now)."""
    try:
        with locations.open_regular(lock) as fh:
            doc = json.loads(fh.read(LOCK_BYTES))
    except (OSError, ValueError, RecursionError, StoreError):
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == LOCK_KIND else None


def _stale(holder: dict) -> bool:
    """Whether the lock's process is known to be gone: of this host, its pid not running."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    return not locations.pid_alive(pid)


def _reclaim(lock: str) -> None:
    """Remove a stale lock: renamed away first, so that of two processes reclaiming it at
    once only one removes it (the other's rename fails) and both then race on O_EXCL."""
    aside = f"{lock}.stale-{secrets.token_hex(6)}"
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return
    holder = _holder(aside)
    if holder is not None and not _stale(holder):  # a live writer's, taken meanwhile: back
        with contextlib.suppress(OSError):
            os.rename(aside, lock)
        _refuse(lock, holder)
    os.remove(aside)


def _refuse(lock: str, holder: dict | None) -> NoReturn:
    out = lock[: -len(SUFFIX)]
    who = (
        f"process {holder.get('pid')} on {holder.get('host')}"
        if holder is not None
        else "another process"
    )
    raise InputError(
        f"{out} is being written by {who} (lock file {lock}); wait for it to finish, or remove "
        f"{lock} once that process is gone"
    )
