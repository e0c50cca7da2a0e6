"""The one rule of every output (docs/design.md, "Safety rules"; ``store/outputs.py``): every
path a command writes, whatever the flag or job-file key, is checked against every input and
every store or model before any work, through ``cli._check_outputs``. The options and keys are
enumerated from the parser and the job file's sections, so that a new one that writes
somewhere fails here until it is routed through the rule."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import typing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SMALL_CSV
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordnmf_dask import OrdNMF
from ordnmf_dask.app import config
from ordnmf_dask.app.cli import main
from ordnmf_dask.app.exits import (
    EXIT_INPUT,
    INPUT_FLAGS,
    JOB_INPUTS,
    JOB_OUTPUTS,
    OUTPUT_FLAGS,
)
from ordnmf_dask.app.parser import build_parser
from ordnmf_dask.errors import InputError
from ordnmf_dask.store import outputs

# the string options that name no path (those that name what a command reads are
# exits.INPUT_FLAGS: every output is kept apart from each)
# reproduce's --data: a directory of datasets it reads by name, which may hold its --out
INPUT_ROOTS = {"data"}
NOT_PATHS = {
    "datasets",
    "delimiter",
    "executor",
    "memory_limit",
    "optimizer",
    "scheduler",
    "start",
    "validation_metric",
    "space_n_components",
    "space_alpha_W",
    "space_alpha_H",
}
NOT_PATH_KEYS = {
    "model.kind",
    "model.optimizer",
    "model.start",
    "engine.cache_blocks",
    "engine.executor",
    "cluster.local.memory_limit",
    "cluster.scheduler",
    "validation.metric",
    "logging.level",
}

# each command with the arguments it needs; "{out}" is where its --out goes
COMMANDS = {
    "ingest": ["{csv}", "--out", "{out}"],
    "synth": ["--out", "{out}", "--users", "5", "--items", "5", "--nnz", "10", "-k", "2"],
    "info": ["{store}"],
    "fit": ["{store}", "--out", "{out}", "-k", "2"],
    "evaluate": ["{store}", "{model}"],
    "recommend": ["{store}", "{model}", "--out", "{out}"],
    "similar-items": ["{model}", "--items", "1"],
    "similar-users": ["{model}", "--users", "1"],
    "fold-in": ["{model}", "{csv}"],
    "score": ["{model}", "--users", "1", "--items", "1"],
    "export": ["{model}", "--out", "{out}"],
    "predict": ["{store}", "{model}", "--pairs", "{pairs}", "--out", "{out}"],
    "reproduce": ["--out", "{out}", "--data", "{tmp}"],
    "tune": ["{store}", "--out", "{out}"],
}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def path_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The options of ``parser`` that take one free string (destination -> flag)."""
    found = {}
    for a in parser._actions:
        if not a.option_strings or a.nargs == 0 or a.choices or a.type not in (None, str):
            continue
        found[a.dest] = max(a.option_strings, key=len)
    return found


def job_keys() -> list[str]:
    """Every string-valued key of a job file, dotted (``cluster.local.memory_limit``)."""

    def walk(cls: type, prefix: str) -> list[str]:
        hints, keys = typing.get_type_hints(cls), []
        for f in dataclasses.fields(cls):
            sub = config._dataclass_in(hints[f.name])
            if sub is not None:
                keys += walk(sub, f"{prefix}{f.name}.")
            elif str in config._members(hints[f.name]):
                keys.append(prefix + f.name)
        return keys

    return [k for name, cls in config._section_classes().items() for k in walk(cls, f"{name}.")]


