"""The import graph inside dpaudit/audit: no cycle (imports inside functions count, and so
do ``importlib.import_module`` calls), and no submodule imports the package ``__init__``."""

import ast
from pathlib import Path

import dpaudit.audit as audit_pkg

PKG = "dpaudit.audit"
ROOT = Path(audit_pkg.__file__).parent
MODULES = {p.stem for p in ROOT.glob("*.py")} - {"__init__"}


def _target(name: str) -> str | None:
    if name == PKG:
        return "__init__"
    return name[len(PKG) + 1 :].split(".")[0] if name.startswith(PKG + ".") else None


def _edges(path: Path) -> set[str]:
    """Sibling modules ``path`` imports ("__init__" for the package itself)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(t for a in node.names if (t := _target(a.name)))
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            t = _target(node.module or "")
            if t:
                out.add(t)  # "from dpaudit.audit import x" goes through the package, even for a submodule x
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and (t := _target(arg.value)):
                out.add(t)
            elif isinstance(arg, ast.JoinedStr):  # f"dpaudit.audit.{name}": the discovered bound_* modules
                out.update(m for m in MODULES if m.startswith("bound_"))
    out.discard(path.stem)
    return out


GRAPH = {p.stem: _edges(p) for p in ROOT.glob("*.py") if p.stem != "__init__"}


def test_no_submodule_imports_the_package():
    assert [m for m, e in GRAPH.items() if "__init__" in e] == []


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(m, path):
        state[m] = 1
        for t in sorted(GRAPH.get(m, ())):
            if state.get(t) == 1:
                cycles.append(path[path.index(t) :] + [t])
            elif t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_the_registry_imports_nothing_of_the_package():
    assert GRAPH["registry"] == set()
    assert "catalog" in GRAPH and {"bounds", "registry"} <= GRAPH["catalog"]
