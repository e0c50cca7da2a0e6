"""I/O layer: ingest text, Parquet or arrays into a zarr block store; read it back by block."""

from .errors import InputError, StoreError
from .ingest import ingest, ingest_arrays
from .store import Block, StoreInfo, open_store, read_block, read_ids

__all__ = [
    "Block",
    "InputError",
    "StoreError",
    "StoreInfo",
    "ingest",
    "ingest_arrays",
    "open_store",
    "read_block",
    "read_ids",
]
