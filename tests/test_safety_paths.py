"""The safety rules about paths (docs/design.md, "Safety rules"): every input and output is
resolved to its real location, so writing through a symbolic link is refused exactly as
writing to its target; a store or model directory is untrusted, so reading it never follows a
link and never opens anything but a regular file, and saving a model copies only the regular
files of its zarr hierarchy. Numbered cases are those of issue 38."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import SMALL_CSV
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ordnmf_dask import OrdNMF, export
from ordnmf_dask.app.cli import main
from ordnmf_dask.errors import InputError, StoreError


def tree_hash(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (not following links): a file's SHA-256, a link's target."""
    out = {}
    for d, dirs, names in os.walk(root):
        for n in [*dirs, *names]:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isfile(p):
                out[rel] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def run_cli(args: list[str]) -> tuple[int, list[str]]:
    """main(args) in this process: its exit code and the lines of its stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([*args, "-q"])
    return code, err.getvalue().splitlines()


def copy_of(source: Path, where: Path) -> Path:
    target = where / source.name
    shutil.copytree(source, target)
    return target


# ------------------------------------------------------------- 1-3: writing through a link


def test_1_json_through_a_link_to_a_store_file_is_refused(small_fitted, tmp_path, monkeypatch):
    """The link leads into a store that is not an input of the command (``o.zarr``, beside the
    evaluated ``b.zarr``)."""
    store, model = (copy_of(p, tmp_path) for p in small_fitted)
    other = tmp_path / "b.zarr"
    shutil.copytree(store, other)
    before = tree_hash(store)
    monkeypatch.chdir(tmp_path)
    Path("metrics.json").symlink_to(store / "zarr.json")
    code, err = run_cli(["evaluate", str(other), str(model), "--json", "metrics.json"])
    assert code == 2, err
    [line] = err
    assert line.startswith("ordnmf-dask evaluate: error: refusing to write --json")
    assert f"it is inside {store}, a store written by ordnmf_dask" in line
    assert tree_hash(store) == before


def test_2_log_file_through_a_link_to_a_model_is_refused(small_fitted, tmp_path, monkeypatch):
    store, model = (copy_of(p, tmp_path) for p in small_fitted)
    before = tree_hash(model)
    monkeypatch.chdir(tmp_path)
    Path("mlink").symlink_to(model)
    code, err = run_cli(
        [
            "fit",
            "--n-members",
            "1",
            str(store),
            "--out",
            "new.zarr",
            "--log-file",
            "mlink/zarr.json",
            "-k",
            "2",
        ]
    )
    assert code == 2, err
    [line] = err
    assert "refusing to write --log-file" in line and f"inside {model}, a model" in line
    assert tree_hash(model) == before
    assert not Path("new.zarr").exists()
    OrdNMF.load(model)  # still a model


def test_3_outputs_under_a_link_to_a_store_are_refused(small_fitted, tmp_path, monkeypatch):
    store, model = (copy_of(p, tmp_path) for p in small_fitted)
    before, model_before = tree_hash(store), tree_hash(model)
    monkeypatch.chdir(tmp_path)
    Path("base.csv").write_text(SMALL_CSV)
    Path("slink").symlink_to(store)
    code, err = run_cli(["ingest", "base.csv", "--out", "slink/sub.zarr"])
    assert code == 2 and len(err) == 1, err
    assert f"it is inside {store}, a store written by ordnmf_dask" in err[0]
    code, err = run_cli(["export", str(model), "--out", "slink/ex"])
    assert code == 2 and len(err) == 1, err
    assert f"inside {store}, a store" in err[0]
    # the API calls refuse the same
    with pytest.raises(InputError, match="inside .*a store written by ordnmf_dask"):
        export(str(model), "slink/ex2", n=3)
    with pytest.raises(InputError, match="inside .*a store written by ordnmf_dask"):
        OrdNMF.load(model).save("slink/m.zarr")
    assert tree_hash(store) == before and tree_hash(model) == model_before


def test_an_existing_output_named_through_a_link_is_not_replaced(small_fitted, tmp_path):
    """Overwriting goes to the real path, never replaces a link, and says why."""
    _, model = small_fitted
    mine = OrdNMF.load(model).save(tmp_path / "m.zarr")
    (tmp_path / "mlink").symlink_to(mine)
    with pytest.raises(InputError, match="mlink is a symbolic link to it"):
        OrdNMF.load(model).save(tmp_path / "mlink", overwrite=True)
    assert os.path.islink(tmp_path / "mlink")


def test_18_a_file_as_parent_is_named_as_a_file(small_fitted, tmp_path, monkeypatch):
    store, _ = small_fitted
    monkeypatch.chdir(tmp_path)
    Path("notes.txt").write_text("mine")
    Path("base.csv").write_text(SMALL_CSV)
    code, err = run_cli(["ingest", "base.csv", "--out", "notes.txt/x"])
    assert code == 2, err
    [line] = err
    assert f"parent directory {tmp_path / 'notes.txt'} is not a directory" in line
    assert Path("notes.txt").read_text() == "mine"


# ------------------------------------------------------- 4-5: a model directory is untrusted


def test_4_save_copies_only_the_models_own_regular_files(small_fitted, tmp_path):
    _, fitted_model = small_fitted
    (tmp_path / "secret.txt").write_text("secret")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "key").write_text("private key")
    model = copy_of(fitted_model, tmp_path / "ev")
    (model / "notes.txt").symlink_to("../../secret.txt")
    (model / "W" / "0" / "extra").symlink_to("../../../../private/")
    dest = Path(OrdNMF.load(model).save(tmp_path / "dest.zarr"))
    copied = tree_hash(dest)
    assert not any("notes" in k or "extra" in k for k in copied), copied
    assert not any("secret" in v or "private" in v for v in copied.values())
    for path in dest.rglob("*"):
        assert not path.is_symlink()
        assert path.is_dir() or b"secret" not in path.read_bytes()
    reloaded = OrdNMF.load(dest)
    assert (reloaded.W_.compute() == OrdNMF.load(fitted_model).W_.compute()).all()


def test_4_a_link_in_the_models_hierarchy_is_refused(small_fitted, tmp_path):
    """A chunk file or a node directory replaced by a link is never read through it."""
    _, fitted_model = small_fitted
    other = copy_of(fitted_model, tmp_path / "other")
    model = copy_of(fitted_model, tmp_path / "ev")
    chunk = model / "H" / "0" / "mean" / "c" / "0" / "0"
    chunk.unlink()
    chunk.symlink_to(other / "H" / "0" / "mean" / "c" / "0" / "0")
    with pytest.raises(StoreError, match="symbolic link inside the model"):
        OrdNMF.load(model)
    shutil.rmtree(model / "W")
    (model / "W").symlink_to(other / "W")
    chunk.unlink()
    shutil.copy(other / "H" / "0" / "mean" / "c" / "0" / "0", chunk)
    with pytest.raises(StoreError, match="W: is a symbolic link inside the model"):
        OrdNMF.load(model)


READ_WITH_A_FIFO = """
import sys
from ordnmf_dask import OrdNMF, evaluate, export, recommend
from ordnmf_dask.errors import StoreError
store, model, out = sys.argv[1:]
calls = {
    "evaluate": lambda: evaluate(store, model),
    "export": lambda: export(model, out, n=3),
    "recommend": lambda: recommend(store, model, users=[1], n=3),
}
for name, call in calls.items():
    try:
        call()
    except StoreError as exc:
        print(name, "StoreError", exc)
    else:
        print(name, "returned")
