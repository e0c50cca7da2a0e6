"""Which rows an input holds and which ids they name, the same in memory and distributed: float
ids beyond int64 refused, ``N.0`` the id ``N`` in text as in Parquet, a file named twice read
once, existing paths taken literally, 0-row Parquet parts accepted; damaged compressed inputs,
``--init`` files and test files that leave no test set named on one line (exit 2), and usage
errors one line."""

from __future__ import annotations

import logging
import lzma

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zarr
import zstandard
from conftest import dense_split, store_from_dense, synthetic_ordinal
from test_input_safety import refused, same_error_both_ways
from test_ooc_ingest import assert_same_store, both

from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.ingest import ingest, ingest_arrays
from ordnmf_dask.store.idmap import coerce_ids

PLAYS = "".join(f"{u}\t{i}\t{1 + (u + 2 * i) % 5}\n" for u in range(6) for i in range(5))


def write_parquet(path, table: dict):
    pq.write_table(pa.table(table), path)
    return path


def sub(tmp_path, name: str):
    """A new directory under ``tmp_path`` (``both`` writes its two stores there)."""
    (tmp_path / name).mkdir()
    return tmp_path / name


def ids(store, axis: str) -> list:
    return zarr.open_group(store, mode="r")[f"{axis}/ids"][:].tolist()


def train_values(store) -> list[float]:
    return sorted(zarr.open_group(store, mode="r")["train/raw"][:].tolist())


def test_float_ids_beyond_int64_are_refused_naming_file_and_row(tmp_path, capsys):
    """1e19 and 2e19 both became int64's minimum: two users merged, silently."""
    path = write_parquet(
        tmp_path / "big.parquet", {"u": [1.0, 1e19, 2e19], "i": [1, 2, 3], "r": [1.0, 2, 3]}
    )
    message = same_error_both_ways(tmp_path, path, test_fraction=0)
    assert message == f"{path}, row 1 (row group 0): user id 1e+19 does not fit in int64"
    err = refused(capsys, tmp_path / "cli", path)
    assert "big.parquet, row 1 (row group 0): user id 1e+19 does not fit in int64" in err
    path = write_parquet(
        tmp_path / "low.parquet", {"u": [1, 2], "i": [5.0, -(2.0**64)], "r": [1.0, 2.0]}
    )
    assert same_error_both_ways(tmp_path, path, test_fraction=0).endswith(
        "low.parquet, row 1 (row group 0): item id -1.8446744073709552e+19 does not fit in int64"
    )
    with pytest.raises(InputError, match=r"^input arrays, row 1: user id 2e\+19 does not fit"):
        ingest_arrays(np.array([1.0, 2e19]), [1, 2], [1.0, 2.0], tmp_path / "arr")
    with pytest.raises(InputError, match=r"^input arrays, row 0: item id 1\.5 is not an integer"):
        ingest_arrays([1, 2], np.array([1.5, 2.0]), [1.0, 2.0], tmp_path / "arr")
    # the largest float below 2**63 is an int64, and kept exactly
    top = float(np.nextafter(2.0**63, 0))
    path = write_parquet(
        tmp_path / "top.parquet", {"u": [top, -(2.0**63)], "i": [1, 2], "r": [1.0, 2.0]}
    )
    ingest(path, tmp_path / "top", test_fraction=0)
    assert ids(tmp_path / "top", "users") == [-(2**63), int(top)]


