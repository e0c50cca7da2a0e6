"""The rule of every input (docs/design.md, "Safety rules", "Inputs"): every file a command
reads besides a store or model goes through one opener (``sources/infile.py``), which refuses
at once, naming the path, anything but a regular file (a FIFO, a device, a socket, also behind
a link), and bounds the size of the small files (job files) before parsing; what is read is
checked before any allocation, ids stay text, and an error names the file and line."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import time
from pathlib import Path

import pytest
from conftest import ZARR_CODEC_WARNING

from ordnmf_dask.app.cli import main
from ordnmf_dask.app.exits import JOB_INPUTS, JOB_OUTPUTS
from ordnmf_dask.errors import InputError
from ordnmf_dask.sources.infile import open_input_file, read_input_bytes


def run_cli(args: list[str]) -> tuple[int, list[str]]:
    """main(args) in this process: its exit code and the lines of its stderr (but zarr's
    warning about its own string codec)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([*args, "-q"])
    return code, [ln for ln in err.getvalue().splitlines() if ZARR_CODEC_WARNING not in ln]


def one_line_error(args: list[str], *expected: str) -> str:
    code, err = run_cli(args)
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    for text in expected:
        assert text in err[0], err
    return err[0]


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_the_opener_refuses_fifos_devices_sockets_and_links_to_them(tmp_path, fifo):
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    link = tmp_path / "link"
    link.symlink_to(fifo)
    try:
        for path, kind in [
            (fifo, "a FIFO"),
            (link, "a FIFO"),
            ("/dev/zero", "a character device"),
            (sock_path, "a socket"),
        ]:
            with pytest.raises(InputError, match=f"{path}: is {kind}, not a regular file"):
                open_input_file(str(path), "pairs file")
    finally:
        sock.close()
    with pytest.raises(InputError, match="is a directory, not a file"):
        open_input_file(str(tmp_path))
    with pytest.raises(InputError, match="no such file"):
        open_input_file(str(tmp_path / "absent"))
    regular = tmp_path / "r.txt"
    regular.write_bytes(b"x" * 11)
    (tmp_path / "to-regular").symlink_to(regular)  # a link to a regular file is followed
    assert read_input_bytes(str(tmp_path / "to-regular"), "job file", limit=11) == b"x" * 11
    with pytest.raises(InputError, match="11 bytes, more than the 10 bytes job files may hold"):
        read_input_bytes(str(regular), "job file", limit=10)


@pytest.mark.parametrize("source", ["fifo", "/dev/zero"])
def test_special_files_as_inputs_are_refused_at_once(tmp_path, fifo, source):
    path = str(fifo) if source == "fifo" else source
    one_line_error(["ingest", path, "--out", str(tmp_path / "s")], path, "not a regular file")
    assert not (tmp_path / "s").exists()
    one_line_error(
        ["fit", "--n-members", "1", path, "--out", str(tmp_path / "m"), "--config", path],
        path,
        "not a regular file",
    )


@pytest.mark.parametrize("nest", ["[", "{a="])
def test_a_job_file_nested_100000_deep_is_one_line(tmp_path, nest):
    close = "]" if nest == "[" else "}"
    job = tmp_path / "job.toml"
    job.write_text("x = " + nest * 100_000 + close * 100_000 + "\n")
    one_line_error(
        [
            "fit",
            "--n-members",
            "1",
            str(tmp_path / "r.csv"),
            "--out",
            str(tmp_path / "m"),
            "--config",
            str(job),
        ],
        f"{job}: not a valid TOML file (arrays or tables nested too deeply)",
    )


def test_a_lock_naming_an_impossible_pid_is_stale(tmp_path):
    from ordnmf_dask.store import writelock

    out = tmp_path / "m.zarr"
    lock = tmp_path / "m.zarr.lock"
    for pid in (2**70, 2**31):
        lock.write_text(
            json.dumps({"kind": writelock.LOCK_KIND, "host": socket.gethostname(), "pid": pid})
        )
        with writelock.held(out):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
    lock.write_text("[" * 100_000)  # not ours, not readable: refused, not a RecursionError
    with pytest.raises(InputError, match="being written by another process"):
        with writelock.held(out):
            pass


