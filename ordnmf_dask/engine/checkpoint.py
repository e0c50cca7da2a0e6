"""Checkpoints of a running fit: whole or ignored, written by the workers, read back on resume.

A checkpoint taken after iteration ``n`` is a zarr group ``<dir>/ckpt-<n>`` holding every factor
chunk (``W/<r>``, ``H/<c>``) and the last local step's shape statistics (``SW/<r>``, ``SH/<c>``),
written where they live, plus the client's O(K + V) state (family parameters, ELBO trace, summed
local statistics, column sums) and a fingerprint of the store and configuration in its
attributes. It is written to ``ckpt-<n>.tmp`` (which records the format and fingerprint from the
start, so that even an unfinished one says whose it is), marked complete, then renamed; chunks
carry their column sums, and each array its chunk inventory (size and CRC-32,
:mod:`ordnmf_dask.modelstore.chunkstore`), checked when read back. The newest two of a fingerprint
are kept. In a directory at a URL (object stores cannot rename) it is written as ``ckpt-<n>``
directly, and is not read back until its ``complete`` attribute is set.

A fit touches only checkpoints of its own fingerprint; :func:`claim` checks a directory before a
fit starts and refuses one holding another fit's checkpoints (or anything named like a checkpoint
that is not readable as one), unless told to restart, which removes the checkpoints this package
wrote there, and nothing else. A directory made for one model (:func:`make_beside`: the CLI's
``MODEL.checkpoints`` when given none) is this package's alone: there checkpoints of another
fingerprint are replaced instead, and the directory is removed once the model is saved.

A running fit submits the writes as soon as the iteration's tasks are (:func:`start`): the
workers write each chunk when it is computed, while the iteration runs. Once the iteration's
bound is in, :func:`finish` completes the checkpoint and :func:`reload` reads it back into fresh
futures with no dependencies, which cuts the task lineage: the scheduler forgets everything
before it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from ordnmf_dask.engine.snapshot import (
    GROUPS,
    CheckpointHeader,
    Layout,
    Snapshot,
    content_problem,
    parse,
    shape_problem,
)
from ordnmf_dask.errors import CheckpointError, InputError
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.runtime.abandoned import abandoned
from ordnmf_dask.runtime.inprocess import wait
from ordnmf_dask.store import locations
from ordnmf_dask.store.kinds import (
    CHECKPOINT_DIRECTORY,
    CHECKPOINT_NAME,
    CHECKPOINTS_MARK,
    fingerprint_of,
    owner,
)

if TYPE_CHECKING:
    from distributed import Client, Future

log = logging.getLogger(__name__)

KEEP = 2
_NAME = re.compile(r"^ckpt-(\d{8})(-m\d{4})?$")


def member_tag(member: int | None) -> str:
    """What the names of the checkpoints of ensemble member ``member`` end with (members run
    at once in one directory); "" for a single fit."""
    return "" if member is None else f"-m{member:04d}"


def fingerprint(store_attrs: dict[str, Any], store_path: str, settings: dict[str, Any]) -> str:
    """Hash of what a fit depends on: the store's identity and the fit's settings."""
    keys = ("created", "n_users", "n_items", "n_classes", "nnz_train", "hist_train", "grid", "seed")
    doc = {
        "store": locations.location(store_path),
        "attrs": {k: store_attrs.get(k) for k in keys},
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _save(value: FactorChunk | np.ndarray, root: str, name: str, index: int) -> list[float]:
    """Write one chunk or statistic; return its column sums (checked when read back)."""
    if isinstance(value, FactorChunk):
        chunkstore.save_chunk(value, root, name, index, derived=False)
        return value.mean.sum(axis=0).tolist()
    chunkstore.save_array(value, root, name, index)
    return np.asarray(value).sum(axis=0).tolist()


@dataclass(frozen=True)
class _Unreadable:
    """What :func:`_load` returns for a damaged chunk (a task that raised would be logged as an
    error by the worker, while a damaged checkpoint is expected and only skipped)."""

    problem: str


def _load(
    root: str, name: str, index: int, rows: int, colsum: list[float], strict: bool, k: int | None
) -> Any:
    """Read one chunk back. If it is not exactly what was written, or (given K = ``k``: a
    resume) not a state of the fit (:func:`shape_problem` from its metadata, before anything
    is allocated; :func:`content_problem` once read): raise CheckpointError (``strict``), else
    return an :class:`_Unreadable`."""
    where = f"{root}/{name}/{index}"
    try:
        wrong = None if k is None else shape_problem(_recorded_shapes(root, name, index), rows, k)
        if wrong is None and name in ("W", "H"):
            value = chunkstore.load_chunk(root, name, index, owner="checkpoint")
            data = value.mean
        elif wrong is None:
            value = data = chunkstore.load_array(root, name, index, owner="checkpoint")
    except Exception as exc:  # noqa: BLE001 - truncated, missing or garbled: not usable
        return _refuse(f"{where}: unreadable ({type(exc).__name__}: {exc})", strict)
    if wrong is not None:
        return _refuse(f"{where}: {wrong}", strict)
    if data.shape[0] != rows or data.sum(axis=0).tolist() != colsum:
        return _refuse(f"{where}: content does not match its checksum", strict)
    wrong = None if k is None else content_problem(value, rows, k)
    return value if wrong is None else _refuse(f"{where}: {wrong}", strict)


def _refuse(problem: str, strict: bool) -> _Unreadable:
    if strict:
        raise CheckpointError(problem)
    return _Unreadable(problem)


def _recorded_shapes(root: str, name: str, index: int) -> dict[str, tuple[int, ...]]:
    """The shape each array of chunk ``name/index`` records in its metadata (a factor chunk's
    fields, or a statistic's one array)."""
    path = chunkstore.chunk_path(root, name, index)
    if name in ("W", "H"):
        return {key: tuple(a.shape) for key, a in zarr.open_group(path, mode="r").arrays()}
    return {"statistic": tuple(zarr.open_array(path, mode="r").shape)}


def _submit_loads(
    client: Client,
    path: str,
    rows: Mapping[str, list[int]],
    colsums: Mapping[str, list],
    strict: bool,
    k: int | None = None,
) -> dict[str, list[Future]]:
    return {
        name: [
            client.submit(_load, path, name, j, n, colsums[name][j], strict, k, pure=False)
            for j, n in enumerate(rows[name])
        ]
        for name in GROUPS
    }


def _problem(value: Any) -> str | None:
    return value.problem if isinstance(value, _Unreadable) else None


def list_checkpoints(directory: str, pattern: re.Pattern = _NAME) -> list[str]:
    """Complete-looking checkpoints in ``directory`` (names matching ``pattern``), newest
    first."""
    if locations.is_url(directory):
        names = sorted(
            (n for n in locations.list_names(directory) if pattern.match(n)), reverse=True
        )
        return [locations.join(directory, n) for n in names]
    if not os.path.isdir(directory):
        return []
    names = sorted((n for n in os.listdir(directory) if pattern.match(n)), reverse=True)
    return [os.path.join(directory, n) for n in names]


def foreign(directory: str) -> list[str]:
    """Entries of the local ``directory`` that are not checkpoints this package wrote (finished,
    unfinished, or emptied by a removal cut short): what a caller must not remove."""
    names = sorted(os.listdir(directory))
    return [
        os.path.join(directory, n)
        for n in names
        if not CHECKPOINT_NAME.match(n)
        or not (
            _is_empty_dir(os.path.join(directory, n)) or fingerprint_of(os.path.join(directory, n))
        )
    ]


def remove(path: str) -> None:
    """Remove the checkpoint directory ``path``, its root attributes last: a removal cut short
    (the job killed) leaves a checkpoint still recognisable as this package's, or an empty
    directory, never an unreadable look-alike that would stop the resubmitted job."""
    if locations.is_url(path):
        locations.remove(path, root_last=True)
        return
    marker = os.path.join(path, "zarr.json")
    for entry in os.scandir(path):
        if entry.path == marker:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.remove(entry.path)
    if os.path.lexists(marker):
        os.remove(marker)
    os.rmdir(path)


def _remove(paths: list[str]) -> None:
    for path in paths:
        remove(path)


def _is_empty_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)


