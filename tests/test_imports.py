"""Imports follow the data flow, one way (docs/architecture.md): no cycles in lib/, and no layer
imports a later one. Function-level imports count (they run too); `if TYPE_CHECKING:` blocks do not."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, skipping the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the lib modules it imports (a package's submodule when `from pkg import submodule`)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                while target and target not in modules:  # lib.hardware.x.y -> the nearest known module
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    edges.add(target)  # a submodule importing its own package's __init__ is not an edge
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def lib_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(LIB.rglob("*.py"))}


def test_lib_has_no_import_cycle():
    cycle = find_cycle(import_graph(lib_modules()))
    assert cycle is None, "import cycle in lib/: " + " -> ".join(cycle)


def test_cycle_finder_names_the_cycle():
    graph = {"lib.a": {"lib.b"}, "lib.b": {"lib.c"}, "lib.c": {"lib.a"}, "lib.d": set()}
    assert find_cycle(graph) == ["lib.a", "lib.b", "lib.c", "lib.a"]
    assert find_cycle({"lib.a": {"lib.b"}, "lib.b": set()}) is None


def test_graph_sees_function_level_and_relative_imports_but_not_type_checking(tmp_path):
    pkg = tmp_path / "lib"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n"
                              "from . import sub\n")
    (pkg / "sub" / "__init__.py").write_text("from .leaf import x\n")
    (pkg / "sub" / "leaf.py").write_text("from .. import a\nfrom lib.sub import y\n")
    modules = {module_name(p, tmp_path): p for p in sorted(pkg.rglob("*.py"))}
    graph = import_graph(modules)
    assert graph["lib.a"] == {"lib.b"}
    assert graph["lib.b"] == {"lib.sub"}
    assert graph["lib.sub"] == {"lib.sub.leaf"}
    assert graph["lib.sub.leaf"] == {"lib.a"}  # its own package's __init__ is no edge
    assert find_cycle(graph) == ["lib.a", "lib.b", "lib.sub", "lib.sub.leaf", "lib.a"]


# The data flow's layers, earliest first (docs/architecture.md). A module may import its own
# layer and earlier ones only; every module of lib/ is placed (test_layers_place_every_module).
LAYERS = [
    {"lib.errors", "lib.env", "lib.fileio", "lib.resources", "lib.units", "lib.progress", "lib.parallel"},
    {"lib.config"},
    {"lib.hardware"},
    {"lib.plan", "lib.models", "lib.data"},
    # what a step and a run are made of, beside the chain: the task, one step, threads, checkpoints, processes
    {"lib.task", "lib.step", "lib.threads", "lib.tracking", "lib.checkpoint", "lib.oom", "lib.monitor",
     "lib.distributed", "lib.torchrun_output", "lib.export", "lib.sample"},
    {"lib.memory", "lib.steptime"},
    {"lib.planning", "lib.probe"},
    {"lib.hyperparams", "lib.trainer"},
    {"lib.report", "lib.recommend", "lib.lr_finder", "lib.hpo", "lib.validation"},
    {"lib.api", "lib.cli", "lib.__main__"},
]


def test_layers_place_every_module():
    unplaced = sorted(m for m in lib_modules() if m != "lib" and _layer(m) is None)
    assert not unplaced, f"modules LAYERS does not place (add each to its layer): {unplaced}"


def _layer(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in layer):
            return i
    return None


@pytest.mark.parametrize("module", sorted(m for m in lib_modules() if _layer(m) is not None))
def test_imports_follow_the_data_flow(module):
    graph = import_graph(lib_modules())
    here = _layer(module)
    later = sorted(t for t in graph[module] if (_layer(t) or -1) > here)
    assert not later, f"{module} (layer {here}) imports later layers: {later}"


def test_nothing_in_lib_imports_the_command_line():
    for name, path in lib_modules().items():
        for node in _imports(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not any(m.split(".")[0] in ("scripts", "kfit_env", "cli_plan", "cli_train", "cli_tune", "cli_recommend")
                           for m in mods), f"{name} imports the command line"


def test_every_path_docs_architecture_names_exists():
    named = set(paths_named((ROOT / "docs" / "architecture.md").read_text()))
    assert len(named) > 30
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def paths_named(text: str) -> list[str]:
    """Paths such as lib/config/, lib/hardware/profile.py, kconfigs/Kconfig.model (in backticks or tables);
    a bare file name after a comma in the same cell ('`lib/x.py`, `y.py`') belongs to the first one's folder."""
    paths = []
    for cell in re.split(r"\||\n", text):
        folder = None
        for token in re.findall(r"`([^`\s]+)`", cell):
            token = token.split("(")[0]
            if re.fullmatch(r"(lib|scripts|tests|docs|kconfigs|defconfigs)/[\w./-]*", token):
                if "<" in token:
                    continue
                paths.append(token)
                folder = token.rsplit("/", 1)[0]
            elif folder and re.fullmatch(r"[\w-]+\.py", token):
                paths.append(f"{folder}/{token}")
    for token in re.findall(r"(?m)^\s+-> .*?(lib/[\w/.]+)", text):
        paths.append(token)
    return paths