@pytest.fixture(scope="module")
def id_model(tmp_path_factory) -> Path:
    """A K = 2 model of users ``007``, ``7``, ``x``, ``y``, ``z`` (text ids, two of them
    differing only by leading zeros)."""
    where = tmp_path_factory.mktemp("ids")
    rows = [
        f"{u},i{i},{1 + (i + j) % 3}"
        for j, u in enumerate(["007", "7", "x", "y", "z"])
        for i in range(6)
    ]
    (where / "r.csv").write_text("\n".join(rows) + "\n")
    for args in (
        ["ingest", str(where / "r.csv"), "--out", str(where / "s"), "--test-fraction", "0"],
        [
            "fit",
            "--n-members",
            "1",
            str(where / "s"),
            "-k",
            "2",
            "--max-iter",
            "2",
            "--executor",
            "inprocess",
        ],
    ):
        assert run_cli([*args, *(["--out", str(where / "m")] if args[0] == "fit" else [])])[0] == 0
    return where / "m"


def test_pairs_file_ids_stay_text_as_on_the_command_line(id_model, tmp_path, capsys):
    pairs = tmp_path / "p.csv"
    pairs.write_text("user,item\n007,i1\n7,i1\n")
    assert main(["score", str(id_model), "--pairs", str(pairs)]) == 0
    from_file = capsys.readouterr().out
    assert main(["score", str(id_model), "--users", "007,7", "--items", "i1,i1"]) == 0
    assert from_file == capsys.readouterr().out
    assert [line.split("\t")[0] for line in from_file.splitlines()] == ["user", "007", "7"]


def test_a_missing_id_in_a_pairs_file_names_file_and_line(id_model, tmp_path, fifo):
    pairs = tmp_path / "p.csv"
    pairs.write_text("user,item\n007,i1\n,i2\n")
    one_line_error(["score", str(id_model), "--pairs", str(pairs)], f"{pairs}, line 3: no id")
    one_line_error(["score", str(id_model), "--pairs", str(fifo)], str(fifo), "a FIFO")


def test_a_pairs_file_is_scored_in_batches_every_id_checked_before_a_line_is_written(
    id_model, tmp_path, capsys, monkeypatch
):
    """``score --pairs`` reads its file a block at a time (here a few lines), scores what the
    same pairs on the command line score, and refuses an unknown id on the last line naming it
    before anything is printed."""
    from ordnmf_dask.app import pairsfile

    monkeypatch.setattr(pairsfile, "BLOCK_BYTES", 64)
    monkeypatch.setattr(pairsfile, "BATCH_ROWS", 7)
    users = ["007", "7", "x", "y", "z"] * 20
    items = [f"i{j % 6}" for j in range(len(users))]
    text = tmp_path / "p.csv"
    text.write_text(
        "user,item\n" + "".join(f"{u},{i}\n" for u, i in zip(users, items, strict=True))
    )
    assert (
        main(["score", str(id_model), "--users", ",".join(users), "--items", ",".join(items)]) == 0
    )
    given = capsys.readouterr().out
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.table({"user": users, "item": items}), parquet)
    for path in (text, parquet):
        assert main(["score", str(id_model), "--pairs", str(path)]) == 0
        assert capsys.readouterr().out == given
    with text.open("a") as fh:
        fh.write("7,i9\n")
    one_line_error(
        ["score", str(id_model), "--pairs", str(text)], f"{text}, line 102: unknown item id 'i9'"
    )
    assert capsys.readouterr().out == ""


