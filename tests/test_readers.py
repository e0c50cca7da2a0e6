"""Readers on pyarrow and fsspec: compressed and quoted text, MovieLens ``::``, globs, S3, and
data in memory (DataFrame, Table, sparse matrix, arrays) giving the same store as the CSV."""

from __future__ import annotations

import bz2
import gzip

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import scipy.sparse as sp
import zarr
import zstandard
from test_ooc_ingest import assert_same_store

from ordnmf_dask import ingest
from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.ingest import ingest_arrays, ingest_distributed

pytest_plugins = ["tests.s3server"]

NOT_SOURCE = ("created", "source", "test_source")


def rows(seed: int = 0, n: int = 300, string_ids: bool = True):
    """Distinct (user, item) pairs with half-star ratings."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(60 * 40, n, replace=False)
    u, i = np.divmod(keys, 40)
    v = rng.integers(1, 11, n) / 2
    if string_ids:
        return [f"u{k}" for k in u], [f"item-{k}" for k in i], v
    return u, i, v


def csv_text(u, i, v, sep: str = ",", header: str = "user,item,rating\n") -> str:
    return header + "".join(f"{a}{sep}{b}{sep}{c}\n" for a, b, c in zip(u, i, v, strict=True))


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [
        (".gz", gzip.compress),
        (".bz2", bz2.compress),
        (".zst", lambda b: zstandard.ZstdCompressor().compress(b)),
    ],
)
def test_compressed_text_by_suffix(tmp_path, suffix, compress):
    text = csv_text(*rows(1)).encode()
    (tmp_path / "r.csv").write_bytes(text)
    (tmp_path / f"r.csv{suffix}").write_bytes(compress(text))
    ingest(tmp_path / "r.csv", tmp_path / "plain", ratings="halfstar")
    ingest(tmp_path / f"r.csv{suffix}", tmp_path / "packed", ratings="halfstar")
    assert_same_store(tmp_path / "plain", tmp_path / "packed", ignore=NOT_SOURCE)
    ingest_distributed(
        tmp_path / f"r.csv{suffix}", tmp_path / "ooc", ratings="halfstar", chunk_bytes=100
    )
    assert_same_store(tmp_path / "plain", tmp_path / "ooc", ignore=NOT_SOURCE)


def test_compressed_error_names_file_and_line(tmp_path):
    u, i, v = rows(2)
    text = csv_text(u, i, v).splitlines()
    text[120] = "u1,item-1,abc"
    path = tmp_path / "bad.csv.gz"
    path.write_bytes(gzip.compress(("\n".join(text) + "\n").encode()))
    with pytest.raises(InputError, match=rf"{path}, line 121: value 'abc' is not a number"):
        ingest(path, tmp_path / "s", ratings="halfstar")
    with pytest.raises(InputError, match=rf"{path}, line 121: value 'abc' is not a number"):
        ingest_distributed(path, tmp_path / "s", ratings="halfstar")
    assert not list(tmp_path.glob("s*"))


def test_streamed_text_errors_name_the_line(tmp_path):
    """A file the streamed reader refuses (a short or long line, a value that is no number
    far from the start) is read again by the line-aware reader, whose error names the line."""
    u, i, v = rows(3, n=2000)
    lines = csv_text(u, i, v).splitlines()
    for k, bad, message in [
        (1500, "u1,item-1", "expected at least 3 columns"),
        (1700, "u1,item-1,4.0,9", "found 4 columns"),
        (1900, "u1,item-1,x", "value 'x' is not a number"),
    ]:
        broken = lines.copy()
        broken[k] = bad
        path = tmp_path / f"b{k}.csv"
        path.write_text("\n".join(broken) + "\n")
        with pytest.raises(InputError, match=rf"b{k}\.csv, line {k + 1}: .*{message}"):
            ingest(path, tmp_path / "s")


def test_quoting_unicode_and_commas_in_ids(tmp_path):
    text = 'user,item,rating\n1,"a, b",4\n"Zoë ""Z""",b,3\n"naïve, 東京",c,5\n2,"a, b",1\n'
    path = tmp_path / "q.csv"
    path.write_text(text, encoding="utf-8")
    info = ingest(path, tmp_path / "s", test_fraction=0)
    users = zarr.open_group(info.path, mode="r")["users/ids"][:].tolist()
    items = zarr.open_group(info.path, mode="r")["items/ids"][:].tolist()
    assert users == sorted(["1", 'Zoë "Z"', "naïve, 東京", "2"])
    assert items == ["a, b", "b", "c"]


def test_movielens_double_colon(tmp_path):
    """MovieLens 1M's ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``)."""
    u, i, v = rows(4, string_ids=False)
    stars = np.ceil(v).astype(int)
    dat = "".join(
        f"{a + 1}::{b + 1}::{s}::97830{k}\n"
        for k, (a, b, s) in enumerate(zip(u, i, stars, strict=True))
    )
    (tmp_path / "ratings.dat").write_text(dat)
    (tmp_path / "ratings.csv").write_text(csv_text(u + 1, i + 1, stars, header=""))
    ingest(tmp_path / "ratings.dat", tmp_path / "dat")
    ingest(tmp_path / "ratings.csv", tmp_path / "csv")
    assert_same_store(tmp_path / "dat", tmp_path / "csv", ignore=NOT_SOURCE)
    ingest_distributed(tmp_path / "ratings.dat", tmp_path / "ooc", chunk_bytes=500)
    assert_same_store(tmp_path / "dat", tmp_path / "ooc", ignore=NOT_SOURCE)