def tree_hash(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_cli(args: list[str]) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([*args, "-q"])
    return code, err.getvalue().splitlines()


@pytest.fixture
def place(small_fitted, tmp_path) -> dict[str, str]:
    """Copies of the store and model, a ratings CSV, a pairs file, and ``victim``: another
    model, which no command here reads."""
    store, model = (shutil.copytree(p, tmp_path / p.name) for p in small_fitted)
    victim = shutil.copytree(small_fitted[1], tmp_path / "victim.zarr")
    (tmp_path / "r.csv").write_text(SMALL_CSV)
    pq.write_table(pa.table({"user": np.array([1]), "item": np.array([1])}), tmp_path / "p.parquet")
    return {
        "store": str(store),
        "model": str(model),
        "victim": str(victim),
        "csv": str(tmp_path / "r.csv"),
        "pairs": str(tmp_path / "p.parquet"),
        "tmp": str(tmp_path),
    }


def test_every_string_option_and_job_key_is_an_input_an_output_or_no_path():
    """An option or key not classified here is one nobody checked: add it to the rule (its
    destination to exits.OUTPUT_FLAGS, its key to exits.JOB_OUTPUTS) or to the inputs
    (exits.INPUT_FLAGS, which the outputs are checked against)."""
    for name, parser in subparsers().items():
        for dest, flag in path_options(parser).items():
            assert dest in {*OUTPUT_FLAGS, *INPUT_FLAGS, *INPUT_ROOTS, *NOT_PATHS}, (name, flag)
        assert name in COMMANDS, name
    for key in job_keys():
        assert key in {*JOB_OUTPUTS, *JOB_INPUTS, *NOT_PATH_KEYS}, key


def test_every_output_option_through_a_link_to_a_models_metadata_is_refused(place, tmp_path):
    """Each output option of each command, aimed through a link at another model's
    ``zarr.json``: exit 2, one line naming the link and where it leads, the model untouched,
    and nothing written (no --out made)."""
    victim = Path(place["victim"])
    before = tree_hash(victim)
    cases = 0
    for name, parser in subparsers().items():
        for dest, flag in path_options(parser).items():
            if dest not in OUTPUT_FLAGS:
                continue
            link = tmp_path / f"link-{name}-{dest}"
            link.symlink_to(victim / "zarr.json")
            fresh = tmp_path / f"fresh-{name}-{dest}"
            out = str(link) if dest == "out" else str(fresh)
            args = [name, *(a.format(**place, out=out) for a in COMMANDS[name])]
            if dest != "out":
                args += [flag, str(link)]
            code, err = run_cli(args)
            assert code == EXIT_INPUT, (args, err)
            assert len(err) == 1, (args, err)
            assert f"{link} (a link to {victim / 'zarr.json'})" in err[0], (args, err)
            assert tree_hash(victim) == before, args
            assert not fresh.exists(), args
            cases += 1
    assert cases >= 20  # every command's --log-file, and the --out, --json, ... of some


@pytest.mark.parametrize("key", sorted(JOB_OUTPUTS))
def test_every_output_key_of_a_job_file_through_a_link_is_refused(place, tmp_path, key):
    victim = Path(place["victim"])
    before = tree_hash(victim)
    link = tmp_path / "link"
    link.symlink_to(victim / "zarr.json")
    values = {"store.path": place["store"], "output.model": str(tmp_path / "new.zarr"), key: link}
    tables: dict[str, dict[str, str]] = {}
    for dotted, value in values.items():
        section, leaf = dotted.split(".")
        tables.setdefault(section, {})[leaf] = str(value)
    job = tmp_path / "job.toml"
    job.write_text(
        "".join(
            f"[{s}]\n" + "".join(f'{k} = "{v}"\n' for k, v in t.items()) for s, t in tables.items()
        )
        + "[model]\nn_components = 2\n"
    )
    code, err = run_cli(["fit", "--n-members", "1", "--config", str(job)])
    assert code == EXIT_INPUT, err
    [line] = err
    assert f"refusing to write {JOB_OUTPUTS[key]} to {link} (a link to" in line
    assert tree_hash(victim) == before
    assert not (tmp_path / "new.zarr").exists()


@pytest.mark.parametrize("overwrite", [["--overwrite"], []])
def test_fit_through_a_link_to_a_model_is_refused_naming_the_link(place, tmp_path, overwrite):
    """--overwrite replaces a model, never through a link (which would replace its target);
    with or without it, the message names the link the user typed."""
    victim = Path(place["victim"])
    before = tree_hash(victim)
    link = tmp_path / "mlink"
    link.symlink_to(victim)
    code, err = run_cli(
        ["fit", "--n-members", "1", place["store"], "--out", str(link), "-k", "2", *overwrite]
    )
    assert code == EXIT_INPUT, err
    [line] = err
    assert f"refusing to overwrite {victim}: {link} is a symbolic link to it" in line
    with pytest.raises(InputError, match=f"{link} is a symbolic link to it"):
        OrdNMF(2, max_iter=1, executor="inprocess", n_members=1).fit(
            place["store"], out=link, overwrite=True
        )
    assert tree_hash(victim) == before and link.is_symlink()


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("{tmp}/absent/r.json", "its directory {tmp}/absent does not exist"),
        ("{tmp}/adir", "it is a directory, not a regular file"),
        ("{csv}/r.json", "its directory {csv} is not a directory"),
    ],
)
def test_a_file_output_that_cannot_be_written_is_refused_before_the_evaluation(
    place, where, reason
):
    os.mkdir(os.path.join(place["tmp"], "adir"))
    code, err = run_cli(
        ["evaluate", place["store"], place["model"], "--json", where.format(**place)]
    )
    assert code == EXIT_INPUT, err
    [line] = err
    assert line.startswith("ordnmf-dask evaluate: error: cannot write --json to ")
    assert reason.format(**place) in line


