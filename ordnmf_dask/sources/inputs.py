"""Which files an input names, and how messages and the store name them: paths, URLs, globs
and directories of Parquet files expanded in order, a file named twice read once, Parquet told
apart from text by its suffix."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from ordnmf_dask.errors import InputError

PathLike = str | os.PathLike
SUFFIXES = (".parquet", ".parq")
log = logging.getLogger(__name__)


def is_parquet(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a Parquet file (by its suffix)."""
    return os.fspath(path).lower().endswith(SUFFIXES)


def expand_inputs(paths: Sequence[str | os.PathLike]) -> list[str]:
    """Input files in order: paths and URLs as given, globs by their sorted matches, and a
    directory for the Parquet files under it.

    An existing path is taken as it is, also where its name holds glob characters
    (``r[1].csv``). A directory's files are found recursively (through fsspec, so also under a
    URL) and sorted by path; names starting with ``.`` or ``_`` (``_SUCCESS``, ``_metadata``,
    ``.crc`` files, hidden directories) are skipped. A file named more than once (given twice,
    or also matched by a glob or found in a directory) is read once, where it first comes, and
    a warning says so: reading it twice would count its rows twice.
    """
    import fsspec

    out: dict[str, str] = {}  # by the file's identity (``_identity``), in input order
    for p in paths:
        path = os.fspath(p)
        try:
            fs, root = fsspec.core.url_to_fs(path)
        except (ImportError, ValueError) as exc:
            raise InputError(f"{path}: cannot open ({exc})") from None
        local = "://" not in path

        def name(found: str, fs: Any = fs, local: bool = local) -> str:
            return found if local else fs.unstrip_protocol(found)

        if any(ch in path for ch in "*?[") and not fs.exists(root):
            matches = sorted(fs.glob(root))
            if not matches:
                raise InputError(f"{path}: no files match")
            _add(out, [name(m) for m in matches])
            continue
        if not fs.isdir(root):
            _add(out, [path])
            continue
        found = [
            f
            for f in fs.find(root)
            if is_parquet(f)
            and not any(
                part.startswith((".", "_")) for part in f[len(root.rstrip("/")) + 1 :].split("/")
            )
        ]
        if not found:
            raise InputError(f"{path}: is a directory without .parquet / .parq files")
        _add(out, [name(f) for f in sorted(found)])
    if not out:
        raise InputError("no input files given")
    return list(out.values())


def _add(out: dict[str, str], files: list[str]) -> None:
    """Add input files to ``out`` (by identity), warning about one that is already there."""
    for f in files:
        key = _identity(f)
        if key in out:
            log.warning("%s: named more than once among the inputs; read once", f)
        else:
            out[key] = f


def _identity(path: str) -> str:
    """What makes two input names one file: a local path resolved (links, ``..``, relative to
    the working directory), a URL as fsspec writes it."""
    return path if "://" in path else os.path.realpath(path)


def source_name(path: PathLike) -> str:
    """How the store records an input: a URL as given, a local path made absolute."""
    name = os.fspath(path)
    return name if "://" in name else os.path.abspath(name)


def as_list(paths: PathLike | Sequence[PathLike]) -> list[PathLike]:
    return [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)


def inputs_label(paths: Sequence[PathLike]) -> str:
    """The input files as messages name them: the first three as given, then how many more."""
    names = [os.fspath(p) for p in paths]
    more = f" and {len(names) - 3} more files" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more
