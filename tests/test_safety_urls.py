"""A store or model at a URL is checked node by node as a local one is (store/nodes.py): a
hostile ``zarr.json`` under it (a huge shape, a wrong data type, a chunk grid larger than its
array, nested brackets, a JSON list, unknown keys, more bytes than any holds) is refused when it
is opened, in one line naming the key, before zarr or numpy allocates anything. The same cases
run on a local copy: one implementation, one message.

URLs are served by an S3-compatible server on loopback with the real s3fs client.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest
from test_cli_errors import one_error_line

from ordnmf_dask import OrdNMF
from ordnmf_dask.errors import StoreError
from ordnmf_dask.store import locations
from ordnmf_dask.store.blocks import open_store, verify_store

pytest_plugins = ["tests.s3server"]

Doc = dict[str, Any]


def _shape(doc: Doc) -> Doc:
    return {**doc, "shape": [10**12, *doc["shape"][1:]]}


def _chunks(doc: Doc) -> Doc:
    grid = {"name": "regular", "configuration": {"chunk_shape": [10**9] * len(doc["shape"])}}
    return {**doc, "chunk_grid": grid}


NESTED = b"[" * 2000 + b"]" * 2000  # past the JSON parser's depth, within 4096 bytes
CHANGES: dict[str, Callable[[Doc], Doc | bytes]] = {
    "shape": _shape,
    "dtype": lambda d: {**d, "data_type": "float32"},
    "chunks": _chunks,
    "list": lambda d: b"[1, 2]",
    "nested": lambda d: NESTED,
    "keys": lambda d: {**d, "shape": [3], "data_type": "int64"},  # a group given an array's
    # a group's node made an array's (zarr 3.0 writes a group's consolidated_metadata key,
    # which an array may not hold: dropped, so that every version is refused for the type)
    "array": lambda d: {
        **{k: v for k, v in d.items() if k != "consolidated_metadata"},
        "node_type": "array",
    },
    "oversize": lambda d: {**d, "attributes": {"pad": "x" * 5000}},
}

# (what, node, change, what the one line says of the key)
CASES = [
    ("store", "", "list", "not zarr metadata (a JSON list)"),
    ("store", "", "nested", "not zarr metadata (not JSON"),
    ("store", "", "array", "an array where the store's root group is"),
    ("store", "", "oversize", "bytes of zarr metadata in the store"),
    ("store", "train", "keys", "zarr metadata of a group with keys data_type, shape"),
    ("store", "users/ids", "dtype", "data type 'float32', not int64 or string"),
    ("store", "users/ids", "nested", "not zarr metadata (not JSON"),
    ("store", "items/ids", "chunks", "chunk grid"),
    ("store", "train/offsets", "shape", "shape [1000000000000], but the store's header"),
    ("store", "train/cols", "dtype", "data type 'float32', not int32"),
    ("store", "test/y", "oversize", "bytes of zarr metadata in the store"),
    ("model", "", "nested", "not zarr metadata (not JSON"),
    ("model", "W", "list", "not zarr metadata (a JSON list)"),
    ("model", "W/0/mean", "shape", "shape [1000000000000, 2], but the model's header"),
    ("model", "H/1/geo", "dtype", "data type 'float32', not float64"),
    ("model", "users/ids", "chunks", "chunk grid"),
    ("model", "seen/indptr/0", "oversize", "bytes of zarr metadata in the model"),
]


@pytest.fixture
def s3conf(s3, monkeypatch):
    """``s3``, with fsspec's configuration pointing s3:// at it in this process."""
    monkeypatch.setitem(fsspec.config.conf, "s3", dict(s3.storage_options))
    return s3


def _place(source: Path, where: str, tmp_path: Path, s3) -> tuple[str, Callable]:
    """A copy of the store or model ``source`` locally or in the bucket, and a function
    writing the bytes of one of its keys."""
    if where == "local":
        copy = tmp_path / source.name
        shutil.copytree(source, copy)

        def write(key: str, data: bytes) -> None:
            (copy / key).write_bytes(data)

        return str(copy), write
    url = s3.url(source.name)
    s3.fs.put(str(source), url, recursive=True)
    s3.fs.invalidate_cache()
    return url, lambda key, data: s3.fs.pipe_file(f"{url}/{key}", data)


@pytest.mark.parametrize("where", ["local", "url"])
@pytest.mark.parametrize(("what", "node", "change", "reason"), CASES)
def test_a_hostile_zarr_json_is_refused_naming_its_key(
    small_fitted, s3conf, tmp_path, capsys, monkeypatch, where, what, node, change, reason
):
    monkeypatch.setattr(locations, "META_BYTES", 4096)  # "oversize": over it, far below 64 MiB
    source = small_fitted[0] if what == "store" else small_fitted[1]
    root, write = _place(source, where, tmp_path, s3conf)
    key = f"{node}/zarr.json".lstrip("/")
    doc = json.loads((source / key).read_bytes())
    changed = CHANGES[change](doc)
    write(key, changed if isinstance(changed, bytes) else json.dumps(changed).encode())
    file = locations.join(root, key)
    code, line = one_error_line(capsys, ["info", root])
    assert code == 2 and f"{file}: " in line and reason in line, line
    opener = open_store if what == "store" else OrdNMF.load
    with pytest.raises(StoreError, match=f"^{file}: "):
        opener(root)


@pytest.mark.parametrize("where", ["local", "url"])
def test_a_chunk_file_larger_than_recorded_is_refused_without_reading_it_whole(
    small_fitted, s3conf, tmp_path, where
):
    """At a URL, a chunk is fetched with one ranged request for one byte more than its
    inventory records: a chunk file replaced by a huge one is refused as larger, not read."""
    root, write = _place(small_fitted[0], where, tmp_path, s3conf)
    write("train/raw/c/0", b"\0" * 100_000)
    with pytest.raises(StoreError, match=r"train/raw/c/0: chunk file has (more than )?\d+ bytes"):
        verify_store(root)
