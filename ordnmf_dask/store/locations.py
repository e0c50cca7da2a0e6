"""Where stores and models live: a local directory or an fsspec URL (``s3://``, ``gs://``, ...),
and the few file operations their readers and writers need on either.

Local paths keep the plain ``os`` calls (the streamed reads of :mod:`.decode` use them
directly); a URL goes through fsspec, its credentials and options found the usual fsspec way
(environment, fsspec configuration): a path string carries none, and Dask workers open the
same URL on their own.

Object stores cannot rename, so whatever this package writes at a URL is written in place
between two marks (:class:`Place`): a ``_PENDING`` marker first (JSON; its ``kind`` says whose),
then the content, then the marker is removed. For a store or model (:func:`begin`,
:func:`finish`) the content is a zarr hierarchy whose root ``zarr.json`` (``complete`` true)
is written last; readers refuse a URL whose marker is there or whose root is not complete. Only
keys listed as ours are ever removed there: the keys of the zarr hierarchy (:func:`zarr_keys`),
or for a Parquet export the files its manifest or marker lists.
"""

from __future__ import annotations

import errno
import json
import lzma
import os
import posixpath
import shutil
import socket
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec

from ordnmf_dask.errors import InputError, StoreError, shown

PID_MAX = 1 << 22  # the largest pid a Linux kernel hands out (pid_max)


def _read_errors() -> tuple[type[Exception], ...]:
    """What reading an input can raise for a damaged file: the OS's errors and those of each
    decompressor fsspec uses (``.gz``, ``.bz2``, ``.xz``, ``.zip``, ``.zst``; numpy's ``.npz``
    is a zip file)."""
    errors: list[type[Exception]] = [
        OSError,
        EOFError,
        ValueError,
        zlib.error,
        lzma.LZMAError,
        zipfile.BadZipFile,
    ]
    try:
        from zstandard import ZstdError
    except ImportError:  # without zstandard, fsspec does not read .zst files
        pass
    else:
        errors.append(ZstdError)
    return tuple(errors)


#: Exceptions of a damaged or unreadable input file, which become an InputError naming it.
READ_ERRORS = _read_errors()


