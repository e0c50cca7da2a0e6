"""The serving commands of the command line (``recommend MODEL --users``, ``similar-items``,
``similar-users``, ``fold-in``, ``score``) give what the API gives, as a table with a header in
each ``--format``; none needs the training store when the model carries its id maps and its
index of training items. Not marked ``cluster``: none starts one."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import CLI, ZARR_CODEC_WARNING
from test_recommend import oracle_top
from test_serving import Case, check_recs

from ordnmf_dask.app.cli import main


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """A model with its own id maps and seen index, its training store moved away (one for
    the module: the commands only read it)."""
    where = tmp_path_factory.mktemp("alone")
    case = Case(where, own_ids=True, own_seen=True)
    shutil.move(case.store.path, where / "moved.zarr")
    return case


def check_text(got, want):
    """Same items in the same order; scores as text prints them (10 significant digits)."""
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-9)


def table(capsys, fmt: str) -> list[dict[str, str]]:
    out = capsys.readouterr().out
    if fmt == "json":
        return [{k: str(v) for k, v in row.items()} for row in json.loads(out)]
    return list(csv.DictReader(io.StringIO(out), delimiter="\t" if fmt == "tsv" else ","))


@pytest.mark.parametrize("fmt", ["tsv", "csv", "json"])
def test_recommend_needs_no_store_and_prints_a_table(alone, capsys, fmt):
    assert main(["recommend", alone.path, "--users", "u1,u19", "-n", "3", "--format", fmt]) == 0
    rows = table(capsys, fmt)
    assert list(rows[0]) == ["user", "rank", "item", "score"]
    want = oracle_top(alone.W, alone.H, alone.train > 0, 3)
    for user, u in (("u1", 0), ("u19", 6)):
        got = [(int(r["item"]), float(r["score"])) for r in rows if r["user"] == user]
        assert [r["rank"] for r in rows if r["user"] == user] == ["1", "2", "3"][: len(got)]
        check_text(got, alone.named(want[u]))


def test_parquet_goes_to_a_file_and_never_to_a_terminal(alone, tmp_path):
    target = tmp_path / "recs.parquet"
    with open(target, "wb") as fh:
        r = subprocess.run(
            [*CLI, "recommend", alone.path, "--users", "u1", "-n", "2", "--format", "parquet"],
            stdout=fh,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert r.returncode == 0, r.stderr
    got = pq.read_table(target).to_pydict()
    assert list(got) == ["user", "rank", "item", "score"]
    want = oracle_top(alone.W, alone.H, alone.train > 0, 2)[0]
    assert got["user"] == ["u1", "u1"] and got["rank"] == [1, 2]
    check_recs(list(zip(got["item"], got["score"], strict=True)), alone.named(want))


@pytest.mark.parametrize("axis", ["items", "users"])
def test_similar_commands_give_the_apis_lists(alone, capsys, axis):
    ids = ["105", "140"] if axis == "items" else ["u1", "u4"]
    assert main([f"similar-{axis}", alone.path, f"--{axis}", ",".join(ids), "-n", "4"]) == 0
    rows = table(capsys, "tsv")
    noun = axis[:-1]
    assert list(rows[0]) == [noun, "rank", f"similar_{noun}", "cosine"]
    api = getattr(alone.model, f"similar_{axis}")
    want = api([int(x) for x in ids] if axis == "items" else ids, n=4)
    for x, key in zip(ids, want, strict=True):
        got = [(r[f"similar_{noun}"], float(r["cosine"])) for r in rows if r[noun] == x]
        assert [g[0] for g in got] == [str(i) for i, _ in want[key]]
        np.testing.assert_allclose([g[1] for g in got], [s for _, s in want[key]], rtol=1e-9)


def test_fold_in_reads_new_users_from_a_file(alone, tmp_path, capsys):
    ratings = tmp_path / "new.csv"
    ratings.write_text("user,item,rating\nnew1,105,3\nnew1,140,4\nnew2,100,1\nnew1,110,2\n")
    assert main(["fold-in", alone.path, str(ratings), "-n", "3"]) == 0
    rows = table(capsys, "tsv")
    assert list(rows[0]) == ["user", "rank", "item", "score"]
    w = alone.model.fold_in_users([[105, 140, 110], [100]], [[3, 4, 2], [1]])
    want = alone.model.recommend_for(w, 3, exclude=[[105, 140, 110], [100]])
    for user, j in (("new1", 0), ("new2", 1)):
        got = [(int(r["item"]), float(r["score"])) for r in rows if r["user"] == user]
        check_text(got, want[j])
    assert main(["fold-in", alone.path, str(ratings), "--factors", "--format", "csv"]) == 0
    rows = table(capsys, "csv")
    assert [r["user"] for r in rows] == ["new1", "new2"]
    assert list(rows[0])[1:] == [f"f{k}" for k in range(w.shape[1])]
    got = np.array([[float(r[f"f{k}"]) for k in range(w.shape[1])] for r in rows])
    np.testing.assert_allclose(got, w, rtol=1e-9)
    ratings.write_text("user,item,rating\nnew1,105,3\nnew1,999,4\n")
    assert main(["fold-in", alone.path, str(ratings)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown item id '999'" in err[0]
    ratings.write_text("user,item,rating\nnew1,105,3\nnew1,110,x\n")
    assert main(["fold-in", alone.path, str(ratings)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{ratings}, line 3" in err[0]


def test_score_of_pairs_from_flags_and_from_a_file(alone, tmp_path, capsys):
    assert main(["score", alone.path, "--users", "u1,u4", "--items", "105,100"]) == 0
    rows = table(capsys, "tsv")
    assert list(rows[0]) == ["user", "item", "score"]
    want = alone.model.score(["u1", "u4"], [105, 100])
    np.testing.assert_allclose([float(r["score"]) for r in rows], want, rtol=1e-9)
    np.testing.assert_allclose(want, [alone.W[0] @ alone.H[1], alone.W[1] @ alone.H[0]])
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("item,user\n105,u1\n100,u4\n")
    assert main(["score", alone.path, "--pairs", str(pairs), "--columns", "user,item"]) == 0
    np.testing.assert_allclose([float(r["score"]) for r in table(capsys, "tsv")], want)
    assert main(["score", alone.path, "--users", "u1"]) == 2
    assert "--users needs --items" in capsys.readouterr().err


# ------------------------------------------------------------ batches: ids from a file or stdin


def test_recommend_reads_a_batch_of_users_from_a_file_into_one_table(alone, tmp_path, capsys):
    """``--users-from FILE``: one id per line (blank lines skipped), one table, the same
    lists as ``--users`` gives for the same ids."""
    ids = tmp_path / "users.txt"
    ids.write_text("u1\n\n  u19 \nu4\n")
    assert main(["recommend", alone.path, "--users-from", str(ids), "-n", "3"]) == 0
    batch = table(capsys, "tsv")
    assert main(["recommend", alone.path, "--users", "u1,u19,u4", "-n", "3"]) == 0
    assert batch == table(capsys, "tsv")
    assert [r["user"] for r in batch][::3] == ["u1", "u19", "u4"]


def test_a_batch_from_standard_input(alone, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("105\n140\n"))
    assert main(["similar-items", alone.path, "--items-from", "-", "-n", "2"]) == 0
    batch = table(capsys, "tsv")
    assert main(["similar-items", alone.path, "--items", "105,140", "-n", "2"]) == 0
    assert batch == table(capsys, "tsv") and len(batch) == 4


def test_a_batch_through_a_pipe_in_one_process(alone):
    """What a script does: the ids piped to the command, the table read back."""
    r = subprocess.run(
        [*CLI, "similar-users", alone.path, "--users-from", "-", "-n", "1", "--format", "csv"],
        input="u1\nu4\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [row["user"] for row in rows] == ["u1", "u4"]
    want = alone.model.similar_users(["u1", "u4"], n=1)
    assert [row["similar_user"] for row in rows] == [want["u1"][0][0], want["u4"][0][0]]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("u1\nnobody\n", "users.txt, line 2: unknown user id 'nobody'"),
        ("\n \n", "users.txt: no user ids (one per line)"),
        (b"u1\n\xff\n", "users.txt, line 2: not UTF-8 text"),
    ],
)
def test_a_bad_batch_file_is_one_line_naming_it(alone, tmp_path, capsys, text, said):
    ids = tmp_path / "users.txt"
    ids.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(["recommend", alone.path, "--users-from", str(ids)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    # zarr 3.0 (the floors) warns about its string codec when it opens the id maps
    err = [ln for ln in captured.err.splitlines() if ZARR_CODEC_WARNING not in ln]
    assert len(err) == 1 and said in err[0] and err[0].startswith("ordnmf-dask recommend: error:")


SERVE_AND_LIST_MODULES = """
import sys
from ordnmf_dask.app.cli import main

code = main(sys.argv[1:])
heavy = ("numba.np.arraymath", "scipy.linalg", "pyarrow", "distributed")
print(code, *(m for m in heavy if m in sys.modules))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["recommend", "{model}", "--users", "u1,u4", "-n", "3"],
        ["similar-items", "{model}", "--items", "105", "-n", "3"],
        ["score", "{model}", "--users", "u1", "--items", "105"],
    ],
)
def test_serving_a_few_users_starts_no_compiled_code(alone, args):
    """A command for a few users runs no numba kernel (numba's start-up on a first call
    imports numba.np.arraymath and scipy.linalg: most of such a command's time), and loads
    neither pyarrow nor distributed (docs/performance.md, "Serving from the command line")."""
    r = subprocess.run(
        [sys.executable, "-c", SERVE_AND_LIST_MODULES, *(a.format(model=alone.path) for a in args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "0"
