"""The zarr metadata of a model's or store's hierarchy, local or at a URL, read and checked
when it is opened, before zarr reads any (docs/design.md, "Safety rules"): every node's
``zarr.json`` is a JSON object of zarr format 3 naming a group or an array, with that node
type's keys only; the nodes its header names are of their kind, and (a model's) each
array has the shape, data type and chunk grid the header gives, its chunks never larger than
itself (zarr allocates a whole chunk to read one). A StoreError names the file otherwise: a
garbage ``W/zarr.json`` fails the model's opening, not a read that happens to meet it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ordnmf_dask.errors import StoreError
from ordnmf_dask.store import locations

NODE_TYPES = ("group", "array")
#: the keys a ``zarr.json`` of each node type may hold (zarr v3; no extension this package
#: does not write)
NODE_KEYS = {
    "group": frozenset({"zarr_format", "node_type", "attributes", "consolidated_metadata"}),
    "array": frozenset(
        {
            "zarr_format",
            "node_type",
            "attributes",
            "shape",
            "data_type",
            "chunk_grid",
            "chunk_key_encoding",
            "fill_value",
            "codecs",
            "storage_transformers",
            "dimension_names",
        }
    ),
}


@dataclass(frozen=True)
class ArraySpec:
    """What the array at one path of a hierarchy must be: its ``shape`` (a None length is any
    up to ``most``), one of ``dtypes`` (zarr's names, ``float64``), and whether it is stored
    as one chunk."""

    shape: tuple[int | None, ...]
    dtypes: Collection[str]
    one_chunk: bool = True
    most: int = 0


def read_nodes(root: str, what: str) -> dict[str, dict[str, Any]]:
    """The metadata of every node of the zarr hierarchy at ``root``, a local directory or a
    URL (its path relative to ``root``, "" for the root -> its ``zarr.json`` parsed), each
    checked to be a JSON object of zarr format 3 naming a group or an array, before zarr reads
    any: at most :data:`~.locations.META_BYTES` of each is read (:func:`~.locations.read_head`;
    :func:`~.locations.check_tree` refused a larger one from its size)."""
    meta = locations.META
    if locations.is_url(root):
        found = [k for k in locations.zarr_keys(root) if k.rpartition("/")[2] == meta]
    else:
        found = locations.hierarchy_keys(
            os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/")
            for d, _, names in os.walk(root)
            for n in names
            if n == meta
        )
    nodes = {}
    for key in found:
        file = locations.join(root, key)
        nodes[key[: -len(meta)].rstrip("/")] = _parse(file, _read(file), what)
    if nodes.get("", {}).get("node_type", "group") != "group":
        raise StoreError(f"{_file(root, '')}: an array where the {what}'s root group is")
    return nodes


def read_root(root: str, what: str) -> dict[str, Any]:
    """The root ``zarr.json`` of the hierarchy at ``root`` parsed and checked as
    :func:`read_nodes` checks each (a regular file of at most
    :data:`~.locations.META_BYTES`); StoreError naming it otherwise, or when there is none."""
    file = locations.join(root, locations.META)
    return _parse(file, _read(file), what)


def _read(file: str) -> bytes:
    try:
        return locations.read_head(file, locations.META_BYTES)
    except OSError as exc:
        raise StoreError(f"{file}: cannot read ({exc})") from None


def _parse(file: str, data: bytes, what: str) -> dict[str, Any]:
    damaged = f"(the {what} is damaged)"
    if len(data) > locations.META_BYTES:
        raise StoreError(f"{file}: more than {locations.META_BYTES} bytes of zarr metadata")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise StoreError(f"{file}: not zarr metadata (not JSON: {exc}) {damaged}") from None
    if not isinstance(doc, dict):
        raise StoreError(f"{file}: not zarr metadata (a JSON {type(doc).__name__}) {damaged}")
    if doc.get("zarr_format") != 3 or doc.get("node_type") not in NODE_TYPES:
        raise StoreError(
            f"{file}: not zarr metadata of format 3 (zarr_format {doc.get('zarr_format')!r}, "
            f"node_type {doc.get('node_type')!r}) {damaged}"
        )
    kind = doc["node_type"]
    extra = ", ".join(sorted(str(k) for k in doc.keys() - NODE_KEYS[kind]))
    if extra:
        raise StoreError(f"{file}: zarr metadata of a {kind} with keys {extra} {damaged}")
    return doc


def check_layout(
    root: str,
    nodes: Mapping[str, Mapping[str, Any]],
    groups: Collection[str],
    arrays: Mapping[str, ArraySpec],
    what: str,
) -> None:
    """StoreError naming the file unless each of ``groups`` present in ``nodes`` is a group
    and each of ``arrays`` present is an array as its :class:`ArraySpec` says (a node absent
    is left to the reader that needs it, which names it)."""
    for name in groups:
        if name in nodes and nodes[name].get("node_type") != "group":
            raise StoreError(
                f"{_file(root, name)}: an array where the {what} has a group "
                f"(the {what} is damaged)"
            )
    for name, spec in arrays.items():
        if name in nodes:
            _check_array(_file(root, name), nodes[name], spec, what)


def _file(root: str, name: str) -> str:
    return locations.join(root, *([name] if name else []), locations.META)


def _counts(value: Any, ndim: int) -> tuple[int, ...] | None:
    """``value`` as a tuple of ``ndim`` nonnegative integers, or None."""
    if not isinstance(value, list) or len(value) != ndim:
        return None
    if not all(type(n) is int and n >= 0 for n in value):
        return None
    return tuple(value)


def _check_array(file: str, meta: Mapping[str, Any], spec: ArraySpec, what: str) -> None:
    damaged = f"(the {what} is damaged)"
    if meta.get("node_type") != "array":
        raise StoreError(f"{file}: a group where the {what} has an array {damaged}")
    shape = _counts(meta.get("shape"), len(spec.shape))
    want = tuple("any" if n is None else n for n in spec.shape)
    fits = shape is not None and all(
        n <= spec.most if w is None else n == w for n, w in zip(shape, spec.shape, strict=True)
    )
    if shape is None or not fits:
        raise StoreError(
            f"{file}: shape {meta.get('shape')!r}, but the {what}'s header gives "
            f"{want if None not in spec.shape else f'{want} (at most {spec.most})'} {damaged}"
        )
    dtype = meta.get("data_type")
    if not isinstance(dtype, str) or dtype not in spec.dtypes:
        raise StoreError(
            f"{file}: data type {dtype!r}, not {' or '.join(sorted(spec.dtypes))} {damaged}"
        )
    grid = meta.get("chunk_grid")
    config = grid.get("configuration") if isinstance(grid, dict) else None
    chunks = _counts(config.get("chunk_shape") if isinstance(config, dict) else None, len(shape))
    regular = isinstance(grid, dict) and grid.get("name") == "regular"
    if (
        not regular
        or chunks is None
        or not all(
            1 <= c <= max(n, 1) and (c >= n or not spec.one_chunk)
            for c, n in zip(chunks, shape, strict=True)
        )
    ):
        one = "one chunk of" if spec.one_chunk else "regular chunks of at most"
        raise StoreError(f"{file}: chunk grid {grid!r}, not {one} its shape {shape} {damaged}")
