"""Ingest round trips, the three shared datasets, value rules and filtering."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from conftest import LASTFM, ML, TPS, data_file

from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.ingest import ingest, ingest_arrays, ingest_distributed
from ordnmf_dask.sources.options import plan_ingest
from ordnmf_dask.sources.readers import read_triples
from ordnmf_dask.sources.split import id_hashes, pair_hash, split_rule
from ordnmf_dask.store.blocks import open_store, read_block, read_ids

ML_HIST = [1370, 2811, 1791, 7551, 5550, 20047, 13136, 26818, 8551, 13211]
LASTFM_HIST = [636, 419, 1001, 1405, 2349, 6270, 9885, 16998, 25744, 28127]
TPS_HIST = [34320, 11815, 11056, 4202, 1820, 673, 68, 16, 3, 0]


def store_triples(path, split: str) -> dict[tuple, tuple[int, float]]:
    """{(raw user, raw item): (y, raw)} rebuilt from every block of ``split``."""
    info = open_store(path)
    users, items = read_ids(path, "users"), read_ids(path, "items")
    out = {}
    n_r, n_c = info.grid
    for r in range(n_r):
        for c in range(n_c):
            b = read_block(path, split, r, c)
            u = b.rows.astype(np.int64) + info.row_bounds[r]
            i = b.cols.astype(np.int64) + info.col_bounds[c]
            keys = zip(users[u].tolist(), items[i].tolist(), strict=True)
            for key, y, raw in zip(keys, b.y, b.raw, strict=True):
                assert key not in out
                out[key] = (int(y), float(raw))
    return out


def random_data(seed: int, n_users: int = 40, n_items: int = 30, density: float = 0.4):
    rng = np.random.default_rng(seed)
    mask = rng.random((n_users, n_items)) < density
    u, i = np.nonzero(mask)
    perm = rng.permutation(len(u))
    users = (u[perm] * 7 + 3).astype(np.int64)  # int ids with gaps
    items = np.array([f"item-{k:03d}" for k in i[perm]])  # string ids
    values = rng.integers(1, 6, len(u)).astype(float)
    return users, items, values


def test_round_trip_random_split(tmp_path):
    users, items, values = random_data(0)
    out = tmp_path / "s.zarr"
    info = ingest_arrays(users, items, values, out, ratings="integer", grid=(3, 2), seed=7)
    assert info.grid == (3, 2)
    assert (info.n_users, info.n_items, info.n_classes) == (40, 30, 5)
    train, test = store_triples(out, "train"), store_triples(out, "test")
    expected = {
        (int(u), str(i)): (int(v), float(v)) for u, i, v in zip(users, items, values, strict=True)
    }
    assert {**train, **test} == expected
    assert not set(train) & set(test)
    # test: exactly the pairs whose seeded hash of their raw ids is below 0.2 * 2^64
    pu, pi = np.array([k[0] for k in expected]), np.array([k[1] for k in expected])
    h = pair_hash(id_hashes(pu), id_hashes(pi), 7)
    below = split_rule(0.2, 0).test_below
    assert set(test) == {k for k, x in zip(expected, h, strict=True) if x < below}
    assert (info.nnz_train, info.nnz_test) == (len(train), len(test))
    hist = np.bincount(values.astype(int), minlength=6)
    np.testing.assert_array_equal(info.hist_train + info.hist_test, hist)
    assert info.hist_train[0] == 0
    np.testing.assert_array_equal(read_ids(out, "users"), np.unique(users))
    np.testing.assert_array_equal(read_ids(out, "items"), np.unique(items))


def test_split_is_deterministic_per_seed(tmp_path):
    users, items, values = random_data(1)
    tests = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        ingest_arrays(users, items, values, tmp_path / name, seed=seed, grid=(2, 2))
        tests.append(set(store_triples(tmp_path / name, "test")))
    assert tests[0] == tests[1]
    assert tests[0] != tests[2]
    # Row order of the input does not change the split.
    perm = np.random.default_rng(0).permutation(len(users))
    ingest_arrays(users[perm], items[perm], values[perm], tmp_path / "d", seed=3, grid=(2, 2))
    assert set(store_triples(tmp_path / "d", "test")) == tests[0]


def test_blocks_sorted_and_in_range(tmp_path):
    users, items, values = random_data(2)
    info = ingest_arrays(users, items, values, tmp_path / "s", grid=(3, 4))
    for split in ("train", "test"):
        for r in range(3):
            for c in range(4):
                b = read_block(info.path, split, r, c)
                assert (b.rows.dtype, b.cols.dtype, b.y.dtype, b.raw.dtype) == (
                    np.int32,
                    np.int32,
                    np.uint8,
                    np.float64,
                )
                assert b.shape == info.block_shape(r, c)
                if b.nnz:
                    assert b.rows.min() >= 0 and b.rows.max() < b.shape[0]
                    assert b.cols.min() >= 0 and b.cols.max() < b.shape[1]
                    key = b.rows.astype(np.int64) * b.shape[1] + b.cols
                    assert np.all(np.diff(key) > 0)


def test_auto_grid_balanced(tmp_path):
    rng = np.random.default_rng(3)
    n_users, n_items, nnz = 3000, 2000, 40000
    pu = 1.0 / np.arange(1, n_users + 1) ** 0.7
    pi = 1.0 / np.arange(1, n_items + 1) ** 0.7
    u = rng.choice(n_users, nnz, p=pu / pu.sum())
    i = rng.choice(n_items, nnz, p=pi / pi.sum())
    key = np.unique(u * n_items + i)
    u, i = key // n_items, key % n_items
    info = ingest_arrays(u, i, np.ones(len(u)), tmp_path / "s", nnz_per_block=4000)
    side = round(np.sqrt(info.nnz_train / 4000))
    assert info.grid == (side, side)
    assert np.all(np.diff(info.row_bounds) > 0) and np.all(np.diff(info.col_bounds) > 0)
    assert info.row_bounds[-1] == info.n_users and info.col_bounds[-1] == info.n_items
    counts = np.zeros(info.grid, dtype=np.int64)
    for r in range(side):
        for c in range(side):
            counts[r, c] = read_block(info.path, "train", r, c).nnz
    assert counts.sum() == info.nnz_train
    for per_block in (counts.sum(axis=1), counts.sum(axis=0)):
        assert per_block.max() < 1.25 * per_block.mean()
        assert per_block.min() > 0.75 * per_block.mean()


def test_filter_paper_vs_stable(tmp_path):
    rows = [
        ("A", "x"),
        ("A", "y"),
        ("B", "x"),
        ("B", "z"),
        ("C", "y"),
        ("D", "p"),
        ("D", "q"),
        ("E", "p"),
        ("E", "q"),
    ]
    users, items = zip(*rows, strict=True)
    ones = np.ones(len(rows))
    common = dict(min_count=2, test_fraction=0.0)
    paper = ingest_arrays(users, items, ones, tmp_path / "p", filter_mode="paper", **common)
    stable = ingest_arrays(users, items, ones, tmp_path / "s", filter_mode="stable", **common)
    assert set(store_triples(paper.path, "train")) == {
        ("A", "x"),
        ("A", "y"),
        ("D", "p"),
        ("D", "q"),
        ("E", "p"),
        ("E", "q"),
    }
    assert set(store_triples(stable.path, "train")) == {
        ("D", "p"),
        ("D", "q"),
        ("E", "p"),
        ("E", "q"),
    }
    assert paper.attrs["filter_mode"] == "paper" and stable.attrs["rows_filtered"] == 5


@pytest.mark.data
def test_movielens_halfstar(tmp_path):
    ml = data_file(ML)
    info = ingest(ml, tmp_path / "ml", ratings="halfstar")
    assert (info.n_users, info.n_items, info.n_classes) == (610, 9724, 10)
    assert (info.hist_train + info.hist_test).tolist() == [0, *ML_HIST]
    assert info.attrs["value_kind"] == "ratings-halfstar"
    assert info.attrs["source"] == [str(ml)]
    assert read_ids(info.path, "users").dtype == np.int64
    raw = read_block(info.path, "train", 0, 0)
    np.testing.assert_array_equal(raw.y, (raw.raw * 2).astype(np.uint8))


@pytest.mark.data
def test_movielens_min_count(tmp_path):
    info = ingest(data_file(ML), tmp_path / "ml", ratings="halfstar", min_count=20)
    full = np.array(ML_HIST)
    hist = (info.hist_train + info.hist_test)[1:]
    assert np.all(hist <= full) and hist.sum() < full.sum()
    assert info.n_users < 610 and info.n_items < 9724
    deg_u = np.zeros(info.n_users, np.int64)
    n_r, n_c = info.grid
    for split, r, c in itertools.product(("train", "test"), range(n_r), range(n_c)):
        np.add.at(deg_u, read_block(info.path, split, r, c).rows + info.row_bounds[r], 1)
    assert deg_u.min() >= 20  # paper mode: users are filtered last


@pytest.mark.data
def test_movielens_binarize(tmp_path):
    info = ingest(data_file(ML), tmp_path / "ml", ratings="halfstar", binarize=8)
    assert info.n_classes == 1 and info.attrs["value_kind"] == "binary"
    assert info.nnz_train + info.nnz_test == sum(ML_HIST[7:])
    assert info.attrs["rows_not_interaction"] == sum(ML_HIST[:7])
    block = read_block(info.path, "train", 0, 0)
    assert set(np.unique(block.y)) == {1} and block.raw.min() >= 4.0


@pytest.mark.data
def test_lastfm_counts_paper(tmp_path):
    info = ingest(data_file(LASTFM), tmp_path / "lfm", counts="paper")
    assert (info.n_users, info.n_items) == (1892, 17632)
    assert (info.hist_train + info.hist_test).tolist() == [0, *LASTFM_HIST]
    assert info.attrs["thresholds"] == [0, 1, 2, 5, 10, 20, 50, 100, 200, 500]


@pytest.mark.data
def test_tasteprofile_counts_paper(tmp_path):
    info = ingest(data_file(TPS), tmp_path / "tps", counts="paper", nnz_per_block=6000)
    assert (info.n_users, info.n_items) == (1502, 786)
    assert (info.hist_train + info.hist_test).tolist() == [0, *TPS_HIST]
    assert info.grid == (3, 3)
    users = read_ids(info.path, "users")
    assert users.dtype.kind == "U" and len(users[0]) == 40 and np.all(users[:-1] < users[1:])


@pytest.mark.data
@pytest.mark.parametrize("path", [ML, LASTFM, TPS])
def test_real_files_parse_to_their_rows(path):
    """Each real file reads to the row count its publisher lists (speed: bench/ingest.py)."""
    rows = {ML: 100836, LASTFM: 92834, TPS: 63973}[path]
    assert len(read_triples(data_file(path))) == rows


def test_text_formats(tmp_path):
    rows = [("1", "10", "3"), ("1", "11", "4"), ("2", "10", "5")]
    variants = {
        "a.csv": ("userId,movieId,rating,ts\r\n", ",", "\r\n"),
        "b.dat": ("", "::", "\n"),
        "c.tsv": ("u\ti\tv\n", "\t", "\n"),
        "d.txt": ("", "  ", "\n"),
    }
    for name, (head, sep, eol) in variants.items():
        text = head + "".join(sep.join([*r, "999"]) + eol for r in rows) + eol
        (tmp_path / name).write_text(text, newline="")
        info = ingest(tmp_path / name, tmp_path / f"{name}.zarr", test_fraction=0.0)
        got = store_triples(info.path, "train")
        assert got == {(1, 10): (3, 3.0), (1, 11): (4, 4.0), (2, 10): (5, 5.0)}, name


def test_columns_header_and_multiple_files(tmp_path):
    (tmp_path / "a.csv").write_text("5,a,u1\n7,b,u2\n")
    (tmp_path / "b.csv").write_text("h1,h2,h3\n2,a,u2\n")
    info = ingest(
        [tmp_path / "a.csv", tmp_path / "b.csv"],
        tmp_path / "s",
        columns=(2, 1, 0),
        test_fraction=0.0,
        counts="paper",
    )
    got = store_triples(info.path, "train")
    assert got == {("u1", "a"): (3, 5.0), ("u2", "b"): (4, 7.0), ("u2", "a"): (2, 2.0)}
    (tmp_path / "c.csv").write_text("5,6,7\n1,2,3\n")
    forced = ingest(tmp_path / "c.csv", tmp_path / "t", header=True, test_fraction=0.0)
    assert forced.nnz_train == 1


def test_integer_ratings_default_and_scale_max(tmp_path):
    info = ingest_arrays([1, 2, 3], [1, 1, 1], [1, 2, 3], tmp_path / "a", test_fraction=0.0)
    assert info.attrs["value_kind"] == "ratings-integer" and info.n_classes == 3
    info = ingest_arrays(
        [1, 2, 3],
        [1, 1, 1],
        [1, 2, 3],
        tmp_path / "b",
        ratings="integer",
        scale_max=5,
        test_fraction=0.0,
    )
    assert info.n_classes == 5 and info.hist_train.tolist() == [0, 1, 1, 1, 0, 0]


def test_whole_star_ratings_read_as_half_stars_warn(tmp_path):
    """Integer 1-5 ratings with ratings='halfstar' fill only the even classes: a warning says
    so and names ratings='integer'; a half star among them, or binarize, says nothing."""
    users, items = [1, 2, 3, 4], [1, 1, 2, 2]
    with pytest.warns(UserWarning, match=r"every rating is a whole star.*ratings='integer'"):
        info = ingest_arrays(users, items, [1, 2, 5, 4], tmp_path / "a", ratings="halfstar")
    assert info.hist_train[1::2].sum() + info.hist_test[1::2].sum() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ingest_arrays(users, items, [1, 2.5, 5, 4], tmp_path / "b", ratings="halfstar")
        ingest_arrays(users, items, [1, 2, 5, 4], tmp_path / "c", ratings="halfstar", binarize=8)


def test_count_thresholds_and_binarize_raw(tmp_path):
    vals = [1, 2, 3, 4, 10, 11]
    info = ingest_arrays(
        range(6), [0] * 6, vals, tmp_path / "a", counts=[2, 4, 10], test_fraction=0.0
    )
    # counts <= 2 are class 0: not interactions
    assert info.nnz_train == 4 and info.hist_train.tolist() == [0, 2, 1, 1]
    assert info.attrs["rows_not_interaction"] == 2
    info = ingest_arrays(
        range(4), [0] * 4, [0.5, -1.0, 1.0, 3.5], tmp_path / "b", binarize=1.0, test_fraction=0.0
    )
    assert info.n_classes == 1 and info.attrs["binarize_on"] == "raw"
    assert store_triples(info.path, "train") == {(2, 0): (1, 1.0), (3, 0): (1, 3.5)}
    info = ingest_arrays(
        range(3),
        [0] * 3,
        [1, 3, 600],
        tmp_path / "c",
        counts="paper",
        binarize=3,
        test_fraction=0.0,
    )
    assert store_triples(info.path, "train") == {(1, 0): (1, 3.0), (2, 0): (1, 600.0)}


def test_test_file_split(tmp_path):
    (tmp_path / "train.tsv").write_text("u1\ti1\t3\nu1\ti2\t1\nu2\ti1\t2\nu2\ti3\t1\n")
    (tmp_path / "test.tsv").write_text("u1\ti3\t4\nu2\ti2\t1\nu9\ti1\t1\nu1\ti9\t2\n")
    with pytest.warns(UserWarning, match="2 test rows dropped"):
        info = ingest(tmp_path / "train.tsv", tmp_path / "s", test=tmp_path / "test.tsv")
    assert info.attrs["split"] == "file" and info.attrs["test_unknown_dropped"] == 2
    assert info.attrs["test_source"] == [str(tmp_path / "test.tsv")]
    assert info.n_classes == 4  # default integer scale spans train and test
    assert store_triples(info.path, "test") == {("u1", "i3"): (4, 4.0), ("u2", "i2"): (1, 1.0)}
    assert len(store_triples(info.path, "train")) == 4


def test_auto_grid_bounds_rows_per_block():
    """Sparse data: blocks hold at most MAX_BLOCK_ROWS users / items whatever the nonzeros, also
    where nnz quantiles would put a long tail of degree-1 users into one range."""
    from ordnmf_dask.store.grid import MAX_BLOCK_ROWS, bounds_from_degrees

    n_heavy, n_tail = 1000, 3 * MAX_BLOCK_ROWS + 5
    user_deg = np.concatenate([np.full(n_heavy, 5000), np.ones(n_tail, dtype=np.int64)])
    item_deg = np.full(MAX_BLOCK_ROWS // 2, 3)
    rb, cb = bounds_from_degrees(user_deg, item_deg, nnz_per_block=1 << 30)
    assert rb[0] == 0 and rb[-1] == len(user_deg) and np.all(np.diff(rb) > 0)
    assert np.diff(rb).max() <= MAX_BLOCK_ROWS
    assert len(rb) - 1 >= -(-len(user_deg) // MAX_BLOCK_ROWS)
    assert len(cb) == 3 and cb[-1] == len(item_deg)  # small side: 2 blocks (SPLIT_BOTH_NNZ)


def test_auto_grid_splits_small_data_for_two_cores():
    """Whatever the block size, a grid has 2 blocks along its longer side from SPLIT_LONG_NNZ
    nonzeros on, and along both from SPLIT_BOTH_NNZ on (as far as the users and items allow),
    so that each pass has tasks for two cores."""
    from ordnmf_dask.store.grid import (
        DEFAULT_NNZ_PER_BLOCK,
        SPLIT_BOTH_NNZ,
        SPLIT_LONG_NNZ,
        auto_grid,
    )

    big = DEFAULT_NNZ_PER_BLOCK
    assert auto_grid(SPLIT_LONG_NNZ - 1, 500, 900, big) == (1, 1)
    assert auto_grid(SPLIT_LONG_NNZ, 500, 900, big) == (1, 2)
    assert auto_grid(SPLIT_LONG_NNZ, 900, 500, big) == (2, 1)
    assert auto_grid(SPLIT_BOTH_NNZ - 1, 900, 500, big) == (2, 1)
    assert auto_grid(SPLIT_BOTH_NNZ, 900, 500, big) == (2, 2)
    assert auto_grid(SPLIT_BOTH_NNZ, 1, 900, big) == (1, 2)
    assert auto_grid(9 * big, 10**5, 10**5, big) == (3, 3)  # the block size rules beyond 2


def test_the_plan_checks_every_argument_before_any_input_is_read(tmp_path):
    """One check before any work, for every entry point: a missing input is not looked at."""
    missing = tmp_path / "missing.csv"
    for bad, message in (
        ({"chunk_bytes": 0}, "ingest: chunk_bytes must be an integer >= 1"),
        ({"delimiter": "|"}, "unknown delimiter"),
        ({"columns": (0, 0, 1)}, "columns must be 3 distinct"),
        ({"min_count": -1}, "min_count must be"),
    ):
        for call in (plan_ingest, ingest, ingest_distributed):
            with pytest.raises(InputError, match=message):
                call(missing, tmp_path / "s.zarr", **bad)
    assert not (tmp_path / "s.zarr").exists()


def test_dropped_test_rows_are_reported_at_the_line_that_called_ingest(tmp_path):
    train = (["a", "a", "b", "b", "b"], ["x", "y", "x", "y", "z"], [1.0, 2.0, 3.0, 2.0, 1.0])
    test = (["a", "c"], ["z", "x"], [1.0, 2.0])  # user c is not in the training data
    calls = {
        "ingest": lambda out: ingest(train, out, test=test),
        "ingest_distributed": lambda out: ingest_distributed(train, out, test=test),
        "ingest_arrays": lambda out: ingest_arrays(*train, out, test=test),
    }
    for name, call in calls.items():
        with pytest.warns(UserWarning, match="1 test rows dropped") as warned:
            call(tmp_path / f"{name}.zarr")
        dropped = [w for w in warned if "test rows dropped" in str(w.message)]
        assert [w.filename for w in dropped] == [__file__], name