def test_integral_float_text_is_the_integer_id_as_in_parquet(tmp_path):
    """A CSV where user N is written ``N`` and ``N.0`` has 50 users, not 99 (as its Parquet
    float column), in memory and distributed."""
    rows = [(u, i, 1 + i) for u in range(50) for i in range(3)]
    text = "".join(f"{u}{'.0' if i == 1 else ''},{i},{v}\n" for u, i, v in rows)
    (tmp_path / "mixed.csv").write_text(text)
    both(
        sub(tmp_path, "csv"),
        tmp_path / "mixed.csv",
        chunk_bytes=300,
        rows_per_partition=40,
        test_fraction=0,
    )
    assert ids(tmp_path / "csv" / "mem", "users") == list(range(50))
    path = write_parquet(
        tmp_path / "mixed.parquet",
        {
            "u": [float(u) for u, _, _ in rows],
            "i": [i for _, i, _ in rows],
            "r": [float(v) for _, _, v in rows],
        },
    )
    ingest(path, tmp_path / "pq", test_fraction=0)
    assert_same_store(tmp_path / "csv" / "mem", tmp_path / "pq", ignore=("created", "source"))
    # among string ids too: "7.00" and " 7 " are "7"; "007" and "7.5" stay as they are
    (tmp_path / "s.csv").write_text("a,x,1\n7.00,x,2\n 7 ,y,3\n007,x,4\n7.5,x,5\n-3.0,y,1\n")
    both(
        sub(tmp_path, "str"),
        tmp_path / "s.csv",
        chunk_bytes=12,
        rows_per_partition=2,
        test_fraction=0,
        duplicates="sum",
    )
    assert ids(tmp_path / "str" / "mem", "users") == ["-3", "007", "7", "7.5", "a"]
    assert train_values(tmp_path / "str" / "mem") == [1.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_ids_asked_for_follow_the_same_rule(tmp_path):
    """``recommend --user 5.0`` finds the user that ``5.0`` in the input became; a float id
    beyond int64 is unknown, not an overflow."""
    y = synthetic_ordinal(6, 4, 2, seed=1)
    train, test = dense_split(y)
    ints = store_from_dense(tmp_path / "i.zarr", train, test, 2, (1, 1), user_ids=np.arange(6) * 5)
    wanted, bad = coerce_ids(ints.path, "users", ["5.0", " 10 ", 15.0, 2.5, "x", 1e19, "-0.0"])
    assert wanted.tolist() == [5, 10, 15] and bad == [3, 4, 5, 6]
    strs = store_from_dense(
        tmp_path / "s.zarr",
        train,
        test,
        2,
        (1, 1),
        user_ids=np.array(["5", "a", "b", "c", "d", "e"]),
    )
    wanted, bad = coerce_ids(strs.path, "users", ["5.00", 5.0, " a "])
    assert wanted.tolist() == ["5", "5", "a"] and bad == []


def test_a_file_named_twice_is_read_once(tmp_path, monkeypatch, caplog):
    """``ingest plays.tsv 'pl*.tsv' --duplicates sum`` doubled every count."""
    (tmp_path / "plays.tsv").write_text(PLAYS)
    (tmp_path / "other.tsv").write_text("9\t9\t1\n")
    monkeypatch.chdir(tmp_path)
    ingest(["plays.tsv", "other.tsv"], tmp_path / "once", test_fraction=0)
    named = ["plays.tsv", str(tmp_path / "pl*.tsv"), "./sub/../plays.tsv", "other.tsv", "*.tsv"]
    (tmp_path / "sub").mkdir()
    with caplog.at_level(logging.WARNING, "ordnmf_dask"):
        both(
            sub(tmp_path, "twice"),
            named,
            chunk_bytes=40,
            rows_per_partition=8,
            test_fraction=0,
            duplicates="sum",
        )
    assert train_values(tmp_path / "twice" / "mem") == train_values(tmp_path / "once")
    warned = [r.getMessage() for r in caplog.records if "more than once" in r.getMessage()]
    assert warned[:4] == [
        f"{tmp_path / 'plays.tsv'}: named more than once among the inputs; read once",
        "./sub/../plays.tsv: named more than once among the inputs; read once",
        f"{tmp_path / 'other.tsv'}: named more than once among the inputs; read once",
        f"{tmp_path / 'plays.tsv'}: named more than once among the inputs; read once",
    ]


def test_an_existing_path_with_glob_characters_is_taken_literally(tmp_path, capsys):
    (tmp_path / "r[1].csv").write_text(PLAYS.replace("\t", ","))
    (tmp_path / "r1.csv").write_text("99,99,1\n")  # what the glob r[1].csv would match
    both(tmp_path, tmp_path / "r[1].csv", chunk_bytes=50, rows_per_partition=8, test_fraction=0)
    assert ids(tmp_path / "mem", "users") == list(range(6))
    capsys.readouterr()  # the ingests' summary lines
    err = refused(capsys, tmp_path / "none", tmp_path / "q[1].csv")  # none there: still a glob
    assert "q[1].csv: no files match" in err


def test_zero_row_parquet_parts_add_nothing(tmp_path):
    """A directory as Spark and Dask write it (a 0-row part among others) was refused."""
    rng = np.random.default_rng(3)
    table = {
        "user": rng.integers(0, 20, 120),
        "item": rng.integers(0, 15, 120),
        "rating": rng.integers(1, 6, 120).astype(float),
    }
    whole = pa.table(table)
    (tmp_path / "full").mkdir()
    (tmp_path / "parts").mkdir()
    pq.write_table(whole, tmp_path / "full" / "part-0.parquet")
    pq.write_table(whole.slice(0, 70), tmp_path / "parts" / "part-0.parquet")
    pq.write_table(whole.slice(0, 0), tmp_path / "parts" / "part-1.parquet")
    pq.write_table(whole.slice(70), tmp_path / "parts" / "part-2.parquet")
    pq.ParquetWriter(tmp_path / "parts" / "part-3.parquet", whole.schema).close()  # no row group
    kw = dict(test_fraction=0.2, duplicates="max", rows_per_partition=30)
    both(sub(tmp_path, "a"), tmp_path / "parts", **kw)
    both(sub(tmp_path, "b"), tmp_path / "full", **kw)
    assert_same_store(tmp_path / "a" / "mem", tmp_path / "b" / "mem", ignore=("created", "source"))
    # a 0-row part must still have the others' columns
    pq.write_table(
        pa.table(
            {
                "uid": pa.array([], pa.int64()),
                "item": pa.array([], pa.int64()),
                "rating": pa.array([], pa.float64()),
            }
        ),
        tmp_path / "parts" / "part-1.parquet",
    )
    assert "part-1.parquet: columns differ from" in same_error_both_ways(
        sub(tmp_path, "c"), tmp_path / "parts"
    )
    # and some file must have rows
    (tmp_path / "empty").mkdir()
    for k in range(2):
        pq.write_table(whole.slice(0, 0), tmp_path / "empty" / f"part-{k}.parquet")
    assert same_error_both_ways(sub(tmp_path, "e"), tmp_path / "empty") == (
        f"{tmp_path / 'empty' / 'part-0.parquet'} and 1 more Parquet files: no data rows "
        "(every file is empty)"
    )
    assert same_error_both_ways(tmp_path / "e", tmp_path / "empty" / "part-1.parquet") == (
        f"{tmp_path / 'empty' / 'part-1.parquet'}: no data rows (the file is empty)"
    )


@pytest.mark.parametrize("suffix", [".zst", ".xz"])
def test_a_damaged_compressed_input_is_named(tmp_path, capsys, suffix):
    """A corrupt .zst was ``internal error: ZstdError`` (exit 1), the file not named."""
    data = "".join(f"{u},{i},{1 + (u + i) % 5}\n" for u in range(400) for i in range(20)).encode()
    packed = zstandard.ZstdCompressor().compress(data) if suffix == ".zst" else lzma.compress(data)
    half = len(packed) // 2
    path = tmp_path / f"bad.csv{suffix}"
    path.write_bytes(packed[:half] + bytes(b ^ 0x55 for b in packed[half:]))
    message = same_error_both_ways(tmp_path, path)
    assert message.startswith(f"{path}: cannot read (")
    magic = b"\x28\xb5\x2f\xfd" if suffix == ".zst" else b"\xfd7zXZ\x00"
    path.write_bytes(magic + b"garbage" * 10)
    assert same_error_both_ways(tmp_path, path).startswith(f"{path}: cannot read (")
    err = refused(capsys, tmp_path / "cli", path)
    assert f"bad.csv{suffix}: cannot read (" in err


def test_a_damaged_init_file_is_named(tmp_path, capsys):
    """A truncated --init .npz was ``internal error: BadZipFile`` (exit 1)."""
    y = synthetic_ordinal(12, 9, 3, seed=4)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (1, 1))
    rng = np.random.default_rng(0)
    good = tmp_path / "init.npz"
    np.savez(good, W=rng.gamma(1, 1, (12, 2)), H=rng.gamma(1, 1, (9, 2)))
    truncated = tmp_path / "cut.npz"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    not_npz = tmp_path / "text.npz"
    not_npz.write_text("W,H\n1,2\n")
    for bad in (truncated, not_npz):
        code = main(
            [
                "fit",
                "--n-members",
                "1",
                store.path,
                "-k",
                "2",
                "--init",
                str(bad),
                "--out",
                str(tmp_path / "m"),
                "-q",
            ]
        )
        err = capsys.readouterr().err.splitlines()
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"ordnmf-dask fit: error: {bad}: not a readable .npz file (")
    np.savez(tmp_path / "w.npz", W=rng.gamma(1, 1, (12, 2)))
    np.save(tmp_path / "one.npy", rng.gamma(1, 1, (12, 2)))
    for name, missing in (("w.npz", "['H']"), ("one.npy", "['H', 'W']")):
        code = main(
            [
                "fit",
                "--n-members",
                "1",
                store.path,
                "-k",
                "2",
                "--init",
                str(tmp_path / name),
                "--out",
                str(tmp_path / "m"),
                "-q",
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and f"{name}: missing array(s) {missing} (need W and H)" in err, err


def test_a_test_file_that_leaves_no_test_set_is_refused(tmp_path, capsys):
    """Every test row of an unknown user or item gave exit 0, an empty test set and a two-line
    Python warning."""
    (tmp_path / "train.tsv").write_text(PLAYS)
    unknown = tmp_path / "unknown.tsv"
    unknown.write_text("x1\t0\t1\n0\tq\t2\n")
    message = same_error_both_ways(tmp_path, tmp_path / "train.tsv", test=unknown)
    assert message == (
        f"{unknown}: no test interactions left: 2 have a user or an item that is "
        "not in the (filtered) training data, 0 are not an interaction"
    )
    err = refused(capsys, tmp_path / "cli", tmp_path / "train.tsv", "--test", unknown)
    assert "unknown.tsv: no test interactions left: 2 have" in err
    # below the count threshold, or of users filtered away: nothing left either
    low = tmp_path / "low.tsv"
    low.write_text("0\t9\t1\n7\t0\t5\n")
    (tmp_path / "train2.tsv").write_text(PLAYS + "7\t1\t5\n")
    message = same_error_both_ways(
        tmp_path, tmp_path / "train2.tsv", test=low, min_count=2, counts=[2, 4]
    )
    assert message.endswith(
        "no test interactions left: 1 have a user or an item that is not "
        "in the (filtered) training data, 1 are not an interaction"
    )


def test_test_rows_dropped_are_one_warning_line(tmp_path, capsys):
    """Some test rows of unknown users: kept as a warning, one line (not Python's two)."""
    (tmp_path / "train.tsv").write_text(PLAYS.split("\n", 1)[1])  # all pairs but (0, 0)
    (tmp_path / "test.tsv").write_text("x1\t0\t1\n0\t0\t2\n9\t1\t3\n")
    out = tmp_path / "s.zarr"
    assert (
        main(
            [
                "ingest",
                str(tmp_path / "train.tsv"),
                "--test",
                str(tmp_path / "test.tsv"),
                "--out",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith(
        "WARNING ordnmf_dask: UserWarning: 2 test rows dropped: their user or item is not in "
        "the (filtered) training data"
    ), err


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["fit", "--n-members", "1", "-k", "abc", "s.zarr"],
            "ordnmf-dask fit: error: argument -k/--n-components: invalid int value: 'abc' "
            "(see ordnmf-dask fit --help)",
        ),
        (
            ["ingest", "a.csv"],
            "ordnmf-dask ingest: error: the following arguments are required: --out "
            "(see ordnmf-dask ingest --help)",
        ),
        (
            ["fitt"],
            "ordnmf-dask: error: argument COMMAND: invalid choice: 'fitt' (choose from "
            "'ingest', 'synth', 'info', 'fit', 'evaluate', 'recommend', 'similar-items', "
            "'similar-users', 'fold-in', 'score', 'export', 'predict', 'reproduce', 'tune') "
            "(see ordnmf-dask --help)",
        ),
    ],
)
def test_usage_errors_are_one_line_exit_2(capsys, args, line):
    """``fit -k abc`` printed 26 lines of usage."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]
