"""A fitted model on disk: one zarr group, factors chunked by block, arrays and JSON only.

Layout::

    MODEL/            attrs: format_version, complete, params, delta, theta, elbo, n_iter,
                      converged, store (path, n_users, n_items, n_classes), row_bounds, col_bounds
      W/<r>/          mean, log_mean, shape, rate, prior_rate   (rows of user-block r, (n_r, K))
      H/<c>/          same for item-block c

Written to ``MODEL.tmp-<id>`` by the workers (each chunk where it lives), then renamed: a model
directory is complete or absent.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import zarr
from distributed import Client, Future, wait

from .engine import chunkstore
from .io.errors import StoreError

MODEL_FORMAT = 1


def save_model(
    client: Client, w: list[Future], h: list[Future], path: str, attrs: dict[str, Any],
    overwrite: bool = False,
) -> str:
    """Write the factor chunks (on the workers) and ``attrs`` to ``path``, atomically."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        root = zarr.open_group(tmp, mode="w")
        root.create_group("W")
        root.create_group("H")
        written = [client.submit(chunkstore.save_chunk, f, tmp, "W", r) for r, f in enumerate(w)]
        written += [client.submit(chunkstore.save_chunk, f, tmp, "H", c) for c, f in enumerate(h)]
        wait(written)
        for f in written:
            f.result()  # re-raise a worker's write error here
        root.attrs.update({**attrs, "format_version": MODEL_FORMAT, "complete": True})
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


@dataclass(frozen=True)
class ModelInfo:
    """A complete model directory: its attributes and lazy access to its factors."""

    path: str
    attrs: dict[str, Any]

    @property
    def n_blocks(self) -> tuple[int, int]:
        return len(self.attrs["row_bounds"]) - 1, len(self.attrs["col_bounds"]) - 1

    def factor(self, name: str, field: str = "mean") -> da.Array:
        """``name`` in {"W", "H"}: a dask array (n, K) chunked by block, read lazily."""
        n = self.n_blocks[0 if name == "W" else 1]
        parts = [da.from_zarr(f"{self.path}/{name}/{j}/{field}") for j in range(n)]
        return da.concatenate(parts, axis=0)

    @property
    def delta(self) -> np.ndarray:
        return np.asarray(self.attrs["delta"], dtype=np.float64)


def open_model(path: str) -> ModelInfo:
    """Open a model written by :func:`save_model`; StoreError if absent, incomplete or newer."""
    path = os.path.abspath(path)
    try:
        attrs = dict(zarr.open_group(path, mode="r").attrs)
    except Exception as exc:  # noqa: BLE001 - any failure to open is reported the same way
        raise StoreError(f"{path}: not a readable ordnmf_dask model ({exc})") from exc
    if attrs.get("complete") is not True:
        raise StoreError(f"{path}: model is incomplete (no completion mark)")
    version = attrs.get("format_version")
    if not isinstance(version, int) or version > MODEL_FORMAT:
        raise StoreError(
            f"{path}: written by a newer ordnmf_dask model format {version}; "
            f"this version reads <= {MODEL_FORMAT}"
        )
    return ModelInfo(path, attrs)
