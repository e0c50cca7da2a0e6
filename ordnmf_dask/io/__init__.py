"""I/O layer: ingest text or arrays into a zarr block store, and read it back block by block.

Names other than the error classes are imported on first use (``ordnmf_dask._lazy``).
"""

from typing import TYPE_CHECKING

from .._lazy import install
from .errors import InputError, StoreError

_EXPORTS = {
    "Block": ".store",
    "StoreInfo": ".store",
    "ingest": ".ingest",
    "ingest_arrays": ".ingest",
    "open_store": ".store",
    "read_block": ".store",
    "read_ids": ".store",
}

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

if TYPE_CHECKING:  # static analysis and IDEs see the real names
    from .ingest import ingest, ingest_arrays
    from .store import Block, StoreInfo, open_store, read_block, read_ids
else:
    install(__name__, _EXPORTS)
