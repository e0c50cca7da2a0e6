"""Input safety: RFC 4180 quoting, one schema per Parquet input, printable ids, and degenerate
inputs named or handled. Bad input is exit 2 with one line naming the file and line (or row), and
nothing is left at ``--out``; the in-memory and the out-of-core ingest agree."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr
from test_ooc_ingest import assert_same_store

from ordnmf_dask import OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError
from ordnmf_dask.model.thresholds import update_delta
from ordnmf_dask.sources.ingest import ingest, ingest_distributed


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, newline="")
    return path


def refused(capsys, out, *args) -> str:
    """Run ``ingest ARGS --out OUT``: exit 2, one line on stderr, nothing at or beside OUT."""
    code = main(["ingest", *(str(a) for a in args), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not list(out.parent.glob(f"{out.name}*"))
    return err


def same_error_both_ways(tmp_path, inputs, **kw) -> str:
    """The in-memory and the out-of-core ingest (small chunks) fail with the same message, and
    leave nothing; returns it."""
    with pytest.raises(InputError) as mem:
        ingest(inputs, tmp_path / "mem", **kw)
    with pytest.raises(InputError) as ooc:
        ingest_distributed(inputs, tmp_path / "ooc", chunk_bytes=8, rows_per_partition=2, **kw)
    assert str(ooc.value) == str(mem.value)
    assert not list(tmp_path.glob("mem*")) and not list(tmp_path.glob("ooc*"))
    return str(mem.value)


def ids(store, axis: str) -> list:
    return zarr.open_group(store, mode="r")[f"{axis}/ids"][:].tolist()


def test_quoted_ids_keep_their_text_in_memory_and_distributed(tmp_path):
    path = write(
        tmp_path, "q.csv", '"Smith, 7",2,3.0\n"x ""y""","b",4\r\n"a","b",4\nplain, "2",1\n'
    )
    ingest(path, tmp_path / "mem", test_fraction=0)
    assert ids(tmp_path / "mem", "users") == ["Smith, 7", "a", "plain", 'x "y"']
    assert ids(tmp_path / "mem", "items") == ["2", "b"]
    ingest_distributed(path, tmp_path / "ooc", test_fraction=0, chunk_bytes=7, rows_per_partition=2)
    assert_same_store(tmp_path / "mem", tmp_path / "ooc")


def test_quoted_header_names_and_delimiters_inside_quotes(tmp_path):
    path = write(tmp_path, "h.csv", '"user","item","rating"\n"a::b",1,5\n"c\t",2,4\n')
    ingest(path, tmp_path / "s", columns=("user", "item", "rating"), test_fraction=0)
    assert ids(tmp_path / "s", "users") == ["a::b", "c"]
    path = write(tmp_path, "s.csv", '"u;1";"7";2\nv;"8";"3"\n')
    ingest(path, tmp_path / "t", delimiter=";", test_fraction=0)
    assert ids(tmp_path / "t", "users") == ["u;1", "v"]
    assert ids(tmp_path / "t", "items") == [7, 8]


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ('1,2,3\n"abc,2,3\n', 2, "not closed on its line"),
        ('1,2,3\n"multi\nline",2,3\n', 2, "not closed on its line"),
        ('1,2,3\n\n"a"b,2,3\n', 3, "bad CSV quoting"),
    ],
)
def test_bad_quoting_names_file_and_line(tmp_path, capsys, text, line, reason):
    path = write(tmp_path, "bad.csv", text)
    err = refused(capsys, tmp_path / "s", path)
    assert f"{path}, line {line}: " in err and reason in err
    same_error_both_ways(tmp_path, path)


def write_parquet(path, table: dict) -> None:
    path.parent.mkdir(exist_ok=True)
    pq.write_table(pa.table(table), path)


def test_parquet_files_with_different_columns_are_refused(tmp_path, capsys):
    a, b = tmp_path / "d" / "a.parquet", tmp_path / "d" / "b.parquet"
    write_parquet(
        a,
        {
            "userId": pa.array([1, 2], pa.int64()),
            "movieId": pa.array([3, 4]),
            "rating": pa.array([4.0, 5.0]),
        },
    )
    write_parquet(
        b, {"user": ["u", "v"], "item": ["x", "y"], "stars": pa.array([1.0, 2.0], pa.float32())}
    )
    err = refused(capsys, tmp_path / "s", tmp_path / "d")
    assert str(a) in err and str(b) in err
    assert "'user' (string) vs 'userId' (int64)" in err and "'stars'" in err
    same_error_both_ways(tmp_path, tmp_path / "d")


