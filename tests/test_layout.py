"""The package's layout follows the data flow (docs/design.md §8): imports only point down."""

from __future__ import annotations

import ast
from pathlib import Path

import ordnmf_dask

# higher imports lower, never the other way round
LAYERS = ["errors", "datasets", "params", "model", "runtime", "store", "sources", "modelstore",
          "engine", "outputs", "postfit", "fitting", "estimator", "tuning", "app"]  # fmt: skip
ROOT = Path(ordnmf_dask.__file__).parent


def _layer(module: str) -> str:
    return module.split(".")[1]


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return [m for m in out if m.startswith("ordnmf_dask.")]


def test_every_module_belongs_to_a_layer():
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[0] not in ("__init__", "_lazy", "__main__"):
            assert parts[0] in LAYERS, path


def test_no_import_points_up_and_no_private_name_crosses_modules():
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[0] in ("__init__", "_lazy", "__main__"):
            continue
        mine = LAYERS.index(parts[0])
        for module in _imports(path):
            assert LAYERS.index(_layer(module)) <= mine, f"{path} imports {module}"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ordnmf_dask"):
                names = [a.name for a in node.names]
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                assert not private, f"{path} imports {private} from {node.module}"


def test_relative_imports_are_not_used():
    """Absolute imports keep every module's dependencies readable from its header."""
    for path in ROOT.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: relative import"


def test_sources_modules_import_each_other_in_one_direction_and_at_the_top():
    """No import circle among the modules of ``sources`` (each rule kept once, in a module below
    its users), and none hidden by an import inside a function."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "sources").glob("*.py"):
        tree = ast.parse(path.read_text())
        graph[path.stem] = {m.split(".")[2] for m in _imports(path)
                            if m.startswith("ordnmf_dask.sources.")}  # fmt: skip
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = [m for node in ast.walk(fn) if isinstance(node, ast.ImportFrom)
                         and (m := node.module or "").startswith("ordnmf_dask")]  # fmt: skip
                assert not inner, f"{path}: {fn.name} imports {inner}"
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for dep in graph.get(module, ()):
            visit(dep, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
