"""Missing or damaged chunk files of a store are errors naming the file, never zeros.

Every writer (``write_store``, the distributed assembly of ``synth`` and the out-of-core ingest)
writes every chunk file and records its size and CRC-32; ``open_store``, the block and id
readers, and the CLI (on the client or in a Dask worker) refuse a store whose files do not match.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr

from ordnmf_dask.app.cli import main
from ordnmf_dask.datasets.synth import synth
from ordnmf_dask.errors import StoreError
from ordnmf_dask.sources.ingest import ingest_arrays, ingest_distributed
from ordnmf_dask.store.blocks import AXES, SPLITS, open_store, read_block, read_ids
from ordnmf_dask.store.decode import ChunkFiles, chunk_path

ARRAYS = ["row_bounds", "col_bounds", "users/ids", "items/ids"] + [
    f"{s}/{f}" for s in SPLITS for f in ("indptr", "cols", "y", "raw", "offsets")
]


def _triples(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    u, i = np.nonzero(rng.random((50, 40)) < 0.3)
    return u * 10, i, rng.integers(1, 6, len(u))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> str:
    """A store of 2 x 2 blocks with a train and a test split."""
    return ingest_arrays(
        *_triples(), tmp_path_factory.mktemp("h") / "s.zarr", grid=(2, 2), counts="paper"
    ).path


def _damaged(healthy: str, tmp_path: Path, array: str, damage: str) -> tuple[str, str]:
    """A copy of ``healthy`` with chunk 0 of ``array`` damaged; (store, damaged file)."""
    store = str(tmp_path / "s.zarr")
    shutil.copytree(healthy, store)
    path = chunk_path(os.path.join(store, array), 0)
    data = bytearray(Path(path).read_bytes())
    if damage == "remove":
        os.remove(path)
    elif damage == "truncate":
        Path(path).write_bytes(data[:-5])
    else:  # flip the bits of one byte of the compressed payload, keeping the size
        data[len(data) - 3] ^= 0xFF
        Path(path).write_bytes(data)
    return store, path


def _read_everything(store: str) -> None:
    """Every API read: metadata, every block of both splits with every field, the ids."""
    info = open_store(store)
    for split in SPLITS:
        for r in range(info.grid[0]):
            for c in range(info.grid[1]):
                read_block(store, split, r, c, values=("y", "raw"))
    for axis in AXES:
        read_ids(store, axis)


@pytest.mark.parametrize("damage", ["remove", "truncate", "flip"])
@pytest.mark.parametrize(
    "array", ["train/indptr", "train/cols", "train/y", "train/offsets", "test/raw", "users/ids"]
)
def test_damaged_chunk_is_named_by_every_reader(healthy, tmp_path, array, damage):
    store, path = _damaged(healthy, tmp_path, array, damage)
    with pytest.raises(StoreError, match="chunk file") as err:
        _read_everything(store)
    assert path in str(err.value) and "damaged" in str(err.value)
    if damage != "flip" or array == "train/offsets":  # a stat, or offsets read at open
        with pytest.raises(StoreError, match="chunk file") as err:
            open_store(store)
        assert path in str(err.value)


def test_healthy_store_reads_what_was_written(healthy):
    """Blocks read with and without reused buffers are zarr's own decoding of the arrays, and
    together hold exactly the ingested triples."""
    info = open_store(healthy)
    group = zarr.open_group(healthy, mode="r")
    users, items = read_ids(healthy, "users"), read_ids(healthy, "items")
    got = []
    for split in SPLITS:
        offsets, pointers = group[f"{split}/offsets"][:], group[f"{split}/indptr"][:]
        start = 0
        for r in range(2):
            for c in range(2):
                lo, hi = (int(x) for x in offsets[2 * r + c : 2 * r + c + 2])
                n_rows = info.block_shape(r, c)[0]
                for reuse in (False, True):
                    block = read_block(healthy, split, r, c, reuse=reuse)
                    np.testing.assert_array_equal(
                        block.indptr, pointers[start : start + n_rows + 1]
                    )
                    for name in ("cols", "y", "raw"):
                        np.testing.assert_array_equal(
                            getattr(block, name), group[f"{split}/{name}"][lo:hi]
                        )
                got += zip(
                    users[info.row_bounds[r] + block.rows],
                    items[info.col_bounds[c] + block.cols],
                    block.raw,
                    strict=True,
                )
                start += n_rows + 1
    assert sorted(got) == sorted(zip(*_triples(), strict=True))


def _assert_every_chunk_listed(store: str) -> None:
    group = zarr.open_group(store, mode="r")
    for name in ARRAYS:
        files = ChunkFiles.of(group[name], os.path.join(store, name))
        assert len(files.nbytes) == group[name].nchunks
        files.verify()
        written = os.path.join(store, name, "c")
        on_disk = sorted(os.listdir(written)) if os.path.isdir(written) else []
        assert on_disk == sorted(str(i) for i in range(group[name].nchunks)), name


def test_every_writer_writes_and_lists_every_chunk(tmp_path):
    """write_store, synth (distributed assembly) and the out-of-core ingest. With no test
    split, test/indptr holds only zeros: its chunk file is written and listed all the same,
    and losing it is an error."""
    u, i, v = _triples(3)
    mem = ingest_arrays(u, i, v, tmp_path / "mem", test_fraction=0.0, counts="paper")
    csv = tmp_path / "r.csv"
    csv.write_text("".join(f"{a},{b},{c}\n" for a, b, c in zip(u, i, v, strict=True)))
    ooc = ingest_distributed(csv, tmp_path / "ooc", counts="paper")
    syn = synth(tmp_path / "syn", 60, 50, 800, 2, seed=1)
    for info in (mem, ooc, syn):
        _assert_every_chunk_listed(info.path)
    zeros = chunk_path(os.path.join(mem.path, "test", "indptr"), 0)
    assert mem.nnz_test == 0 and os.path.exists(zeros)
    os.remove(zeros)
    with pytest.raises(StoreError, match=f"{zeros}: chunk file missing"):
        open_store(mem.path)


def test_store_without_inventory_is_refused(healthy, tmp_path):
    """A store written before chunk inventories existed: its absent chunk files could be empty
    chunks or lost ones, so it is refused with what to do."""
    store = str(tmp_path / "s.zarr")
    shutil.copytree(healthy, store)
    arr = zarr.open_array(os.path.join(store, "train", "cols"), mode="r+")
    arr.attrs.pop("chunk_files")
    with pytest.raises(StoreError, match="train/cols: no chunk inventory.*ordnmf-dask ingest"):
        open_store(store)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """``ordnmf-dask ARGS`` in this process (its exit code and output are the claims, not the
    process: twelve interpreters' start-ups saved), as a finished process."""
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def _error_line(r: subprocess.CompletedProcess) -> str:
    return r.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("array", "damage"),
    [("train/indptr", "remove"), ("train/y", "truncate"), ("train/offsets", "flip")],
)
def test_info_exits_2_naming_the_file(healthy, tmp_path, capsys, array, damage):
    store, path = _damaged(healthy, tmp_path, array, damage)
    r = run(capsys, "info", store)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1
    assert _error_line(r).startswith(f"ordnmf-dask info: error: {path}: chunk file")