def test_score_pairs_streams_under_an_address_space_limit(id_model, tmp_path):
    """2 million pairs scored under a 1.5 GiB address-space limit (``ulimit -v``): the memory
    the command takes is bounded by its batches, not by the file (it took 1.1 GB of resident
    memory for 10^6 pairs, and a MemoryError under such a limit, when read whole)."""
    import resource
    import subprocess

    from conftest import CLI
    from test_safety_signals import limited

    pairs = tmp_path / "big.csv"
    n = 2_000_000
    with pairs.open("w") as fh:
        fh.write("user,item\n")
        users = ["007", "7", "x", "y", "z"]
        fh.writelines(f"{users[k % 5]},i{k % 6}\n" for k in range(n))
    with (tmp_path / "scores.tsv").open("w") as out:
        r = subprocess.run(
            [*CLI, "score", str(id_model), "--pairs", str(pairs), "-q"],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
            preexec_fn=limited(resource.RLIMIT_AS, int(1.5 * (1 << 30))),
        )
    assert r.returncode == 0, r.stderr
    with (tmp_path / "scores.tsv").open() as fh:
        assert sum(1 for _ in fh) == n + 1


def test_an_npz_header_claiming_10_12_rows_is_refused_before_any_allocation(
    id_model, tmp_path, fifo
):
    import zipfile

    import numpy as np

    store = id_model.parent / "s"
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w") as zf:
        for name in ("W", "H"):
            head = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                head, {"descr": "<f8", "fortran_order": False, "shape": (10**12, 2)}
            )
            zf.writestr(f"{name}.npy", head.getvalue() + b"\0" * 64)
    args = [
        "fit",
        "--n-members",
        "1",
        str(store),
        "-k",
        "2",
        "--max-iter",
        "1",
        "--executor",
        "inprocess",
    ]
    one_line_error(
        [*args, "--out", str(tmp_path / "m"), "--init", str(bomb)],
        f"{bomb}: array W has shape (1000000000000, 2), expected",
    )
    one_line_error([*args, "--out", str(tmp_path / "m"), "--init", str(fifo)], "a FIFO")
    assert not (tmp_path / "m").exists()


def test_two_dimensional_id_arrays_are_named(id_model):
    import numpy as np

    from ordnmf_dask import OrdNMF

    model = OrdNMF.load(id_model)
    users, items = np.array([["007", "7"]]), np.array([["i1", "i2"]])
    with pytest.raises(ValueError, match=r"user_ids must be one-dimensional, got shape \(1, 2\)"):
        model.predict_proba(users, items)
    with pytest.raises(ValueError, match=r"item_ids must be one-dimensional"):
        model.predict_proba(["007"], [["i1"]])
    assert model.predict_proba(["007", "7"], ["i1", "i1"]).shape[0] == 2


def test_fold_in_file_errors_name_the_file_line_and_raw_ids(id_model, tmp_path, fifo):
    unknown = tmp_path / "f1.csv"
    unknown.write_text("new1,i1,2\nnew1,i2,3\nnew2,i9,1\n")
    one_line_error(["fold-in", str(id_model), str(unknown)], f"{unknown}, line 3:", "'i9'")
    twice = tmp_path / "f2.csv"
    twice.write_text("new1,i1,2\nnew2,i2,3\nnew1,i1,1\n")
    one_line_error(
        ["fold-in", str(id_model), str(twice)],
        f"{twice}, line 3: user 'new1' rates item 'i1' twice",
    )
    one_line_error(["fold-in", str(id_model), str(fifo)], str(fifo), "a FIFO")
    for rows, expected in [
        ("new1,i1,2\nnew2,i2,-3\n", "line 2 (user 'new2', item 'i2'): rating -3 is off the"),
        ("new1,i1,2\nnew1,i2,2.5\n", "line 2 (user 'new1', item 'i2'): rating 2.5 is off the"),
        ("new1,i1,2\n  ,i2,3\n", "line 2: no user id (item 'i2')"),
    ]:
        bad = tmp_path / "f3.csv"
        bad.write_text(rows)
        one_line_error(["fold-in", str(id_model), str(bad)], f"{bad}, {expected}")


def _substitute(kind: str, where: Path, fifo: Path) -> Path:
    """A hostile file of ``kind`` at a new path under ``where``."""
    path = where / f"{kind}-{len(list(where.iterdir()))}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "link-to-fifo":
        path.symlink_to(fifo)
    elif kind == "deep":
        path.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    else:  # a directory
        path.mkdir()
    return path


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("hostile")
    fifo = where / "the-fifo"
    os.mkfifo(fifo)
    return where, fifo


