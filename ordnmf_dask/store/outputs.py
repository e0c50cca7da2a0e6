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

import itertools
import os
from collections.abc import Mapping

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
    for label, given in (inputs or {}).items():
        if given is None:
            continue
        source = locations.location(given)
        where = _relation(source, loc)
        if where is not None:
            raise InputError(f"refusing to write {what} to {loc}: it {where} the {label} {source}")
    here = None if locations.is_url(loc) else loc if itself else os.path.dirname(loc)
    while here is not None:
        kind = kind_of(here)
        if kind is not None and not (here == loc and kind == writes):
            where = "it is a" if here == loc else f"it is inside {here}, a"
            raise InputError(
                f"refusing to write {what} to {loc}: {where} {NAMES[kind]} written by ordnmf_dask"
            )
        parent = os.path.dirname(here)
        here = None if parent == here else parent
    if loc.rstrip("/").rsplit("/", 1)[-1] in ZARR_METADATA:
        raise InputError(
            f"refusing to write {what} to {loc}: a zarr metadata file's name, which would make "
            "its directory look like a zarr group"
        )
    return loc


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
) -> None:
    """The whole rule for one command: its outputs (name -> path) apart, and each checked by
    :func:`check_place` against ``inputs``, writing the kind ``writes[name]``."""
    check_apart(outputs)
    for name, path in outputs.items():
        if path is not None:
            check_place(path, name, writes.get(name), inputs)


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
