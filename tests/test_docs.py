"""The user guide's code (docs/guide/*.md; the site is built by .ci/run): every fenced ``python``
block compiles, imports only public names, calls only methods the estimators have, and uses no
name that neither it, an earlier block of its page, nor its first line ``# needs: ...`` provides.
Every block runs as shown, in a temporary directory: one without ``# needs:`` is
self-contained; what the others need, ``PROVIDED`` makes (from the MovieLens copy the checkout
ships, small synthetic ratings, an S3 bucket on loopback, the session's cluster)."""

from __future__ import annotations

import ast
import builtins
import re
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pytest
from conftest import CHECKOUT, synthetic_ordinal

import ordnmf_dask

pytest_plugins = ["tests.s3server"]

GUIDE = CHECKOUT / "docs" / "guide"
NEEDS = "# needs:"


def python_blocks(page: Path) -> list[str]:
    """The fenced ``python`` blocks of a Markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```$", page.read_text(), flags=re.M | re.S)


PLACES = [(page, j) for page in sorted(GUIDE.glob("*.md")) for j in range(len(python_blocks(page)))]
BLOCKS = [pytest.param(page, j, id=f"{page.name}-{j}") for page, j in PLACES]


def defined(tree: ast.AST) -> set[str]:
    """Names a block binds: imports, assignments, functions, loop and comprehension targets."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
            names |= {a.arg for a in node.args.args} if isinstance(node, ast.FunctionDef) else set()
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def test_guide_has_blocks_and_a_self_contained_one():
    """The parametrization below sees the guide's blocks, and at least one of them runs."""
    blocks = [b for page in GUIDE.glob("*.md") for b in python_blocks(page)]
    assert len(blocks) >= 5
    assert any(not b.startswith(NEEDS) for b in blocks)