def test_every_input_option_refuses_hostile_files_at_once_and_writes_nothing(id_model, hostile_dir):
    import signal
    import time

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    model, store = str(id_model), str(id_model.parent / "s")
    ratings = str(id_model.parent / "r.csv")
    synth_args = ["--users", "5", "--items", "5", "--nnz", "10", "-k", "2"]

    def synth(out: str) -> list[str]:
        return ["synth", "--out", out, *synth_args]

    options = {
        "ingest": lambda p, out: ["ingest", p, "--out", out],
        "fit --config": lambda p, out: [
            "fit",
            "--n-members",
            "1",
            store,
            "-k",
            "2",
            "--config",
            p,
            "--out",
            out,
        ],
        "fit --init": lambda p, out: [
            "fit",
            "--n-members",
            "1",
            store,
            "-k",
            "2",
            "--init",
            p,
            "--out",
            out,
        ],
        "score --pairs": lambda p, out: ["score", model, "--pairs", p],
        "fold-in": lambda p, out: ["fold-in", model, p],
        "predict --pairs": lambda p, out: ["predict", store, model, "--pairs", p, "--out", out],
        # a job file the command uses none of (ingest without --distributed) is read all the same
        "ingest --config": lambda p, out: ["ingest", ratings, "--out", out, "--config", p],
        "recommend --users-from": lambda p, out: ["recommend", model, "--users-from", p],
        "similar-items --items-from": lambda p, out: ["similar-items", model, "--items-from", p],
        "synth --scheduler-file": lambda p, out: [*synth(out), "--scheduler-file", p],
        "synth --tls-ca-file": lambda p, out: [
            *synth(out),
            "--scheduler",
            "tls://127.0.0.1:1",
            *("--tls-ca-file", p, "--tls-cert", p, "--tls-key", p),
        ],
    }
    where, fifo = hostile_dir

    def timeout(*_: object) -> None:
        raise TimeoutError("an input was waited on")

    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.sampled_from(sorted(options)),
        st.sampled_from(["fifo", "device", "link-to-fifo", "deep", "directory"]),
    )
    def check(option: str, kind: str) -> None:
        path = _substitute(kind, where, fifo)
        out = where / f"out-{path.name}"
        before = sorted(os.listdir(where))
        previous = signal.signal(signal.SIGALRM, timeout)
        signal.alarm(30)
        start = time.monotonic()
        try:
            code, err = run_cli(options[option](str(path), str(out)))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        assert time.monotonic() - start < 30
        assert code == 2 and len(err) == 1 and "Traceback" not in err[0], (option, kind, err)
        assert sorted(os.listdir(where)) == before and not out.exists(), (option, kind)

    check()


def test_a_pairs_file_whose_header_is_not_utf8_is_named(id_model, tmp_path):
    pairs = tmp_path / "p.csv"
    pairs.write_bytes(b"us\xffer,item\n007,i1\n")
    one_line_error(
        ["score", str(id_model), "--pairs", str(pairs)], f"{pairs}, line 1: the header is not UTF-8"
    )


def _parquet_bombs(where: Path) -> dict[str, tuple[Path, str]]:
    """Parquet files whose footer lies, each with what its refusal says: metadata claimed
    longer than the file (2^31 - 1 bytes), a row group claiming 2^50 bytes uncompressed (its
    thrift field rewritten), and a file without the ``PAR1`` footer."""
    import struct

    import pyarrow as pa
    import pyarrow.parquet as pq

    def varint(n: int) -> bytes:
        out = b""
        while n > 0x7F:
            out, n = out + bytes([(n & 0x7F) | 0x80]), n >> 7
        return out + bytes([n])

    good = where / "good.parquet"
    pq.write_table(pa.table({"user": ["007", "7"], "item": ["i1", "i2"], "v": [1, 2]}), good)
    data = good.read_bytes()
    length = struct.unpack("<I", data[-8:-4])[0]
    footer = data[-8 - length : -8]
    size = pq.ParquetFile(good).metadata.row_group(0).total_byte_size
    field = b"\x16" + varint(size << 1)  # RowGroup.total_byte_size: field 2, i64, zigzag
    assert footer.count(field) == 1
    huge = footer.replace(field, b"\x16" + varint(2**50 << 1))
    bombs = {
        "long-footer": (data[:-8] + struct.pack("<I", 2**31 - 1) + b"PAR1", "claims 2147483647"),
        "huge-row-group": (
            data[: -8 - length] + huge + struct.pack("<I", len(huge)) + b"PAR1",
            "row group 0: claims 1.02e+03 TiB uncompressed, more than the",
        ),
        "no-footer": (
            b"user,item\n007,i1\n",
            "not a readable Parquet file (no PAR1 footer at its end)",
        ),
    }
    out = {}
    for name, (content, says) in bombs.items():
        (where / f"{name}.parquet").write_bytes(content)
        out[name] = (where / f"{name}.parquet", says)
    return out


