"""The shape of the house, checked: no folder of the project holds more than 20 Python modules, no module of the
package is over 500 lines, and no import circle joins any two modules. Each limit is the brief's
(a folder per job, small modules, dependencies pointing one way); a test fails naming the folder, module or
circle, so the tree cannot drift back to a flat folder of prefixed names."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "diloco_chaos"
MAX_MODULES = 20
MAX_LINES = 500


def _tracked_py() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.split()]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_imports(path: Path, known: set[str]) -> set[str]:
    """Modules of the package `path` imports, at module level or inside a function (a deferred import is still a
    dependency), but not under TYPE_CHECKING. A package's own `__init__` imported from inside that package is left
    out: that is how a registry package discovers its modules (chaos/faults/, invariants/checks/)."""
    tree = ast.parse(path.read_text())
    pkg = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(node.body)

    visit(tree.body)
    me = _module_name(path)
    return {m for m in found if m in known and not me.startswith(m + ".")}


def import_graph() -> dict[str, set[str]]:
    paths = [p for p in _tracked_py() if p.is_relative_to(PACKAGE)]
    known = {_module_name(p) for p in paths}
    return {_module_name(p): module_imports(p, known) for p in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
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

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _package_of(module: str, graph: dict[str, set[str]]) -> str:
    """The sub-package a module lives in (a package's __init__ belongs to the package itself)."""
    return module if any(m.startswith(module + ".") for m in graph) else module.rpartition(".")[0]


def test_no_folder_has_more_than_20_modules() -> None:
    by_dir: dict[Path, int] = {}
    for p in _tracked_py():
        if p.name != "__init__.py":
            by_dir[p.parent] = by_dir.get(p.parent, 0) + 1
    assert len(by_dir) > 20, "the walk finds the project's folders"
    big = {str(d.relative_to(ROOT)): n for d, n in by_dir.items() if n > MAX_MODULES}
    assert not big, f"folders with more than {MAX_MODULES} Python modules: {big}"


def test_no_module_is_over_500_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _tracked_py()
             if p.is_relative_to(PACKAGE)}
    assert len(sizes) > 100
    big = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_no_import_circle() -> None:
    """Stricter than the brief's "none across sub-packages": none at all, so a module can always be read (and
    tested) after the modules it imports; the circles across sub-packages are listed first when there are."""
    graph = import_graph()
    assert "diloco_chaos.harness.run.supervisor" in graph and graph["diloco_chaos.harness.run.supervisor"]
    found = sorted(circles(graph), key=lambda c: len({_package_of(m, graph) for m in c}) == 1)
    assert not found, "import circles (deferred imports included):\n" + "\n".join(
        "  " + " <-> ".join(c) for c in found)


def test_the_circle_finder_finds_a_circle() -> None:
    g = {"a.x": {"b.y"}, "b.y": {"c.z"}, "c.z": {"a.x"}, "d.w": {"a.x"}}
    assert circles(g) == [["a.x", "b.y", "c.z"]]
    assert circles({"a.x": {"b.y"}, "b.y": set()}) == []
