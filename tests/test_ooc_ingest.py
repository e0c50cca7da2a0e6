"""The ingest pipeline cut into many chunks or run on a cluster: the same store as the input
ingested in one chunk, chunked split, test files, dask DataFrames, errors."""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import zarr
from conftest import LASTFM, ML, TPS, data_file
from distributed import Event

from ordnmf_dask.errors import InputError, StoreError
from ordnmf_dask.runtime.runner import Runner
from ordnmf_dask.sources.distributed_tasks import as_kind, chunk_prefix, split_ids_task
from ordnmf_dask.sources.filtering import distinct_ids, encode_ids, encode_sorted
from ordnmf_dask.sources.ingest import ingest, ingest_distributed
from ordnmf_dask.sources.origin import Origin
from ordnmf_dask.sources.text import line_numbers
from ordnmf_dask.store.staged import held_staging, load_arrays, load_rows, save_arrays, widen

ARRAYS = ["row_bounds", "col_bounds", "users/ids", "items/ids"] + [
    f"{s}/{f}" for s in ("train", "test") for f in ("indptr", "cols", "y", "raw", "offsets")
]


def assert_same_store(a, b, ignore=("created",)) -> None:
    """Same attributes (but ``ignore``), and the same arrays (dtype, shape, chunks, values),
    the validation subset's too."""
    ga, gb = zarr.open_group(a, mode="r"), zarr.open_group(b, mode="r")
    attrs_a, attrs_b = dict(ga.attrs), dict(gb.attrs)
    for key in ignore:
        attrs_a.pop(key)
        attrs_b.pop(key)
    assert attrs_a == attrs_b
    assert ("validation" in ga) == ("validation" in gb)
    val = [f"validation/{f}" for f in ("indptr", "cols", "y", "raw", "offsets")]
    for name in ARRAYS + (val if "validation" in ga else []):
        x, y = ga[name], gb[name]
        assert (x.dtype, x.shape, x.chunks) == (y.dtype, y.shape, y.chunks), name
        np.testing.assert_array_equal(x[:], y[:], err_msg=name)


def both(tmp_path, inputs, client=None, chunk_bytes=200_000, rows_per_partition=15_000, **kw):
    ingest(inputs, tmp_path / "mem", **kw)
    ingest_distributed(
        inputs,
        tmp_path / "ooc",
        client=client,
        chunk_bytes=chunk_bytes,
        rows_per_partition=rows_per_partition,
        **kw,
    )
    assert_same_store(tmp_path / "mem", tmp_path / "ooc")


@pytest.mark.data
def test_movielens_on_cluster(tmp_path, client):
    both(
        tmp_path,
        data_file(ML),
        client,
        ratings="halfstar",
        min_count=20,
        nnz_per_block=10_000,
        seed=3,
    )


@pytest.mark.data
def test_lastfm_stable_filter(tmp_path):
    both(tmp_path, data_file(LASTFM), counts="paper", min_count=5, filter_mode="stable")


@pytest.mark.data
def test_tasteprofile_counts(tmp_path):
    both(tmp_path, data_file(TPS), counts="paper", nnz_per_block=6000, chunk_bytes=65_536)


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
    both(
        tmp_path,
        paths,
        chunk_bytes=700,
        rows_per_partition=97,
        counts=[0, 2, 4, 6, 9],
        duplicates=policy,
        min_count=3,
        grid=(3, 2),
        seed=5,
    )


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


def test_encode_sorted_is_numpys_unique():
    rng = np.random.default_rng(3)
    alphabet = np.array(list("az09 ,é日本\U0001f600ß-"))
    text = np.array(["".join(rng.choice(alphabet, rng.integers(1, 6))) for _ in range(3000)])
    ascii_ = np.array(["".join(rng.choice(list("ab1 ,"), rng.integers(1, 6))) for _ in range(3000)])
    for ids in (text, ascii_.astype("S"), rng.integers(-50, 50, 500), np.zeros(0, "<U3")):
        distinct, codes = encode_sorted(ids)
        expect, inverse = np.unique(ids, return_inverse=True)
        np.testing.assert_array_equal(distinct, expect)
        np.testing.assert_array_equal(codes, inverse.reshape(-1))
        assert distinct.dtype == expect.dtype and codes.dtype == np.int32
    assert as_kind(np.array([7, 40]), "U").tolist() == ["7", "40"]


