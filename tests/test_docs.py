"""The user guide's code (docs/guide/*.md; the site is built by .ci/run): every fenced ``python``
block compiles, imports only public names, calls only methods the estimators have, and uses no
name that neither it, an earlier block of its page, nor its first line ``# needs: ...`` provides.
A block without ``# needs:`` is self-contained and runs as shown, in a temporary directory; so
does one whose needs are all in ``PROVIDED`` (made from the MovieLens copy the checkout ships);
any other is skipped, saying what it needs."""

from __future__ import annotations

import ast
import builtins
import re
import shutil
from pathlib import Path

import pytest
from conftest import CHECKOUT

import ordnmf_dask

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


def movielens_store(cwd: Path) -> dict[str, object]:
    """``store``: MovieLens latest-small ingested as README's quickstart does, 20% held out."""
    movielens_ratings(cwd)
    store = ordnmf_dask.ingest(
        "ratings.csv", "given.zarr", ratings="halfstar", min_count=20, test_fraction=0.2
    )
    return {"store": store}


def last_nights_model(cwd: Path) -> dict[str, object]:
    """``day.csv`` (MovieLens latest-small) and ``model-last.zarr``: a model of K = 50 (the
    retraining example's) fitted on it, as last night's job would have left it."""
    if (cwd / "model-last.zarr").exists():  # made for the other of the two
        return {}
    movielens_ratings(cwd)
    shutil.copy(cwd / "ratings.csv", cwd / "day.csv")
    store = ordnmf_dask.ingest("day.csv", "last.zarr", ratings="halfstar", test_fraction=0)
    ordnmf_dask.OrdNMF(50, max_iter=20).fit(store, out="model-last.zarr")
    return {}


# what a block may need and this test provides: files in the working directory, names in the
# namespace the block runs in
PROVIDED = {
    "ratings.csv": lambda cwd: movielens_ratings(cwd) or {},
    "store": movielens_store,
    "day.csv": last_nights_model,
    "model-last.zarr": last_nights_model,
}


def reads_data(page: Path, index: int) -> list[pytest.MarkDecorator]:
    """Marker ``data`` for a block that runs on the MovieLens copy (a real dataset)."""
    return [pytest.mark.data] if PROVIDED.keys() & set(needed(python_blocks(page)[index])) else []


RUNS = [
    pytest.param(page, j, id=f"{page.name}-{j}", marks=reads_data(page, j)) for page, j in PLACES
]


@pytest.mark.parametrize(("page", "index"), RUNS)
def test_block_runs_as_shown(page, index, tmp_path, monkeypatch):
    block = python_blocks(page)[index]
    missing = [item for item in needed(block) if item not in PROVIDED]
    if missing:
        pytest.skip(f"{page.name} block {index} needs {', '.join(missing)}")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__guide__"}
    for item in needed(block):
        namespace.update(PROVIDED[item](tmp_path))
    exec(compile(block, f"{page.name} block {index}", "exec"), namespace)  # noqa: S102
