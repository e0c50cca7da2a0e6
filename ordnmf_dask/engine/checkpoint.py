"""Checkpoints of a running fit: whole or ignored, written by the workers, read back on resume.

A checkpoint taken after iteration ``n`` is a zarr group ``<dir>/ckpt-<n>`` holding every factor
chunk (``W/<r>``, ``H/<c>``) and the last local step's shape statistics (``SW/<r>``, ``SH/<c>``),
written where they live, plus the client's O(K + V) state (family parameters, ELBO trace, summed
local statistics, column sums) and a fingerprint of the store and configuration in its
attributes. It is written to ``ckpt-<n>.tmp``, marked complete, then renamed; chunks carry their
column sums, checked when read back. The newest two are kept.

Taking a checkpoint also cuts the task lineage: the state is read back from disk into fresh
futures with no dependencies, so the scheduler forgets everything before it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from distributed import Client, Future, wait

from ..model.updates import FactorChunk
from . import chunkstore

log = logging.getLogger(__name__)

FORMAT = 1
KEEP = 2
_NAME = re.compile(r"^ckpt-(\d{8})$")
GROUPS = ("W", "H", "SW", "SH")


class CheckpointError(RuntimeError):
    """No usable checkpoint, or one written for another store or configuration."""


@dataclass
class Snapshot:
    """The client-side part of the state after an iteration (JSON-able)."""

    iteration: int
    params: Any
    elbo: list[float]
    objective: float
    small: list[float]
    w_sum: list[float]
    h_sum: list[float]


def fingerprint(store_attrs: dict[str, Any], store_path: str, settings: dict[str, Any]) -> str:
    """Hash of what a fit depends on: the store's identity and the fit's settings."""
    keys = ("created", "n_users", "n_items", "n_classes", "nnz_train", "hist_train", "grid", "seed")
    doc = {
        "store": os.path.abspath(store_path),
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


def _load(root: str, name: str, index: int, rows: int, colsum: list[float]) -> Any:
    """Read one chunk back, or an :class:`_Unreadable` if it is not exactly what was written."""
    try:
        if name in ("W", "H"):
            value = chunkstore.load_chunk(root, name, index)
            data = value.mean
        else:
            value = data = chunkstore.load_array(root, name, index)
    except Exception as exc:  # noqa: BLE001 - truncated, missing or garbled: not usable
        return _Unreadable(f"{root}/{name}/{index}: unreadable ({type(exc).__name__}: {exc})")
    if data.shape[0] != rows or data.sum(axis=0).tolist() != colsum:
        return _Unreadable(f"{root}/{name}/{index}: content does not match its checksum")
    return value


def _problem(value: Any) -> str | None:
    return value.problem if isinstance(value, _Unreadable) else None


def list_checkpoints(directory: str) -> list[str]:
    """Complete-looking checkpoints in ``directory``, newest first."""
    if not os.path.isdir(directory):
        return []
    names = sorted((n for n in os.listdir(directory) if _NAME.match(n)), reverse=True)
    return [os.path.join(directory, n) for n in names]


def write(
    client: Client,
    directory: str,
    groups: dict[str, list[Future]],
    snap: Snapshot,
    print_: str,
) -> str:
    """Write a checkpoint of ``groups`` (W, H, SW, SH futures) and ``snap``; return its path."""
    final = os.path.join(directory, f"ckpt-{snap.iteration:08d}")
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    root = zarr.open_group(tmp, mode="w")
    for name in GROUPS:
        root.create_group(name)
    sums = {
        name: [client.submit(_save, f, tmp, name, j) for j, f in enumerate(groups[name])]
        for name in GROUPS
    }
    wait([f for fs in sums.values() for f in fs])
    root.attrs.update(
        {
            "format": FORMAT,
            "fingerprint": print_,
            "snapshot": snap.__dict__,
            "colsums": {name: [f.result() for f in fs] for name, fs in sums.items()},
            "complete": True,
        }
    )
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    older = [p for p in list_checkpoints(directory) if p < final]  # names sort by iteration
    for old in older[KEEP - 1 :]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def clear(directory: str) -> None:
    """Remove every checkpoint in ``directory`` (a fresh fit does not mix with an old run's)."""
    for path in list_checkpoints(directory):
        shutil.rmtree(path, ignore_errors=True)


def read(
    client: Client, path: str, rows: dict[str, list[int]], print_: str
) -> tuple[dict[str, list[Future]], Snapshot]:
    """Futures reading checkpoint ``path`` back on the workers (validated), and its snapshot."""
    try:
        attrs = dict(zarr.open_group(path, mode="r").attrs)
    except Exception as exc:  # noqa: BLE001 - unreadable metadata: not a usable checkpoint
        raise CheckpointError(f"{path}: unreadable ({exc})") from exc
    if attrs.get("complete") is not True or attrs.get("format") != FORMAT:
        raise CheckpointError(f"{path}: incomplete or unknown format")
    if attrs.get("fingerprint") != print_:
        raise CheckpointError(f"{path}: written for another store or configuration")
    colsums = attrs["colsums"]
    futures = {
        name: [
            client.submit(_load, path, name, j, n, colsums[name][j], pure=False)
            for j, n in enumerate(rows[name])
        ]
        for name in GROUPS
    }
    flat = [f for fs in futures.values() for f in fs]
    wait(flat)
    for f in flat:
        if f.status != "finished":
            raise CheckpointError(f"{path}: {f.exception()}")
    problems = [p for p in client.gather([client.submit(_problem, f) for f in flat]) if p]
    if problems:
        raise CheckpointError(problems[0])
    return futures, Snapshot(**attrs["snapshot"])


def read_newest(
    client: Client, directory: str, rows: dict[str, list[int]], print_: str
) -> tuple[dict[str, list[Future]], Snapshot, str]:
    """The newest checkpoint in ``directory`` that reads back whole; others are skipped."""
    problems = []
    for path in list_checkpoints(directory):
        try:
            futures, snap = read(client, path, rows, print_)
        except CheckpointError as exc:
            log.warning("skipping checkpoint: %s", exc)
            problems.append(str(exc))
            continue
        return futures, snap, path
    detail = "; ".join(problems) if problems else "none found"
    raise CheckpointError(f"no usable checkpoint in {directory} ({detail})")