def test_distinct_ids_unsorted_then_sorted_are_numpys_unique():
    """``distinct_ids`` (ASCII strings as bytes, in the order first seen) sorted afterwards is
    ``np.unique`` of the stripped ids, whichever kind they are; ``encode_ids`` gives str."""
    rng = np.random.default_rng(5)
    ascii_ = np.array([f" u{j}" for j in rng.integers(0, 400, 2000)])
    text = np.array([f"é{j}日" if j % 3 else f"u{j}" for j in rng.integers(0, 400, 2000)])
    numbers = np.array([str(j) for j in rng.integers(-9, 300, 2000)])
    for ids, kind in ((ascii_, "S"), (text, "U"), (numbers, "i"), (pa.array(list(ascii_)), "S")):
        distinct, codes = distinct_ids(ids, Origin.arrays(2000), "user")
        assert distinct.dtype.kind == kind and codes.dtype == np.int32
        stripped = np.char.strip(np.asarray(ids, dtype=str))
        expect = np.unique(stripped.astype(np.int64) if kind == "i" else stripped)
        np.testing.assert_array_equal(np.sort(widen(distinct)), np.sort(expect))
        np.testing.assert_array_equal(widen(distinct)[codes], stripped.astype(expect.dtype))
        sorted_, sorted_codes = encode_ids(ids, Origin.arrays(2000), "user")
        np.testing.assert_array_equal(sorted_, expect)
        np.testing.assert_array_equal(sorted_[sorted_codes], stripped.astype(expect.dtype))
        assert sorted_.dtype == np.array(expect.tolist()).dtype  # as narrow as the longest


def test_ids_of_every_kind_across_many_id_ranges(tmp_path):
    """Chunks whose ids are ASCII, other text, or integers (another kind than the global one),
    grouped into many id ranges: the same store as in memory."""
    rng = np.random.default_rng(11)
    n = 6000
    users = [f"u{j}" if j % 4 else f"ü{j}" for j in rng.integers(0, 900, n)]
    users[:1500] = [str(j) for j in rng.integers(0, 900, 1500)]  # integers in the first chunks
    items = [f"日{j}" if j % 7 == 0 else f"i{j:03d}" for j in rng.integers(0, 300, n)]
    path = tmp_path / "ids.csv"
    pd.DataFrame({"u": users, "i": items, "r": rng.integers(1, 6, n)}).to_csv(path, index=False)
    both(tmp_path, path, chunk_bytes=4_000, rows_per_partition=60, duplicates="max")


def test_ids_written_from_their_ranges_over_many_store_chunks(tmp_path, monkeypatch):
    """With store chunks of 64 entries, the kept ids (some users and items filtered away) are
    gathered from several id ranges per chunk, and several chunks per range: the same store."""
    import ordnmf_dask.sources.distributed_tasks as tasks
    import ordnmf_dask.store.blocks as blocks
    import ordnmf_dask.store.staged as staged

    for module in (tasks, blocks, staged):
        monkeypatch.setattr(module, "CHUNK", 64)
    rng = np.random.default_rng(4)
    n = 5000
    frame = pd.DataFrame(
        {
            "u": [f"user-{j}" for j in rng.zipf(1.3, n) % 700],
            "i": rng.zipf(1.2, n) % 400,
            "r": rng.integers(1, 6, n),
        }
    )
    path = tmp_path / "zipf.csv"
    frame.to_csv(path, index=False)
    both(tmp_path, path, chunk_bytes=3_000, rows_per_partition=40, duplicates="max", min_count=2)
    ids = zarr.open_group(tmp_path / "ooc", mode="r")["users/ids"]
    assert ids.chunks == (64,) and ids.shape[0] > 3 * 64