def test_glob_of_files(tmp_path):
    u, i, v = rows(5)
    (tmp_path / "all.csv").write_text(csv_text(u, i, v))
    (tmp_path / "p").mkdir()
    for k in range(3):
        part = slice(100 * k, 100 * (k + 1))
        (tmp_path / "p" / f"part-{k}.csv").write_text(csv_text(u[part], i[part], v[part]))
    ingest(tmp_path / "all.csv", tmp_path / "one", ratings="halfstar")
    pattern = str(tmp_path / "p" / "part-*.csv")
    info = ingest(pattern, tmp_path / "glob", ratings="halfstar")
    assert info.attrs["source"] == [pattern]
    assert_same_store(tmp_path / "one", tmp_path / "glob", ignore=NOT_SOURCE)
    with pytest.raises(InputError, match="no files match"):
        ingest(str(tmp_path / "p" / "none-*.csv"), tmp_path / "x")


@pytest.mark.parametrize("string_ids", [True, False])
def test_data_in_memory_gives_the_csv_store(tmp_path, string_ids):
    u, i, v = rows(6, string_ids=string_ids)
    (tmp_path / "r.csv").write_text(csv_text(u, i, v))
    ingest(tmp_path / "r.csv", tmp_path / "csv", ratings="halfstar", seed=3)
    frame = pd.DataFrame({"user": u, "item": i, "rating": v})
    given = {
        "frame": frame,
        "table": pa.table({"r": v, "user": u, "item": i}),
        "tuple": (np.asarray(u), np.asarray(i), v),
    }
    for name, data in given.items():
        columns = ("user", "item", "r") if name == "table" else None
        ingest(data, tmp_path / name, ratings="halfstar", seed=3, columns=columns)
        assert_same_store(tmp_path / "csv", tmp_path / name, ignore=NOT_SOURCE)
    ingest_arrays(u, i, v, tmp_path / "arrays", ratings="halfstar", seed=3)
    assert_same_store(tmp_path / "csv", tmp_path / "arrays", ignore=NOT_SOURCE)


def test_sparse_matrix_gives_the_csv_store(tmp_path):
    u, i, v = rows(7, string_ids=False)
    (tmp_path / "r.csv").write_text(csv_text(u, i, v, header=""))
    ingest(tmp_path / "r.csv", tmp_path / "csv", ratings="halfstar")
    for fmt in ("csr", "coo"):
        matrix = sp.coo_matrix((v, (u, i)), shape=(60, 40)).asformat(fmt)
        ingest(matrix, tmp_path / fmt, ratings="halfstar")
        assert_same_store(tmp_path / "csv", tmp_path / fmt, ignore=NOT_SOURCE)


def test_data_in_memory_errors_name_the_row(tmp_path):
    frame = pd.DataFrame({"u": ["a", "b", None], "i": [1, 2, 3], "r": [1.0, 2.0, 3.0]})
    with pytest.raises(InputError, match=r"input DataFrame, row 2: null user id"):
        ingest(frame, tmp_path / "s", columns=("u", "i", "r"))
    table = pa.table({"u": ["a", " "], "i": [1, 2], "r": [1.0, 2.0]})
    with pytest.raises(InputError, match=r"input Table, row 1: empty user id"):
        ingest(table, tmp_path / "s", columns=("u", "i", "r"))
    with pytest.raises(InputError, match=r"input Table: no column 'x'"):
        ingest(table, tmp_path / "s", columns=("x", "i", "r"))
    assert not list(tmp_path.glob("s*"))


def test_dask_dataframe_goes_the_distributed_way(tmp_path):
    import dask.dataframe as dd

    u, i, v = rows(8)
    (tmp_path / "r.csv").write_text(csv_text(u, i, v))
    ingest(tmp_path / "r.csv", tmp_path / "csv", ratings="halfstar")
    frame = dd.from_pandas(pd.DataFrame({"user": u, "item": i, "rating": v}), npartitions=3)
    ingest(frame, tmp_path / "dask", ratings="halfstar")
    assert_same_store(tmp_path / "csv", tmp_path / "dask", ignore=NOT_SOURCE)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("dask")] == ["dask"]


def test_gzipped_csv_on_s3(tmp_path, s3, monkeypatch):  # noqa: F811 - fixture
    u, i, v = rows(9)
    text = csv_text(u, i, v).encode()
    (tmp_path / "r.csv").write_bytes(text)
    s3.fs.pipe(s3.url("ratings.csv.gz"), gzip.compress(text))
    monkeypatch.setitem(fsspec.config.conf, "s3", s3.storage_options)
    ingest(tmp_path / "r.csv", tmp_path / "local", ratings="halfstar")
    info = ingest(s3.url("ratings.csv.gz"), tmp_path / "s3", ratings="halfstar")
    assert info.attrs["source"] == [s3.url("ratings.csv.gz")]
    assert_same_store(tmp_path / "local", tmp_path / "s3", ignore=NOT_SOURCE)
    with pytest.raises(InputError, match="no such file"):
        ingest(s3.url("missing.csv"), tmp_path / "x")