@pytest.mark.parametrize(("page", "index"), BLOCKS)
def test_block_names_are_public_and_provided(page, index):
    blocks = python_blocks(page)
    block = blocks[index]
    tree = ast.parse(block, filename=f"{page.name} block {index}")
    earlier = set().union(*(defined(ast.parse(b)) for b in blocks[:index]))
    needs = block.splitlines()[0] if block.startswith(NEEDS) else ""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "ordnmf_dask":
            missing = [a.name for a in node.names if a.name not in ordnmf_dask.__all__]
            assert not missing, f"{page.name} block {index} imports non-public {missing}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "model":
                # a method or property, or a fitted attribute its docstring lists
                documented = re.search(rf"\b{node.attr}\b", ordnmf_dask.OrdNMF.__doc__ or "")
                assert hasattr(ordnmf_dask.OrdNMF, node.attr) or documented, (
                    f"{page.name} block {index}: OrdNMF has no {node.attr!r}"
                )
    free = (
        {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        - defined(tree)
        - earlier
        - set(dir(builtins))
    )
    unprovided = sorted(n for n in free if not re.search(rf"\b{re.escape(n)}\b", needs))
    assert not unprovided, (
        f"{page.name} block {index} uses {unprovided}: define them or list them in '# needs:'"
    )


def needed(block: str) -> list[str]:
    """The names and files a block's ``# needs:`` line lists (their notes in parentheses
    dropped)."""
    if not block.startswith(NEEDS):
        return []
    line = re.sub(r"\([^()]*(\([^()]*\)[^()]*)*\)", "", block.splitlines()[0][len(NEEDS) :])
    return [item.strip() for item in line.split(",")]


def movielens_ratings(cwd: Path) -> None:
    """``ratings.csv`` in the working directory: the checkout's MovieLens latest-small copy."""
    from ordnmf_dask.datasets import fetch_movielens_small

    shutil.copy(fetch_movielens_small(data_home=cwd / "cache"), cwd / "ratings.csv")


def last_nights_model(cwd: Path, request: pytest.FixtureRequest) -> dict[str, object]:
    """``day.csv`` (MovieLens latest-small) and ``model-last.zarr``: a model of K = 50 (the
    retraining example's) fitted on it, as last night's job would have left it."""
    if (cwd / "model-last.zarr").exists():  # made for the other of the two
        return {}
    movielens_ratings(cwd)
    shutil.copy(cwd / "ratings.csv", cwd / "day.csv")
    store = ordnmf_dask.ingest("day.csv", "last.zarr", ratings="halfstar", test_fraction=0)
    ordnmf_dask.OrdNMF(50, max_iter=20).fit(store, out="model-last.zarr")
    return {}


# the small ratings the guide's fitting and serving blocks run on: half stars of a low-rank model
# (tests/conftest.py), 120 users x 80 items (K = 50 fits it in milliseconds an iteration, and a
# randomized SVD of rank 50 exists), ids as MovieLens's (users from 1, items 250.. holding the
# guide's 296 and 318); the grown store adds 20 users and 10 items
USERS, ITEMS, GROWN = 120, 80, (20, 10)


def write_ratings(path: Path, users: int, items: int, counts: bool = False) -> None:
    """``user,item,rating`` lines of the first ``users`` x ``items`` of the small ratings (the
    ratings of a grown period extend those of the earlier one); ``counts``: play counts (the
    class squared) instead of half stars."""
    y = synthetic_ordinal(USERS + GROWN[0], ITEMS + GROWN[1], 10, k=3, density=0.2, seed=0)
    u, i = np.nonzero(y[:users, :items])
    v = y[u, i] ** 2 if counts else y[u, i] / 2
    lines = [f"{a + 1},{b + 250},{c:g}" for a, b, c in zip(u, i, v, strict=True)]
    path.write_text("\n".join(["user,item,rating", *lines]) + "\n")


def small_store(cwd: Path, request: pytest.FixtureRequest) -> dict[str, object]:
    """``store``: the small ratings ingested with test and validation subsets (tune scores the
    validation one)."""
    if (cwd / "given.zarr").exists():  # made for another need of the block
        return {"store": ordnmf_dask.open_store("given.zarr")}
    write_ratings(cwd / "small.csv", USERS, ITEMS)
    store = ordnmf_dask.ingest(
        "small.csv", "given.zarr", ratings="halfstar", test_fraction=0.2, validation_fraction=0.1
    )
    return {"store": store}


def counts_store(cwd: Path, request: pytest.FixtureRequest) -> dict[str, object]:
    """``counts_store``: play counts of the same pairs, ingested with the paper's thresholds."""
    write_ratings(cwd / "plays.csv", USERS, ITEMS, counts=True)
    return {"counts_store": ordnmf_dask.ingest("plays.csv", "plays.zarr", counts="paper")}


def grown_store(cwd: Path, request: pytest.FixtureRequest) -> dict[str, object]:
    """``new_store``: the small ratings grown by new users and items (the next period's)."""
    write_ratings(cwd / "grown.csv", USERS + GROWN[0], ITEMS + GROWN[1])
    new = ordnmf_dask.ingest("grown.csv", "grown.zarr", ratings="halfstar", test_fraction=0.2)
    return {"new_store": new}


def fitted_model(cwd: Path, request: pytest.FixtureRequest) -> dict[str, object]:
    """``model`` and ``model.zarr``: a model of K = 50 (the guide's) fitted on the small
    ratings (5 iterations) and saved there."""
    if (cwd / "model.zarr").exists():  # made for the other of the two
        return {"model": ordnmf_dask.OrdNMF.load("model.zarr")}
    store = small_store(cwd, request)["store"]
    return {"model": ordnmf_dask.OrdNMF(50, max_iter=5).fit(store, out="model.zarr")}


def s3_bucket(cwd: Path, request: pytest.FixtureRequest) -> dict[str, object]:
    """An S3 bucket named ``bucket`` (the guide's s3://bucket/...) on the loopback server
    (tests/s3server.py), reached through the environment as a user's credentials and endpoint
    are (monkeypatch restores it); the bucket is removed after the test."""
    s3 = request.getfixturevalue("s3")
    monkeypatch = request.getfixturevalue("monkeypatch")
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", dict(s3.storage_options))
    s3.fs.mkdir("bucket")
    request.addfinalizer(lambda: s3.fs.rm("bucket", recursive=True))
    return {}


def a_cluster(cwd: Path, request: pytest.FixtureRequest) -> dict[str, object]:
    """The session's LocalCluster, its client the current one (the block's fits run there):
    ``test_cluster_block_runs_as_shown`` holds it."""
    assert "client" in request.fixturenames
    return {}


# what a block may need and this test provides: files in the working directory, names in the
# namespace the block runs in (made from its working directory and the test's request)
PROVIDED = {
    "ratings.csv": lambda cwd, request: movielens_ratings(cwd) or {},
    "store": small_store,
    "counts_store": counts_store,
    "new_store": grown_store,
    "model": fitted_model,
    "model.zarr": fitted_model,
    "day.csv": last_nights_model,
    "model-last.zarr": last_nights_model,
    "an S3 bucket": s3_bucket,
    "a cluster": a_cluster,
}
# those made from MovieLens (a real dataset: marker ``data``) and those needing the cluster
REAL_DATA = {"ratings.csv", "day.csv", "model-last.zarr"}
CLUSTER = {"a cluster"}


def marks(page: Path, index: int) -> list[pytest.MarkDecorator]:
    """Marker ``data`` for a block that runs on the MovieLens copy (a real dataset), ``cluster``
    for one that runs on the session's cluster."""
    needs = set(needed(python_blocks(page)[index]))
    return [pytest.mark.data] * bool(needs & REAL_DATA) + [pytest.mark.cluster] * bool(
        needs & CLUSTER
    )


RUNS = [
    pytest.param(page, j, id=f"{page.name}-{j}", marks=marks(page, j))
    for page, j in PLACES
    if not CLUSTER & set(needed(python_blocks(page)[j]))
]
ON_CLUSTER = [
    pytest.param(page, j, id=f"{page.name}-{j}", marks=marks(page, j))
    for page, j in PLACES
    if CLUSTER & set(needed(python_blocks(page)[j]))
]


def test_every_need_is_provided():
    """Every block runs below: whatever a block needs, this test provides."""
    for page, index in PLACES:
        missing = [item for item in needed(python_blocks(page)[index]) if item not in PROVIDED]
        assert not missing, f"{page.name} block {index} needs {missing}: add them to PROVIDED"


@pytest.mark.parametrize(("page", "index"), RUNS)
def test_block_runs_as_shown(page, index, tmp_path, monkeypatch, request):
    run_block(page, index, tmp_path, monkeypatch, request)


@pytest.mark.parametrize(("page", "index"), ON_CLUSTER)
def test_cluster_block_runs_as_shown(page, index, tmp_path, monkeypatch, request, client):
    """A block that needs a cluster, with the session's client the current one (asked for here,
    not by its provider, so that the session's cluster is up before the test starts)."""
    run_block(page, index, tmp_path, monkeypatch, request)


def run_block(page: Path, index: int, tmp_path: Path, monkeypatch, request) -> None:
    """Run a block as shown in ``tmp_path``, with what it needs."""
    block = python_blocks(page)[index]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__guide__"}
    for item in needed(block):
        namespace.update(PROVIDED[item](tmp_path, request))
    exec(compile(block, f"{page.name} block {index}", "exec"), namespace)  # noqa: S102
