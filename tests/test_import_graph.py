"""The package's modules import each other without cycles (read from the source with ast).

Two graphs: the imports a module runs when it is imported (its top level, ``if``/``try`` blocks
included, ``if TYPE_CHECKING:`` left out) must be acyclic; the imports inside functions too may
close a cycle only where listed in ``LAZY_EDGES_ALLOWED`` with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "headcount"

#: imports inside functions that close a cycle, each with why it is still there: none (the
#: compatibility re-exports that needed them are gone); kept so that a future one is argued here
LAZY_EDGES_ALLOWED: set[tuple[str, str]] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _targets(module: str, is_pkg: bool, node: ast.Import | ast.ImportFrom, modules) -> set[str]:
    """The package modules an import statement loads (``from a import b`` may name module a.b)."""
    names = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: None if is_pkg else -1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    out = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith(PACKAGE) and name != module and not module.startswith(name + "."):
            out.add(name)
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _top_level(body):
    """Import statements run at import time: the module body and its if/try/with blocks."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                yield from _top_level(block)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def graph(lazy: bool) -> dict[str, set[str]]:
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, (path, is_pkg) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = ([n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] if lazy
                 else list(_top_level(tree.body)))
        for node in nodes:
            edges[module] |= _targets(module, is_pkg, node, modules)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_relative_and_absolute_imports():
    edges = graph(lazy=False)
    assert "headcount.runner.registry" in edges["headcount.runner.config"]  # from .registry import ...
    assert "headcount.errors" in edges["headcount.runner.config"]  # from ..errors import ...


def test_no_import_cycles_at_import_time():
    found = cycles(graph(lazy=False))
    assert not found, f"import cycles among top-level imports: {found}"


def test_imports_inside_functions_close_only_the_listed_cycles():
    edges = graph(lazy=True)
    without = {a: {b for b in bs if (a, b) not in LAZY_EDGES_ALLOWED} for a, bs in edges.items()}
    found = cycles(without)
    assert not found, f"import cycles through imports inside functions: {found}"


@pytest.mark.parametrize("low, high", [("headcount.runner", "headcount.report"),
                                       ("headcount.runner", "headcount.studies"),
                                       ("headcount.runner", "headcount.commands")])
def test_the_runner_imports_neither_reports_nor_study_types(low, high):
    """The runner knows no report and no study by name: reports build on it, study types register."""
    edges = graph(lazy=True)
    offenders = {(a, b) for a, bs in edges.items() if a.startswith(low) for b in bs if b.startswith(high)}
    assert not offenders
    registry = (SRC / PACKAGE / "runner" / "registry.py").read_text(encoding="utf-8")
    assert "headcount.studies." not in registry
