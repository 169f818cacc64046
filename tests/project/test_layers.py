"""The layers of mgx_graph (docs/architecture.md, "Layers"), checked over the source: every import of
mgx_graph/ and operators/ (``mgx_graph.operators``), at the top of a module or inside a function,
relative or absolute, is resolved to the module it loads (``from pkg import name`` to the submodule
``pkg.name`` when there is one, else to ``pkg`` itself), and

(a) no two modules import each other, directly or through others (a strongly connected component of
    more than one module is reported with one of its cycles, each step with its file and line);
(b) each import goes to the importer's own layer or to one that :data:`ALLOWED` lets it use.

A submodule that imports names from its own package (``from mgx_graph import x`` inside mgx_graph)
imports the package's ``__init__``: import from the defining module instead.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = {"mgx_graph": ROOT / "mgx_graph", "mgx_graph.operators": ROOT / "operators"}
# modules that are imported but not scanned here: the native replay (a C extension) and the model builders
NOT_SCANNED = {"mgx_graph._native": "base", "mgx_graph.models": "models"}

# module (or package prefix) -> layer; the longest prefix of a module's name decides
LAYER_OF = {
    "mgx_graph": "top",  # the package __init__: the public names, re-exported
    "mgx_graph.errors": "base", "mgx_graph.env": "base", "mgx_graph.version": "base", "mgx_graph.settings": "base",
    "mgx_graph.runtime": "runtime",
    "mgx_graph.ir": "ir",
    "mgx_graph.operators": "operators",
    "mgx_graph.onnx": "onnx",
    "mgx_graph.passes": "passes",
    "mgx_graph.passes.analysis": "analysis", "mgx_graph.passes.compile_result": "analysis",
    "mgx_graph.exec": "exec",
    "mgx_graph.graph": "graph",
    "mgx_graph.targets": "targets",
    "mgx_graph.compiler": "compile", "mgx_graph.dynamic": "compile", "mgx_graph.backend": "compile",
    "mgx_graph.mxr": "compile",
    "mgx_graph.llm": "llm",
    "mgx_graph.cli": "cli", "mgx_graph.__main__": "cli", "mgx_graph.serve": "cli",
}
_BELOW_RUN_TIME = {"base", "runtime", "ir", "operators", "analysis"}
_BELOW_COMPILE = _BELOW_RUN_TIME | {"onnx", "passes", "exec", "graph", "targets"}
# layer -> the other layers it may import (its own always)
ALLOWED = {
    "base": set(),
    "models": set(),  # not scanned here (models/ is the model builders)
    "runtime": {"base"},
    "ir": {"base"},
    "operators": {"base", "ir", "runtime"},
    "onnx": {"base", "ir", "operators"},
    "analysis": {"base", "ir", "operators"},
    "passes": {"base", "ir", "operators", "analysis"},
    "exec": _BELOW_RUN_TIME | {"graph"},  # the run time: never the compiler nor a pass
    "graph": _BELOW_RUN_TIME | {"exec"},
    "targets": _BELOW_RUN_TIME | {"passes", "exec", "graph"},
    "compile": _BELOW_COMPILE,
    "llm": _BELOW_COMPILE | {"compile", "models"},
    "cli": _BELOW_COMPILE | {"compile", "models", "llm"},
    "top": _BELOW_COMPILE | {"compile", "models", "llm", "cli"},
}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    file: str
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def module_files(roots: dict) -> dict:
    """``{module name: path}`` of every ``.py`` file under ``roots`` (``{package name: folder}``)."""
    found = {}
    for pkg, folder in roots.items():
        for path in sorted(Path(folder).rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([pkg] + parts)] = path
    for pkg in roots:  # a package nested in another one (operators inside mgx_graph) stays itself
        found.setdefault(pkg, Path(roots[pkg]) / "__init__.py")
    return found


def _targets(node, module: str, is_package: bool, known) -> list:
    """The modules an import statement loads (names outside ``known``'s roots are left out)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            keep = len(parts) - node.level + (1 if is_package else 0)
            base = ".".join(parts[:keep] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def import_edges(roots: dict, not_scanned=()) -> tuple[dict, list]:
    """``(modules, edges)``: the modules under ``roots`` and every import between them (and to
    ``not_scanned``), top-level or not, as :class:`Edge` with file and line."""
    files = module_files(roots)
    known = set(files) | set(not_scanned)
    edges = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for dst in _targets(node, module, path.name == "__init__.py", known):
                    if dst != module:
                        edges.append(Edge(module, dst, str(rel), node.lineno))
    return files, edges


def import_cycles(edges) -> list[list[Edge]]:
    """One cycle (a list of edges) per strongly connected component of more than one module."""
    graph: dict = {}
    for e in edges:
        graph.setdefault(e.src, {}).setdefault(e.dst, e)
        graph.setdefault(e.dst, {})
    index, low, stack, on_stack, comps = {}, {}, [], set(), []
    for start in graph:  # Tarjan's algorithm, iterative
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)
    return [_cycle_in(graph, comp) for comp in comps]


def _cycle_in(graph, comp) -> list[Edge]:
    """A shortest cycle through the first module (by name) of a strongly connected component."""
    start = min(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w, e in sorted(graph[v].items()):
                if w == start:
                    path = [e]
                    while prev[v] is not None:
                        path.append(prev[v])
                        v = prev[v].src
                    return path[::-1]
                if w in comp and w not in prev:
                    prev[w] = e
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover - a component has one


def format_cycle(cycle: list[Edge]) -> str:
    return " -> ".join(f"{e.src} ({e.where()})" for e in cycle) + f" -> {cycle[0].src}"


def layer_of(module: str, table: dict) -> str | None:
    name = module
    while name:
        if name in table:
            return table[name]
        name = name.rpartition(".")[0]
    return None


def forbidden_imports(edges, table: dict, allowed: dict) -> list[str]:
    """``"file:line: src (layer) imports dst (layer)"`` for each import the table does not allow."""
    found = []
    for e in edges:
        a, b = layer_of(e.src, table), layer_of(e.dst, table)
        if a != b and b not in allowed.get(a, ()):
            found.append(f"{e.where()}: {e.src} ({a}) imports {e.dst} ({b})")
    return found


def _layer_table() -> dict:
    return {**LAYER_OF, **NOT_SCANNED}


def test_every_module_has_a_layer():
    modules, _ = import_edges(SCANNED, NOT_SCANNED)
    table = _layer_table()
    missing = sorted(m for m in modules if layer_of(m, table) in (None, "top") and m != "mgx_graph")
    assert not missing, f"modules with no layer (add them to LAYER_OF): {missing}"
    assert set(ALLOWED) == set(table.values()), "every layer needs its entry in ALLOWED"


def test_no_import_cycles():
    _, edges = import_edges(SCANNED, NOT_SCANNED)
    cycles = [format_cycle(c) for c in import_cycles(edges)]
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_imports_follow_the_layers():
    _, edges = import_edges(SCANNED, NOT_SCANNED)
    bad = forbidden_imports(edges, _layer_table(), ALLOWED)
    assert not bad, "imports against the layers (docs/architecture.md):\n  " + "\n  ".join(bad)


def test_the_checker_finds_a_cycle_and_a_wrong_way_import(tmp_path):
    pkg = tmp_path / "fake"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "low.py": "def f():\n    from . import high  # a wrong-way import inside a function\n",
        "high.py": "from fake import low\n",
        "a.py": "import fake.sub.b\n",
        "sub/__init__.py": "",
        "sub/b.py": "def g():\n    from ..a import name\n",  # a name of fake.a: an edge to fake.a
        "sub/c.py": "from . import b\nfrom .. import low\n",  # submodules: no edge to the packages
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    modules, edges = import_edges({"fake": pkg})
    assert set(modules) == {"fake", "fake.low", "fake.high", "fake.a", "fake.sub", "fake.sub.b", "fake.sub.c"}
    assert {(e.src, e.dst) for e in edges} == {("fake.low", "fake.high"), ("fake.high", "fake.low"),
                                               ("fake.a", "fake.sub.b"), ("fake.sub.b", "fake.a"),
                                               ("fake.sub.c", "fake.sub.b"), ("fake.sub.c", "fake.low")}
    cycles = sorted(format_cycle(c) for c in import_cycles(edges))
    assert len(cycles) == 2
    assert cycles[0].startswith("fake.a (") and "fake.sub.b (" in cycles[0] and "b.py:2" in cycles[0]
    assert cycles[1].startswith("fake.high (") and "low.py:2" in cycles[1]
    table = {"fake": "low", "fake.high": "high"}
    bad = forbidden_imports(edges, table, {"low": set(), "high": {"low"}})
    assert len(bad) == 1 and "low.py:2: fake.low (low) imports fake.high (high)" in bad[0]