def beside(model: str) -> str:
    """The checkpoint directory a fit writing the local ``model`` uses when given none."""
    return f"{model}.checkpoints"


def check_beside(directory: str, model: str) -> None:
    """InputError unless ``directory`` can be the checkpoint directory made beside ``model``:
    absent, empty, or made for it (a directory of the same name holding anything else is a
    user's)."""
    if not os.path.lexists(directory) or _is_empty_dir(directory) or owner(directory) == model:
        return
    raise InputError(
        f"{directory}: exists and was not made by ordnmf_dask for the checkpoints "
        f"of {model}; move it, or give checkpoint_dir"
    )


def make_beside(directory: str, model: str) -> None:
    """Create the checkpoint directory beside ``model`` (checked by :func:`check_beside`) with
    the marker that makes it this package's alone."""
    os.makedirs(directory, exist_ok=True)
    if owner(directory) != model:
        with open(os.path.join(directory, CHECKPOINTS_MARK), "w") as fh:
            json.dump({"kind": CHECKPOINT_DIRECTORY, "model": model}, fh)


def release(directory: str) -> None:
    """Remove the checkpoint directory made beside a model (:func:`make_beside`): its
    checkpoints, then its marker, then the directory if nothing else is left in it."""
    _remove(list_checkpoints(directory, CHECKPOINT_NAME))
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, CHECKPOINTS_MARK))
    if _is_empty_dir(directory):
        os.rmdir(directory)


