"""The CLI's error promise: one line on stderr and the exit code of its table (2 for input and
local I/O, 3 for the cluster), whatever fails and wherever (here or in a worker process); and
main() leaves logging as it found it."""

from __future__ import annotations

import logging
import pickle
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import CLI, dense_split, store_from_dense, synthetic_ordinal
from distributed import Client

from ordnmf_dask import OrdNMF
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError

CSV = "".join(f"{u},{i},{1 + (u * i) % 5}\n" for u in range(12) for i in range(10) if (u + i) % 3)


@pytest.fixture(scope="module")
def cluster_fit(tmp_path_factory, cluster) -> tuple[str, str, str]:
    """A store, a model fitted on it, and the address of the session's cluster."""
    d = tmp_path_factory.mktemp("fitted")
    store = store_from_dense(
        d / "s.zarr", *dense_split(synthetic_ordinal(20, 15, 3, seed=2)), 3, (1, 1)
    )
    with Client(cluster) as client:
        OrdNMF(2, max_iter=2, n_members=1).fit(store, client, out=d / "m.zarr")
    return store.path, str(d / "m.zarr"), cluster.scheduler_address


def one_error_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str]:
    """Run main(args) with -q: its exit code and its stderr, which must be one line."""
    code = main([*args, "-q"])
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ordnmf-dask {args[0]}: error: ")
    return code, lines[0]


def test_main_leaves_logging_and_sigint_as_it_found_them(cluster_fit, tmp_path, capsys):
    store, _, _ = cluster_fit
    loggers = [
        logging.getLogger(n)
        for n in ("ordnmf_dask", "distributed", "asyncio", "distributed.client")
    ]
    before = [(list(g.handlers), g.level, g.propagate) for g in loggers]
    sigint = signal.getsignal(signal.SIGINT)
    assert main(["info", store, "--log-file", str(tmp_path / "x.log")]) == 0
    assert [(list(g.handlers), g.level, g.propagate) for g in loggers] == before
    assert signal.getsignal(signal.SIGINT) is sigint


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("adir", "it is a directory, not a regular file"),
        ("afile/r.json", "afile is not a directory"),
        ("/dev/full", "No space left on device"),
    ],
)
def test_unwritable_local_output_exits_2_naming_it(cluster_fit, tmp_path, capsys, target, reason):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    target = target if target.startswith("/") else str(tmp_path / target)
    store, model, address = cluster_fit
    code, line = one_error_line(
        capsys, ["evaluate", store, model, "--json", target, "--scheduler", address]
    )
    assert code == 2 and target in line and reason in line and "cluster" not in line


def test_ingest_into_a_directory_we_may_not_write_exits_2(tmp_path, capsys):
    (tmp_path / "r.csv").write_text(CSV)
    out = "/sys/ordnmf-dask-test.zarr"  # sysfs: nobody, root included, may create files there
    code, line = one_error_line(capsys, ["ingest", str(tmp_path / "r.csv"), "--out", out])
    assert code == 2 and out in line
    assert "Operation not permitted" in line or "Permission denied" in line
    assert not Path(out).exists()


def test_non_utf8_config_exits_2_naming_the_file(cluster_fit, tmp_path, capsys):
    store, _, _ = cluster_fit
    job = tmp_path / "job.toml"
    job.write_bytes(b"[model]\nn_components = 2  # caf\xe9\n")
    code, line = one_error_line(
        capsys,
        ["fit", "--n-members", "1", store, "--out", str(tmp_path / "m.zarr"), "--config", str(job)],
    )
    assert code == 2 and str(job) in line and "UTF-8" in line
    assert not (tmp_path / "m.zarr").exists()


def test_levels_outside_the_classes_exit_2_naming_the_flag(cluster_fit, capsys):
    store, model, address = cluster_fit
    code, line = one_error_line(
        capsys, ["evaluate", store, model, "--levels", "0,11", "--scheduler", address]
    )
    assert code == 2 and "--levels" in line and "1..3" in line and "[0, 11]" in line


@pytest.mark.parametrize(
    ("flags", "spelled", "api"),
    [
        ([], "--overwrite", "overwrite="),
        (["--ratings", "integer", "--counts", "paper"], "--ratings", "ratings="),
        (
            ["--ratings", "halfstar", "--scale-max", "5"],
            "--scale-max applies to --ratings integer",
            "scale_max",
        ),
    ],
)
def test_messages_spell_flags_not_api_keywords(tmp_path, capsys, flags, spelled, api):
    (tmp_path / "r.csv").write_text(CSV)
    if not flags:  # an existing store, without --overwrite
        store_from_dense(tmp_path / "s.zarr", *dense_split(synthetic_ordinal(12, 10, 3)), 3, (1, 1))
    code, line = one_error_line(
        capsys, ["ingest", str(tmp_path / "r.csv"), "--out", str(tmp_path / "s.zarr"), *flags]
    )
    assert code == 2 and spelled in line and api not in line


@pytest.mark.parametrize("before", [True, False])
def test_quiet_keeps_info_in_the_log_file_and_global_flags_go_anywhere(
    cluster_fit, tmp_path, capsys, before
):
    store, _, address = cluster_fit
    log_file = tmp_path / "fit.log"
    quiet = ["-q", "--log-file", str(log_file)]
    fit = [
        "fit",
        "--n-members",
        "1",
        store,
        "--out",
        str(tmp_path / "m.zarr"),
        "-k",
        "2",
        "--max-iter",
        "3",
        "--scheduler",
        address,
    ]
    assert main(quiet + fit if before else fit + quiet) == 0
    assert capsys.readouterr().err == ""
    assert "iter    3" in log_file.read_text()


