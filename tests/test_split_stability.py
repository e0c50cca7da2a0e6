"""The random split is a function of each pair's raw ids and the seed only: a pair present in two
periods of growing data lands in the same subset (test, validation, train) in both, whichever
ingest pipeline, file format, file order or partitioning; and the subsets' sizes stay close to
the requested fractions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ordnmf_dask.sources.ingest import ingest, ingest_distributed
from ordnmf_dask.sources.split import id_hashes, pair_hash, split_rule
from ordnmf_dask.store.blocks import open_store, read_block, read_ids

SPLITS = ("train", "test", "validation")
OPTIONS = dict(ratings="integer", scale_max=5, test_fraction=0.3, validation_fraction=0.25)


def subsets(path) -> dict[tuple[str, str], str]:
    """The subset of every (raw user, raw item) pair of a store, raw ids as text."""
    info = open_store(path)
    users = [str(x) for x in read_ids(path, "users")]
    items = [str(x) for x in read_ids(path, "items")]
    out = {}
    for split in SPLITS:
        for r in range(info.grid[0]):
            for c in range(info.grid[1]):
                b = read_block(path, split, r, c)
                rows = np.repeat(np.arange(len(b.indptr) - 1), np.diff(b.indptr))
                for u, i in zip(
                    rows + info.row_bounds[r], b.cols + info.col_bounds[c], strict=True
                ):
                    out[users[u], items[i]] = split
    return out


def period(rng: np.random.Generator, users: np.ndarray, items: np.ndarray, n: int):
    """``n`` distinct random (user, item, value) rows over the given raw ids."""
    keys = rng.choice(len(users) * len(items), size=n, replace=False)
    u, i = np.divmod(keys, len(items))
    return list(
        zip(users[u].tolist(), items[i].tolist(), rng.integers(1, 6, n).tolist(), strict=True)
    )


def write_files(rows: list, directory, n_files: int, fmt: str) -> list:
    """``rows`` cut into ``n_files`` files of format ``fmt`` ("csv" or "parquet")."""
    directory.mkdir()
    paths = []
    for k, part in enumerate(np.array_split(np.arange(len(rows)), n_files)):
        chunk = [rows[j] for j in part]
        if fmt == "csv":
            path = directory / f"part-{k}.csv"
            path.write_text("".join(f"{u},{i},{v}\n" for u, i, v in chunk))
        else:
            path = directory / f"part-{k}.parquet"
            cols = list(zip(*chunk, strict=True))
            pq.write_table(
                pa.table(
                    {
                        "u": pa.array([str(x) for x in cols[0]]),
                        "i": pa.array([str(x) for x in cols[1]]),
                        "v": pa.array(cols[2], pa.float64()),
                    }
                ),
                path,
            )
        paths.append(path)
    return paths


def test_pairs_keep_their_subset_when_data_grow(tmp_path):
    """Random growth: new users and items (among them ids that turn an integer id axis into a
    string one), new pairs of known users and items; the grown data shuffled and cut into
    other files, read in memory and distributed. Every pair of period 1 is in the same subset
    in every store of period 2."""
    for case in range(4):
        rng = np.random.default_rng(case)
        base = tmp_path / f"case{case}"
        base.mkdir()
        users = np.array([int(x) for x in rng.choice(10**6, 40, replace=False)], dtype=object)
        items = np.array([f"it-{x}" for x in rng.choice(10**6, 30, replace=False)], dtype=object)
        first = period(rng, users, items, 500)
        new_users = np.array(
            [str(x) for x in rng.choice(10**6, 15, replace=False) + 10**6]
            + (["user-x"] if case % 2 else []),
            dtype=object,
        )
        new_items = np.array([f"it-new-{x}" for x in range(10 + case)], dtype=object)
        all_users = np.concatenate([users, new_users])
        all_items = np.concatenate([items, new_items])
        seen = {(u, i) for u, i, _ in first}
        extra = [r for r in period(rng, all_users, all_items, 700) if (r[0], r[1]) not in seen]
        grown = first + extra
        grown = [grown[j] for j in rng.permutation(len(grown))]
        kw = dict(OPTIONS, seed=case + 1)
        one = write_files(first, base / "p1", 1, "csv")
        two = write_files(grown, base / "p2", 2 + case, "parquet" if case % 2 else "csv")
        ingest(one, base / "p1.zarr", **kw)
        ingest(two, base / "p2-mem.zarr", **kw)
        ingest_distributed(two, base / "p2-ooc.zarr", chunk_bytes=900, rows_per_partition=150, **kw)
        before = subsets(base / "p1.zarr")
        assert len(before) == len(first) and set(before.values()) == set(SPLITS)
        key = {(str(u), str(i)) for u, i, _ in first}
        for store in ("p2-mem.zarr", "p2-ooc.zarr"):
            after = subsets(base / store)
            assert len(after) == len(grown)
            moved = [p for p in key if after[p] != before[p]]
            assert not moved, f"case {case}, {store}: {len(moved)} pairs changed subset"


def test_id_hash_is_fnv1a_of_the_canonical_text_then_splitmix():
    """The same raw id hashes alike as int64, str or staged ASCII bytes (so an id axis that
    turns from int to str keeps its hashes); the bytes are hashed as FNV-1a 64 of UTF-8."""

    def reference(text: str) -> int:
        h = 0xCBF29CE484222325
        for byte in text.encode("utf-8"):
            h = ((h ^ byte) * 0x100000001B3) % 2**64
        h ^= h >> 30
        h = (h * 0xBF58476D1CE4E5B9) % 2**64
        h ^= h >> 27
        h = (h * 0x94D049BB133111EB) % 2**64
        return h ^ (h >> 31)

    ints = np.array([0, 7, -12, 2**62, 123456789], dtype=np.int64)
    text = np.array(["0", "7", "-12", str(2**62), "123456789"])
    np.testing.assert_array_equal(id_hashes(ints), id_hashes(text))
    np.testing.assert_array_equal(id_hashes(ints), id_hashes(text.astype("S")))
    words = np.array(["é日本", "a", "user 42", "\U0001f600x", "a" * 70])
    assert id_hashes(words).tolist() == [reference(w) for w in words]
    ascii_words = words[[1, 2, 4]]  # all ASCII: hashed from the fixed-width array directly
    assert id_hashes(ascii_words).tolist() == [reference(w) for w in ascii_words]
    assert id_hashes(np.array(["007"]))[0] != id_hashes(np.array([7]))[0]


def test_fractions_are_close_to_the_requested_ones_on_large_n():
    """About (not exactly) test_fraction of the pairs are test, and validation_fraction of the
    rest validation: within 4 binomial standard deviations on a million pairs; other seeds
    draw other sets."""
    rng = np.random.default_rng(5)
    n = 1_000_000
    hu = id_hashes(rng.integers(0, 10**9, n))
    hi = id_hashes(np.char.add("item-", rng.integers(0, 10**6, n).astype(str)))
    rule = split_rule(0.2, 0.1)
    is_test, is_val = rule.masks(pair_hash(hu, hi, 3))
    assert not (is_test & is_val).any()
    assert abs(is_test.sum() - 0.2 * n) < 4 * np.sqrt(0.2 * 0.8 * n)
    rest = n - int(is_test.sum())
    assert abs(is_val.sum() - 0.1 * rest) < 4 * np.sqrt(0.1 * 0.9 * rest)
    other, _ = rule.masks(pair_hash(hu, hi, 4))
    assert abs((other & is_test).sum() - 0.04 * n) < 4 * np.sqrt(0.04 * 0.96 * n)


def test_stores_keep_the_fraction_on_large_n(tmp_path):
    """The ingest's test set is about test_fraction of the nonzeros."""
    rng = np.random.default_rng(2)
    keys = np.unique(rng.integers(0, 2000 * 500, 60_000))
    u, i = np.divmod(keys, 500)
    info = ingest((u, i, np.ones(len(u))), tmp_path / "s", test_fraction=0.25, seed=9)
    n = info.nnz_train + info.nnz_test
    assert n == len(keys)
    assert abs(info.nnz_test - 0.25 * n) < 4 * np.sqrt(0.25 * 0.75 * n)
