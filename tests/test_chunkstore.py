"""Factor chunks on disk: what is written, and chunks written by earlier versions."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

from ordnmf_dask.engine import checkpoint
from ordnmf_dask.errors import CheckpointError
from ordnmf_dask.model.updates import FactorChunk
from ordnmf_dask.modelstore import chunkstore
from ordnmf_dask.store import kinds


def _chunk(seed: int = 0) -> FactorChunk:
    rng = np.random.default_rng(seed)
    shape = rng.gamma(2.0, 1.0, (7, 3))
    mean = rng.gamma(1.0, 1.0, (7, 3))
    return FactorChunk(mean, mean * 0.8, shape, rng.random((7, 1)), elbo=-1.5)


def test_chunks_are_written_uncompressed_and_read_back_exactly(tmp_path):
    chunk = _chunk()
    for derived in (True, False):
        root = str(tmp_path / f"d{derived}")
        chunkstore.save_chunk(chunk, root, "W", 0, derived=derived)
        group = zarr.open_group(chunkstore.chunk_path(root, "W", 0), mode="r")
        names = set(group.array_keys())
        assert names == (
            {"mean", "geo", "shape", "prior_rate"} | ({"log_mean", "rate"} if derived else set())
        )
        assert all(group[n].compressors == () for n in names)
        back = chunkstore.load_chunk(root, "W", 0)
        for field in ("mean", "geo", "shape", "prior_rate"):
            np.testing.assert_array_equal(getattr(back, field), getattr(chunk, field))
        assert back.elbo == chunk.elbo


def test_compressed_chunks_of_earlier_versions_still_load(tmp_path):
    """Checkpoints and models written before chunks were stored uncompressed (zarr's default
    codec, derived arrays included) read back bit-exactly."""
    chunk, root = _chunk(1), str(tmp_path)
    group = zarr.open_group(chunkstore.chunk_path(root, "H", 2), mode="w")
    for field in ("mean", "geo", "shape", "prior_rate", "log_mean", "rate"):
        arr = np.ascontiguousarray(getattr(chunk, field))
        group.create_array(field, shape=arr.shape, dtype=arr.dtype, chunks=arr.shape)[...] = arr
    group.attrs["elbo"] = chunk.elbo
    assert group["mean"].compressors != ()
    back = chunkstore.load_chunk(root, "H", 2)
    for field in ("mean", "geo", "shape", "prior_rate"):
        np.testing.assert_array_equal(getattr(back, field), getattr(chunk, field))


def test_a_checkpoint_written_then_reloaded_in_a_fit_and_a_damaged_chunk(tmp_path, client):
    """start / finish / reload as a fit uses them: the chunks read back exactly, and a chunk
    damaged after the checkpoint was completed makes its future raise CheckpointError naming
    it (the fit stops there) instead of handing a wrong chunk to the next iteration."""
    chunks = {"W": [_chunk(0), _chunk(1)], "H": [_chunk(2)]}
    stats = {"SW": [np.full((7, 3), 2.0), np.ones((7, 3))], "SH": [np.arange(21.0).reshape(7, 3)]}
    groups = {name: client.scatter(values) for name, values in {**chunks, **stats}.items()}
    pending = checkpoint.start(client, str(tmp_path), 4, groups, "print")
    snap = checkpoint.Snapshot(4, [0.1], [-2.0], -2.0, [1.0], [1.0], [1.0])
    path, colsums = checkpoint.finish(pending, snap)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000004"]
    rows = {"W": [7, 7], "H": [7], "SW": [7, 7], "SH": [7]}
    back = checkpoint.reload(client, path, rows, colsums)
    np.testing.assert_array_equal(back["W"][1].result().mean, chunks["W"][1].mean)
    np.testing.assert_array_equal(back["SH"][0].result(), stats["SH"][0])
    damaged = tmp_path / "ckpt-00000004" / "W" / "1" / "mean" / "c" / "0" / "0"
    damaged.write_bytes(damaged.read_bytes()[:10])
    again = checkpoint.reload(client, path, rows, colsums)
    with pytest.raises(CheckpointError, match="W/1"):
        again["W"][1].result()
    np.testing.assert_array_equal(again["W"][0].result().geo, chunks["W"][0].geo)


def test_a_saved_model_records_the_versions_that_wrote_it(tmp_path, client):
    """Provenance: the package and the numerical libraries, as installed where it was saved."""
    import importlib.metadata

    from ordnmf_dask.modelstore.model import open_model, save_model
    from ordnmf_dask.modelstore.modelheader import PROVENANCE

    chunk = FactorChunk(mean=np.ones((3, 2)), geo=np.ones((3, 2)), elbo=0.0)
    w, h = client.scatter([chunk]), client.scatter([chunk])
    attrs = {  # the least a model header holds (ordnmf_dask/modelstore/modelheader.py)
        "params": {"n_components": 2},
        "elbo": [0.0],
        "delta": [0.0, 1.0],
        "store": {"path": None, "n_users": 3, "n_items": 3, "n_classes": 1},
        "row_bounds": [0, 3],
        "col_bounds": [0, 3],
    }
    path = save_model(client, w, h, str(tmp_path / "m.zarr"), attrs)
    recorded = open_model(path).attrs["versions"]
    assert set(recorded) == set(PROVENANCE) >= {"ordnmf-dask", "numpy", "dask", "zarr", "numba"}
    assert all(recorded[name] == importlib.metadata.version(name) for name in PROVENANCE)


@pytest.mark.parametrize("lost", ["array", "chunk file"])
def test_a_lost_model_file_is_an_error_naming_it_never_zeros(tmp_path, lost):
    """Every reader of factor chunks (fit state, evaluate, recommend, W_ / H_) names what is
    missing; zarr alone would read a missing chunk file as zeros."""
    import shutil

    from ordnmf_dask.errors import StoreError
    from ordnmf_dask.modelstore.model import ModelInfo

    chunk, root = _chunk(), str(tmp_path)
    chunkstore.save_chunk(chunk, root, "W", 0)
    n = chunk.mean.shape[0]
    header = {  # the least a model header holds (ordnmf_dask/modelstore/modelheader.py)
        "format_version": 2,
        "params": {"n_components": chunk.mean.shape[1]},
        "delta": [0.0, 1.0],
        "store": {"path": None, "n_users": n, "n_items": 1, "n_classes": 1},
        "row_bounds": [0, n],
        "col_bounds": [0, 1],
    }
    info = ModelInfo(root, header)
    lazy = info.factor("W", "mean")  # opened while whole
    mean = chunkstore.field_path(root, "W", 0, "mean")
    if lost == "array":
        shutil.rmtree(mean)
    else:
        for directory, _, names in os.walk(os.path.join(mean, "c")):
            for name in names:
                os.remove(os.path.join(directory, name))
    for read in (
        lambda: chunkstore.load_chunk(root, "W", 0),
        lambda: chunkstore.read_field(root, "W", 0, "mean"),
        lazy.compute,
    ):
        with pytest.raises(StoreError, match="W/0/mean"):
            read()


def _fake_checkpoint(directory, iteration: int, print_: str) -> str:
    """A checkpoint directory as start() makes it: root attributes first, then chunks."""
    path = os.path.join(directory, f"ckpt-{iteration:08d}")
    root = zarr.open_group(
        path, mode="w", attributes={"format": kinds.CHECKPOINT_FORMAT, "fingerprint": print_}
    )
    for name in checkpoint.GROUPS:
        root.create_group(name)
    chunkstore.save_chunk(_chunk(), path, "W", 0, derived=False)
    return path


def test_a_checkpoint_removal_cut_short_never_blocks_the_next_fit(tmp_path, monkeypatch):
    """The job can be killed while the rotation removes an old checkpoint: what is left is still
    recognisably this fit's (the root attributes go last) or an empty directory, and the
    resubmitted fit goes on (it used to refuse a half-removed look-alike)."""
    directory = str(tmp_path)
    kept = _fake_checkpoint(directory, 4, "abc")
    cut = _fake_checkpoint(directory, 2, "abc")
    real_remove = os.remove

    def killed_at_the_marker(path):
        if os.path.basename(path) == "zarr.json" and os.path.dirname(path) == cut:
            raise OSError("killed")
        real_remove(path)

    monkeypatch.setattr(os, "remove", killed_at_the_marker)
    with pytest.raises(OSError, match="killed"):
        checkpoint.remove(cut)
    monkeypatch.undo()
    assert os.listdir(cut) == ["zarr.json"] and kinds.fingerprint_of(cut) == "abc"
    assert checkpoint.claim(directory, ["abc"], restart=False) == [kept, cut]
    os.remove(os.path.join(cut, "zarr.json"))  # killed just before the final rmdir
    assert checkpoint.claim(directory, ["abc"], restart=False) == [kept]
    assert not os.path.exists(cut)