def test_a_file_output_is_whole_or_absent(tmp_path):
    """A write stopped half way (here by a signal) leaves the earlier file as it was and no
    temporary file; a FIFO nobody reads is refused, never waited for."""
    target = tmp_path / "r.json"
    target.write_text("earlier")

    def stopped(fh):
        fh.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        outputs.write_file(str(target), stopped)
    assert target.read_text() == "earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    assert outputs.write_file(str(target), lambda fh: fh.write(b"new")) == str(target)
    assert target.read_text() == "new"
    os.mkfifo(tmp_path / "fifo")  # a stream: written as it is, but never waited for
    with pytest.raises(InputError, match="a FIFO that nobody reads"):
        outputs.write_file(str(tmp_path / "fifo"), lambda fh: fh.write(b"x"))
    with pytest.raises(InputError, match="a FIFO that nobody reads"):
        outputs.open_log(str(tmp_path / "fifo"))
    assert outputs.write_file("/dev/null", lambda fh: fh.write(b"x")) == "/dev/null"


def test_a_plot_is_written_at_exactly_its_path(tmp_path):
    """matplotlib adds ``.png`` to a name without a suffix: the rule checks the path given,
    so the figure goes there and nowhere else."""
    from ordnmf_dask.app.plots import plot_elbo

    assert plot_elbo({"a": [1.0, 2.0]}, tmp_path / "elbo") == str(tmp_path / "elbo")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elbo"]
    assert (tmp_path / "elbo").read_bytes()[:4] == b"\x89PNG"


def test_a_store_replaced_while_the_model_is_saved_is_caught_before_the_publish(
    small_fitted, tmp_path, monkeypatch
):
    """The model's id maps and training items come from the store: one replaced (``ingest
    --overwrite``) after they were copied is a StoreError saying it changed, and no model (nor
    a temporary directory) is left at --out."""
    from ordnmf_dask import ingest
    from ordnmf_dask.errors import StoreError
    from ordnmf_dask.modelstore import model as model_module

    store = shutil.copytree(small_fitted[0], tmp_path / "s.zarr")
    (tmp_path / "r.csv").write_text(SMALL_CSV)
    checked = model_module.ModelHeader.from_attrs

    def then_replaced(*args, **kwargs):
        header = checked(*args, **kwargs)
        ingest(str(tmp_path / "r.csv"), str(store), overwrite=True, test_fraction=0.2)
        return header

    monkeypatch.setattr(model_module.ModelHeader, "from_attrs", then_replaced)
    with pytest.raises(StoreError, match="the store changed while it was read"):
        OrdNMF(2, max_iter=2, executor="inprocess", n_members=1).fit(store, out=tmp_path / "m.zarr")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "s.zarr"]


