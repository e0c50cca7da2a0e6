"""A store's blocks as the kernels' ``CsrBlock``: classes, raw values, or classes binarized."""

from __future__ import annotations

import numpy as np

from ordnmf_dask.model.kernels import CsrBlock
from ordnmf_dask.store.blocks import read_block


def load_block(
    path: str, split: str, r: int, c: int, values: str = "class", reuse: bool = False
) -> CsrBlock:
    """Read block (r, c) of ``split`` from the zarr store.

    ``values``: "class" (uint8 classes), "raw" (float64 raw values, e.g. play counts) or
    "ge:S" (classes binarized at S: nonzeros with class >= S become 1, the others are dropped).
    ``reuse``: see :func:`~ordnmf_dask.store.blocks.read_block` (valid until the thread's next
    reusing read).
    """
    kind = ("raw",) if values == "raw" else ("y",)
    b = read_block(path, split, r, c, values=kind, reuse=reuse)
    if values == "class":
        return CsrBlock(b.indptr, b.cols, b.classes, b.shape)
    if values == "raw":
        assert b.raw is not None  # read above
        return CsrBlock(b.indptr, b.cols, b.raw, b.shape)
    if values.startswith("ge:"):
        keep = np.asarray(b.classes >= int(values[3:]))
        ones = np.ones(int(keep.sum()), dtype=np.uint8)
        return CsrBlock.from_coo(b.rows[keep], b.cols[keep], ones, b.shape)
    raise ValueError(f"unknown block values {values!r}")
