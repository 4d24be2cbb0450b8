"""No import circle among headcount's modules, counting every import statement: at module level,
inside functions, and under ``if TYPE_CHECKING:`` (import-linter's contract leaves those out, and a
circle through them is still two modules that each need the other to be read)."""

from __future__ import annotations

import ast
from pathlib import Path

import headcount

SRC = Path(headcount.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its ``__init__.py``)."""
    found = {}
    for f in SRC.rglob("*.py"):
        parts = ("headcount", *f.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = f
    return found


def _imported(name: str, is_package: bool, node: ast.AST, modules: dict) -> set[str]:
    """The headcount modules one import statement of module ``name`` reads."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        if node.level:  # relative: from the module's package, one level up per extra dot
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            pkg = ".".join([*base, *([node.module] if node.module else [])])
        else:
            pkg = node.module or ""
        # `from pkg import module` reads that module; `from pkg import name` reads pkg
        targets = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in modules else pkg for a in node.names]
    out = set()
    for t in targets:
        while t and t not in modules:  # `import headcount.x.y` of a name inside x: the deepest module
            t = t.rpartition(".")[0]
        if t and t != name:
            out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, f in modules.items():
        tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(name, f.name == "__init__.py", node, modules)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (``a -> b -> ... -> a``) per strongly connected group of more than one module."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm, recursion bounded by the module count
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_in(graph, g) for g in groups]


def _path_in(graph, group: set[str]) -> list[str]:
    """A shortest circle through the first module of ``group`` (breadth first, inside the group)."""
    start = min(group)
    prev, queue = {start: None}, [start]
    for v in queue:
        for w in sorted(graph[v] & group):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return sorted(group)  # pragma: no cover - a strongly connected group always has one


def test_the_graph_sees_function_level_relative_and_type_checking_imports():
    graph = import_graph()
    assert len(graph) > 50 and "headcount.runtime.errors" in graph["headcount.runtime.atomic"]  # module level
    # function level: magnitude_prune reads core.models inside a function only
    assert "headcount.core.models" in graph["headcount.train.magnitude_prune"]
    # a circle the walk must find: two modules, one of them importing inside a function
    toy = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(toy) == [["a", "b", "c", "a"]]
    src = "def f():\n    from . import sibling\nif TYPE_CHECKING:\n    from .other import X\n"
    mods = {"p": None, "p.m": None, "p.sibling": None, "p.other": None}
    found = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= _imported("p.m", False, node, mods)
    assert found == {"p.sibling", "p.other"}


def test_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)