def claim(directory: str, prints: list[str], restart: bool, dry_run: bool = False) -> list[str]:
    """Check ``directory`` before a fit whose runs have the fingerprints ``prints``; return its
    checkpoints of those fingerprints (finished or not), newest first.

    InputError, before anything is removed, if an entry named like a checkpoint is not readable
    as one (it may not be this package's), or, unless ``restart``, if a checkpoint has another
    fingerprint (another fit's: never removed without being asked), except in a directory made
    beside a model (:func:`make_beside`), which holds nothing but this package's checkpoints
    for that model: there they are replaced. ``restart`` removes every checkpoint this package
    wrote in ``directory``, whatever its fingerprint, and logs them. ``dry_run``: only check.
    """
    for path in list_checkpoints(directory, CHECKPOINT_NAME):
        if _is_empty_dir(path) and not dry_run:  # the last step of a removal cut short
            os.rmdir(path)
    found = [
        (path, fingerprint_of(path))
        for path in list_checkpoints(directory, CHECKPOINT_NAME)
        if not _is_empty_dir(path)
    ]
    unknown = [path for path, print_ in found if print_ is None]
    if unknown:
        raise InputError(
            f"{unknown[0]}: named like a checkpoint but not readable as an "
            "ordnmf_dask checkpoint; move or remove it"
        )
    if not restart and not locations.is_url(directory) and owner(directory) is not None:
        other = [path for path, print_ in found if print_ not in prints]
        if other and not dry_run:
            _remove(other)
            log.info(
                "removed %d checkpoint(s) of another configuration from %s", len(other), directory
            )
        return [path for path, print_ in found if print_ in prints]
    if restart:
        _remove([path for path, _ in found])
        if found:
            log.info(
                "restart: removed %d checkpoint(s) from %s: %s",
                len(found),
                directory,
                " ".join(os.path.basename(path) for path, _ in found),
            )
        return []
    other = [path for path, print_ in found if print_ not in prints]
    if other:
        raise InputError(
            f"{directory} holds checkpoints of another store or configuration "
            f"(such as {os.path.basename(other[0])}); they are kept: pass restart=True to "
            "discard them and start afresh, or use another checkpoint directory"
        )
    return [path for path, _ in found]