def test_info_verify_passes_a_healthy_store(healthy, capsys):
    """(Once, not in each case below: the same command on the same store.)"""
    r = run(capsys, "info", "--verify", healthy)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("array", ["train/cols", "train/y", "test/raw", "items/ids"])
def test_info_verify_checks_every_checksum(healthy, tmp_path, capsys, array):
    """A changed byte of a large array passes the cheap checks of ``info`` (sizes) and is found
    by ``info --verify`` (every file's CRC-32), exit 2 naming it (a healthy store verifies: the
    test above)."""
    store, path = _damaged(healthy, tmp_path, array, "flip")
    assert run(capsys, "info", store).returncode == 0
    r = run(capsys, "info", "--verify", store)
    assert r.returncode == 2 and r.stdout == ""
    assert _error_line(r).startswith(f"ordnmf-dask info: error: {path}: chunk file")


def test_fit_on_a_damaged_store_exits_2_naming_the_file(healthy, tmp_path, capsys, cluster):
    """On a cluster of worker processes: a lost row-pointer chunk is found before the fit (it
    was read as zeros: a model of nothing), a changed class chunk by the worker that reads it
    (it gave a NaN ELBO); a healthy store fits, and its model is not taken for a store."""
    model = str(tmp_path / "m.zarr")
    on_cluster = ("-k", "2", "--max-iter", "2", "--scheduler", cluster.scheduler_address)
    ok = run(capsys, "fit", "--n-members", "1", healthy, "--out", model, *on_cluster)
    assert ok.returncode == 0, ok.stderr
    r = run(
        capsys,
        "fit",
        "--n-members",
        "1",
        model,
        "--out",
        str(tmp_path / "of-a-model.zarr"),
        *on_cluster,
    )
    assert r.returncode == 2 and _error_line(r) == (
        f"ordnmf-dask fit: error: {model}: is an ordnmf_dask model, not a store"
    )
    assert not os.path.exists(tmp_path / "of-a-model.zarr")
    for n, (array, damage) in enumerate([("train/indptr", "remove"), ("train/y", "flip")]):
        store, path = _damaged(healthy, tmp_path / str(n), array, damage)
        out = str(tmp_path / f"m{n}.zarr")
        r = run(capsys, "fit", "--n-members", "1", store, "--out", out, *on_cluster)
        assert r.returncode == 2, r.stderr
        assert _error_line(r).startswith(f"ordnmf-dask fit: error: {path}: chunk file")
        assert not os.path.exists(out)


