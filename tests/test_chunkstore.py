"""Factor chunks on disk: what is written, and chunks written by earlier versions."""

from __future__ import annotations

import numpy as np
import zarr

from ordnmf_dask.engine import chunkstore
from ordnmf_dask.model.updates import FactorChunk


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
        assert names == ({"mean", "geo", "shape", "prior_rate"}
                         | ({"log_mean", "rate"} if derived else set()))  # fmt: skip
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
        group.create_array(field, data=arr, chunks=arr.shape)  # default: zstd
    group.attrs["elbo"] = chunk.elbo
    assert group["mean"].compressors != ()
    back = chunkstore.load_chunk(root, "H", 2)
    for field in ("mean", "geo", "shape", "prior_rate"):
        np.testing.assert_array_equal(getattr(back, field), getattr(chunk, field))