def test_debug_before_the_command_shows_the_traceback(tmp_path, capsys):
    assert main(["--debug", "info", str(tmp_path / "none.zarr")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("ordnmf-dask info: error: ")


@pytest.mark.cluster
def test_a_task_failing_on_the_cli_local_cluster_is_one_line(tmp_path):
    """A damaged chunk of the same size is found by the task that reads it, in a worker process
    of the LocalCluster the command starts: no worker log or traceback reaches stderr."""
    store = store_from_dense(
        tmp_path / "s.zarr", *dense_split(synthetic_ordinal(20, 15, 3)), 3, (1, 1)
    )
    chunk = Path(store.path) / "train" / "y" / "c" / "0"
    chunk.write_bytes(bytes(chunk.stat().st_size))
    r = subprocess.run(
        [
            *CLI,
            "fit",
            "--n-members",
            "1",
            store.path,
            "--out",
            str(tmp_path / "m.zarr"),
            "-k",
            "2",
            "--max-iter",
            "2",
            "--workers",
            "1",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ordnmf-dask fit: error: "), lines
    assert store.path in lines[0]


class LineError(InputError):
    """An input error whose constructor takes other arguments than its message."""

    def __init__(self, path: str, line: int) -> None:
        super().__init__(f"{path}, line {line}: not a number")
        self.line = line


def _fail_on_line_3(path: str) -> None:
    raise LineError(path, 3)


def test_an_input_error_raised_in_a_worker_keeps_its_class(client):
    """A worker sends a task's exception pickled, through tblib, whose older versions (distributed
    accepts tblib >= 1.6) rebuild it as its class called with its args: that fails for a class
    with its own __init__, and Dask then sends a plain Exception instead (exit 1, not 2)."""
    again = pickle.loads(pickle.dumps(LineError("r.csv", 3)))
    assert type(again) is LineError and str(again) == "r.csv, line 3: not a number"
    assert again.line == 3
    with pytest.raises(LineError, match=r"^r\.csv, line 3: not a number$") as info:
        client.submit(_fail_on_line_3, "r.csv").result()
    assert info.value.line == 3


def test_a_reader_that_goes_away_is_no_cluster_failure(tmp_path):
    """``ordnmf-dask info STORE | head -0``: the closed pipe ends the command quietly with 141
    (128 + SIGPIPE, as other tools report it), not exit 3 "cluster failure: Broken pipe"."""
    y = synthetic_ordinal(20, 15, 3, seed=2)
    store = store_from_dense(tmp_path / "s.zarr", *dense_split(y), 3, (1, 1)).path
    job = subprocess.Popen(
        [*CLI, "info", "--json", store], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert job.stdout is not None
    job.stdout.close()  # the reader is gone before the command writes
    _, err = job.communicate(timeout=120)
    assert job.returncode == 141, err
    assert err == b""


@pytest.mark.parametrize(
    "bad", [["--counts", "0,5,2"], ["--chunk-bytes", "0"], ["--test-fraction", "1.5"]]
)
def test_distributed_ingest_refuses_bad_options_before_any_cluster(tmp_path, capsys, bad):
    """Not marked ``cluster``: a scheduler started here fails the test (conftest)."""
    data = tmp_path / "r.csv"
    data.write_text(CSV)
    code, line = one_error_line(
        capsys, ["ingest", str(data), "--out", str(tmp_path / "s.zarr"), "--distributed", *bad]
    )
    assert code == 2, line
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("bad", [["--users", "0"], ["--classes", "300"]])
def test_synth_refuses_bad_parameters_before_any_cluster(tmp_path, capsys, bad):
    """Not marked ``cluster``: a scheduler started here fails the test (conftest)."""
    args = {"--users": "50", "--items": "40", "--nnz": "500", "-k": "2", "--classes": "5"}
    args.update(dict(zip(bad[::2], bad[1::2], strict=True)))
    code, line = one_error_line(
        capsys,
        ["synth", "--out", str(tmp_path / "s.zarr"), *[x for kv in args.items() for x in kv]],
    )
    assert code == 2, line
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (MemoryError(), "out of memory: the command needs more memory"),
        (RecursionError("maximum recursion depth exceeded"), "input nested too deeply"),
        (OverflowError("Python int too large to convert to C long"), "a number out of range"),
    ],
)
def test_a_libraries_error_on_what_it_reads_is_bad_input_not_a_bug(exc, said):
    """Errors numpy, pyarrow, tomllib or json raise on what they were given (memory, numbers
    or nesting past their range, a file pyarrow cannot parse) are exit 2 with one line; any
    other foreign error stays exit 1, an internal error."""
    import argparse

    import pyarrow as pa

    from ordnmf_dask.app.exits import EXIT_INPUT, EXIT_INTERNAL, exit_code

    args = argparse.Namespace()
    code, message = exit_code(exc, args)
    assert code == EXIT_INPUT and message.startswith(said) and "\n" not in message
    code, message = exit_code(pa.ArrowInvalid("CSV parse error: Expected 3 columns"), args)
    assert (code, message) == (
        EXIT_INPUT,
        "cannot read the input: CSV parse error: Expected 3 columns",
    )
    code, message = exit_code(KeyError("w"), args)
    assert code == EXIT_INTERNAL and message.startswith("internal error: KeyError")