@pytest.mark.parametrize("damage", ["remove", "truncate", "flip"])
def test_piecewise_id_reads_name_a_damaged_id_chunk(healthy, tmp_path, damage):
    """The post-fit commands read raw ids piecewise on the workers (store/idmap.py), not through
    open_store: a lost, cut or changed id chunk is an error there too, never empty or other
    ids."""
    from ordnmf_dask.store.idmap import find_in_slice, ids_at, ids_slice

    store, chunk = _damaged(healthy, tmp_path, "items/ids", damage)
    for read in (
        lambda: ids_slice(store, "items", 0, 3),
        lambda: ids_at(store, "items", np.array([2, 0, 2])),
        lambda: find_in_slice(store, "items", 1, 4, np.array([1, 2])),
    ):
        with pytest.raises(StoreError, match=chunk):
            read()


@pytest.mark.parametrize(
    ("key", "garbage", "reason"),
    [
        ("train/zarr.json", b"{garbage", "not zarr metadata (not JSON"),
        ("users/zarr.json", b"[]", "not zarr metadata (a JSON list)"),
        ("test/cols/zarr.json", b'{"zarr_format": 2}', "not zarr metadata of format 3"),
        ("train/zarr.json", None, "an array where the store has a group"),
    ],
)
def test_a_store_whose_zarr_metadata_is_garbage_is_refused_naming_the_file(
    healthy, tmp_path, capsys, key, garbage, reason
):
    """Every node's ``zarr.json`` of a store is read as zarr metadata when the store is opened
    (store/nodes.py), a group's that no reader reads included: exit 2 naming the file."""
    copy = Path(shutil.copytree(healthy, tmp_path / "s.zarr"))
    if garbage is None:  # an array's metadata where a group belongs
        garbage = (copy / "row_bounds" / "zarr.json").read_bytes()
    (copy / key).write_bytes(garbage)
    assert main(["info", str(copy)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"{copy / key}: {reason}" in line, line
    with pytest.raises(StoreError, match=str(copy / key)):
        open_store(str(copy))
