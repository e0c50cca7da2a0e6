"""Out-of-core ingest: identical stores to the in-memory ingest, chunked split, errors."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from conftest import SHARED_DATA as DATA

from ordnmf_dask.dist.runner import Runner
from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.distributed import ingest_distributed
from ordnmf_dask.sources.distributed_tasks import union_ids
from ordnmf_dask.sources.inmemory import ingest
from ordnmf_dask.sources.split import pair_hash, random_test_mask
from ordnmf_dask.sources.text import line_numbers

ML = DATA / "ml-latest-small" / "ratings.csv"
LASTFM = DATA / "hetrec2011-lastfm-2k" / "user_artists.dat"
TPS = DATA / "tasteprofile-gouvert-subset" / "derived" / "tps_98765_U1502_I786_triplets.txt"
ARRAYS = ["row_bounds", "col_bounds", "users/ids", "items/ids"] + [
    f"{s}/{f}" for s in ("train", "test") for f in ("indptr", "cols", "y", "raw", "offsets")
]


def assert_same_store(a, b, ignore=("created",)) -> None:
    """Same attributes (but ``ignore``), and the same arrays (dtype, shape, chunks, values)."""
    ga, gb = zarr.open_group(a, mode="r"), zarr.open_group(b, mode="r")
    attrs_a, attrs_b = dict(ga.attrs), dict(gb.attrs)
    for key in ignore:
        attrs_a.pop(key)
        attrs_b.pop(key)
    assert attrs_a == attrs_b
    for name in ARRAYS:
        x, y = ga[name], gb[name]
        assert (x.dtype, x.shape, x.chunks) == (y.dtype, y.shape, y.chunks), name
        np.testing.assert_array_equal(x[:], y[:], err_msg=name)


def both(tmp_path, inputs, client=None, chunk_bytes=200_000, rows_per_partition=15_000, **kw):
    ingest(inputs, tmp_path / "mem", **kw)
    ingest_distributed(inputs, tmp_path / "ooc", client=client, chunk_bytes=chunk_bytes,
                       rows_per_partition=rows_per_partition, **kw)  # fmt: skip
    assert_same_store(tmp_path / "mem", tmp_path / "ooc")


@pytest.mark.data
def test_movielens_on_cluster(tmp_path, client):
    both(tmp_path, ML, client, ratings="halfstar", min_count=20, nnz_per_block=10_000, seed=3)


@pytest.mark.data
def test_lastfm_stable_filter(tmp_path):
    both(tmp_path, LASTFM, counts="paper", min_count=5, filter_mode="stable")


@pytest.mark.data
def test_tasteprofile_counts(tmp_path):
    both(tmp_path, TPS, counts="paper", nnz_per_block=6000, chunk_bytes=65_536)


def write_parts(tmp_path, seed: int, n_files: int = 3, dup: bool = False):
    """Several CSV/TSV files of random (user, item, value) rows; string or padded ids."""
    rng = np.random.default_rng(seed)
    users = np.array([f"u{k:03d}" for k in range(60)] + ["007", "7"])
    paths = []
    for f in range(n_files):
        n = 400
        uu, ii = rng.choice(users, n), rng.integers(0, 50, n)
        vv = rng.integers(1, 6, n)
        if not dup:
            keep = np.unique(np.char.add(uu, ii.astype(str)), return_index=True)[1]
            uu, ii, vv = uu[keep], ii[keep], vv[keep]
        sep = "\t" if f % 2 else ","
        lines = ["user,item,value" if sep == "," else "", "  "]
        lines += [f"{u}{sep}{i}{sep}{v}" for u, i, v in zip(uu, ii, vv, strict=True)]
        path = tmp_path / f"part{f}.txt"
        path.write_text("\r\n".join(lines) + "\r\n")
        paths.append(path)
    return paths


@pytest.mark.parametrize("policy", ["sum", "max", "last"])
def test_multifile_duplicates(tmp_path, policy):
    paths = write_parts(tmp_path, 1, dup=True)
    both(tmp_path, paths, chunk_bytes=700, rows_per_partition=97, counts=[0, 2, 4, 6, 9],
         duplicates=policy, min_count=3, grid=(3, 2), seed=5)  # fmt: skip


def test_multifile_int_ids_and_binarize(tmp_path):
    rng = np.random.default_rng(2)
    paths = []
    for f in range(4):
        rows = {(int(u), int(i)): int(v) for u, i, v in rng.integers(1, 90, (300, 3))}
        path = tmp_path / f"f{f}.csv"
        path.write_text("".join(f"{u},{i + 1000 * f},{v}\n" for (u, i), v in rows.items()))
        paths.append(path)
    both(tmp_path, paths, chunk_bytes=333, rows_per_partition=50, binarize=40, nnz_per_block=50)


def test_errors_name_file_and_line(tmp_path):
    paths = write_parts(tmp_path, 3)
    text = paths[1].read_bytes().decode().split("\r\n")
    text[40] = "u001\t3\tfive"
    paths[1].write_text("\r\n".join(text))
    with pytest.raises(InputError, match=r"part1\.txt, line 41: value 'five' is not a number"):
        ingest_distributed(paths, tmp_path / "x", chunk_bytes=500)
    assert not list(tmp_path.glob("x*"))
    (tmp_path / "d").mkdir()
    dup = write_parts(tmp_path / "d", 4, dup=True)
    with pytest.raises(InputError) as mem:
        ingest(dup, tmp_path / "y")
    with pytest.raises(InputError) as ooc:
        ingest_distributed(dup, tmp_path / "y", chunk_bytes=500, rows_per_partition=100)
    assert str(ooc.value) == str(mem.value) and "duplicate" in str(mem.value)
    assert not list(tmp_path.glob("y*"))


def test_hash_split_is_exact_and_order_free():
    rng = np.random.default_rng(0)
    u, i = np.nonzero(rng.random((300, 200)) < 0.1)
    mask = random_test_mask(u, i, 200, 0.2, seed=4)
    assert mask.sum() == round(0.2 * len(u))
    perm = rng.permutation(len(u))
    np.testing.assert_array_equal(random_test_mask(u[perm], i[perm], 200, 0.2, 4), mask[perm])
    assert not np.array_equal(random_test_mask(u, i, 200, 0.2, 5), mask)
    h = pair_hash(u, i, 200, 4)
    assert len(np.unique(h)) == len(h)
    top = (h >> np.uint64(60)).astype(int)  # roughly uniform bins
    counts = np.bincount(top, minlength=16)
    assert counts.min() > 0.6 * len(h) / 16


def test_union_of_sorted_id_runs():
    a, b = np.array([3, 7, 40]), np.array([7, 8, 300])
    np.testing.assert_array_equal(union_ids(a, b), [3, 7, 8, 40, 300])
    mixed = union_ids(a, np.array(["007", "40", "u1"]))
    np.testing.assert_array_equal(mixed, ["007", "3", "40", "7", "u1"])
    assert mixed.dtype == np.dtype("<U3")  # as wide as the longest id, not as any int64


def test_line_numbers_skip_blank_lines():
    rng = np.random.default_rng(1)
    for _ in range(300):
        data = b"".join(rng.choice([b"a", b" ", b"\n", b"\r", b"\t"], int(rng.integers(1, 12))))
        starts = [0] + [k + 1 for k, c in enumerate(data) if c == 10]
        lines = data.split(b"\n")
        expect = [n + 5 for n, (s, line) in enumerate(zip(starts, lines, strict=True))
                  if s < len(data) and line.strip(b" \t\r\x0b\x0c")]  # fmt: skip
        np.testing.assert_array_equal(line_numbers(data, 5), expect, err_msg=repr(data))


def test_map_reduce_combines_each_pair_as_soon_as_it_is_done():
    calls = []

    def leaf(x: int) -> list[int]:
        calls.append(f"leaf {x}")
        return [x]

    def combine(a: list[int], b: list[int]) -> list[int]:
        calls.append("combine")
        return a + b

    assert Runner().map_reduce(leaf, [0, 1, 2, 3, 4], combine) == [0, 1, 2, 3, 4]
    assert calls == ["leaf 0", "leaf 1", "combine", "leaf 2", "leaf 3", "leaf 4", "combine",
                     "combine", "combine"]  # fmt: skip
