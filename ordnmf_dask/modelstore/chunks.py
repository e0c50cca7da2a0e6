"""Factor chunks on disk: one zarr group per chunk, written and read by the workers.

Used for checkpoints during a fit and for saved models. Chunks are written where they live;
nothing passes through the client. Arrays are stored uncompressed: posterior parameters are
dense float64 that compression barely shrinks, at several times the cost of a plain write and
read (docs/performance.md, "Storage choices"). Every chunk file is written, zeros included, and
every read checks that the files are there: zarr would read a lost one as zeros.
"""

from __future__ import annotations

import numpy as np
import zarr

from ordnmf_dask.errors import StoreError
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.store import files as locations

_FIELDS = ("mean", "geo", "shape", "prior_rate")  # the state: read back bit-exactly
_REQUIRED = ("mean", "geo")  # shape and prior_rate do not exist yet for an initial state
_DERIVED = ("log_mean", "rate")  # also written, for readers of saved models
_WRITE_ALL = {"write_empty_chunks": True}


def open_checked(path: str) -> zarr.Array:
    """The zarr array at ``path``, after checking that all its chunk files exist; StoreError
    naming the array otherwise (zarr reads a missing chunk file as zeros)."""
    try:
        array = zarr.open_array(path, mode="r")
    except FileNotFoundError:
        raise StoreError(f"{path}: array missing (the checkpoint or model is damaged)") from None
    if locations.count_files(locations.join(path, "c")) < array.nchunks:
        raise StoreError(f"{path}: chunk file missing (the checkpoint or model is damaged)")
    return array


def chunk_path(root: str, name: str, index: int) -> str:
    """Group path of chunk ``index`` of factor ``name`` ("W" or "H") under ``root``."""
    return f"{root}/{name}/{index}"


def field_path(root: str, name: str, index: int, field: str) -> str:
    """Array path of ``field`` (e.g. "mean") of chunk ``index`` of factor ``name``."""
    return f"{chunk_path(root, name, index)}/{field}"


def has_field(root: str, name: str, index: int, field: str) -> bool:
    """Whether chunk ``index`` of factor ``name`` holds ``field``."""
    return field in zarr.open_group(chunk_path(root, name, index), mode="r")


def read_field(
    root: str, name: str, index: int, field: str, rows: np.ndarray | None = None
) -> np.ndarray:
    """``field`` of chunk ``index`` of factor ``name`` (only the local ``rows`` if given)."""
    array = open_checked(field_path(root, name, index, field))
    return array[...] if rows is None else array.get_orthogonal_selection((rows, slice(None)))


def save_chunk(
    chunk: FactorChunk, root: str, name: str, index: int, derived: bool = True
) -> str:
    """Write ``chunk`` to ``root/name/index`` (with ``derived``, also ``log_mean`` and ``rate``,
    which a checkpoint does not need); returns the group path."""
    path = chunk_path(root, name, index)
    group = zarr.open_group(path, mode="w")
    for field in (*_FIELDS, *_DERIVED) if derived else _FIELDS:
        value = getattr(chunk, field)
        if value is not None:
            arr = np.ascontiguousarray(value, dtype=np.float64)
            group.create_array(
                field, shape=arr.shape, dtype=arr.dtype, chunks=arr.shape or None,
                compressors=None, overwrite=True, config=_WRITE_ALL,
            )[...] = arr
    group.attrs["elbo"] = chunk.elbo
    return path


def load_chunk(root: str, name: str, index: int) -> FactorChunk:
    """Read a chunk written by :func:`save_chunk`."""
    path = chunk_path(root, name, index)
    group = zarr.open_group(path, mode="r")
    fields = {
        f: open_checked(f"{path}/{f}")[...] if f in _REQUIRED or f in group else None
        for f in _FIELDS
    }
    return FactorChunk(elbo=float(group.attrs["elbo"]), **fields)


def save_array(
    value: np.ndarray, root: str, name: str, index: int, dtype: type = np.float64
) -> str:
    """Write a plain array (e.g. a shape statistic, (n, K) float64) as ``root/name/index``, as
    ``dtype``."""
    path = chunk_path(root, name, index)
    arr = np.ascontiguousarray(value, dtype=dtype)
    zarr.create_array(path, data=arr, chunks=arr.shape, compressors=None, overwrite=True,
                      config=_WRITE_ALL)
    return path


def load_array(root: str, name: str, index: int) -> np.ndarray:
    """Read an array written by :func:`save_array`."""
    return open_checked(chunk_path(root, name, index))[...]