def test_grouping_ids_by_range_again_gives_the_same_files(tmp_path):
    """``split_ids_task`` replaces a chunk's parsed ids by the grouped ones; run again (its
    worker lost after the removal), it returns the same offsets and leaves the files as
    they were."""
    staging = tmp_path / "store.tmp"
    prefix = chunk_prefix(str(staging), 3)
    ids = np.array(["u9", "é2", "u1", "a7", "u5", "zz", "b0"])
    save_arrays(prefix, {"users": ids})
    splitters = np.array(["b0", "u5"])
    first = split_ids_task(3, str(staging), "users", "U", splitters)
    files = {n: load_arrays(prefix, [n])[n] for n in ("r_users", "r_users_order")}
    assert not (staging / "_staging" / "chunks" / "000003.users.npy").exists()
    assert split_ids_task(3, str(staging), "users", "U", splitters) == first == [0, 2, 4, 7]
    for name, arr in files.items():
        np.testing.assert_array_equal(load_arrays(prefix, [name])[name], arr)
    grouped = files["r_users"]
    assert grouped.tolist() == ids[files["r_users_order"]].tolist()
    assert sorted(grouped[:2]) == ["a7", "b0"] and sorted(grouped[2:4]) == ["u1", "u5"]


def test_staged_arrays_are_compact_and_restored_exactly(tmp_path):
    arrays = {
        "ascii": np.array(["u1", "item 22", ""]),
        "text": np.array(["é", "b"]),
        "halves": np.array([0.5, -0.0, 3.0]),
        "fine": np.array([0.1, 2.0]),
        "codes": np.arange(3, dtype=np.int32),
    }
    save_arrays(str(tmp_path / "x"), arrays)
    got = load_arrays(str(tmp_path / "x"), list(arrays))
    for name, arr in arrays.items():
        assert got[name].dtype == arr.dtype and got[name].tolist() == arr.tolist(), name
        assert load_rows(str(tmp_path / "x"), name, 1, 2).tolist() == arr[1:2].tolist()
    assert np.signbit(got["halves"][1])
    sizes = {n: np.load(tmp_path / f"x.{n}.npy").dtype for n in arrays}
    assert sizes["ascii"] == np.dtype("S7") and sizes["halves"] == np.float32
    assert sizes["text"].kind == "U" and sizes["fine"] == np.float64


def test_held_staging_keeps_arrays_in_memory_as_files_would(tmp_path):
    """An in-process ingest of a small input stages in memory: nothing is written, the arrays
    read back as from files (compacted, restored, copied), a missing one is a StoreError naming
    it, and leaving drops them."""
    tmp = str(tmp_path / "store")
    arrays = {
        "ascii": np.array(["u1", "item 22"]),
        "halves": np.array([0.5, 3.0]),
        "codes": np.arange(2, dtype=np.int32),
    }
    with held_staging(tmp):
        prefix = str(tmp_path / "store" / "_staging" / "chunks" / "000000")
        save_arrays(prefix, arrays)
        arrays["codes"][0] = 7  # the held copy is the saved one
        got = load_arrays(prefix, list(arrays))
        for name, arr in arrays.items():
            assert got[name].dtype == arr.dtype, name
        assert got["codes"].tolist() == [0, 1] and got["ascii"].tolist() == ["u1", "item 22"]
        assert load_arrays(prefix, ["ascii"], staged=True)["ascii"].dtype == np.dtype("S7")
        got["halves"][0] = 9.0  # a reader's copy is its own
        assert load_rows(prefix, "halves", 0, 1).tolist() == [0.5]
        with pytest.raises(StoreError, match=f"^{prefix}.y.npy: staged array missing"):
            load_rows(prefix, "y", 0, 1)
        assert not tmp_path.joinpath("store").exists()
    with pytest.raises(FileNotFoundError):
        load_arrays(prefix, ["codes"])