@pytest.mark.parametrize("bomb", ["long-footer", "huge-row-group", "no-footer"])
def test_a_parquet_footer_that_lies_is_refused_before_pyarrow_allocates(id_model, tmp_path, bomb):
    """Every Parquet input (ingest, fold-in, score and predict pairs) is opened by
    ``infile.open_parquet`` and its row groups checked by ``infile.check_row_groups``."""
    path, says = _parquet_bombs(tmp_path)[bomb]
    model, store, out = str(id_model), str(id_model.parent / "s"), str(tmp_path / "out")
    for args in (
        ["ingest", str(path), "--out", out],
        ["fold-in", model, str(path)],
        ["score", model, "--pairs", str(path)],
        ["predict", store, model, "--pairs", str(path), "--out", out],
    ):
        one_line_error(args, str(path), says)
    assert not (tmp_path / "out").exists()


def test_an_empty_fold_in_history_is_named_by_its_raw_id(id_model, tmp_path):
    """A new user whose ratings all fall below a BePoF model's threshold has no interaction
    left: the warning names it as the file does (``'low'``), not by its position."""
    store, model = str(id_model.parent / "s"), str(tmp_path / "bepof")
    fit = ["fit", "--n-members", "1", store, "--model", "bepof", "--threshold", "3", "-k", "2"]
    assert run_cli([*fit, "--max-iter", "2", "--executor", "inprocess", "--out", model])[0] == 0
    ratings = tmp_path / "f.csv"
    ratings.write_text("high,i1,3\nlow,i1,1\nlow,i2,2\n")
    code, err = run_cli(["fold-in", model, str(ratings)])
    assert code == 0 and len(err) == 1, err
    assert "fold-in: 1 new users without any interaction ('low')" in err[0], err


def test_a_zarr_json_too_big_to_be_metadata_is_refused_before_zarr_reads_it(id_model, tmp_path):
    """A model's or a store's ``zarr.json`` grown to 65 MiB (sparse: no disk used) is refused
    from its size by the scan of the tree (``locations.check_tree``), never read whole."""
    import shutil

    from ordnmf_dask.store.locations import META_BYTES

    for source in (id_model, id_model.parent / "s"):
        copy = Path(shutil.copytree(source, tmp_path / source.name))
        with (copy / "zarr.json").open("r+b") as fh:
            fh.truncate(META_BYTES + 1)
        one_line_error(["info", str(copy)], f"{copy / 'zarr.json'}: {META_BYTES + 1} bytes of")


def test_an_id_file_is_read_as_the_ratings_readers_read_text(id_model, tmp_path, capsys):
    """A leading byte-order mark is dropped (ingest drops it: ``007`` is found), and lines are
    split at newlines only, so a form feed inside an id stays in it and the line is named."""
    ids = tmp_path / "u.txt"
    ids.write_bytes(b"\xef\xbb\xbf007\n7\n")
    assert main(["similar-users", str(id_model), "--users-from", str(ids), "-n", "1"]) == 0
    assert [ln.split("\t")[0] for ln in capsys.readouterr().out.splitlines()] == [
        "user",
        "007",
        "7",
    ]
    ids.write_bytes(b"007\nx\x0cy\n")
    one_line_error(
        ["recommend", str(id_model), "--users-from", str(ids)], f"{ids}, line 2: unknown user id"
    )