def test_at_a_url_the_pending_marker_is_the_lock(small_fitted):
    """Object stores have no exclusive create: a write there begins with its pending marker,
    which names the writer; a second writer is refused before any work while that writer may
    be live (another host's cannot be checked), and an unfinished write of a gone process of
    this host is replaced."""
    import json
    import socket
    import subprocess

    from ordnmf_dask.store import locations

    url = "memory://outputs-lock/m.zarr"
    model = OrdNMF.load(small_fitted[1])
    place = locations.Place.of(url)
    place.begin({"kind": "ordnmf_dask.model"}, [])
    mark = json.loads(place.fs.cat_file(f"{place.root}/{locations.PENDING}"))
    assert (mark["host"], mark["pid"]) == (socket.gethostname(), os.getpid())
    other = {**mark, "host": "another-host.example"}
    place.fs.pipe_file(f"{place.root}/{locations.PENDING}", json.dumps(other).encode())
    with pytest.raises(InputError, match="being written by process .* on another-host"):
        model.save(url, overwrite=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = {**mark, "pid": gone.pid}
    place.fs.pipe_file(f"{place.root}/{locations.PENDING}", json.dumps(dead).encode())
    assert model.save(url, overwrite=True) == url
    # published, marker gone (reading a model at memory:// through zarr needs fsspec >= 2024.12,
    # newer than the floor; models at URLs are read back in tests/test_urls.py, on S3)
    assert locations.marker(url) is None
    assert json.loads(place.fs.cat_file(f"{place.root}/zarr.json"))["attributes"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["similar-users", "{model}", "--users", ","], "--users: no value in ','"),
        (["similar-items", "{model}", "--items", ","], "--items: no value in ','"),
        (["score", "{model}", "--users", ",", "--items", "1"], "--users: no value in ','"),
        (["recommend", "{model}", "--users", ","], "--users: no value in ','"),
        (["recommend", "{model}", "--users", "1,,2"], "--users: empty value at position 2 of"),
        (["similar-users", "{model}", "--users", "1,2,"], "--users: empty value at position 3"),
        (["similar-items", "{model}", "--items", " ,1"], "--items: empty value at position 1"),
        (["score", "{model}", "--users", "1,2", "--items", "1,,"], "--items: empty value at"),
        (["export", "{model}", "--out", "{model}-x", "--what", "factors,"], "--what: empty"),
        (["ingest", "{model}", "--out", "{model}-x", "--grid", "1,,2"], "--grid: empty value"),
        (["ingest", "{model}", "--out", "{model}-x", "--columns", "0,,2"], "--columns: empty"),
    ],
)
def test_a_list_with_an_empty_value_is_refused_naming_its_position(
    small_fitted, capsys, args, line
):
    """``--users u1,,u2`` is refused in one line naming the empty position (never read as
    ``u1,u2``), and a list of none (``--users ,``) as such, by every flag that takes a list,
    before anything is read."""
    model = str(small_fitted[1])
    with pytest.raises(SystemExit) as stopped:
        main([a.format(model=model) for a in args])
    assert stopped.value.code == EXIT_INPUT
    [err] = capsys.readouterr().err.splitlines()
    assert err.startswith(f"ordnmf-dask {args[0]}: error: argument {line}"), err
    assert capsys.readouterr().out == "" and not os.path.exists(f"{model}-x")


@pytest.mark.parametrize("fmt", ["tsv", "csv", "json", "parquet"])
def test_a_closed_standard_output_is_exit_141_in_every_format(small_fitted, fmt):
    """The reader gone before the command wrote (``| head`` that has read enough): 141 and
    nothing on stderr, whatever the format and however little it writes."""
    import subprocess

    from conftest import CLI, COMPILE_NOTICE, ZARR_CODEC_WARNING

    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [*CLI, "similar-items", str(small_fitted[1]), "--items", "1", "--format", fmt, "-q"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=240,
        )
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    said = [
        ln
        for ln in done.stderr.splitlines()
        if COMPILE_NOTICE not in ln and ZARR_CODEC_WARNING not in ln
    ]
    assert said == []


