"""Where stores and models live: a local directory or an fsspec URL (``s3://``, ``gs://``, ...),
and the few file operations their readers and writers need on either.

Local paths keep the plain ``os`` calls (the streamed reads of :mod:`.decode` use them
directly); a URL goes through fsspec, its credentials and options found the usual fsspec way
(environment, fsspec configuration): a path string carries none, and Dask workers open the
same URL on their own.

Object stores cannot rename, so a store or model at a URL is written in place between two
marks (:func:`begin`, :func:`finish`): a ``_PENDING`` marker first, then the zarr hierarchy,
the root ``zarr.json`` (whose ``complete`` attribute is true) last, then the marker is removed.
Readers refuse a URL whose marker is there or whose root is not complete. The keys of a zarr
hierarchy at a URL (:func:`zarr_keys`) are the only ones this package ever removes there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

import fsspec

from ordnmf_dask.errors import InputError, StoreError

PENDING = "_PENDING"  # at a URL: written first, removed last (a write is in progress or failed)
META = "zarr.json"


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URL of a non-local filesystem (``file://`` is local)."""
    text = os.fspath(path)
    return "://" in text and not text.startswith(("file://", "local://"))


def location(path: str | os.PathLike) -> str:
    """The canonical name of a store or model: an absolute local path, or the URL without a
    trailing slash."""
    text = os.fspath(path)
    if is_url(text):
        return text.rstrip("/")
    if "://" in text:
        text = text.split("://", 1)[1]
    return os.path.abspath(text)


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


def marker(url: str) -> dict[str, Any] | None:
    """The pending marker at ``url`` if there is one of ours, else None."""
    try:
        mark = json.loads(read_bytes(join(url, PENDING)))
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) and str(mark.get("kind", "")).startswith(
        "ordnmf_dask") else None


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
    """Start writing a zarr hierarchy at ``url``: the pending marker, then the removal of what
    a previous one of ours left there (the root's metadata first, so it is no longer complete).
    InputError when nothing can be written there."""
    try:
        write_bytes(join(url, PENDING), json.dumps({"kind": mark}).encode())
    except OSError as exc:  # the first write: no bucket, no permission, ...
        raise InputError(f"{url}: cannot write there ({exc})") from None
    remove(url, keep_pending=True)


def finish(url: str) -> None:
    """The hierarchy at ``url`` is complete: remove its pending marker."""
    fs, key = filesystem(url)
    fs.rm_file(f"{key}/{PENDING}")
    fs.invalidate_cache(key)


def zarr_keys(url: str) -> list[str]:
    """The keys of the zarr hierarchy rooted at ``url`` (paths relative to it): the
    ``zarr.json`` of the root and of every node whose parent is a node, and every key under
    ``<node>/c/`` (chunks). The root's ``zarr.json`` comes first."""
    found = sorted(sizes(url))
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
    fs, key = filesystem(url)
    keys = zarr_keys(url) if fs.exists(key) else []
    if root_last and keys[:1] == [META]:
        keys = [*keys[1:], META]
    for k in [*keys, *([] if keep_pending else [PENDING])]:
        path = f"{key}/{k}"
        if fs.exists(path):
            fs.rm_file(path)
    fs.invalidate_cache(key)


def upload(local: str, url: str) -> None:
    """Copy the zarr hierarchy in the local directory ``local`` to ``url`` (between
    :func:`begin` and :func:`finish`): every node's metadata, parents first, then the chunks,
    then the root's ``zarr.json`` last (the one that marks it complete)."""
    fs, key = filesystem(url)
    files = sorted(
        os.path.relpath(os.path.join(d, n), local).replace(os.sep, "/")
        for d, _, names in os.walk(local) for n in names
    )
    meta = sorted((f for f in files if f.endswith(META) and f != META),
                  key=lambda f: f.count("/"))
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
        raise StoreError(f"{url}: incomplete {what} (marker {PENDING}: a write is in progress "
                         "or failed)")
