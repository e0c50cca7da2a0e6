"""The package's layout follows the data flow (docs/design.md §8): imports only point down."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import ordnmf_dask

# higher imports lower, never the other way round
LAYERS = [
    "errors",
    "params",
    "model",
    "runtime",
    "store",
    "datasets",
    "sources",
    "modelstore",
    "engine",
    "postfit",
    "fitting",
    "tuning",
    "estimator",
    "app",
]
ROOT = Path(ordnmf_dask.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own)."""
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("ordnmf_dask", *path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _import_nodes(source: str) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of the module text ``source``, at its top or inside a function."""
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))]


@functools.cache
def _imports_of(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """:func:`_import_nodes` of the module at ``path``, found once for all the checks below
    (parsing and walking the package is most of their time)."""
    return tuple(_import_nodes(path.read_text()))


def imported(source: str | tuple[ast.Import | ast.ImportFrom, ...], modules: set[str]) -> set[str]:
    """The ``modules`` the module text ``source`` (or its :func:`_import_nodes`) imports
    (``from ordnmf_dask.x import y`` imports the module ``ordnmf_dask.x.y`` when there is
    one, else ``ordnmf_dask.x``)."""
    targets = set()
    for node in _import_nodes(source) if isinstance(source, str) else source:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                targets.add(inner if inner in modules else node.module)
        elif isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
    return targets & modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (:func:`imported`), the package's own
    ``__init__`` and ``_lazy`` (public names loaded on first use) left out."""
    modules = _modules()
    names = set(modules) - {"ordnmf_dask", "ordnmf_dask._lazy"}
    return {name: imported(_imports_of(modules[name]), names) - {name} for name in names}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module, each sorted:
    every set of modules that import one another round a circle."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return sorted(found)


def _layer(module: str) -> str:
    return module.split(".")[1]


def _imports(path: Path) -> list[str]:
    out = []
    for node in _imports_of(path):
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
        for node in _imports_of(path):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ordnmf_dask"):
                names = [a.name for a in node.names]
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                assert not private, f"{path} imports {private} from {node.module}"


def test_relative_imports_are_not_used():
    """Absolute imports keep every module's dependencies readable from its header."""
    for path in ROOT.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        for node in _imports_of(path):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: relative import"


def test_cycles_finds_a_circle_closed_inside_a_function():
    """The check below sees what it is meant to: an import inside a function counts, a name
    imported from a package counts as its module, and a circle is found where imports point
    round and none where they point one way."""
    modules = {"ordnmf_dask.store", "ordnmf_dask.store.blocks", "ordnmf_dask.store.locations"}
    source = (
        "from ordnmf_dask.store import locations\n"
        "def f():\n    from ordnmf_dask.store import blocks\n"
    )
    assert imported(source, modules) == {"ordnmf_dask.store.locations", "ordnmf_dask.store.blocks"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_between_modules():
    """No two modules import each other, directly or round a longer circle, whether the
    imports sit at the top of a module or inside a function: a module can be read, and
    loaded, after the ones it names."""
    found = cycles(import_graph())
    assert not found, "modules importing one another: " + "; ".join(map(" <-> ".join, found))