def test_an_id_file_is_bounded_before_it_is_read(id_model, tmp_path, monkeypatch):
    """An id file (``--users-from``, ``--items-from``) larger than ``ID_FILE`` is refused from
    its size, before a byte is read (a sparse file of 1 TiB here), and standard input is read
    at most that far (``< /dev/zero`` ends): one line naming the file, exit 2."""
    import io

    from ordnmf_dask.sources.infile import ID_FILE

    huge = tmp_path / "u.txt"
    with huge.open("wb") as fh:
        fh.truncate(1 << 40)
    one_line_error(
        ["recommend", str(id_model), "--users-from", str(huge)],
        f"{huge}: {1 << 40} bytes, more than the {ID_FILE} bytes user id files may hold",
    )
    with open("/dev/zero", "rb") as zero:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(zero))
        one_line_error(
            ["similar-items", str(id_model), "--items-from", "-"],
            f"standard input: more than the {ID_FILE} bytes item id files may hold",
        )


@pytest.mark.parametrize("kind", ["fifo", "device", "file"])
def test_a_store_or_model_that_is_not_a_directory_is_named_as_what_it_is(
    id_model, tmp_path, fifo, kind
):
    """A store or model argument that is a FIFO, a device or a file (never opened, never
    waited on): one line saying what it is, for each command's store and model."""
    path = {"fifo": fifo, "device": Path("/dev/zero"), "file": tmp_path / "f"}[kind]
    if kind == "file":
        path.write_text("x")
    what = {"fifo": "a FIFO", "device": "a character device", "file": "a file"}[kind]
    model, store = str(id_model), str(id_model.parent / "s")
    for args, role in [
        (["info", str(path)], "store"),
        (["evaluate", str(path), model], "store"),
        (["recommend", str(path), "--users", "x"], "model"),
        (["export", str(path), "--out", str(tmp_path / "e")], "model"),
        (
            ["fit", store, "-k", "2", "--init-model", str(path), "--out", str(tmp_path / "m")],
            "model",
        ),
    ]:
        one_line_error(args, f"{path}: is {what}, not a {role} (a {role} is a directory)")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["fifo", *(["f"] if kind == "file" else [])]
    )


def test_a_text_file_of_zeros_or_too_big_to_read_whole_is_refused_at_once(id_model, tmp_path):
    """A sparse file of 1 TiB of zero bytes (no line end: its first line was looked for in
    ever larger reads, 21 GB held before MemoryError) is refused after its first
    ``HEAD_LIMIT`` bytes; one whose first row is fine but which fold-in must read whole is
    refused from its size, before a byte more is read."""
    from ordnmf_dask.sources.text import HEAD_LIMIT

    zeros, big = tmp_path / "zeros.csv", tmp_path / "big.csv"
    with zeros.open("wb") as fh:
        fh.truncate(1 << 40)
    with big.open("wb") as fh:
        fh.write(b"new,i1,2\n")
        fh.truncate(1 << 40)
    for command in (["fold-in", str(id_model)], ["ingest", "--out", str(tmp_path / "s")]):
        one_line_error(
            [*command, str(zeros)],
            f"{zeros}: no complete non-blank line in its first {HEAD_LIMIT} bytes",
        )
    one_line_error(["fold-in", str(id_model), str(big)], f"{big}: 1 TiB of text to read whole")
    assert not (tmp_path / "s").exists()


def test_a_megabyte_long_id_is_shown_cut_in_its_one_line(id_model, tmp_path):
    """An id of a million characters (a line of NUL bytes, a line of letters) is named in its
    message by its first characters and its length (errors.shown), not printed whole: the
    line stays one a person can read, and still names the file and line."""
    for name, text in [("nul.txt", "\0" * (1 << 20)), ("long.txt", "b" * (1 << 20))]:
        ids = tmp_path / name
        ids.write_text(text + "\n")
        line = one_line_error(
            ["recommend", str(id_model), "--users-from", str(ids)],
            f"{ids}, line 1: unknown user id ",
            f"... ({1 << 20} characters)",
        )
        assert len(line) < 400, len(line)
    code, err = run_cli(["recommend", str(id_model), "--users", "c" * 100_000])
    assert code == 2 and len(err[0]) < 400 and "(100000 characters)" in err[0], err