def test_line_numbers_skip_blank_lines():
    rng = np.random.default_rng(1)
    for _ in range(300):
        data = b"".join(rng.choice([b"a", b" ", b"\n", b"\r", b"\t"], int(rng.integers(1, 12))))
        starts = [0] + [k + 1 for k, c in enumerate(data) if c == 10]
        lines = data.split(b"\n")
        expect = [
            n + 5
            for n, (s, line) in enumerate(zip(starts, lines, strict=True))
            if s < len(data) and line.strip(b" \t\r\x0b\x0c")
        ]
        np.testing.assert_array_equal(line_numbers(data, 5), expect, err_msg=repr(data))


def wait_or_fail(x: int, release: str) -> int:
    """A task: item 0 runs until the Dask event ``release`` is set, any other fails at once
    with an OSError."""
    if x:
        raise OSError("the disk went away")
    assert Event(release).wait(timeout=600), "never released"  # a hang guard only
    return 0


def test_a_failure_cancels_the_tasks_left_and_says_one_may_still_run(client, caplog):
    """A task's error (not an InputError) reaches the caller while another still runs (it
    waits for the test to release it): the runner cancels the rest and is no longer
    ``settled``; a failure after every task finished leaves it settled."""
    runner = Runner(client)
    release = Event("release-" + uuid.uuid4().hex, client=client)
    try:
        with caplog.at_level(logging.WARNING, logger="ordnmf_dask"):  # no progress: at once
            with pytest.raises(OSError, match="went away"):
                runner.map(wait_or_fail, [0, 1], release.name)
            assert not runner.settled
    finally:
        release.set()
    with caplog.at_level(logging.WARNING, logger="ordnmf_dask"):
        done = Runner(client)
        with pytest.raises(OSError, match="went away"):
            done.map(wait_or_fail, [1], release.name)
        assert done.settled


def test_a_task_submitted_and_not_yet_finished_leaves_the_runner_unsettled(client):
    """An interrupt may come between submitting tasks and gathering them (SIGTERM during a
    distributed ingest once left its staged files): the runner is not ``settled`` while a task
    it submitted runs, whether or not anyone gathers it, and is again once it finished."""
    runner = Runner(client)
    release = Event("release-" + uuid.uuid4().hex, client=client)
    try:
        (handle,) = runner.submit(wait_or_fail, [0], release.name)
        assert not runner.settled
    finally:
        release.set()
    assert handle.result(timeout=60) == 0
    assert runner.settled


def test_map_reduce_combines_each_pair_as_soon_as_it_is_done():
    calls = []

    def leaf(x: int) -> list[int]:
        calls.append(f"leaf {x}")
        return [x]

    def combine(a: list[int], b: list[int]) -> list[int]:
        calls.append("combine")
        return a + b

    assert Runner().map_reduce(leaf, [0, 1, 2, 3, 4], combine) == [0, 1, 2, 3, 4]
    assert calls == [
        "leaf 0",
        "leaf 1",
        "combine",
        "leaf 2",
        "leaf 3",
        "combine",
        "combine",
        "leaf 4",
        "combine",
    ]


