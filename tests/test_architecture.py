"""The shape of the house, enforced: the layer contracts (import-linter), no import cycle in
dpaudit/, and the statistics, the attacks, the config and the report importing without torch."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dpaudit"


def test_the_layer_contracts_hold():
    """``lint-imports`` with the contracts of pyproject.toml (docs/architecture.md)."""
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    out = subprocess.run([exe], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module -> the dpaudit modules it imports, at any depth of its code (imports inside
    functions too), package ``__init__`` modules included as modules of their own. ``from
    PACKAGE import NAME`` is an import of ``PACKAGE.NAME`` when that is a module."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs + ([base] if len(subs) < len(node.names) else [])
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target.startswith("dpaudit") and target != name:
                    edges[name].add(target)
    return edges


def test_no_import_cycle_in_dpaudit():
    """Tarjan's strongly connected components of the import graph: every one a single module."""
    edges = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_graph_sees_imports_inside_functions():
    """The cycle test can fail: a function-level import is an edge."""
    assert "dpaudit.stages.report" in import_graph()["dpaudit.report"]


@pytest.mark.parametrize("module", ["dpaudit.audit", "dpaudit.attacks", "dpaudit.config", "dpaudit.report",
                                    "dpaudit.report.data", "dpaudit.accounting"])
def test_imports_without_torch(module):
    code = f"import sys, {module}; bad = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]; " \
           "print(bad); sys.exit(1 if bad else 0)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
