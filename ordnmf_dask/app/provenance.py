"""What produced a model: the resolved job config, stored as a JSON attribute of the model."""

from __future__ import annotations

import os
from typing import Any

import zarr


def record_config(model_path: str | os.PathLike, resolved: dict[str, Any]) -> None:
    """Add ``resolved_config`` to the attributes of a saved model group (JSON only)."""
    group = zarr.open_group(os.fspath(model_path), mode="r+")
    group.attrs["resolved_config"] = resolved


def read_config(model_path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``resolved_config`` of a saved model, or None if it was fitted through the API."""
    config = zarr.open_group(os.fspath(model_path), mode="r").attrs.get("resolved_config")
    return None if config is None else dict(config)  # type: ignore[arg-type]
