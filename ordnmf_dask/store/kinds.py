"""The directories this package writes, recognised by what it writes in them: a store, a model, a
checkpoint, a checkpoint directory made beside a model, a Parquet export.

The modules writing each kind (:mod:`.blocks`, :mod:`ordnmf_dask.modelstore.model`,
:mod:`ordnmf_dask.engine.checkpoint`, :mod:`ordnmf_dask.postfit.export`) take their marks from
here, so that the rule of every output (:mod:`.outputs`) knows them all while sitting below
every writer.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ordnmf_dask.errors import StoreError
from ordnmf_dask.store import locations, nodes

STORE_MARK = "ordnmf_dask.store"  # the kind a store's pending marker records at a URL
MODEL_KIND = "ordnmf_dask.model"  # the ``kind`` attribute that marks a model directory
CHECKPOINT = "ordnmf_dask.checkpoint"
CHECKPOINT_FORMAT = 1  # the ``format`` attribute of a checkpoint
# a checkpoint's name, finished or not: after iteration n, of an ensemble's member m or not
CHECKPOINT_NAME = re.compile(r"^ckpt-(\d{8})(-m\d{4})?(\.tmp)?$")
CHECKPOINT_DIRECTORY = "ordnmf_dask.checkpoints"  # the kind of a directory made beside a model
CHECKPOINTS_MARK = "_ORDNMF_CHECKPOINTS"  # the name of that directory's marker
EXPORT = "ordnmf_dask.export"  # the kind of an export's markers
MANIFEST = "_SUCCESS"  # an export's manifest, written last

#: How a message names each kind.
NAMES = {
    STORE_MARK: "store",
    MODEL_KIND: "model",
    EXPORT: "Parquet export",
    CHECKPOINT: "checkpoint",
    CHECKPOINT_DIRECTORY: "checkpoint directory",
}


def group_attrs(path: str) -> dict[str, Any] | None:
    """The attributes of the zarr group at ``path`` (a directory or a URL), or None if there is
    no readable one."""
    if not (locations.is_url(path) or os.path.isdir(path)):
        return None
    try:  # never through a link, a FIFO or a device, nor more than a zarr.json can hold
        doc = nodes.read_root(path, "zarr group")
    except StoreError:  # whatever makes it unreadable, it is not a group of ours
        return None
    attrs = doc.get("attributes", {})
    return dict(attrs) if doc["node_type"] == "group" and isinstance(attrs, dict) else None


_STORE_FIELDS = ("n_users", "n_items", "n_classes", "nnz_train", "hist_train", "grid")


def is_store(path: str) -> bool:
    """Whether ``path`` holds a store written by this package (complete or not): a zarr group
    with an integer ``format_version``, a ``complete`` mark and the store's fields."""
    attrs = group_attrs(path)
    if attrs is None:
        return False
    version = attrs.get("format_version")
    return (
        isinstance(version, int)
        and not isinstance(version, bool)
        and "complete" in attrs
        and all(k in attrs for k in _STORE_FIELDS)
    )


def is_model(path: str) -> bool:
    """Whether ``path`` holds a model (complete or not): its ``kind`` says so, or it has the
    attributes every model has had since format 1."""
    attrs = group_attrs(path)
    if attrs is None:
        return False
    version = attrs.get("format_version")
    return attrs.get("kind") == MODEL_KIND or (
        isinstance(version, int) and "params" in attrs and "elbo" in attrs
    )


def fingerprint_of(path: str) -> str | None:
    """The fingerprint recorded by the checkpoint (finished or not) at ``path``, or None when
    it holds no readable checkpoint attributes of this format."""
    attrs = group_attrs(path)
    if attrs is None or attrs.get("format") != CHECKPOINT_FORMAT:
        return None
    found = attrs.get("fingerprint")
    return found if isinstance(found, str) else None


_MARK = 1 << 16  # bytes of a marker read at most (one is a line of JSON)


def owner(directory: str) -> str | None:
    """The model the local checkpoint ``directory`` was made beside (its marker says so), or
    None."""
    try:  # a regular file of a marker's size, never a FIFO to wait on or a bomb to parse
        doc = json.loads(locations.read_head(os.path.join(directory, CHECKPOINTS_MARK), _MARK))
    except (OSError, ValueError, RecursionError, StoreError):
        return None
    found = (
        doc.get("model")
        if isinstance(doc, dict) and doc.get("kind") == CHECKPOINT_DIRECTORY
        else None
    )
    return found if isinstance(found, str) else None


def holds_checkpoints(directory: str) -> bool:
    """Whether the local ``directory`` is a checkpoint directory: one made beside a model
    (:func:`owner`), or one holding a checkpoint this package wrote."""
    if owner(directory) is not None:
        return True
    if not os.path.isdir(directory):
        return False
    return any(
        fingerprint_of(os.path.join(directory, n)) is not None
        for n in os.listdir(directory)
        if CHECKPOINT_NAME.match(n)
    )


def export_listing(place: locations.Place) -> list[str]:
    """The keys of the export at ``place``, in the order they are removed: the manifest first
    (from then on it is not a complete export), then the files it or the pending marker
    lists."""
    listed: set[str] = set()
    for name in (MANIFEST, locations.PENDING):
        mark = place.marker(name, EXPORT) or {}
        listed.update(p for d in (mark.get("datasets") or {}).values() for p in d["parts"])
        listed.update(mark.get("planned") or [])
    return [MANIFEST, *sorted(listed)]


def export_keys(path: str) -> list[str] | None:
    """The keys an export at ``path`` (local or a URL) lists as its own, or None when no
    marker of an export is there."""
    place = locations.Place.of(path)
    if all(place.marker(name, EXPORT) is None for name in (MANIFEST, locations.PENDING)):
        return None
    return export_listing(place)


def kind_of(path: str) -> str | None:
    """What the local directory ``path`` is, as written by this package (a key of
    :data:`NAMES`), or None (a URL, a file, a link or anything else)."""
    try:
        return _kind_of(path)
    except OSError:  # a directory that cannot be read (permissions) holds nothing we know
        return None


def _kind_of(path: str) -> str | None:
    if locations.is_url(path) or os.path.islink(path) or not os.path.isdir(path):
        return None
    if is_store(path):
        return STORE_MARK
    if is_model(path):
        return MODEL_KIND
    if export_keys(path) is not None:
        return EXPORT
    if fingerprint_of(path) is not None:
        return CHECKPOINT
    if holds_checkpoints(path):
        return CHECKPOINT_DIRECTORY
    return None
