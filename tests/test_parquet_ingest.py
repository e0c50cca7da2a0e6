"""Parquet input: row groups as chunks, same stores as the same data in CSV, columns, errors."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_ooc_ingest import assert_same_store

from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError
from ordnmf_dask.runtime.runner import Runner
from ordnmf_dask.sources.columns import file_columns
from ordnmf_dask.sources.distributed import plan
from ordnmf_dask.sources.ingest import ingest, ingest_distributed
from ordnmf_dask.sources.textsplit import input_format

NOT_SOURCE = ("created", "source")


def write_csv(path, columns, header=None):
    """A CSV file of the given columns (lists of equal length)."""
    lines = [] if header is None else [",".join(header)]
    lines += [",".join(str(x) for x in row) for row in zip(*columns, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path, table: dict, row_group_size: int):
    pq.write_table(pa.table(table), path, row_group_size=row_group_size)
    assert pq.ParquetFile(path).metadata.num_row_groups > 1
    return path


def random_parts(seed: int, n_files: int = 3, n: int = 300):
    """(users str, items int, values int) per file; string ids include "007" and "7"."""
    rng = np.random.default_rng(seed)
    users = np.array([f"u{k:03d}" for k in range(40)] + ["007", "7"])
    return [
        (rng.choice(users, n), rng.integers(0, 60, n) + 7 * f, rng.integers(1, 6, n))
        for f in range(n_files)
    ]


def three_ways(tmp_path, csv, parquet, client=None, **kw):
    """In-memory CSV = in-memory Parquet (but the source) = distributed Parquet (every attr)."""
    ingest(csv, tmp_path / "csv", **kw)
    ingest(parquet, tmp_path / "mem", **kw)
    ingest_distributed(parquet, tmp_path / "ooc", client=client, rows_per_partition=97, **kw)
    assert_same_store(tmp_path / "csv", tmp_path / "mem", ignore=NOT_SOURCE)
    assert_same_store(tmp_path / "mem", tmp_path / "ooc")


def test_many_files_and_row_groups_on_cluster(tmp_path, client):
    csv, parquet = [], []
    (tmp_path / "pq").mkdir()
    for f, (u, i, v) in enumerate(random_parts(1)):
        csv.append(write_csv(tmp_path / f"p{f}.csv", [u, i, v]))
        parquet.append(
            write_parquet(
                tmp_path / "pq" / f"p{f}.parquet", {"user": u, "item": i, "rating": v}, 70
            )
        )
    kw = dict(counts=[0, 2, 4, 6, 9], duplicates="sum", min_count=3, grid=(3, 2), seed=5)
    three_ways(tmp_path, csv, parquet, client, **kw)
    # a directory stands for its Parquet files in sorted order; _SUCCESS and hidden files skipped
    (tmp_path / "pq" / "_SUCCESS").write_text("")
    (tmp_path / "pq" / ".p9.parquet.crc").write_text("x")
    ingest_distributed(tmp_path / "pq", tmp_path / "dir", client=client, **kw)
    assert_same_store(tmp_path / "mem", tmp_path / "dir", ignore=NOT_SOURCE)


def test_one_task_per_row_group_never_a_whole_file(tmp_path, monkeypatch):
    u, i, v = random_parts(2, n_files=1)[0]
    path = write_parquet(tmp_path / "a.parquet", {"user": u, "item": i, "rating": v}, 40)
    formats = [input_format(str(path), None, None, (0, 1, 2))]
    chunks = plan(Runner(), formats, chunk_bytes=2**30)
    assert [(c.group, c.first_row, c.n_rows) for c in chunks] == [
        (g, 40 * g, min(40, 300 - 40 * g)) for g in range(8)
    ]

    def whole_file(*args, **kwargs):
        raise AssertionError("a whole Parquet file was read at once")

    monkeypatch.setattr(pq.ParquetFile, "read", whole_file)
    monkeypatch.setattr(pq, "read_table", whole_file)
    ingest(path, tmp_path / "mem", duplicates="max")
    ingest_distributed(path, tmp_path / "ooc", duplicates="max")
    assert_same_store(tmp_path / "mem", tmp_path / "ooc")


def test_columns_by_name_and_position(tmp_path):
    u, i, v = random_parts(3, n_files=1)[0]
    v = v / 2  # halfstar ratings 0.5 .. 2.5
    ts = np.arange(len(u)) * 1000
    csv = write_csv(tmp_path / "plain.csv", [u, i, v])
    path = write_parquet(
        tmp_path / "wide.parquet",
        {"ts": ts, "rating": v, "item": i, "user": u, "note": ["x"] * len(u)},
        100,
    )
    kw = dict(ratings="halfstar", duplicates="last", nnz_per_block=100)
    ingest(csv, tmp_path / "csv", **kw)
    for k, cols in enumerate([("user", "item", "rating"), (3, 2, 1), ("user", 2, "rating")]):
        ingest(path, tmp_path / f"mem{k}", columns=cols, **kw)
        ingest_distributed(path, tmp_path / f"ooc{k}", columns=cols, **kw)
        assert_same_store(tmp_path / "csv", tmp_path / f"mem{k}", ignore=NOT_SOURCE)
        assert_same_store(tmp_path / f"mem{k}", tmp_path / f"ooc{k}")
    # text files take names too, from their header line
    named = write_csv(
        tmp_path / "named.csv", [ts, v, i, u], header=["ts", "rating", "item", "user"]
    )
    ingest(named, tmp_path / "tm", columns=("user", "item", "rating"), **kw)
    ingest_distributed(
        named, tmp_path / "to", columns=("user", "item", "rating"), chunk_bytes=999, **kw
    )
    assert_same_store(tmp_path / "csv", tmp_path / "tm", ignore=NOT_SOURCE)
    assert_same_store(tmp_path / "tm", tmp_path / "to")


def test_files_without_columns_are_read_by_their_names(tmp_path):
    """A header line or a Parquet schema whose names tell the user, item and value chooses
    them (a reordered MovieLens file gives the canonical store, in memory and distributed);
    names that tell nothing leave the positions 0, 1, 2; a name that contradicts its position
    is refused, naming the file and the columns."""
    u, i, v = random_parts(4, n_files=1)[0]
    kw = dict(ratings="halfstar", duplicates="last", nnz_per_block=100)
    canonical = write_csv(tmp_path / "c.csv", [u, i, v / 2], header=["userId", "movieId", "rating"])
    ingest(canonical, tmp_path / "canon", **kw)
    swapped = write_csv(
        tmp_path / "s.csv", [i, v / 2, u, u], header=["movieId", "Rating", "user_id", "note"]
    )
    pq.write_table(pa.table({"movieId": i, "userId": u, "rating": v / 2}), tmp_path / "s.parquet")
    for k, path in enumerate([swapped, tmp_path / "s.parquet"]):
        ingest(path, tmp_path / f"mem{k}", **kw)
        ingest_distributed(path, tmp_path / f"ooc{k}", chunk_bytes=999, **kw)
        assert_same_store(tmp_path / "canon", tmp_path / f"mem{k}", ignore=NOT_SOURCE)
        assert_same_store(tmp_path / f"mem{k}", tmp_path / f"ooc{k}")
    out = str(tmp_path / "cli")
    args = ["--ratings", "halfstar", "--duplicates", "last", "--nnz-per-block", "100"]
    assert main(["ingest", str(swapped), "--out", out, "--test-fraction", "0.2", *args]) == 0
    assert_same_store(tmp_path / "canon", out, ignore=NOT_SOURCE)
    plain = write_csv(tmp_path / "p.csv", [u, i, v / 2], header=["a", "b", "c"])
    ingest(plain, tmp_path / "plain", **kw)
    assert_same_store(tmp_path / "canon", tmp_path / "plain", ignore=NOT_SOURCE)
    wrong = write_csv(tmp_path / "w.csv", [i, u, v / 2], header=["movieId", "b", "c"])
    for run in (ingest, ingest_distributed):
        with pytest.raises(
            InputError,
            match=r"w\.csv: column 0 \('movieId'\) would be read by position as the user "
            r"but is named as the item \(columns: movieId, b, c\)",
        ):
            run(wrong, tmp_path / "never", **kw)
        assert not (tmp_path / "never").exists()
    # chosen columns are taken as given, whatever the names say
    ingest(wrong, tmp_path / "chosen", columns=(1, 0, 2), **kw)
    assert_same_store(tmp_path / "canon", tmp_path / "chosen", ignore=NOT_SOURCE)


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (["UserID", "artistID", "weight"], ("UserID", "artistID", "weight")),
        (["rating", "item", "user", "ts"], ("user", "item", "rating")),
        (["a", "b", "c"], (0, 1, 2)),
        (["user", "b", "c"], (0, 1, 2)),  # the names tell no item, no value: positions
        (["userId", "movieId", "rating", "stars"], (0, 1, 2)),  # two values: positions
        (
            ["user", "b", "c", "movieId"],
            "column 1 \\('b'\\) would be read by position as the item but is not; 'movieId'",
        ),
        (["user", "item"], (0, 1, 2)),
        (["user", "uid", "rating"], "column 1 \\('uid'\\) would be read by position as the item"),
        (["x", "y", "movieId"], "column 1 \\(.y.\\) would be read by position as the item but"),
    ],
)
def test_file_columns_names_positions_and_contradictions(names, chosen):
    if isinstance(chosen, str):
        with pytest.raises(InputError, match=f"^f.csv: {chosen}"):
            file_columns(names, "f.csv")
    else:
        assert file_columns(names, "f.csv") == chosen


def test_id_and_value_column_types(tmp_path):
    """Integer, string, dictionary-encoded and integral-float ids; string and int values."""
    rng = np.random.default_rng(4)
    n = 250
    u1, i1, v1 = rng.integers(0, 30, n), rng.integers(0, 40, n), rng.integers(1, 11, n) / 2
    u2, i2, v2 = (
        rng.choice(["u1", "u2", "7", " u3 "], n),
        rng.integers(0, 40, n) + 5,
        rng.integers(1, 11, n) / 2,
    )
    t1 = {
        "user": pa.array(u1, pa.int32()),
        "item": pa.array([str(x) for x in i1]).dictionary_encode(),
        "rating": pa.array([f"{x:.1f}" for x in v1]),
    }
    t2 = {
        "user": pa.array(u2),
        "item": pa.array(i2, pa.uint16()),
        "rating": pa.array(v2, pa.float32()),
    }
    t3 = {
        "user": pa.array(u1[:60].astype(float)),
        "item": pa.array(i1[:60] + 50, pa.int64()),
        "rating": pa.array((v1[:60] * 2).astype(int) / 2),
    }
    parquet = [write_parquet(tmp_path / f"t{k}.parq", t, 50) for k, t in enumerate([t1, t2, t3])]
    csv = [
        write_csv(tmp_path / "t0.csv", [u1, i1, v1]),
        write_csv(tmp_path / "t1.csv", [u2, i2, v2]),
        write_csv(tmp_path / "t2.csv", [u1[:60], i1[:60] + 50, v1[:60]]),
    ]
    three_ways(tmp_path, csv, parquet, ratings="halfstar", duplicates="max", nnz_per_block=200)
    import zarr

    attrs = zarr.open_group(tmp_path / "ooc", mode="r").attrs
    assert attrs["id_kind"] == {"users": "str", "items": "int"}


def table(n=300, **override):
    rng = np.random.default_rng(0)
    t = {
        "user": [f"u{k % 37}" for k in range(n)],
        "item": list(range(n)),
        "rating": rng.integers(1, 6, n).astype(float),
    }
    t.update(override)
    return t


def both_fail(tmp_path, inputs, match, **kw):
    """The in-memory and the distributed ingest fail with the same message; no store is left."""
    with pytest.raises(InputError, match=match) as mem:
        ingest(inputs, tmp_path / "out", **kw)
    with pytest.raises(InputError) as ooc:
        ingest_distributed(inputs, tmp_path / "out", rows_per_partition=60, **kw)
    assert str(ooc.value) == str(mem.value)
    assert not list(tmp_path.glob("out*"))
    return str(mem.value)


def test_errors_name_file_row_group_and_row(tmp_path):
    rows = table()
    good = write_parquet(tmp_path / "good.parquet", rows, 100)
    both_fail(
        tmp_path,
        good,
        r"good\.parquet: no column 'score' \(columns: user, item, rating\)",
        columns=("user", "item", "score"),
    )
    both_fail(
        tmp_path,
        good,
        r"good\.parquet: no column 5 \(0-based\); the file has 3 columns",
        columns=(0, 1, 5),
    )
    user = rows["user"][:130] + [None] + rows["user"][131:]
    path = write_parquet(tmp_path / "null.parquet", table(user=user), 100)
    both_fail(tmp_path, [good, path], r"null\.parquet, row 130 \(row group 1\): null user id")
    rating = [str(x) for x in rows["rating"]]
    rating[250] = "five"
    path = write_parquet(tmp_path / "text.parquet", table(rating=rating), 100)
    both_fail(tmp_path, path, r"text\.parquet, row 250 \(row group 2\): value 'five' is not a num")
    path = write_parquet(tmp_path / "bool.parquet", table(rating=[True] * 300), 100)
    both_fail(tmp_path, path, r"bool\.parquet: column 'rating' \(values\) has type bool; values")
    rating = list(rows["rating"])
    rating[142] = 7.5  # off the halfstar scale: found when every value is checked (codes pass)
    path = write_parquet(tmp_path / "scale.parquet", table(rating=rating), 100)
    both_fail(
        tmp_path,
        [good, path],
        r"scale\.parquet, row 142 \(row group 1\): rating 7\.5 is off the halfstar scale",
        ratings="halfstar",
    )
    rating[142] = float("nan")
    path = write_parquet(tmp_path / "nan.parquet", table(rating=rating), 100)
    both_fail(tmp_path, path, r"nan\.parquet, row 142 \(row group 1\): value nan is not finite")
    # a pair in two files: both rows named, with their row groups (the merge pass)
    dup = write_parquet(tmp_path / "dup.parquet", table(n=220), 100)
    msg = both_fail(tmp_path, [good, dup], r"duplicate \(user u0, item 0\)")
    assert "good.parquet, row 0 (row group 0) and /" in msg
    assert msg.endswith(
        "dup.parquet, row 0 (row group 0); "
        "pass duplicates='sum', duplicates='max' or duplicates='last'"
    )
    bad = tmp_path / "junk.parquet"
    bad.write_bytes(b"not parquet at all")
    both_fail(tmp_path, [good, bad], r"junk\.parquet: not a readable Parquet file")
    both_fail(tmp_path, tmp_path / "none.parquet", r"none\.parquet: no such file")
    (tmp_path / "empty").mkdir()
    both_fail(tmp_path, tmp_path / "empty", r"empty: is a directory without \.parquet")


def test_without_pyarrow_the_error_names_the_extra(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "a.parquet", table(), 100)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    both_fail(
        tmp_path,
        path,
        r"a\.parquet: reading Parquet needs pyarrow; install it with the "
        r"'parquet' extra \(pip install 'ordnmf-dask\[parquet\]'\)",
    )


def test_cli_parquet_directory_and_named_columns(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    for k in range(2):
        write_parquet(
            tmp_path / "d" / f"part-{k}.parquet",
            table(n=150, item=list(range(150 * k, 150 * (k + 1)))),
            60,
        )
    out = tmp_path / "s.zarr"
    assert (
        main(
            [
                "ingest",
                str(tmp_path / "d"),
                "--out",
                str(out),
                "--columns",
                "user,item,rating",
                "-q",
            ]
        )
        == 0
    )
    assert "37 users x 300 items" in capsys.readouterr().out
    ingest(sorted((tmp_path / "d").glob("*.parquet")), tmp_path / "api", columns=(0, 1, 2))
    assert_same_store(out, tmp_path / "api", ignore=NOT_SOURCE)


def test_test_file_in_parquet(tmp_path):
    """A held-out test set may be Parquet too (mixed with text training files), in memory and
    distributed (row groups as chunks)."""
    (u, i, v), (tu, ti, tv) = random_parts(5, n_files=2)
    pairs = set(zip(u, i, strict=True))
    new = np.array([(a, b) not in pairs for a, b in zip(tu, ti, strict=True)])
    tu, ti, tv = tu[new], ti[new], tv[new]
    train = write_csv(tmp_path / "train.csv", [u, i, v])
    test_csv = write_csv(tmp_path / "test.csv", [tu, ti, tv])
    test_pq = write_parquet(tmp_path / "test.parquet", {"u": tu, "i": ti, "v": tv}, 50)
    kw = dict(duplicates="last", min_count=2)
    with pytest.warns(UserWarning, match="test rows dropped"):
        ingest(train, tmp_path / "a", test=test_csv, **kw)
    with pytest.warns(UserWarning, match="test rows dropped"):
        ingest(train, tmp_path / "b", test=test_pq, **kw)
    assert_same_store(tmp_path / "a", tmp_path / "b", ignore=("created", "test_source"))
    with pytest.warns(UserWarning, match="test rows dropped"):
        ingest_distributed(
            train, tmp_path / "c", test=test_pq, chunk_bytes=1000, rows_per_partition=80, **kw
        )
    assert_same_store(tmp_path / "b", tmp_path / "c")