def discard(directory: str, print_: str) -> None:
    """Remove the checkpoints of fingerprint ``print_`` in ``directory`` (finished or not)."""
    found = list_checkpoints(directory, CHECKPOINT_NAME)
    _remove([p for p in found if fingerprint_of(p) == print_])


def _make_room(path: str, print_: str) -> None:
    """Remove ``path`` if it is a checkpoint of fingerprint ``print_``; CheckpointError if
    something else is there."""
    if locations.exists(path) if locations.is_url(path) else os.path.lexists(path):
        if _is_empty_dir(path):
            os.rmdir(path)
            return
        if fingerprint_of(path) != print_:
            raise CheckpointError(f"{path}: exists and is not a checkpoint of this fit")
        remove(path)


@dataclass
class Pending:
    """A checkpoint whose chunks are being written by the workers (see :func:`start`)."""

    iteration: int
    final: str
    fingerprint: str
    sums: dict[str, list[Future]]  # column sums of each chunk, as each write returns them

    @property
    def tmp(self) -> str:
        """Where the chunks are written until the checkpoint is complete (at a URL, where
        nothing can be renamed: the final name)."""
        return self.final if locations.is_url(self.final) else self.final + ".tmp"


def start(
    client: Client,
    directory: str,
    iteration: int,
    groups: dict[str, list[Future]],
    print_: str,
    tag: str = "",
) -> Pending:
    """Submit the writes of ``groups`` (W, H, SW, SH futures) for the checkpoint of iteration
    ``iteration`` of the fit with fingerprint ``print_`` (``tag``: :func:`member_tag`);
    nothing waits: each chunk is written as soon as it is computed."""
    final = locations.join(directory, f"ckpt-{iteration:08d}{tag}")
    pending = Pending(iteration, final, print_, {})
    tmp = pending.tmp
    _make_room(tmp, print_)
    root = zarr.open_group(tmp, mode="w", attributes=CheckpointHeader(print_).to_attrs())
    for name in GROUPS:
        root.create_group(name)
    for name in GROUPS:
        pending.sums[name] = [
            client.submit(_save, f, tmp, name, j) for j, f in enumerate(groups[name])
        ]
    return pending


def finish(pending: Pending, snap: Snapshot) -> tuple[str, dict[str, list]]:
    """Wait for ``pending``'s chunks, add ``snap``, mark it complete and rename it into place;
    of the older checkpoints of its fingerprint, keep the newest :data:`KEEP` - 1 finished ones
    and no unfinished one. Returns its path and column sums."""
    wait([f for fs in pending.sums.values() for f in fs])
    colsums = {name: [f.result() for f in fs] for name, fs in pending.sums.items()}
    header = CheckpointHeader(pending.fingerprint, snap, colsums)
    zarr.open_group(pending.tmp, mode="r+").update_attributes(header.to_attrs())  # one write
    if pending.tmp != pending.final:
        _make_room(pending.final, pending.fingerprint)
        os.replace(pending.tmp, pending.final)
    directory = os.path.dirname(pending.final)
    older = [  # newest first; names sort by iteration, and "ckpt-n" < "ckpt-n.tmp"
        p
        for p in list_checkpoints(directory, CHECKPOINT_NAME)
        if p < pending.final and fingerprint_of(p) == pending.fingerprint
    ]
    finished = [p for p in older if _NAME.match(os.path.basename(p))]
    for old in finished[KEEP - 1 :] + [p for p in older if p not in finished]:
        with contextlib.suppress(OSError):  # a failed clean-up does not stop the fit
            remove(old)
    return pending.final, colsums


