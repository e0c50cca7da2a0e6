"""Factor chunks on disk: one zarr group per chunk, written and read by the workers.

Used for checkpoints during a fit and for saved models. Chunks are written where they live;
nothing passes through the client. Arrays are stored uncompressed, one chunk file each: posterior
parameters are dense float64 that compression barely shrinks, at several times the cost of a
plain write and read (docs/performance.md, "Storage choices"). Every chunk file is written, zeros
included, and every array records the size and CRC-32 of its file (the chunk inventory of
:mod:`ordnmf_dask.store.decode`, computed from the values written): every read checks them, so a
lost, cut or changed file is a StoreError naming it, never zeros or other numbers. Arrays written
before inventories were recorded (models of format 1, older checkpoints) are checked for their
size only, or, compressed, decoded by zarr.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import zarr

from ordnmf_dask.errors import StoreError
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.store import locations
from ordnmf_dask.store.decode import INVENTORY, WRITE_ALL, ChunkFiles, chunk_grid, inventory
from ordnmf_dask.store.kinds import group_attrs

_FIELDS = ("mean", "geo", "shape", "prior_rate")  # the state: read back bit-exactly
_REQUIRED = ("mean", "geo")  # shape and prior_rate do not exist yet for an initial state
_DERIVED = ("log_mean", "rate")  # also written, for readers of saved models
SAVED_FIELDS = (*_FIELDS, *_DERIVED)  # the arrays of a factor chunk of a saved model
_DTYPE = np.dtype("<f8")  # factor arrays: little-endian float64, the bytes of their one chunk file
INVENTORY_SINCE = 2  # the model format_version from which every factor array has an inventory


def chunk_path(root: str, name: str, index: int) -> str:
    """Group path of chunk ``index`` of factor ``name`` ("W" or "H") under ``root``."""
    return f"{root}/{name}/{index}"


def field_path(root: str, name: str, index: int, field: str) -> str:
    """Array path of ``field`` (e.g. "mean") of chunk ``index`` of factor ``name``."""
    return f"{chunk_path(root, name, index)}/{field}"


def has_field(root: str, name: str, index: int, field: str) -> bool:
    """Whether chunk ``index`` of factor ``name`` holds ``field``."""
    return field in zarr.open_group(chunk_path(root, name, index), mode="r")


def _plain(array: zarr.Array) -> bool:
    """Whether ``array`` is stored as this module writes it: one chunk file holding its values
    (float64, or the integers of :func:`save_array`) as little-endian bytes, default '/' chunk
    keys."""
    meta: dict[str, Any] = array.metadata.to_dict()  # zarr types it as any JSON value
    codecs = meta.get("codecs", ())
    keys = meta.get("chunk_key_encoding", {})
    return (
        [c.get("name") for c in codecs] == ["bytes"]
        and (codecs[0].get("configuration") or {}).get("endian", "little") == "little"
        and keys.get("name") == "default"
        and (keys.get("configuration") or {}).get("separator", "/") == "/"
        and tuple(array.chunks) == tuple(array.shape)
        and np.dtype(array.dtype).kind in "fiu"
    )


def _open(root: str, path: str, owner: str) -> tuple[zarr.Array, ChunkFiles | None]:
    """The array at ``path`` (under the model or checkpoint ``root``) and its chunk files: as
    its inventory lists them; for an array written before inventories, with the size its shape
    gives (None when compressed: zarr decodes it). StoreError naming what is wrong."""
    try:
        array = zarr.open_array(path, mode="r")
    except FileNotFoundError:
        raise StoreError(f"{path}: array missing (the {owner} is damaged)") from None
    except (ValueError, KeyError, TypeError) as exc:  # e.g. its zarr.json changed
        raise StoreError(
            f"{path}: unreadable array metadata ({type(exc).__name__}: {exc}; "
            f"the {owner} is damaged)"
        ) from None
    if INVENTORY in array.attrs:
        if not _plain(array):
            raise StoreError(
                f"{path}: not stored as one uncompressed little-endian chunk, "
                f"which its inventory describes (the {owner} is damaged)"
            )
        return array, ChunkFiles.of(array, path, owner)
    version = (group_attrs(root) or {}).get("format_version")
    if isinstance(version, int) and version >= INVENTORY_SINCE:
        raise StoreError(
            f"{path}: no chunk inventory (attribute {INVENTORY}), which every factor "
            f"array of a model of format {version} has (the {owner} is damaged)"
        )
    if not _plain(array):
        return array, None
    size = int(np.prod(array.shape)) * np.dtype(array.dtype).itemsize
    return array, ChunkFiles(path, (size,) * array.nchunks, None, chunk_grid(array), owner)


def open_checked(
    root: str, name: str, index: int, field: str | None = None, owner: str = "model"
) -> zarr.Array:
    """The zarr array ``field`` of chunk ``index`` of factor ``name`` (or, without ``field``,
    the array :func:`save_array` wrote there), after checking that its chunk file exists with
    its recorded size; StoreError naming the file otherwise (zarr reads a missing chunk file as
    zeros). Its values are read by :func:`read_field`, which checks them."""
    path = chunk_path(root, name, index) if field is None else field_path(root, name, index, field)
    array, files = _open(root, path, owner)
    if files is not None:
        files.check_present()
    elif locations.count_files(locations.join(path, "c")) < array.nchunks:
        raise StoreError(f"{path}: chunk file missing (the {owner} is damaged)")
    return array


def _read(root: str, path: str, owner: str, rows: np.ndarray | None = None) -> np.ndarray:
    """The values of the array at ``path`` (only ``rows`` if given), checked against its chunk
    inventory and decoded from the very bytes checked."""
    array, files = _open(root, path, owner)
    if files is None:  # compressed, written before inventories: zarr decodes it
        if locations.count_files(locations.join(path, "c")) < array.nchunks:
            raise StoreError(f"{path}: chunk file missing (the {owner} is damaged)")
        try:
            value = np.asarray(array[...])
        except (ValueError, RuntimeError) as exc:
            raise StoreError(f"{path}: unreadable chunk ({exc}; the {owner} is damaged)") from None
        return value if rows is None else value[rows]
    dtype = np.dtype(array.dtype).newbyteorder("<")
    if array.nchunks:  # the file's recorded and real sizes, before a byte is allocated
        need = int(np.prod(array.shape, dtype=object)) * dtype.itemsize
        if need != files.nbytes[0]:
            raise StoreError(
                f"{path}: its shape {tuple(array.shape)} takes {need} bytes, but the {owner} "
                f"records {files.nbytes[0]} for its chunk file (the {owner} is damaged)"
            )
        files.check_present()
    value = np.empty(array.shape, dtype)
    if array.nchunks:  # none for an array of no rows
        files.load(0, into=value.data.cast("B"))
    return value if rows is None else value[rows]


def read_field(
    root: str,
    name: str,
    index: int,
    field: str,
    rows: np.ndarray | None = None,
    owner: str = "model",
) -> np.ndarray:
    """``field`` of chunk ``index`` of factor ``name`` (only the local ``rows`` if given);
    ``owner`` names what ``root`` is in messages ("model" or "checkpoint")."""
    return _read(root, field_path(root, name, index, field), owner, rows)


def _create(
    parent: zarr.Group | str, name: str | None, value: np.ndarray, dtype: np.dtype = _DTYPE
) -> None:
    """Write ``value`` as a ``dtype`` array of one uncompressed chunk with its inventory: the
    array ``name`` of group ``parent``, or (``name`` None) the array at the path ``parent``."""
    arr = np.ascontiguousarray(value, dtype=np.dtype(dtype).newbyteorder("<"))
    # the chunk file holds exactly the array's bytes (:func:`_plain`): its size and CRC-32
    # are those of the values in memory, so a file that differs from them is found
    records = [(arr.nbytes, zlib.crc32(arr.data))] if arr.size else []
    spec: dict[str, Any] = {
        "shape": arr.shape,
        "dtype": arr.dtype,
        "chunks": arr.shape or None,
        "compressors": None,
        "overwrite": True,
        "config": WRITE_ALL,
        "attributes": {INVENTORY: inventory(records)},
    }
    if isinstance(parent, zarr.Group):
        assert name is not None
        array = parent.create_array(name, **spec)
    else:
        array = zarr.create_array(parent, **spec)
    array[...] = arr


def save_chunk(chunk: FactorChunk, root: str, name: str, index: int, derived: bool = True) -> str:
    """Write ``chunk`` to ``root/name/index`` (with ``derived``, also ``log_mean`` and ``rate``,
    which a checkpoint does not need); returns the group path."""
    path = chunk_path(root, name, index)
    group = zarr.open_group(path, mode="w")
    for field in SAVED_FIELDS if derived else _FIELDS:
        value = getattr(chunk, field)
        if value is not None:
            _create(group, field, value)
    group.attrs["elbo"] = chunk.elbo
    return path


def load_chunk(root: str, name: str, index: int, owner: str = "model") -> FactorChunk:
    """Read a chunk written by :func:`save_chunk`."""
    path = chunk_path(root, name, index)
    group = zarr.open_group(path, mode="r")
    fields: dict[str, Any] = {
        f: _read(root, f"{path}/{f}", owner) if f in _REQUIRED or f in group else None
        for f in _FIELDS
    }
    elbo = group.attrs["elbo"]
    assert isinstance(elbo, float | int), path  # written by save_chunk
    return FactorChunk(elbo=float(elbo), **fields)


def save_array(
    value: np.ndarray, root: str, name: str, index: int, dtype: type = np.float64
) -> str:
    """Write a plain array (e.g. a shape statistic, (n, K) float64) as ``root/name/index``, as
    ``dtype``."""
    path = chunk_path(root, name, index)
    _create(path, None, value, np.dtype(dtype))
    return path


def load_array(root: str, name: str, index: int, owner: str = "model") -> np.ndarray:
    """Read an array written by :func:`save_array`."""
    return _read(root, chunk_path(root, name, index), owner)
