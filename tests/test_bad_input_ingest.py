"""Every kind of bad input fails with InputError naming the place, and leaves nothing behind."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.sources.ingest import ingest, ingest_arrays
from ordnmf_dask.store import staged as staged_module
from ordnmf_dask.store.blocks import open_store, read_block


def assert_nothing_left(out) -> None:
    assert not out.exists()
    assert not list(out.parent.glob(f"{out.name}.tmp-*"))
    assert not list(out.parent.glob(f"{out.name}.old-*"))


def fails(out, match: str, fn, *args, **kw) -> InputError:
    with pytest.raises(InputError, match=match) as exc:
        fn(*args, out, **kw) if args else fn(out, **kw)
    assert_nothing_left(out)
    return exc.value


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, newline="")
    return path


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.csv"
    fails(tmp_path / "s", "nope.csv: no such file", ingest, missing)
    fails(tmp_path / "s", "is a directory", ingest, tmp_path)


def test_wrong_column_count(tmp_path):
    path = write(tmp_path, "r.csv", "u,i,r\n1,2,3\n1,3\n")
    err = fails(tmp_path / "s", r"r\.csv, line 3: expected at least 3 columns", ingest, path)
    assert str(path) in str(err)
    path = write(tmp_path, "t.tsv", "1\t2\t3\n1\t3\t4\n")
    fails(
        tmp_path / "s",
        r"t\.tsv, line 1: expected at least 5 columns",
        ingest,
        path,
        columns=(0, 1, 4),
    )


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("1,2,3\n1,3,abc\n", 2, "is not a number"),
        ("1,2,3\n\n1,3,nan\n", 3, "is not finite"),
        ("1,2,inf\n", 1, "is not finite"),
        ("u,i,v\n1,2,3\n1,3,\n", 3, "is not a number"),
        ("1,,3\n", 1, "empty item id"),
    ],
)
def test_bad_values(tmp_path, text, line, what):
    path = write(tmp_path, "v.csv", text)
    fails(tmp_path / "s", rf"v\.csv, line {line}: .*{what}", ingest, path)


def test_bad_values_in_arrays(tmp_path):
    fails(
        tmp_path / "s",
        r"input arrays, row 1: value nan",
        ingest_arrays,
        [1, 2],
        [1, 2],
        [1.0, np.nan],
    )
    fails(tmp_path / "s", "equal length", ingest_arrays, [1, 2], [1], [1.0, 2.0])
    fails(tmp_path / "s", "not booleans", ingest_arrays, [True], [1], [1.0])


def test_non_utf8(tmp_path):
    path = tmp_path / "b.csv"
    path.write_bytes(b"1,2,3\n1,\xff\xfe,3\n")
    fails(tmp_path / "s", r"b\.csv, line 2: not valid UTF-8", ingest, path)


@pytest.mark.parametrize("count", ["0", "-3", "0.0"])
def test_zero_or_negative_count(tmp_path, count):
    path = write(tmp_path, "c.tsv", f"a\tx\t4\nb\tx\t{count}\n")
    fails(
        tmp_path / "s",
        rf"c\.tsv, line 2: count {float(count):g} must be > 0",
        ingest,
        path,
        counts="paper",
    )


@pytest.mark.parametrize("rating", ["0", "2.25", "5.5", "-1"])
def test_rating_off_halfstar_scale(tmp_path, rating):
    path = write(tmp_path, "r.csv", f"userId,movieId,rating\r\n1,1,4.5\r\n1,2,{rating}\r\n")
    fails(
        tmp_path / "s",
        r"r\.csv, line 3: rating .* off the halfstar scale",
        ingest,
        path,
        ratings="halfstar",
    )


def test_rating_off_integer_scale(tmp_path):
    path = write(tmp_path, "r.csv", "1,1,4\n1,2,6\n")
    fails(
        tmp_path / "s",
        r"r\.csv, line 2: rating 6 is off the integer scale 1\.\.5",
        ingest,
        path,
        ratings="integer",
        scale_max=5,
    )
    path = write(tmp_path, "f.csv", "1,1,4\n1,2,2.5\n")
    fails(
        tmp_path / "s",
        r"f\.csv, line 2: rating 2\.5 is not an integer class",
        ingest,
        path,
        ratings="integer",
    )
    fails(tmp_path / "s", r"f\.csv, line 2: value 2\.5 is not a positive integer", ingest, path)


def test_bad_options(tmp_path):
    path = write(tmp_path, "r.csv", "1,1,4\n1,2,3\n")
    out = tmp_path / "s"
    fails(out, "either ratings= or counts=", ingest, path, ratings="halfstar", counts="paper")
    said = r"ingest: ratings must be 'halfstar' or 'integer' \(or None\), got 'stars'"
    fails(out, said, ingest, path, ratings="stars")
    fails(out, "counts must be 'paper'", ingest, path, counts="log")
    said = "ingest: duplicates must be 'error', 'sum', 'max' or 'last', got 'mean'"
    fails(out, said, ingest, path, duplicates="mean")
    said = "ingest: filter_mode must be 'paper' or 'stable', got 'loose'"
    fails(out, said, ingest, path, filter_mode="loose")
    fails(out, "test_fraction", ingest, path, test_fraction=1.0)
    fails(out, "unknown delimiter", ingest, path, delimiter="|")
    fails(out, "columns must be", ingest, path, columns=(0, 0, 1))
    fails(out, "cannot cut 1 indices into 2", ingest, path, grid=(2, 1))
    fails(out, "grid must be", ingest, path, grid=(0, 1))


@pytest.mark.parametrize("thresholds", [(0, 1, 1, 5), (0, 5, 2), (-1, 2, 3), ()])
def test_thresholds_invalid(tmp_path, thresholds):
    path = write(tmp_path, "c.csv", "1,1,4\n1,2,3\n")
    fails(tmp_path / "s", "count thresholds", ingest, path, counts=thresholds)


def test_duplicates_error_names_both_lines(tmp_path):
    a = write(tmp_path, "a.csv", "u,i,v\n1,1,2\n1,2,3\n")
    b = write(tmp_path, "b.csv", "2,2,1\n1,2,5\n")
    err = fails(tmp_path / "s", "duplicate", ingest, [a, b])
    assert "user 1, item 2" in str(err)
    assert "a.csv, line 3" in str(err) and "b.csv, line 2" in str(err)
    c = write(tmp_path, "c.csv", "1,1,2\n2,2,1\n1,1,4\n")
    err = fails(tmp_path / "s", r"c\.csv, line 1 and .*c\.csv, line 3", ingest, c)


@pytest.mark.parametrize(("policy", "value"), [("sum", 9.0), ("max", 5.0), ("last", 3.0)])
def test_duplicate_policies(tmp_path, policy, value):
    path = write(tmp_path, "d.csv", "1,1,1\n1,2,5\n2,1,2\n1,2,1\n1,2,3\n")
    info = ingest(path, tmp_path / "s", counts="paper", duplicates=policy, test_fraction=0.0)
    assert info.nnz_train == 3 and info.attrs["duplicates"] == policy
    block = read_block(info.path, "train", 0, 0)
    got = {
        (int(r), int(c)): (int(y), float(v))
        for r, c, y, v in zip(block.rows, block.cols, block.y, block.raw, strict=True)
    }
    expected_class = int(np.searchsorted([0, 1, 2, 5, 10, 20, 50, 100, 200, 500], value))
    assert got[(0, 1)] == (expected_class, value)
    assert got[(0, 0)] == (1, 1.0) and got[(1, 0)] == (2, 2.0)


@pytest.mark.parametrize(
    "text", ["", "\n\n  \n", "userId,movieId,rating\r\n", "userId,movieId,rating\n\n"]
)
def test_empty_input(tmp_path, text):
    path = write(tmp_path, "e.csv", text)
    fails(tmp_path / "s", r"e\.csv: no data rows", ingest, path)


def test_empty_arrays(tmp_path):
    fails(tmp_path / "s", "no data rows", ingest_arrays, [], [], [])


def test_everything_filtered_away(tmp_path):
    path = write(tmp_path, "f.csv", "1,1,1\n1,2,1\n2,1,1\n")
    fails(tmp_path / "s", "filtered away by min_count=3", ingest, path, min_count=3)
    fails(tmp_path / "s", "no interactions left", ingest, path, binarize=2)


def test_test_file_sharing_pairs(tmp_path):
    train = write(tmp_path, "train.csv", "1,1,4\n1,2,3\n2,1,5\n")
    test = write(tmp_path, "test.csv", "2,2,1\n2,1,4\n")
    err = fails(
        tmp_path / "s", r"test\.csv, line 2: test pair \(user 2, item 1\)", ingest, train, test=test
    )
    assert "train.csv, line 3" in str(err)


def test_output_exists(tmp_path):
    path = write(tmp_path, "r.csv", "1,1,4\n1,2,3\n")
    out = tmp_path / "s"
    ingest(path, out)
    with pytest.raises(InputError, match="already exists"):
        ingest(path, out)
    assert open_store(out).nnz_train + open_store(out).nnz_test == 2
    with pytest.raises(InputError, match="parent directory"):
        ingest(path, tmp_path / "no" / "s")


def test_failure_while_writing_cleans_up(tmp_path, monkeypatch):
    path = write(tmp_path, "r.csv", "1,1,4\n1,2,3\n")
    calls = []
    real = staged_module._copy_chunk  # what writes every chunk of the store's arrays

    def flaky(job, opened=None):
        calls.append(job.fields)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(job, opened)

    monkeypatch.setattr(staged_module, "_copy_chunk", flaky)
    with pytest.raises(OSError, match="disk full"):
        ingest(path, tmp_path / "s")
    assert_nothing_left(tmp_path / "s")
    # An existing store survives a failed overwrite.
    monkeypatch.setattr(staged_module, "_copy_chunk", real)
    ingest(path, tmp_path / "s")
    calls.clear()
    monkeypatch.setattr(staged_module, "_copy_chunk", flaky)
    with pytest.raises(OSError, match="disk full"):
        ingest(path, tmp_path / "s", overwrite=True, seed=5)
    assert open_store(tmp_path / "s").attrs["seed"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "s"]


def _store(tmp_path):
    path = write(tmp_path, "r.csv", "1,1,4\n1,2,3\n2,2,1\n")
    return ingest(path, tmp_path / "s").path


def test_newer_format_version(tmp_path):
    path = _store(tmp_path)
    zarr.open_group(path, mode="r+").attrs["format_version"] = 4
    with pytest.raises(StoreError, match="newer ordnmf_dask format 4; this version reads 3"):
        open_store(path)
    with pytest.raises(StoreError, match="newer"):
        read_block(path, "train", 0, 0)


def test_older_format_version(tmp_path):
    """An older store is refused, saying how to make it again."""
    path = _store(tmp_path)
    zarr.open_group(path, mode="r+").attrs["format_version"] = 1
    with pytest.raises(StoreError, match="format 1; .*reads format 3.*ordnmf-dask ingest"):
        open_store(path)


def test_incomplete_store(tmp_path):
    path = _store(tmp_path)
    read_block(path, "train", 0, 0)  # warm the cache first
    zarr.open_group(path, mode="r+").attrs["complete"] = False
    with pytest.raises(StoreError, match="incomplete"):
        open_store(path)
    with pytest.raises(StoreError, match="incomplete"):
        read_block(path, "train", 0, 0)
