"""The package's layers point down: every import (at the top of a module or inside a function) goes to
the importer's own layer or a lower one, as ``pyro_flat.LAYERS`` lists them, and no modules import
each other in a cycle. Read from the source with ``ast``: nothing is imported to check it."""

import ast
from pathlib import Path

import pytest

import pyro_flat

PACKAGE = Path(pyro_flat.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict:
    """``{module: {imported pyro_flat module, ...}}`` over every module of the package; ``from x import y``
    counts as an import of ``x.y`` when ``x.y`` is a module, else of ``x``."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = _resolve(name, is_package, node)
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in files else module for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t.split(".")[0] == "pyro_flat" and t != name and t in files)
        graph[name] = edges
    return graph


def unit(module: str) -> str:
    """The top-level module or subpackage that ``module`` belongs to (``pyro_flat.kernels.sgld`` -> ``kernels``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of() -> dict:
    return {name: depth for depth, names in enumerate(pyro_flat.LAYERS) for name in names}


def test_every_module_of_the_package_has_a_layer():
    layers = layer_of()
    units = {unit(m) for m in import_graph()} - {"__init__", "__main__"}
    assert sorted(units - set(layers)) == [], "add the module or subpackage to pyro_flat.LAYERS"
    assert sorted(set(layers) - units) == [], "pyro_flat.LAYERS names a module that does not exist"


#: the most modules the package's root may hold, ``__init__`` and ``__main__`` included (the rest sit in folders)
ROOT_MODULES_MAX = 8


def root_modules(package: Path) -> set:
    return {p.stem for p in package.glob("*.py")} - {"__init__", "__main__"}


def stray_root_modules(package: Path, layers) -> set:
    """The modules at the root of ``package`` that ``layers`` does not name."""
    return root_modules(package) - {name for names in layers for name in names}


def test_the_root_holds_only_the_foundations_layers_names_and_folders_hold_the_rest():
    """A module added at the root fails here unless LAYERS names it on purpose, and the root stays small."""
    assert sorted(stray_root_modules(PACKAGE, pyro_flat.LAYERS)) == [], "put the module in a folder of its layer"
    assert len(root_modules(PACKAGE)) + 2 <= ROOT_MODULES_MAX
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert {name for names in pyro_flat.LAYERS for name in names} == root_modules(PACKAGE) | folders


def test_a_new_module_at_the_root_is_caught(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    for name in ("errors", "validation", "stray"):
        (tmp_path / f"{name}.py").write_text("")
    assert stray_root_modules(tmp_path, (("errors", "validation"),)) == {"stray"}


def test_no_import_points_up_a_layer():
    layers = layer_of()
    upward = sorted(f"{a} -> {b} ({unit(a)}: layer {layers[unit(a)]}, {unit(b)}: layer {layers[unit(b)]})"
                    for a, edges in import_graph().items() if unit(a) in layers
                    for b in edges if layers[unit(b)] > layers[unit(a)])
    assert upward == []


def _cycles(graph: dict) -> list:
    """The strongly connected components with more than one node (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_each_other_in_a_cycle():
    graph = import_graph()
    between_units = {}
    for a, edges in graph.items():
        between_units.setdefault(unit(a), set()).update(unit(b) for b in edges if unit(b) != unit(a))
    assert _cycles(between_units) == []
    # inside a subpackage, its __init__ gathers its modules: a module that imports its own package's
    # __init__ would close a loop through it, so those edges are checked too
    assert _cycles(graph) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle(graph, expected):
    assert _cycles(graph) == expected


def test_an_import_inside_a_function_counts(tmp_path, monkeypatch):
    package = tmp_path / "pyro_flat"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from .high import g\n")
    (package / "high.py").write_text("from . import low\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", package)
    assert import_graph()["pyro_flat.low"] == {"pyro_flat.high"}
    assert _cycles(import_graph()) == [["pyro_flat.high", "pyro_flat.low"]]