def split_rows(seed: int, numeric_test_users: bool = False, dup: bool = True):
    """Random training and test rows (with repeated pairs, in training data only if ``dup``;
    none shared between the two); test users and items partly unknown to the training data.
    String user ids, the test's possibly all numeric (then its ids are integers, the
    training's strings)."""
    rng = np.random.default_rng(seed)
    users = np.array([f"u{k:03d}" for k in range(60)] + ["007", "7", "12"])
    u, i, v = rng.choice(users, 900), rng.integers(0, 50, 900), rng.integers(1, 6, 900)
    if not dup:
        first = np.sort(
            np.unique(np.char.add(np.char.add(u, "/"), i.astype(str)), return_index=True)[1]
        )
        u, i, v = u[first], i[first], v[first]
    t_users = (
        np.array(["7", "12", "8", "31"])
        if numeric_test_users
        else np.concatenate([users, ["u900", "u901", "8"]])
    )
    tu, ti, tv = rng.choice(t_users, 500), rng.integers(0, 60, 500), rng.integers(1, 6, 500)
    train_pairs = set(zip(u.tolist(), i.tolist(), strict=True))
    new = np.array([p not in train_pairs for p in zip(tu.tolist(), ti.tolist(), strict=True)])
    return (u, i, v), (tu[new], ti[new], tv[new])


def write_rows(path, rows, sep: str = ","):
    path.write_text("".join(f"{a}{sep}{b}{sep}{c}\n" for a, b, c in zip(*rows, strict=True)))
    return path


def write_split(tmp_path, seed: int, numeric_test_users: bool = False, dup: bool = True):
    """``split_rows`` as two training files and two test files (CSV and TSV)."""
    (u, i, v), (tu, ti, tv) = split_rows(seed, numeric_test_users, dup)
    train = [
        write_rows(tmp_path / "a.csv", (u[:500], i[:500], v[:500])),
        write_rows(tmp_path / "b.tsv", (u[500:], i[500:], v[500:]), "\t"),
    ]
    h = len(tu) // 2
    test = [
        write_rows(tmp_path / "t1.csv", (tu[:h], ti[:h], tv[:h])),
        write_rows(tmp_path / "t2.tsv", (tu[h:], ti[h:], tv[h:]), "\t"),
    ]
    return train, test


@pytest.mark.parametrize("numeric_test_users", [False, True])
def test_test_file_as_in_memory(tmp_path, numeric_test_users):
    """A test file: repeated test pairs merged, rows of unknown and of filtered-away users and
    items dropped, those not an interaction counted, with a validation subset; the same store
    as in memory, whatever the chunks and partitions."""
    train, test = write_split(tmp_path, 7, numeric_test_users)
    kw = dict(
        test=test,
        counts=[1, 3, 5, 8],
        duplicates="sum",
        min_count=4,
        seed=2,
        validation_fraction=0.25,
        nnz_per_block=150,
    )
    with pytest.warns(UserWarning, match="test rows dropped") as warned:
        both(tmp_path, train, chunk_bytes=900, rows_per_partition=120, **kw)
    dropped = [str(w.message) for w in warned if "test rows dropped" in str(w.message)]
    assert len(dropped) == 2 and len(set(dropped)) == 1  # once each way, the same count
    attrs = zarr.open_group(tmp_path / "ooc", mode="r").attrs
    assert attrs["split"] == "file" and attrs["test_unknown_dropped"] > 0
    assert attrs["test_not_interaction"] > 0 and attrs["nnz_test"] > 0
    assert attrs["nnz_validation"] > 0
    assert attrs["test_source"] == [str(p) for p in test]


def test_test_file_errors_as_in_memory(tmp_path):
    """Bad test files fail distributed with the in-memory message, naming file and line, and
    leave nothing behind."""
    train, test = write_split(tmp_path, 3, dup=False)
    lines = test[1].read_text().splitlines()
    a, b, c = next(line.split("\t") for line in lines if int(line.split("\t")[2]) >= 3)
    cases = {
        "value": [*lines[:9], "u001\t3\tmany", *lines[9:]],
        "overlap": [*lines[:20], train[1].read_text().splitlines()[40], *lines[20:]],
        "duplicate": [*lines[:50], f"{a}\t{b}\t2", *lines[50:]],
        "scale": [*lines[:50], f"{a}\t{b}\t58", *lines[50:]],  # 58 + c is off the scale
        "empty": [],
    }
    options = {"duplicate": {}, "scale": {"duplicates": "sum", "scale_max": 60}}
    for case, text in cases.items():
        test[1].write_text("".join(f"{line}\n" for line in text))
        kw = dict(test=test, **options.get(case, {"duplicates": "max"}))
        with pytest.raises(InputError) as mem:
            ingest(train, tmp_path / "s", **kw)
        with pytest.raises(InputError) as ooc:
            ingest_distributed(train, tmp_path / "s", chunk_bytes=400, rows_per_partition=60, **kw)
        assert str(ooc.value) == str(mem.value), case
        assert "t2.tsv" in str(mem.value), case
        assert not list(tmp_path.glob("s*")), case