def test_a_file_output_at_dev_stdout_of_a_pipe_is_written_or_141(small_fitted):
    """``--json /dev/stdout`` when standard output is a pipe (``| jq``, ``| head``): the pipe
    has no real path (``/proc/PID/fd/pipe:[N]``), so it is named as typed and written as a
    stream: the JSON reaches the reader, and a reader gone is 141, never a temporary file
    beside a path that does not exist (exit 2)."""
    import subprocess

    from conftest import CLI

    store, model = (str(p) for p in small_fitted)
    args = [*CLI, "evaluate", store, model, "-q", "--json", "/dev/stdout"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert '"posterior"' in done.stdout and done.stdout.rstrip().endswith("}")
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(args, stdout=write, stderr=subprocess.PIPE, text=True, timeout=240)
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr


def test_json_tables_are_streamed_as_they_were_printed_whole():
    from ordnmf_dask.app.tables import write_table

    rows = [(1, 2, "a", 0.5), (1, 3, "b", np.float64(0.25))]
    out = io.StringIO()
    write_table(["user", "rank", "item", "score"], rows, "json", out)
    records = [dict(zip(["user", "rank", "item", "score"], r, strict=True)) for r in rows]
    assert out.getvalue() == json.dumps(records, indent=1, default=float) + "\n"


@pytest.mark.parametrize("at", ["wait", "header", "publish", "sweep"])
def test_an_interrupt_at_any_step_of_a_fits_save_leaves_no_half_written_model(
    small_fitted, tmp_path, monkeypatch, at
):
    """SIGINT (KeyboardInterrupt in the main thread) while the factor chunks are written, once
    they are, as the model is published, or as the old one is removed: once the fit has
    returned, --out holds nothing or a complete model, and no OUT.tmp-* is left."""
    import time

    from ordnmf_dask.modelstore import model as model_module
    from ordnmf_dask.store import blocks

    store = shutil.copytree(small_fitted[0], tmp_path / "s.zarr")
    out = tmp_path / "m.zarr"
    if at == "sweep":  # an old model is being replaced
        shutil.copytree(small_fitted[1], out)

    def interrupted(real):
        def call(*args, **kwargs):
            if at == "wait":
                time.sleep(0.05)  # the tasks are under way
            elif at != "header":
                real(*args, **kwargs)
            raise KeyboardInterrupt

        return call

    target = {
        "wait": (model_module, "wait"),
        "header": (model_module.ModelHeader, "from_attrs"),
        "publish": (model_module, "publish"),
        "sweep": (blocks.shutil, "rmtree"),
    }[at]
    real = getattr(*target)
    if at == "sweep":
        aside = []

        def once(path, *args, **kwargs):
            real(path, *args, **kwargs)
            if os.path.basename(path) == blocks.ASIDE and not aside:
                aside.append(path)
                raise KeyboardInterrupt

        monkeypatch.setattr(*target, once)
    else:
        monkeypatch.setattr(*target, interrupted(real))
    with pytest.raises(KeyboardInterrupt):
        OrdNMF(2, max_iter=2, executor="inprocess", n_members=1).fit(store, out=out, overwrite=True)
    monkeypatch.undo()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "s.zarr")
    assert left in ([], ["m.zarr"], ["m.zarr", "m.zarr.checkpoints"]), left
    if out.exists():
        OrdNMF.load(out)  # complete


def test_a_cluster_stopped_as_it_starts_is_closed_and_forgotten():
    """SIGTERM while tune (or any command) starts its LocalCluster's first worker: the
    cluster begun is closed there, its error kept quiet, and removed from distributed's list,
    whose exit hook would close it again and print a worker's traceback."""
    from distributed.deploy.spec import SpecCluster

    from ordnmf_dask.errors import Terminated
    from ordnmf_dask.runtime.cluster import _start_cluster

    closed = []

    class Begun:
        def close(self, timeout=None):
            closed.append(timeout)
            raise AssertionError("Status.init")  # what closing a worker still starting raises

    begun = Begun()

    def make():
        SpecCluster._instances.add(begun)
        raise Terminated()

    with pytest.raises(Terminated):
        _start_cluster(make)
    assert closed and begun not in SpecCluster._instances


def output_cases(job_keys: bool = False) -> list[tuple[str, str, str]]:
    """(command, destination, flag) of every output option of every command, and with
    ``job_keys`` ("job", key, "") of every output key of a job file (for ``fit --config``)."""
    return [
        (name, dest, flag)
        for name, parser in subparsers().items()
        for dest, flag in path_options(parser).items()
        if dest in OUTPUT_FLAGS
    ] + [("job", key, "") for key in sorted(JOB_OUTPUTS) if job_keys]