def test_everything_filtered_away_names_the_files(tmp_path, capsys):
    a = write(tmp_path, "a.csv", "1,1,4\n1,2,3\n")
    b = write(tmp_path, "b.csv", "2,1,4\n")
    err = refused(capsys, tmp_path / "s", a, b, "--min-count", "20")
    assert f"{a}, {b}: everything was filtered away" in err
    message = same_error_both_ways(tmp_path, [a, b], min_count=20)
    assert message.startswith(f"{a}, {b}: everything was filtered away by min_count=20")


@pytest.mark.parametrize(
    ("text", "shown", "code"),
    [
        ("1,2,3\na\x00b,2,3\n", "'a\\x00b'", "U+0000"),
        ("1,2,3\nab\x00,2,3\n", "'ab\\x00'", "U+0000"),
        ('1,2,3\n"a\tb",2,3\n', "'a\\tb'", "U+0009"),
        ("1,2,3\n1,x\x1by,3\n", "'x\\x1by'", "U+001B"),
    ],
)
def test_ids_with_control_characters_are_refused(tmp_path, capsys, text, shown, code):
    path = write(tmp_path, "c.csv", text)
    err = refused(capsys, tmp_path / "s", path)
    assert f"{path}, line 2: " in err and f"id {shown} contains the control character {code}" in err
    same_error_both_ways(tmp_path, path)


def test_parquet_id_with_nul_is_refused(tmp_path, capsys):
    path = tmp_path / "n.parquet"
    write_parquet(path, {"u": ["a", "b\x00c"], "i": [1, 2], "r": [1.0, 2.0]})
    err = refused(capsys, tmp_path / "s", path)
    assert f"{path}, row 1 (row group 0): user id 'b\\x00c' contains the control" in err


def test_split_leaving_no_training_data_is_refused(tmp_path, capsys):
    path = write(tmp_path, "one.csv", "1,2,3\n")
    err = refused(capsys, tmp_path / "s", path, "--test-fraction", "0.9")
    assert f"{path}: the random split leaves no training data" in err
    same_error_both_ways(tmp_path, path, test_fraction=0.9)


def test_empty_classes_without_zero_pairs_give_zero_delta():
    """Every pair observed (no class-0 pairs) and classes 1, 2 empty: Delta_1 = Delta_2 = 0."""
    delta = update_delta(np.array([0.0, 0.0, 0.0, 1.0]), np.array([0.0, 0.0, 0.0, 2.0]), 2.0)
    np.testing.assert_array_equal(delta, [0.0, 0.0, 0.0, 0.5])


def test_one_row_csv_fits_to_a_finite_elbo(tmp_path, client):
    info = ingest(write(tmp_path, "one.csv", "1,2,3\n"), tmp_path / "s")
    assert (info.n_users, info.n_items, info.nnz_train) == (1, 1, 1)
    model = OrdNMF(1, max_iter=6, min_iter=6, n_members=1).fit(info, client)
    assert len(model.elbo_) == 6 and np.all(np.isfinite(model.elbo_))
    assert np.all(np.isfinite(model.delta_)) and np.all(np.isfinite(model.W_))


@pytest.mark.parametrize("value", ["-3", "0", "2.5"])
def test_an_integer_rating_that_is_no_class_is_named_by_file_and_line(tmp_path, value):
    """With --ratings integer and no --scale-max the scale is the largest rating; a rating that
    is not a class 1, 2, ... is named where it is (it used to give a scale message naming
    nothing)."""
    path = write(tmp_path, "r.csv", f"u,i,r\n1,2,3\n1,3,{value}\n")
    message = same_error_both_ways(tmp_path, path, ratings="integer")
    assert message == f"{path}, line 3: rating {float(value):g} is not an integer class 1, 2, ..."


@pytest.mark.parametrize(
    ("text", "api", "cli"),
    [
        (
            "1,2,4\n1,3,3.5\n2,2,0.5\n",
            "value 3.5 is not a positive integer; for half-star ratings "
            "0.5 .. 5 pass ratings='halfstar'",
            "pass --ratings halfstar",
        ),
        (
            "1,2,4\n1,3,1000\n",
            "got 1000; if the values are counts (plays, clicks), pass counts='paper'",
            "pass --counts paper",
        ),
    ],
)
def test_a_value_scale_without_a_value_option_says_which_to_give(tmp_path, capsys, text, api, cli):
    path = write(tmp_path, "v.csv", text)
    assert api in same_error_both_ways(tmp_path, path)
    assert cli in refused(capsys, tmp_path / "s", path)
