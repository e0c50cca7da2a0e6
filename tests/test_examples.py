"""Every example and shipped job file runs as shipped, as a new user runs it: DATA unset (the
MovieLens copy in examples/data), outputs under a temporary directory, nothing written into the
checkout, and no cluster started (not marked ``cluster``: a scheduler would fail, conftest)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHECKOUT, CLI, TPS, data_root

from ordnmf_dask.app.config import resolve

EXAMPLES = CHECKOUT / "examples"
# what the examples below cover; a new example needs a test here
TESTED = {"movielens_small.sh", "api_quickstart.py", "reproduce_paper.sh"}
JOB = CHECKOUT / "cluster" / "job.toml"


def user_env(**extra: str) -> dict[str, str]:
    """This environment without DATA (a new user's), plus ``extra``; the commands installed
    with this interpreter come first on PATH (as in its activated virtual environment)."""
    env = {k: v for k, v in os.environ.items() if k != "DATA"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return {**env, **extra}


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd, env=user_env(**env), capture_output=True, text=True, timeout=600
    )


def readme_output() -> list[str]:
    """The output of the main command as README.md shows it (the indented block after
    "Output of the first command")."""
    text = (CHECKOUT / "README.md").read_text()
    block = text.split("Output of the first command", 1)[1].split("\n\n", 2)[1]
    return [line[4:] for line in block.splitlines()]


def readme_iterations() -> str:
    """The iterations README.md gives for the main command's fit: its members', "a/b/c/d"."""
    text = (CHECKOUT / "README.md").read_text().split("Output of the first command", 1)[1]
    return re.search(r"([\d/]+)\s+iterations", text.split("\n\n", 1)[0]).group(1)


def readme_ndcg_at_1() -> str:
    """NDCG@100 at relevance 1 as README.md's output block shows it (4 decimals)."""
    return readme_output()[2].split()[1]


def readme_block(heading: str, fence: str) -> str:
    """The first block under README.md's ``heading``: a fenced ``python`` block, or (``fence``
    "") the first indented one."""
    section = (CHECKOUT / "README.md").read_text().split(f"## {heading}\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    if fence:
        return section.split(f"```{fence}\n", 1)[1].split("```", 1)[0]
    block = section.split("\n    ", 1)[1].split("\n\n", 1)[0]
    return "\n".join(line.removeprefix("    ") for line in ("    " + block).splitlines())


def test_readme_is_short():
    assert len((CHECKOUT / "README.md").read_text().splitlines()) <= 120


def test_readme_and_guide_links_resolve():
    """Every relative link of README.md, cluster/README.md and the guide names a file here."""
    pages = [CHECKOUT / "README.md", CHECKOUT / "cluster" / "README.md"]
    pages += sorted((CHECKOUT / "docs" / "guide").glob("*.md"))
    assert len(pages) >= 8
    for page in pages:
        for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if not link.startswith(("http://", "https://")):
                assert (page.parent / link).exists(), f"{page}: {link}"


def test_readme_python_quickstart_runs_as_shown(tmp_path):
    """Its ten lines as a script, from an empty directory, as a new user pastes them: the
    shipped MovieLens copy, a fit on all of it, recommend / similar / fold-in, an export and
    a saved model; then the saved model serves as the fitted one did."""
    (tmp_path / "quickstart.py").write_text(readme_block("Python quickstart", "python"))
    r = run([sys.executable, "quickstart.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    printed = [ast.literal_eval(line) for line in r.stdout.splitlines()]
    assert len(printed) == 3
    recs, similar, new = printed
    assert list(recs) == [1] and len(recs[1]) == 5
    assert list(similar) == [296] and 296 not in [i for i, _ in similar[296]]
    assert list(new) == [0] and not {296, 318} & {i for i, _ in new[0]}
    assert (tmp_path / "exp" / "_SUCCESS").is_file()
    check = "from ordnmf_dask import OrdNMF; print(OrdNMF.load('model.zarr').recommend([1], n=5))"
    r = run([sys.executable, "-c", check], tmp_path)
    assert r.returncode == 0, r.stderr
    assert ast.literal_eval(r.stdout.strip()) == recs


def test_readme_command_line_pipeline_runs_as_shown(tmp_path):
    """The four lines, on a ratings.csv that is the shipped MovieLens copy."""
    (tmp_path / "ratings.csv").symlink_to(EXAMPLES / "data" / "ml-latest-small" / "ratings.csv")
    lines = readme_block("Command line", "").splitlines()
    assert len(lines) == 4 and all(line.startswith("ordnmf-dask ") for line in lines)
    out = {}
    for line in lines:
        r = run(["bash", "-c", line], tmp_path)
        assert r.returncode == 0, (line, r.stderr)
        out[line.split()[1]] = r.stdout
    header, *rows = out["recommend"].splitlines()
    assert header == "user,rank,item,score" and len(rows) == 20
    assert {row.split(",")[0] for row in rows} == {"1", "42"}
    assert (tmp_path / "exp" / "_SUCCESS").is_file()


def test_every_example_is_tested():
    assert {p.name for p in EXAMPLES.iterdir() if p.is_file()} == TESTED


def test_movielens_small_prints_what_the_readme_shows(tmp_path):
    r = run(["bash", str(EXAMPLES / "movielens_small.sh")], tmp_path, OUT=str(tmp_path / "ml"))
    assert r.returncode == 0, r.stderr
    shown = readme_output()
    assert shown[0].startswith("ranking metrics at k = 100") and len(shown) == 15
    assert r.stdout.splitlines()[-15:] == shown
    results = json.loads((tmp_path / "ml" / "results.json").read_text())
    assert f"{results['ndcg']['1']:.4f}" == readme_ndcg_at_1()
    assert f"converged: 4 members after {readme_iterations()} iterations" in r.stdout
    assert list(tmp_path.iterdir()) == [tmp_path / "ml"]


def test_api_quickstart_honours_data_and_out(tmp_path):
    script = str(EXAMPLES / "api_quickstart.py")
    r = run([sys.executable, script], tmp_path, OUT=str(tmp_path / "qs"))
    assert r.returncode == 0, r.stderr
    n_iter, ndcg = r.stdout.splitlines()[0].split()[0], r.stdout.splitlines()[-2]
    assert n_iter == readme_iterations()
    assert f"{ast.literal_eval(ndcg)[1]:.4f}" == readme_ndcg_at_1()
    assert {p.name for p in (tmp_path / "qs").iterdir()} == {"store.zarr", "model.zarr"}
    # DATA points at another copy: that one is read (here: absent, so an error naming it)
    r = run(
        [sys.executable, script],
        tmp_path,
        OUT=str(tmp_path / "qs2"),
        DATA=str(tmp_path / "elsewhere"),
    )
    assert r.returncode != 0
    assert f"{tmp_path / 'elsewhere' / 'ml-latest-small' / 'ratings.csv'}" in r.stderr


def test_reproduce_paper_without_its_data_says_what_it_needs(tmp_path):
    r = run(
        ["bash", str(EXAMPLES / "reproduce_paper.sh")],
        tmp_path,
        DATA=str(tmp_path / "data"),
        OUT=str(tmp_path / "rep"),
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "set DATA to a directory holding" in r.stderr
    assert "hetrec2011-lastfm-2k/" in r.stderr and "tasteprofile-gouvert-subset/" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.data
def test_reproduce_paper_runs_where_its_data_is(tmp_path):
    """The script as shipped, its protocol shrunk (one dataset) by extra arguments, which it
    passes on."""
    r = run(
        [
            "bash",
            str(EXAMPLES / "reproduce_paper.sh"),
            "--k-grid",
            "2",
            "--seeds",
            "0",
            "--max-iter",
            "2",
            "--jobs",
            "2",
            "--datasets",
            "tasteprofile",
        ],
        tmp_path,
        DATA=str(data_root(TPS)),
        OUT=str(tmp_path / "rep"),
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "rep" / "tasteprofile" / "runs.csv").is_file()
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# OrdNMF vs BePoF")


def prepare_command(job: Path) -> str:
    """The command the job file's comments give to prepare its store."""
    [command] = re.findall(r"^#\s+(mkdir -p .*ordnmf-dask ingest .*)$", job.read_text(), re.M)
    return command


def test_job_file_runs_as_shipped(tmp_path):
    """From a working directory laid out as the repository (the data, the job file): the
    command its comments give, then ``fit --config``; everything is written under out/job."""
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "data").symlink_to(EXAMPLES / "data")
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "job.toml").write_bytes(JOB.read_bytes())
    r = run(["bash", "-c", prepare_command(JOB)], tmp_path)
    assert r.returncode == 0, r.stderr
    r = run([*CLI, "fit", "--n-members", "1", "--config", "cluster/job.toml"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "converged: " in r.stdout
    assert "running in-process" in r.stderr
    assert "test split" not in r.stderr  # the nightly form trains on every rating
    r = run([*CLI, "info", "out/job/ml.zarr", "--json"], tmp_path)
    assert json.loads(r.stdout)["nnz_test"] == 0
    # the next night: the file's overwrite replaces its own model (a short fit: the file as
    # shipped has run to convergence above)
    r = run(
        [*CLI, "fit", "--n-members", "1", "--config", "cluster/job.toml", "--max-iter", "3"],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster", "examples", "out"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["job"]
    assert {p.name for p in (tmp_path / "out" / "job").iterdir()} >= {
        "ml.zarr",
        "model.zarr",
        "fit.log",
    }
    cfg = resolve(str(JOB))
    paths = [cfg.store.path, cfg.output.model, cfg.logging.file]
    assert all(p.startswith("out/job/") for p in paths) and len(set(paths)) == 3
    assert cfg.checkpoint.dir is None  # the default: beside the model, removed once it is saved
    assert not (tmp_path / "out" / "job" / "model.zarr.checkpoints").exists()
    # the same job with another K runs at once (the default checkpoints are the fit's own)
    r = run(
        [
            "ordnmf-dask",
            "fit",
            "--n-members",
            "1",
            "--config",
            "cluster/job.toml",
            "-k",
            "3",
            "--max-iter",
            "3",
            "--overwrite",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr


def test_kubernetes_job_file_is_valid():
    """Not runnable here (it names the pod's /data volume): read and validated as shipped."""
    cfg = resolve(str(CHECKOUT / "cluster" / "kubernetes" / "job.toml"))
    paths = [cfg.store.path, cfg.output.model, cfg.checkpoint.dir]
    assert all(p.startswith("/data/") for p in paths) and len(set(paths)) == 3
    assert cfg.cluster.local is None  # the manifest gives the scheduler address