SUBSTITUTES = [
    "link-to-metadata",
    "link-to-model",
    "under-a-link",
    "link-to-a-chunk",
    "hard-link-to-metadata",
    "link-to-store-metadata",
    "link-to-the-ratings",
    "hard-link-to-the-ratings",
    "fifo",
    "socket",
    "device",
    "link-to-a-device",
    "directory",
]
# the commands that read the ratings file (a link to it elsewhere is a file of one name)
READ_RATINGS = {"ingest", "fold-in"}
# outputs that are directories (an existing empty one is theirs to write in)
DIRECTORY_OUTPUTS = {"out", "work_dir", "checkpoint_dir", *JOB_OUTPUTS} - {"logging.file"}


def _aim(substitute: str, where: Path, victim: Path, store: Path, csv: Path) -> Path:
    """A path under ``where`` that leads, as ``substitute`` says, into the model ``victim``,
    into the ``store``, to the ratings file ``csv``, or to what no output can be (a FIFO
    nobody reads, a socket, ``/dev/full``, a directory)."""
    import socket

    aimed = where / "aimed"
    chunk = next(p for p in sorted((victim / "W").rglob("*")) if p.is_file())
    if substitute == "fifo":
        os.mkfifo(aimed)
    elif substitute == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(aimed))
    elif substitute == "device":
        return Path("/dev/full")
    elif substitute == "directory":
        aimed.mkdir()
    elif substitute == "under-a-link":
        (where / "vlink").symlink_to(victim)
        return where / "vlink" / "x"
    elif substitute.startswith("hard-link"):
        os.link(victim / "zarr.json" if substitute.endswith("metadata") else csv, aimed)
    else:
        aimed.symlink_to(
            {
                "link-to-metadata": victim / "zarr.json",
                "link-to-model": victim,
                "link-to-a-chunk": chunk,
                "link-to-store-metadata": store / "zarr.json",
                "link-to-the-ratings": csv,
                "link-to-a-device": Path("/dev/full"),
            }[substitute]
        )
    return aimed


def _job_args(place: dict[str, str], where: Path, key: str, aimed: Path) -> list[str]:
    """``fit --config JOB`` with a job file under ``where`` whose ``key`` is ``aimed``."""
    values = {"store.path": place["store"], "output.model": str(where / "fresh"), key: aimed}
    tables: dict[str, dict[str, str]] = {}
    for dotted, value in values.items():
        section, leaf = dotted.split(".")
        tables.setdefault(section, {})[leaf] = str(value)
    job = where / "job.toml"
    job.write_text(
        "".join(
            f"[{s}]\n" + "".join(f'{k} = "{v}"\n' for k, v in t.items()) for s, t in tables.items()
        )
        + "[model]\nn_components = 2\n"
    )
    return ["fit", "--n-members", "1", "--config", str(job)]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=st.sampled_from(output_cases(job_keys=True)), substitute=st.sampled_from(SUBSTITUTES))
def test_any_output_option_aimed_at_a_model_an_input_or_a_stream_is_refused_in_one_line(
    place, case, substitute
):
    """Property: whatever output option or job-file key, and whichever way it is aimed into
    a model (a link to its metadata, to it, to a file deep in it, a path under a link to it,
    a hard link to its metadata), at an input (a link to a store's metadata, to the ratings
    file the command reads, a hard link to the ratings file) or
    at what no output can be (a FIFO nobody reads, a socket, ``/dev/full`` or a link to it, a
    directory where a file goes), the command ends in bounded time with exit 2 and one line,
    the model, the command's store, model and inputs unchanged, and nothing written beside
    them."""
    import signal
    import tempfile

    from hypothesis import assume

    name, dest, flag = case
    assume(not (substitute == "directory" and dest in DIRECTORY_OUTPUTS))
    assume(substitute != "link-to-the-ratings" or name in READ_RATINGS)
    victim, csv = Path(place["victim"]), Path(place["csv"])
    watched = [victim, Path(place["store"]), Path(place["model"])]
    before = [tree_hash(p) for p in watched], csv.read_bytes()
    with tempfile.TemporaryDirectory(dir=place["tmp"]) as d:
        where = Path(d)
        aimed = _aim(substitute, where, victim, Path(place["store"]), csv)
        if name == "job":
            args = _job_args(place, where, dest, aimed)
        else:
            out = str(aimed) if dest == "out" else str(where / "fresh")
            args = [name, *(a.format(**place, out=out) for a in COMMANDS[name])]
            if dest != "out":
                args += [flag, str(aimed)]
        made = sorted(os.listdir(where))

        def stuck(*_):
            raise TimeoutError(f"{args} did not end")

        old = signal.signal(signal.SIGALRM, stuck)
        signal.alarm(60)
        try:
            code, err = run_cli(args)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        assert code == EXIT_INPUT and len(err) == 1, (args, code, err)
        assert "Traceback" not in err[0] and str(aimed) in err[0], (args, err)
        assert ([tree_hash(p) for p in watched], csv.read_bytes()) == before, args
        assert sorted(os.listdir(where)) == made, args