def test_data_in_memory_as_one_chunk(tmp_path):
    """Distributed, a pandas DataFrame, a test set of arrays beside training files: the
    in-memory store (for data the client already holds, one chunk each)."""
    (u, i, v), (tu, ti, tv) = split_rows(4)
    train = write_rows(tmp_path / "train.csv", (u, i, v))
    frame = pd.DataFrame({"user": u, "item": i, "value": v})
    kw = dict(test=(tu, ti, tv), duplicates="max", min_count=2, nnz_per_block=300)
    with pytest.warns(UserWarning, match="test rows dropped"):
        both(tmp_path, train, rows_per_partition=100, **kw)
    with pytest.warns(UserWarning, match="test rows dropped"):
        ingest(frame, tmp_path / "mem-frame", **kw)
    with pytest.warns(UserWarning, match="test rows dropped"):
        ingest_distributed(frame, tmp_path / "ooc-frame", rows_per_partition=100, **kw)
    assert_same_store(tmp_path / "mem-frame", tmp_path / "ooc-frame")
    bad = tv.astype(float)
    bad[3] = np.nan
    with pytest.raises(InputError, match=r"^test arrays, row 3: value nan is not finite$"):
        ingest_distributed(frame, tmp_path / "x", test=(tu, ti, bad))
    assert not list(tmp_path.glob("x*"))


def test_test_file_on_cluster(tmp_path, client):
    train, test = write_split(tmp_path, 5)
    with pytest.warns(UserWarning, match="test rows dropped"):
        both(
            tmp_path,
            train,
            client,
            chunk_bytes=1500,
            rows_per_partition=200,
            test=test,
            duplicates="last",
            min_count=2,
            binarize=3,
            grid=(3, 2),
        )


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"ratings": "stars"}, "ratings must be"),
        ({"counts": [0, 5, 2]}, "count thresholds"),
        ({"binarize": float("nan")}, "binarize must be"),
        ({"ratings": "halfstar", "scale_max": 5}, "scale_max applies"),
        ({"scale_max": 300}, "integer rating scale"),
        ({"min_count": -1}, "min_count"),
        ({"filter_mode": "loose"}, "filter_mode"),
        ({"duplicates": "mean"}, "duplicates"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"validation_fraction": 1}, "validation"),
        ({"seed": -2}, "seed"),
        ({"nnz_per_block": 0}, "nnz_per_block"),
        ({"grid": (0, 2)}, "grid must be"),
        ({"delimiter": "|"}, "unknown delimiter"),
        ({"columns": (0, 0, 1)}, "columns must be"),
        ({"chunk_bytes": 0}, "^ingest: chunk_bytes must be an integer >= 1, got 0$"),
        (
            {"rows_per_partition": -3},
            "^ingest: rows_per_partition must be an integer >= 1, got -3$",
        ),
    ],
)
def test_every_option_checked_before_any_input_is_read(tmp_path, option, match):
    """Missing input and test files: a wrong option is what both paths report."""
    missing = dict(test=tmp_path / "missing-test.csv")
    with pytest.raises(InputError, match=match):
        ingest_distributed(tmp_path / "missing.csv", tmp_path / "s", **missing, **option)
    if not {"chunk_bytes", "rows_per_partition"} & set(option):
        with pytest.raises(InputError, match=match):
            ingest(tmp_path / "missing.csv", tmp_path / "s", **missing, **option)


