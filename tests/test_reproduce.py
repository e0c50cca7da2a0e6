"""The reproduction command end to end on a real dataset (tiny settings: it checks the plumbing;
the full protocol's figures are in README.md with the command that produced them)."""

from __future__ import annotations

import csv

import pytest
from conftest import TPS, data_root

from ordnmf_dask.app.cli import main


@pytest.mark.data
def test_reproduce_writes_table_runs_and_figures(tmp_path, client, capsys):
    code = main(
        [
            "reproduce",
            "--out",
            str(tmp_path),
            "--data",
            str(data_root(TPS)),
            "--datasets",
            "tasteprofile",
            "--k-grid",
            "3",
            "--seeds",
            "0,1",
            "--max-iter",
            "2",
            "--jobs",
            "3",
            "--scheduler",
            client.scheduler.address,
        ]
    )
    assert code == 0
    report = (tmp_path / "report.md").read_text()
    assert report == capsys.readouterr().out.rstrip("\n") + "\n"
    for label in ("OrdNMF", "BePoF >=1", "BePoF >=3", "PF >=1", "PF >=3", "dcPF"):
        assert f"| {label} |" in report
    with open(tmp_path / "tasteprofile" / "runs.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 6 * 2 and {r["seed"] for r in rows} == {"0", "1"}
    assert all(int(r["n_iter"]) == 2 for r in rows)
    for name in ("elbo.png", "ppc.png", "thresholds.png", "ppc.json"):
        assert (tmp_path / "tasteprofile" / name).stat().st_size > 0


@pytest.mark.data
def test_reproduce_without_a_cluster_runs_small_datasets_in_process(tmp_path, capsys):
    """Not marked ``cluster``: the command fails if it starts a scheduler (conftest)."""
    code = main(
        [
            "reproduce",
            "--out",
            str(tmp_path),
            "--data",
            str(data_root(TPS)),
            "--datasets",
            "tasteprofile",
            "--k-grid",
            "2",
            "--seeds",
            "0",
            "--max-iter",
            "2",
            "--jobs",
            "2",
        ]
    )
    assert code == 0, capsys.readouterr().err
    with open(tmp_path / "tasteprofile" / "runs.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 6
    assert (tmp_path / "tasteprofile" / "ppc.json").stat().st_size > 0


def test_reproduce_rejects_unknown_dataset(tmp_path, capsys):
    assert main(["reproduce", "--out", str(tmp_path), "--datasets", "netflix"]) == 2
    assert "netflix" in capsys.readouterr().err


def test_reproduce_data_follows_the_input_rule(tmp_path, capsys):
    """``--data`` is a directory and each dataset a regular file, checked before any work: a
    missing directory, a file in its place, a FIFO or a directory where the dataset file
    belongs, or a link to a device, each refused in one line naming the path, nothing
    written under --out."""
    import os

    rel = os.path.join("ml-latest-small", "ratings.csv")
    (tmp_path / "afile").write_text("x")
    cases = {
        "absent": (tmp_path / "absent", "no such directory"),
        "afile": (tmp_path / "afile", "not a directory"),
    }
    for kind in ("fifo", "dir", "device"):
        root = tmp_path / kind
        (root / "ml-latest-small").mkdir(parents=True)
        path = root / rel
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            path.mkdir()
        else:
            path.symlink_to("/dev/zero")
        reason = {"fifo": "a FIFO", "dir": "a directory", "device": "a character device"}
        cases[kind] = (root, f"{path}: is {reason[kind]}")
    for data, reason in cases.values():
        out = tmp_path / f"out-{data.name}"
        code = main(
            ["reproduce", "--out", str(out), "--data", str(data), "--datasets", "movielens", "-q"]
        )
        [line] = capsys.readouterr().err.splitlines()
        assert code == 2 and reason in line and str(data) in line, line
        assert not out.exists()