def test_a_lock_file_planted_as_a_link_is_never_written_through(place, tmp_path):
    """``OUT.lock`` made a link to a model's metadata: the lock is created with O_EXCL and
    O_NOFOLLOW, so the writer is refused (naming the lock file) and the model is untouched."""
    victim = Path(place["victim"])
    before = tree_hash(victim)
    (tmp_path / "m.zarr.lock").symlink_to(victim / "zarr.json")
    code, err = run_cli(
        ["fit", "--n-members", "1", place["store"], "--out", str(tmp_path / "m.zarr"), "-k", "2"]
    )
    assert code == EXIT_INPUT, err
    [line] = err
    assert f"lock file {tmp_path / 'm.zarr.lock'}" in line
    assert tree_hash(victim) == before and not (tmp_path / "m.zarr").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["score", "{model}", "--pairs", "{input}"],
        ["fold-in", "{model}", "{input}"],
        ["recommend", "{model}", "--users-from", "{input}"],
        ["similar-items", "{model}", "--items-from", "{input}"],
        ["ingest", "{csv}", "--out", "{tmp}/o", "--scheduler-file", "{input}"],
    ],
)
def test_a_log_file_that_is_an_input_of_the_command_is_refused(place, command):
    """Every file a command reads (exits.INPUT_FLAGS) is kept apart from its outputs: the log
    would be appended to the pairs, ratings or id file being read."""
    victim = Path(place["tmp"]) / "read.csv"
    victim.write_text("1,1,2\n")
    args = [a.format(**place, input=victim) for a in command]
    code, err = run_cli([*args, "--log-file", str(victim)])
    assert code == EXIT_INPUT and len(err) == 1, err
    assert f"refusing to write --log-file to {victim}: it is the" in err[0], err
    assert victim.read_text() == "1,1,2\n"


def test_predict_out_inside_its_pairs_directory_is_refused(place):
    pairs_dir = Path(place["tmp"]) / "pairs"
    pairs_dir.mkdir()
    shutil.copy(place["pairs"], pairs_dir / "p.parquet")
    out = pairs_dir / "predictions"
    code, err = run_cli(
        ["predict", place["store"], place["model"], "--pairs", str(pairs_dir)] + ["--out", str(out)]
    )
    assert code == EXIT_INPUT and len(err) == 1, err
    assert f"it is inside the pairs input {pairs_dir}" in err[0], err
    assert sorted(os.listdir(pairs_dir)) == ["p.parquet"]


def test_a_log_file_that_cannot_be_written_fails_the_command_in_one_line(place, tmp_path):
    """A log on a device that takes nothing (``/dev/full``) is refused before any work; one that
    loses records once the command runs (a disk filled meanwhile) is an output that failed:
    exit 2 naming it, not a traceback per record and exit 0."""
    out = Path(place["tmp"]) / "s"
    code, err = run_cli(["ingest", place["csv"], "--out", str(out), "--log-file", "/dev/full"])
    assert code == EXIT_INPUT and err == [
        "ordnmf-dask ingest: error: cannot write --log-file to /dev/full: No space left on device"
    ], err
    assert not out.exists()
    from ordnmf_dask.app.logs import LogFile, log, log_file_failure

    handler = LogFile("/dev/full")  # opened as the command opens it, after its check
    log.addHandler(handler)
    try:
        log.warning("a record the disk has no room for")
        assert log_file_failure() == "cannot write the log file /dev/full: No space left on device"
    finally:
        log.removeHandler(handler)
        handler.close()