def frames(seed: int):
    """``split_rows`` as pandas DataFrames (training with one null-free extra column)."""
    (u, i, v), (tu, ti, tv) = split_rows(seed)
    train = pd.DataFrame({"x": np.arange(len(u)), "user": u, "item": i, "rating": v.astype(float)})
    return train, pd.DataFrame({"user": tu, "item": ti, "rating": tv.astype(float)})


def test_dask_dataframe_partitions_are_chunks(tmp_path, client, monkeypatch):
    """On a cluster, a dask DataFrame (some partitions empty) with a dask DataFrame test set:
    the store of the pandas DataFrames in memory, bit for bit, nothing staged as Parquet."""
    import dask.dataframe as dd

    train, test = frames(11)
    kw = dict(
        columns=("user", "item", "rating"),
        counts=[1, 3, 5, 8],
        duplicates="max",
        min_count=3,
        validation_fraction=0.2,
        nnz_per_block=200,
    )
    d_train = dd.from_pandas(train, npartitions=5)
    d_train = d_train[(d_train.x < 300) | (d_train.x >= 500)]  # partition 2 is empty
    d_test = dd.from_pandas(test, npartitions=3)
    train = train[(train.x < 300) | (train.x >= 500)]
    with pytest.warns(UserWarning, match="test rows dropped"):
        ingest(train, tmp_path / "mem", test=test, **kw)

    def no_parquet(*args, **kwargs):
        raise AssertionError("a dask DataFrame was written to Parquet")

    monkeypatch.setattr(type(d_train), "to_parquet", no_parquet)
    with pytest.warns(UserWarning, match="test rows dropped"):
        ingest_distributed(
            d_train, tmp_path / "ooc", test=d_test, client=client, rows_per_partition=150, **kw
        )
    assert_same_store(tmp_path / "mem", tmp_path / "ooc")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mem", "ooc"]


def test_dask_dataframe_errors_name_partition_and_row(tmp_path):
    import dask.dataframe as dd

    clean, test = frames(12)
    train = clean.copy()
    train.loc[[260, 500], "user"] = [None, " "]  # partitions of 225 rows
    frame = dd.from_pandas(train, npartitions=4)
    with pytest.raises(InputError, match=r"^input DataFrame, partition 1, row 35: null user id$"):
        ingest(frame, tmp_path / "s")  # the columns told by name, "x" left out
    with pytest.raises(InputError, match=r"^input DataFrame: no column 'u'"):
        ingest(frame, tmp_path / "s", columns=("u", "item", "rating"))
    test.loc[7, "rating"] = -1.0
    with pytest.raises(InputError, match=r"^test DataFrame, partition 0, row 7: count -1"):
        ingest_distributed(
            dd.from_pandas(clean, npartitions=3),
            tmp_path / "s",
            columns=("user", "item", "rating"),
            test=dd.from_pandas(test, npartitions=2),
            counts="paper",
        )
    assert not list(tmp_path.glob("s*"))


def test_a_dask_dataframe_test_set_beside_data_in_memory(tmp_path):
    """``ingest`` of a pandas DataFrame with a dask DataFrame test set: the store of the two
    pandas DataFrames (the test set is read partition by partition, not taken for files)."""
    import dask.dataframe as dd

    train, test = frames(13)
    kw = dict(columns=("user", "item", "rating"), duplicates="max", min_count=2)
    with pytest.warns(UserWarning, match="test rows dropped"):
        ingest(train, tmp_path / "mem", test=test, **kw)
    with pytest.warns(UserWarning, match="test rows dropped"):
        ingest(train, tmp_path / "dask", test=dd.from_pandas(test, npartitions=3), **kw)
    assert_same_store(tmp_path / "mem", tmp_path / "dask")