@pytest.mark.parametrize("key", [*JOB_OUTPUTS, *JOB_INPUTS])
@pytest.mark.parametrize("value", ["", "a\\u0000b"])
def test_a_job_file_path_that_names_no_file_is_refused_naming_it(id_model, tmp_path, key, value):
    """A TOML string can hold a NUL character, and an empty path is the current directory to
    the OS: either, as any path of a job file, is refused in one line (exit 2) naming the file
    and the key and saying so (locations.named), never an internal error, and nothing is
    written."""
    section, leaf = key.split(".")
    job = tmp_path / "job.toml"
    job.write_text(f'[{section}]\n{leaf} = "{value}"\n')
    store = str(id_model.parent / "s")
    problem = "an empty path" if not value else "a path with a NUL character"
    args = ["fit", "--n-members", "1", store, "-k", "2", "--out", str(tmp_path / "m")]
    one_line_error(
        [*args, "--config", str(job)],
        f"{job}: key '{leaf}' in [{section}]",
        f"{problem} names no file",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml"]


def test_an_empty_path_given_as_a_flag_is_refused_naming_the_flag(id_model, tmp_path):
    store = str(id_model.parent / "s")
    one_line_error(["evaluate", store, str(id_model), "--json", ""], "--json '': an empty path")
    one_line_error(["fit", "", "-k", "2", "--out", str(tmp_path / "m")], "'': an empty path")
    one_line_error(["score", str(id_model), "--pairs", ""], "'': an empty path names no file")
    assert not list(tmp_path.iterdir())


def test_fold_in_new_user_ids_obey_ingests_rule_of_printable_text(id_model, tmp_path):
    """A new user's id is echoed in fold-in's table: a newline or NUL in it (a Parquet
    string can hold either) would break the table, so it is refused as ingest refuses it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "f.parquet"
    pq.write_table(pa.table({"user": ["a\nb", "ok"], "item": ["i1", "i2"], "r": [2, 3]}), bad)
    one_line_error(
        ["fold-in", str(id_model), str(bad)],
        f"{bad}, row 0 (row group 0): user id 'a\\nb' contains the control character U+000A",
    )


def test_a_pairs_file_with_two_columns_of_one_name_is_refused_naming_them(id_model, tmp_path):
    pairs = tmp_path / "p.csv"
    pairs.write_text("user,user,item\n007,7,i1\n")
    one_line_error(
        ["score", str(id_model), "--pairs", str(pairs)],
        f"{pairs}: 2 columns named 'user' (columns: user, user, item)",
    )


def test_a_scheduler_file_that_is_a_loop_of_links_is_refused_at_once(tmp_path):
    """A scheduler file not yet there is waited for (the scheduler may still be starting);
    a loop of symbolic links can never become one, so it is refused at once, naming it,
    rather than after the connect timeout."""
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    start = time.monotonic()
    one_line_error(
        [
            *("synth", "--out", str(tmp_path / "s"), "--users", "5", "--items", "5"),
            *("--nnz", "10", "-k", "2", "--scheduler-file", str(tmp_path / "a.json")),
        ],
        f"scheduler file {tmp_path / 'a.json'}: a loop of symbolic links",
    )
    assert time.monotonic() - start < 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]


@pytest.mark.parametrize("key", ["engine.work_dir", "checkpoint.dir"])
def test_a_directory_output_that_is_a_dangling_link_is_refused_naming_it(id_model, tmp_path, key):
    """A work or checkpoint directory given as a link to nothing cannot be made ("File
    exists" from the OS): it is refused before any work, naming the link and its target, and
    the missing target is not created."""
    section, leaf = key.split(".")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    job = tmp_path / "job.toml"
    job.write_text(f'[{section}]\n{leaf} = "{link}"\n')
    store = str(id_model.parent / "s")
    args = ["fit", "--n-members", "1", store, "-k", "2", "--out", str(tmp_path / "m")]
    one_line_error(
        [*args, "--config", str(job)],
        f"{link}: a symbolic link to {tmp_path / 'nowhere'}, which does not exist",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.toml", "link"]