def test_a_full_standard_output_is_named_as_such(place):
    err, full = io.StringIO(), open("/dev/full", "w")  # noqa: SIM115 - its close fails too
    with contextlib.redirect_stdout(full), contextlib.redirect_stderr(err):
        code = main(["similar-items", place["model"], "--items", "1", "-q"])
    with contextlib.suppress(OSError):  # what main could not write is still in its buffer
        full.close()
    assert code == EXIT_INPUT
    assert err.getvalue().splitlines() == [
        "ordnmf-dask similar-items: error: No space left on device (writing standard output)"
    ]


def test_an_output_typed_as_a_file_url_through_a_link_names_the_link(place, tmp_path):
    link = tmp_path / "to-model"
    link.symlink_to(place["model"])
    code, err = run_cli(["export", place["model"], "--out", f"file://{link}", "--overwrite"])
    assert code == EXIT_INPUT and len(err) == 1, err
    assert f"--out to file://{link} (a link to {place['model']}): it is the model" in err[0], err


@pytest.mark.parametrize("stream", ["fifo", "/dev/full"])
def test_every_output_option_at_a_dead_stream_is_refused_before_any_work(place, tmp_path, stream):
    """Each output option of each command aimed at a FIFO nobody reads or at ``/dev/full``
    (which takes no byte): refused in one line naming it before any work, so before the
    command's inputs are even looked at (here every input is missing: an error about one
    would mean the output was checked after it)."""
    aimed = tmp_path / "fifo"
    if stream == "fifo":
        os.mkfifo(aimed)
    else:
        aimed = Path(stream)
    missing = {k: str(tmp_path / f"missing-{k}") for k in ("store", "model", "csv", "pairs")}
    cases = 0
    for name, dest, flag in output_cases():
        fresh = str(tmp_path / f"fresh-{name}-{dest}")
        out = str(aimed) if dest == "out" else fresh
        args = [name, *(a.format(**{**place, **missing}, out=out) for a in COMMANDS[name])]
        if dest != "out":
            args += [flag, str(aimed)]
        code, err = run_cli(args)
        assert code == EXIT_INPUT and len(err) == 1, (args, err)
        assert str(aimed) in err[0] and "missing-" not in err[0], (args, err)
        assert not os.path.exists(fresh), args
        cases += 1
    assert cases >= 20


@pytest.mark.parametrize("flag", ["--log-file", "--json", "--reliability"])
def test_a_file_output_that_is_a_hard_link_of_a_models_file_is_refused(place, tmp_path, flag):
    """A hard link is another name of the very file, which no comparison of paths sees: a log
    appended to a hard link of a model's ``zarr.json`` damaged the model (exit 0). A file
    output with other names is refused before any work, and by the log's opener too."""
    victim = Path(place["victim"])
    before = tree_hash(victim)
    link = tmp_path / "hard"
    os.link(victim / "zarr.json", link)
    code, err = run_cli(["evaluate", place["store"], place["model"], flag, str(link)])
    assert code == EXIT_INPUT and len(err) == 1, err
    assert f"{link}: it has 2 hard links" in err[0], err
    out = tmp_path / "s"
    if flag == "--log-file":  # a command that logs (ingest), and the opener itself
        code, err = run_cli(["ingest", place["csv"], "--out", str(out), flag, str(link)])
        assert code == EXIT_INPUT and "it has 2 hard links" in err[0] and not out.exists()
        with pytest.raises(InputError, match="it has 2 hard links"):
            outputs.open_log(str(link))
    assert tree_hash(victim) == before


def test_a_device_that_cannot_be_opened_is_named_by_its_reason(small_fitted):
    """``/dev/tty`` in a process without a terminal (a new session) cannot be opened (ENXIO,
    which a FIFO nobody reads also gives): refused before any work with the device's reason,
    not called a FIFO. A real process, since the session is the point."""
    import subprocess

    from conftest import CLI

    done = subprocess.run(
        [*CLI, "similar-items", str(small_fitted[1]), "--items", "1", "--log-file", "/dev/tty"],
        capture_output=True,
        text=True,
        timeout=240,
        start_new_session=True,
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.splitlines()[-1] == (
        "ordnmf-dask similar-items: error: cannot write --log-file to /dev/tty: "
        "No such device or address"
    )