def abandon(pending: Pending, finish_writes: bool) -> None:
    """Drop a checkpoint that will not be completed (the fit stopped at its iteration) and
    remove its temporary directory, after waiting for its writes when ``finish_writes`` (a
    fit that stopped normally; a failed one does not wait on its cluster: a write still
    running may leave a ``.tmp`` behind, which is never read as a checkpoint and is removed
    by the rotation of :func:`finish` or a restart, and by this process once the workers that
    might write there are gone: :func:`ordnmf_dask.runtime.abandoned.sweep_abandoned`)."""
    if finish_writes:
        wait([f for fs in pending.sums.values() for f in fs])
    elif not locations.is_url(pending.tmp):
        abandoned(pending.tmp)
    with contextlib.suppress(OSError):
        remove(pending.tmp)


def _root_attrs(path: str, layout: Layout) -> dict[str, Any]:
    """The root attributes of the checkpoint at ``path``, its ``zarr.json`` read as a regular
    file (never a link, FIFO or device) of the size a checkpoint of ``layout`` can have."""
    meta = locations.join(path, locations.META)
    limit = layout.max_bytes()
    try:
        text = locations.read_head(meta, limit)
    except Exception as exc:  # noqa: BLE001 - unreadable metadata: not a usable checkpoint
        raise CheckpointError(f"{path}: unreadable ({exc})") from exc
    return parse(text, path, layout)


def read(
    client: Client, path: str, layout: Layout, print_: str
) -> tuple[dict[str, list[Future]], Snapshot]:
    """Futures reading checkpoint ``path`` back on the workers (its header and every chunk
    checked against ``layout``), and its snapshot."""
    try:
        locations.check_tree(path, "checkpoint")  # no FIFO or device for zarr to block on
    except (InputError, OSError) as exc:
        raise CheckpointError(str(exc)) from None
    header = CheckpointHeader.from_attrs(_root_attrs(path, layout), path, layout, print_)
    assert header.snapshot is not None and header.colsums is not None  # complete: checked
    rows, k = layout.rows, layout.n_components
    futures = _submit_loads(client, path, rows, header.colsums, strict=False, k=k)
    flat = [f for fs in futures.values() for f in fs]
    wait(flat)
    for f in flat:
        if f.status != "finished":
            raise CheckpointError(f"{path}: {f.exception()}")
    problems = [p for p in client.gather([client.submit(_problem, f) for f in flat]) if p]
    if problems:
        raise CheckpointError(problems[0])
    return futures, header.snapshot


def reload(
    client: Client, path: str, rows: Mapping[str, list[int]], colsums: Mapping[str, list]
) -> dict[str, list[Future]]:
    """Futures reading back the checkpoint just written at ``path`` (nothing waits): they
    depend on no task, which cuts the lineage. A chunk that does not read back exactly makes
    its future raise CheckpointError."""
    return _submit_loads(client, path, rows, colsums, strict=True)


def read_newest(
    client: Client, directory: str, layout: Layout, print_: str, tag: str = ""
) -> tuple[dict[str, list[Future]], Snapshot, str]:
    """The newest checkpoint in ``directory`` (named with ``tag``: :func:`member_tag`) taken
    before iteration ``layout.max_iter`` (a fit stopping at max_iter continues from it) that
    reads back whole and sound; the newer ones are skipped with a warning naming each, or, when
    none is usable, CheckpointError naming them all."""
    problems = []
    for path in list_checkpoints(directory):
        match = _NAME.match(os.path.basename(path))
        if match is None or (match.group(2) or "") != tag:
            continue
        if int(match.group(1)) >= layout.max_iter:
            continue
        try:
            futures, snap = read(client, path, layout, print_)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        for problem in problems:
            log.warning("skipping checkpoint: %s", problem)
        return futures, snap, path
    detail = "; ".join(problems) if problems else "none found"
    raise CheckpointError(f"no usable checkpoint in {directory} ({detail})")