PENDING = "_PENDING"  # at a URL: written first, removed last (a write is in progress or failed)
META = "zarr.json"


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URL of a non-local filesystem (``file://`` is local)."""
    text = os.fspath(path)
    return "://" in text and not text.startswith(("file://", "local://"))


def location(path: str | os.PathLike) -> str:
    """The canonical name of an input or output: a local path resolved to its real location
    (symbolic links followed, ``..`` removed, so that a path through a link names what it
    reaches), or the URL in canonical form (:func:`canonical_url`). Every command and API call
    resolves its paths through it once, at its entry; the rule of every output
    (:mod:`.outputs`) compares what it returns. InputError for what names no file
    (:func:`named`)."""
    text = named(path)
    if is_url(text):
        return canonical_url(text)
    if "://" in text:
        text = text.split("://", 1)[1]
    real = os.path.realpath(text)
    if not os.path.lexists(real) and os.path.exists(text):
        # reached through a link of /proc to what has no name (``/dev/stdout`` of a pipe or a
        # socket): named as typed, which still opens it
        return os.path.abspath(text)
    return real


def named(path: str | os.PathLike) -> str:
    """``path`` as text, InputError if it names no file: an empty path (which the OS would
    read as the current directory) or one holding a NUL character (which no file name can,
    and a job file's TOML string can). Every path read or written passes here first, through
    :func:`location` or the one opener of input files."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text or "\0" in text:
        problem = "an empty path" if not text else "a path with a NUL character"
        raise InputError(f"{shown(text)}: {problem} names no file")
    return text


def canonical_url(url: str) -> str:
    """``url`` with its scheme in lower case, its path without empty, ``.`` or ``..`` segments
    and without a trailing slash: two spellings of one place compare equal."""
    scheme, _, rest = url.partition("://")
    query = ""
    if "?" in rest:
        rest, query = rest.split("?", 1)
        query = "?" + query
    path = posixpath.normpath("/" + rest).lstrip("/") if rest.strip("/") else ""
    return f"{scheme.lower()}://{path}{query}"


def join(base: str, *parts: str) -> str:
    """``base/part/...``, for a local path or a URL."""
    return "/".join([base.rstrip("/"), *parts]) if is_url(base) else os.path.join(base, *parts)


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem of ``url`` and the path on it."""
    fs, key = fsspec.core.url_to_fs(url)
    return fs, key.rstrip("/")


def contains(outer: str, inner: str) -> bool:
    """Whether the location ``inner`` is ``outer`` or inside it (both canonical)."""
    if is_url(outer) != is_url(inner):
        return False
    if not is_url(outer):
        outer, inner = os.path.realpath(outer), os.path.realpath(inner)
    sep = "/" if is_url(outer) else os.sep
    return inner == outer or inner.startswith(outer.rstrip(sep) + sep)


def read_bytes(url: str) -> bytes:
    """The content of the file at ``url``; FileNotFoundError if there is none."""
    fs, key = filesystem(url)
    return fs.cat_file(key)


def read_head(path: str, most: int) -> bytes:
    """At most ``most + 1`` bytes from the start of the file ``path``, enough to tell one
    larger than ``most`` and never more: a local file opened by :func:`open_regular` (never a
    link, FIFO or device), a URL in one ranged request. FileNotFoundError if absent."""
    if is_url(path):
        fs, key = filesystem(path)
        return bytes(fs.cat_file(key, start=0, end=most + 1))
    with open_regular(path) as fh:
        return fh.read(most + 1)


def exists(url: str) -> bool:
    """Whether anything (a file or a prefix with keys under it) is at ``url``."""
    fs, key = filesystem(url)
    fs.invalidate_cache(key)
    return bool(fs.exists(key))


def identity(path: str) -> tuple[Any, ...]:
    """What changes when the file at ``path`` is replaced: (inode, size, mtime, ctime) locally,
    (size, ETag or modification time) at a URL; FileNotFoundError if it is absent."""
    if not is_url(path):
        st = os.stat(path)
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
    fs, key = filesystem(path)
    fs.invalidate_cache(key)
    info = fs.info(key)
    if info.get("type") != "file":
        raise FileNotFoundError(path)
    tag = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime")
    return info.get("size"), str(tag)


def sizes(directory: str) -> dict[str, int]:
    """Size of every file under ``directory`` at a URL, by path relative to it."""
    fs, key = filesystem(directory)
    fs.invalidate_cache(key)
    found = fs.find(key, detail=True)
    return {name[len(key) + 1 :]: int(info["size"]) for name, info in found.items()}


def count_files(directory: str) -> int:
    """Number of files under ``directory`` (local or a URL)."""
    if is_url(directory):
        return len(sizes(directory))
    return sum(len(names) for _, _, names in os.walk(directory))


def open_file(path: str, mode: str = "rb") -> Any:
    """The file at a local path or a URL, opened (a context manager; seekable for reading)."""
    if not is_url(path):
        return open(path, mode)  # noqa: SIM115 - the caller closes it
    fs, key = filesystem(path)
    return fs.open(key, mode)


# ------------------------------------------------------ reading a directory others may write

_NO_FOLLOW = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str) -> Any:
    """The local file ``path`` of a store or model opened for reading (unbuffered), only if it
    is a regular file: never through a link at its name, never a FIFO, socket or device (opened
    without blocking, then checked on the open descriptor). FileNotFoundError if absent;
    StoreError naming it otherwise. Every chunk file of a store or model is opened here."""
    try:
        fd = os.open(path, _NO_FOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW on a link
            raise StoreError(
                f"{path}: is a symbolic link, which a store or model never "
                "holds; refusing to follow it"
            ) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StoreError(
                f"{path}: is {file_kind(mode)}, not a regular file; refusing "
                "to read it as part of a store or model"
            )
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb", buffering=0)


def copy_regular(source: str, target: str) -> None:
    """Copy the local regular file ``source`` (opened by :func:`open_regular`) to the new local
    file ``target``, creating its directory, streamed."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open_regular(source) as src, open(target, "xb") as dst:
        shutil.copyfileobj(src, dst, 1 << 22)


def file_kind(mode: int) -> str:
    """How a message names a file that is not a regular one."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def local_files(root: str) -> list[str]:
    """The regular files under the local directory ``root`` (paths relative to it, '/'
    separated), found without following any link: a link or special file is never listed."""
    found = []
    for d, _, names in os.walk(root):  # os.walk does not descend into linked directories
        for n in names:
            full = os.path.join(d, n)
            if stat.S_ISREG(os.lstat(full).st_mode):
                found.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return sorted(found)


#: Bytes of one ``zarr.json`` of a store, model or checkpoint: far above a real one (a few KiB
#: to MiB), far below what zarr would read whole into memory as a bomb.
META_BYTES = 64 << 20


def check_directory(root: str, what: str) -> None:
    """StoreError if the local ``root`` of a store or model exists but is not a directory (a
    file, a FIFO, a device), naming what it is."""
    if os.path.exists(root) and not os.path.isdir(root):
        kind = file_kind(os.stat(root).st_mode).replace("not a regular file", "a file")
        raise StoreError(f"{root}: is {kind}, not a {what} (a {what} is a directory)")


def check_tree(root: str, what: str) -> None:
    """StoreError unless the directory or URL ``root`` (a store, model or checkpoint about to
    be read) is safe to read through zarr, which reads a ``zarr.json`` whole, follows links and
    blocks on a FIFO: no ``zarr.json`` larger than :data:`META_BYTES` (at a URL, by one
    listing), and locally no FIFO, socket or device anywhere in it and no symbolic link where
    a part of its zarr hierarchy is (a ``zarr.json``, anything under a chunk directory ``c/``,
    or a link to a directory holding a ``zarr.json``). Links elsewhere (a user's notes) are
    left alone: they are never read."""
    if is_url(root):
        try:
            listed = sizes(root)
        except OSError as exc:
            raise StoreError(f"{root}: cannot be listed ({exc})") from None
        for key, size in listed.items():
            if key.rpartition("/")[2] == META and size > META_BYTES:
                raise StoreError(_oversized(join(root, key), size, what, root))
        return
    check_directory(root, what)
    for d, dirs, names in os.walk(root):
        for n in [*dirs, *names]:
            full = os.path.join(d, n)
            st = os.lstat(full)
            mode = st.st_mode
            if n == META and stat.S_ISREG(mode) and st.st_size > META_BYTES:
                raise StoreError(_oversized(full, st.st_size, what, root))
            if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                continue
            rel = os.path.relpath(full, root)
            if not stat.S_ISLNK(mode):
                raise StoreError(
                    f"{full}: is {file_kind(mode)} inside the {what} {root}; a "
                    f"{what} holds regular files only"
                )
            parts = rel.split(os.sep)
            if n in (META, "c") or "c" in parts[:-1] or os.path.isfile(os.path.join(full, META)):
                raise StoreError(
                    f"{full}: is a symbolic link inside the {what} {root}, where "
                    f"its own files belong; refusing to follow it"
                )


def _oversized(file: str, size: int, what: str, root: str) -> str:
    return (
        f"{file}: {size} bytes of zarr metadata in the {what} {root}, more than the "
        f"{META_BYTES} any holds; refusing to read it"
    )


def remove_tree(path: str, suffix: str = "") -> None:
    """Remove the files under the directory (or URL prefix) ``path`` whose names end with
    ``suffix`` (every file with ""), then the directories left empty (locally). Only for what
    this package created there itself; with a suffix, other files stay."""
    if not is_url(path):
        if not suffix:
            shutil.rmtree(path, ignore_errors=True)
            return
        for d, _, names in os.walk(path, topdown=False):
            for n in names:
                if n.endswith(suffix):
                    os.remove(os.path.join(d, n))
            if not os.listdir(d):
                os.rmdir(d)
        return
    fs, key = filesystem(path)
    fs.invalidate_cache(key)
    found = [k for k in (fs.find(key) if fs.exists(key) else []) if k.endswith(suffix)]
    if found:
        fs.rm(found)
    fs.invalidate_cache(key)


def write_bytes(url: str, data: bytes | memoryview) -> None:
    """Write ``data`` as the file at ``url`` (parent directories created locally)."""
    if not is_url(url):
        os.makedirs(os.path.dirname(url), exist_ok=True)
        with open(url, "wb") as fh:
            fh.write(data)
        return
    fs, key = filesystem(url)
    fs.pipe_file(key, bytes(data))


# ------------------------------------------------------------------------- writing at a URL


@dataclass(frozen=True)
class Place:
    """A prefix at a URL written in place between marks: its filesystem, its path there and the
    name to report. Stores, models, checkpoints and Parquet exports all use it; what each
    counts as its own keys (and so may remove) is the caller's list."""

    fs: fsspec.AbstractFileSystem
    root: str
    url: str

    @classmethod
    def of(cls, url: str) -> Place:
        fs, key = filesystem(url)
        return cls(fs, key, url)

    def marker(self, name: str = PENDING, kind: str | None = None) -> dict[str, Any] | None:
        """The JSON marker ``name`` if it is one of ours (of ``kind`` when given), else None."""
        try:
            mark = json.loads(self.fs.cat_file(f"{self.root}/{name}"))
        except (OSError, ValueError):
            return None
        found = str(mark.get("kind", "")) if isinstance(mark, dict) else ""
        ours = found == kind if kind is not None else found.startswith("ordnmf_dask")
        return mark if ours else None

    def begin(self, doc: dict[str, Any], replaced: Sequence[str]) -> None:
        """Start a write: the pending marker ``doc`` (its ``kind`` says whose), then the removal
        of ``replaced`` (the previous write's keys, listed before the marker was written).
        InputError when nothing can be written there."""
        doc = {**doc, "host": socket.gethostname(), "pid": os.getpid()}  # the writer, as a lock
        try:
            self.fs.pipe_file(f"{self.root}/{PENDING}", json.dumps(doc).encode())
        except OSError as exc:  # the first write: no bucket, no permission, ...
            raise InputError(f"{self.url}: cannot write there ({exc})") from None
        self.remove(replaced, keep_pending=True)

    def finish(self) -> None:
        """The write is complete: remove the pending marker."""
        self.fs.rm_file(f"{self.root}/{PENDING}")
        self.fs.invalidate_cache(self.root)

    def remove(self, keys: Sequence[str], keep_pending: bool = False) -> None:
        """Remove ``keys`` (relative to the root, in this order) where present and, unless
        ``keep_pending``, the pending marker; nothing else."""
        self.fs.invalidate_cache(self.root)
        for k in [*keys, *([] if keep_pending else [PENDING])]:
            path = f"{self.root}/{k}"
            if self.fs.exists(path):
                self.fs.rm_file(path)
        self.fs.invalidate_cache(self.root)


def marker(url: str) -> dict[str, Any] | None:
    """The pending marker at ``url`` if there is one of ours, else None."""
    return Place.of(url).marker()


def check_no_writer(url: str) -> None:
    """InputError when another process may be writing at ``url`` right now: its pending marker
    names a live process of this host, or a process of another host (which cannot be checked
    from here; the message names the marker to remove once it is known to be gone). Object
    stores have no exclusive create, so this marker is their lock: checked before any work,
    it refuses a second writer that comes once the first has begun."""
    mark = marker(url)
    if mark is None or mark.get("pid") is None:
        return
    host, pid = mark.get("host"), mark.get("pid")
    if host == socket.gethostname() and (pid == os.getpid() or not pid_alive(pid)):
        return
    raise InputError(
        f"{url} is being written by process {pid} on {host} (marker {join(url, PENDING)}); "
        f"wait for it to finish, or remove {join(url, PENDING)} once that process is gone"
    )


def pid_alive(pid: object) -> bool:
    """Whether a process of this host has ``pid`` (anyone's); False for what no pid can be
    (not an int, <= 0, past the kernel's pid_max: os.kill would overflow)."""
    if not isinstance(pid, int) or not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        return True
    return True


def check_url_target(
    url: str, overwrite: bool, kind: str, is_ours: Callable[[str], bool], mark: str
) -> str:
    """``url`` after checking a store or model may be written there (InputError if not):
    nothing there, or with ``overwrite`` a ``kind`` of ours (``is_ours``) or an unfinished write
    of one (its pending marker says ``mark``)."""
    try:
        present = exists(url)
    except OSError as exc:
        raise InputError(f"{url}: cannot be reached ({exc})") from None
    if present:
        if not overwrite:
            raise InputError(f"{url} already exists; pass overwrite=True to replace it")
        pending = marker(url)
        if not (is_ours(url) or (pending is not None and pending.get("kind") == mark)):
            raise InputError(f"refusing to overwrite {url}: it is not a {kind}")
    return url


def begin(url: str, mark: str) -> None:
    """Start writing a zarr hierarchy at ``url`` (:meth:`Place.begin`, pending marker of kind
    ``mark``): a previous one of ours there is removed, the root's metadata first, so that it
    is no longer complete."""
    Place.of(url).begin({"kind": mark}, zarr_keys(url))


def finish(url: str) -> None:
    """The hierarchy at ``url`` is complete: remove its pending marker."""
    Place.of(url).finish()


def zarr_keys(url: str) -> list[str]:
    """The keys of the zarr hierarchy rooted at ``url`` (paths relative to it): the
    ``zarr.json`` of the root and of every node whose parent is a node, and every key under
    ``<node>/c/`` (chunks). The root's ``zarr.json`` comes first."""
    try:
        found = sorted(sizes(url))
    except FileNotFoundError:
        return []
    return hierarchy_keys(found)


def hierarchy_keys(found: Iterable[str]) -> list[str]:
    """Of the files ``found`` (paths relative to a directory), those of the zarr hierarchy
    rooted there (see :func:`zarr_keys`), the root's ``zarr.json`` first."""
    found = sorted(found)
    nodes = {""} | {k[: -len(META)].rstrip("/") for k in found if k.endswith(META)}

    def linked(node: str) -> bool:  # the node and every ancestor up to the root is a node
        while node:
            if node not in nodes:
                return False
            node = node.rpartition("/")[0]
        return True

    keys = []
    for k in found:
        head, _, name = k.rpartition("/")
        if name == META:
            ours = linked(head)
        else:
            node, sep, _ = k.partition("/c/") if "/c/" in k else ("", "", "")
            ours = bool(sep) and node in nodes and linked(node)
        if ours:
            keys.append(k)
    return sorted(keys, key=lambda k: k != META)


def remove(url: str, keep_pending: bool = False, root_last: bool = False) -> None:
    """Remove the zarr hierarchy of ours at ``url`` (:func:`zarr_keys`) and, unless
    ``keep_pending``, its pending marker; nothing else there is touched. The root's metadata
    goes first (from then on it is not complete), or with ``root_last`` last (until then it
    still says whose it is)."""
    keys = zarr_keys(url)
    if root_last and keys[:1] == [META]:
        keys = [*keys[1:], META]
    Place.of(url).remove(keys, keep_pending)


def upload(local: str, url: str) -> None:
    """Copy the zarr hierarchy in the local directory ``local`` to ``url`` (between
    :func:`begin` and :func:`finish`): every node's metadata, parents first, then the chunks,
    then the root's ``zarr.json`` last (the one that marks it complete)."""
    fs, key = filesystem(url)
    files = sorted(
        os.path.relpath(os.path.join(d, n), local).replace(os.sep, "/")
        for d, _, names in os.walk(local)
        for n in names
    )
    meta = sorted((f for f in files if f.endswith(META) and f != META), key=lambda f: f.count("/"))
    order: Iterable[str] = [*meta, *(f for f in files if not f.endswith(META)), META]
    for name in order:
        fs.put_file(os.path.join(local, name), f"{key}/{name}")
    fs.invalidate_cache(key)


def list_names(url: str) -> list[str]:
    """Names of the entries (files and prefixes) directly under ``url``."""
    fs, key = filesystem(url)
    fs.invalidate_cache(key)
    try:
        return [name.rstrip("/").rpartition("/")[2] for name in fs.ls(key, detail=False)]
    except FileNotFoundError:
        return []


def check_not_pending(url: str, what: str) -> None:
    """StoreError when a write of the ``what`` at ``url`` is in progress or failed."""
    if is_url(url) and marker(url) is not None:
        raise StoreError(
            f"{url}: incomplete {what} (marker {PENDING}: a write is in progress or failed)"
        )