"""


def test_5_a_fifo_in_place_of_a_chunk_is_an_error_not_a_hang(small_fitted, tmp_path):
    store, fitted_model = small_fitted
    model = copy_of(fitted_model, tmp_path)
    chunk = model / "H" / "0" / "mean" / "c" / "0" / "0"
    chunk.unlink()
    os.mkfifo(chunk)
    r = subprocess.run(
        [sys.executable, "-c", READ_WITH_A_FIFO, str(store), str(model), str(tmp_path / "ex")],
        capture_output=True,
        text=True,
        timeout=240,  # on main these hang for ever
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["evaluate", "StoreError"],
        ["export", "StoreError"],
        ["recommend", "StoreError"],
    ], r.stdout
    assert all("FIFO" in line for line in lines), r.stdout
    assert not (tmp_path / "ex").exists()


def test_5_open_regular_refuses_links_fifos_and_devices(tmp_path):
    from ordnmf_dask.store import locations

    (tmp_path / "f").write_bytes(b"abc")
    (tmp_path / "l").symlink_to(tmp_path / "f")
    os.mkfifo(tmp_path / "p")
    with locations.open_regular(str(tmp_path / "f")) as fh:
        assert fh.read() == b"abc"
    with pytest.raises(StoreError, match="is a symbolic link"):
        locations.open_regular(str(tmp_path / "l"))
    with pytest.raises(StoreError, match="is a FIFO"):
        locations.open_regular(str(tmp_path / "p"))
    with pytest.raises(StoreError, match="is a character device"):
        locations.open_regular("/dev/null")
    with pytest.raises(FileNotFoundError):
        locations.open_regular(str(tmp_path / "absent"))


# ------------------------------------------------- the path rule, on random trees of links

PLACES = ["o.zarr", "o.zarr/train", "o.zarr/zarr.json", "bm.zarr", "bm.zarr/W/0", "in", ".", "free"]


@st.composite
def trees(draw):
    """Links (name -> one of PLACES) made in the working directory or in ``free``, and an
    output aimed through a chain of them."""
    links = draw(
        st.lists(
            st.tuples(st.sampled_from(["", "free/"]), st.sampled_from(PLACES)),
            min_size=1,
            max_size=4,
        )
    )
    via = draw(st.integers(0, len(links) - 1))
    tail = draw(st.sampled_from(["", "zarr.json", "x", "x/y", "../x", "train/zarr.json"]))
    command = draw(st.sampled_from(["ingest", "log-file", "export"]))
    return links, via, tail, command


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=trees())
def test_outputs_through_random_links_never_touch_a_store_model_or_input(small_fitted, case):
    """Whatever chain of links an output goes through, the command either refuses (one line,
    exit 2; the API: InputError) or writes outside every store, model and input; none of them
    changes."""
    links, via, tail, command = case
    with tempfile.TemporaryDirectory() as d:
        base = Path(d).resolve()
        store, model = (copy_of(p, base) for p in small_fitted)
        (base / "in").mkdir()
        (base / "in" / "base.csv").write_text(SMALL_CSV)
        (base / "free").mkdir()
        names = []
        for j, (where, place) in enumerate(links):
            name = base / f"{where}l{j}"
            name.symlink_to(base / place)
            names.append(name)
        out = str(names[via] / tail) if tail else str(names[via])
        # the input is the file in/base.csv: a new output beside it (in/x) is allowed
        guarded = {p: tree_hash(base / p) for p in ("o.zarr", "bm.zarr")}
        csv_before = (base / "in" / "base.csv").read_bytes()
        if command == "export":  # the API, in this process
            try:
                export(str(model), out, n=2)
                code, err = 0, []
            except InputError as exc:
                code, err = 2, [str(exc)]
        else:
            args = {
                "ingest": ["ingest", str(base / "in" / "base.csv"), "--out", out],
                "log-file": ["info", str(store), "--log-file", out],
            }[command]
            code, err = run_cli(args)
        assert code in (0, 2), (code, err)
        if code == 2:
            assert len(err) == 1, err
        for p, before in guarded.items():
            assert tree_hash(base / p) == before, (p, out, command, err)
        assert (base / "in" / "base.csv").read_bytes() == csv_before
        assert not (base / "in" / "base.csv").is_dir()
        if code == 0:
            real = os.path.realpath(out)
            for p in ("o.zarr", "bm.zarr", "in/base.csv"):
                inside = real == str(base / p) or real.startswith(str(base / p) + os.sep)
                assert not inside, (real, command)


# ------------------------------------------------------------ 8-10: one version per reader


@pytest.fixture(scope="module")
def two_models(small_fitted, tmp_path_factory) -> tuple[Path, Path]:
    """A second model of the same store, of another rank (3): what a ``fit --overwrite``
    publishes over the first."""
    store, _ = small_fitted
    where = tmp_path_factory.mktemp("second")
    other = OrdNMF(3, max_iter=2, executor="inprocess", seed=5, n_members=1).fit(
        store, out=where / "k3.zarr"
    )
    return small_fitted[1], Path(other.model_path_)


def publish_over(source: Path, target: Path) -> None:
    """Replace the model at ``target`` by a copy of ``source``, as ``fit --overwrite`` does."""
    OrdNMF.load(source).save(target, overwrite=True)


def test_8_evaluate_stops_when_the_model_is_replaced_while_it_reads(
    small_fitted, two_models, tmp_path, monkeypatch
):
    """The replacement lands after evaluate opened the model (its thresholds) and before it
    reads the factors: an error saying it changed, never a result mixing the two."""
    from ordnmf_dask import evaluate
    from ordnmf_dask.postfit import evaluate as evaluate_module

    store, _ = small_fitted
    first, second = two_models
    model = copy_of(first, tmp_path)
    checked = evaluate_module.check_compatible

    def then_replaced(*args, **kwargs):
        checked(*args, **kwargs)
        publish_over(second, model)

    monkeypatch.setattr(evaluate_module, "check_compatible", then_replaced)
    with pytest.raises(StoreError, match="the model changed while it was read"):
        evaluate(store, model)
    monkeypatch.undo()
    again = evaluate(store, model)  # the new version, whole
    assert again["test_loglik"] == evaluate(store, second)["test_loglik"]


def test_8_export_stops_when_the_model_is_replaced_while_it_reads(
    two_models, tmp_path, monkeypatch
):
    from ordnmf_dask.postfit import export as export_module

    first, second = two_models
    model = copy_of(first, tmp_path)
    planned = export_module.plan_export

    def then_replaced(*args, **kwargs):
        plan = planned(*args, **kwargs)
        publish_over(second, model)
        return plan

    monkeypatch.setattr(export_module, "plan_export", then_replaced)
    with pytest.raises(StoreError, match="the model changed while it was read"):
        export(str(model), tmp_path / "ex", what=["factors"])
    assert not (tmp_path / "ex").exists()
    assert not list(tmp_path.glob("ex.tmp-*"))


def test_9_a_loaded_estimator_never_serves_a_model_published_after_it(two_models, tmp_path):
    first, second = two_models
    model = copy_of(first, tmp_path)
    m = OrdNMF.load(model)
    assert m.n_components == 2
    publish_over(second, model)
    with pytest.raises(StoreError, match="the model changed while it was read"):
        m.recommend([1], n=3)
    with pytest.raises(StoreError, match="the model changed while it was read"):
        m.W_.compute()
    with pytest.raises(StoreError, match="the model changed while it was read"):
        m.save(tmp_path / "copy.zarr")
    assert not (tmp_path / "copy.zarr").exists()
    assert m.n_components == 2
    fresh = OrdNMF.load(model)  # loading again gives the new one, whole
    assert fresh.n_components == 3 and fresh.W_.compute().shape[1] == 3
    assert len(fresh.recommend([1], n=3)[1]) == 3


def test_9_what_a_server_already_holds_stays_of_its_version(two_models, tmp_path):
    """Answers from what was read before the replacement (the factors, the id maps) are of the
    loaded model; a read after it (the index of training items, read per request) is
    refused."""
    first, second = two_models
    model = copy_of(first, tmp_path)
    m = OrdNMF.load(model)
    before = m.recommend([1], n=3, filter_already_seen=False)
    publish_over(second, model)
    assert m.recommend([1], n=3, filter_already_seen=False) == before
    with pytest.raises(StoreError, match="the model changed while it was read"):
        m.recommend([1], n=3)


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_10_a_second_writer_of_the_same_out_is_refused_before_any_work(small_fitted, tmp_path):
    import signal

    from conftest import CLI

    store, _ = small_fitted
    out = tmp_path / "m.zarr"
    fit = [
        *CLI,
        "fit",
        "--n-members",
        "1",
        str(store),
        "--out",
        str(out),
        "-k",
        "2",
        "--executor",
        "inprocess",
    ]
    first = subprocess.Popen(
        [*fit, "--max-iter", "1000000", "--min-iter", "1000000", "--overwrite"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(tmp_path / "m.zarr.lock", first)
        second = subprocess.run(
            [*fit, "--max-iter", "2", "--overwrite", "-q"],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert second.returncode == 2, second.stderr
        [line] = second.stderr.splitlines()
        assert f"{out} is being written by process {first.pid} on " in line
        assert "lock file" in line and "m.zarr.lock" in line
        assert first.poll() is None  # the first writer goes on
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=240)
    assert first.returncode == 143, err
    left = sorted(p.name for p in tmp_path.iterdir())
    assert set(left) <= {"m.zarr.checkpoints"}, left  # no lock, no model, no m.zarr.tmp-*


def test_10_a_lock_left_by_a_killed_writer_is_reclaimed(tmp_path):
    import json
    import socket

    from ordnmf_dask.store import writelock

    gone = subprocess.Popen(["true"])
    gone.wait()
    out = tmp_path / "m.zarr"
    lock = tmp_path / "m.zarr.lock"
    doc = {"kind": writelock.LOCK_KIND, "host": socket.gethostname(), "pid": gone.pid}
    lock.write_text(json.dumps(doc))
    with writelock.held(out):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with writelock.held(out):  # this process again: taken
            pass
        assert lock.exists()
    assert not lock.exists()
    doc["host"] = "another-host.example"  # its process cannot be checked: never taken over
    lock.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="being written by process .* on another-host"):
        with writelock.held(out):
            pass
    assert json.loads(lock.read_text()) == doc


def test_urls_are_compared_in_canonical_form():
    """Two spellings of one place at a URL are one output: the rule refuses the second."""
    from ordnmf_dask.store import locations
    from ordnmf_dask.store.outputs import check_apart

    assert locations.location("S3://bucket//a/./b/../m.zarr/") == "s3://bucket/a/m.zarr"
    assert locations.location("memory://x/y") == "memory://x/y"
    with pytest.raises(InputError, match="is the same path as"):
        check_apart({"--out": "s3://bucket/a/m.zarr", "--json": "S3://bucket//a/m.zarr/"})
    with pytest.raises(InputError, match="is inside"):
        check_apart({"--out": "s3://bucket/a", "--json": "s3://bucket/a/./b/../c"})


@pytest.mark.parametrize("name", ["zarr.json", ".zgroup", ".zattrs"])
def test_an_output_named_like_zarr_metadata_is_refused(tmp_path, name):
    """``--out data/zarr.json`` would make the user's directory ``data`` read as a zarr group."""
    from ordnmf_dask.store.outputs import check_place

    with pytest.raises(InputError, match="zarr metadata file's name"):
        check_place(tmp_path / name, "the store")
    assert check_place(tmp_path / "ml.zarr", "the store") == str(tmp_path / "ml.zarr")
