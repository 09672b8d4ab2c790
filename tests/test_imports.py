"""The rules docs/architecture.md states, checked: imports follow the data flow, one way (no cycles in lib/, no
layer imports a later one, and the document's layers are LAYERS); only lib/planning/ changes a plan; the
environment reaches the resolver only through planning.Settings; only lib/hardware/ asks NVML, psutil or
torch.cuda for device properties. Function-level imports count (they run too); `if TYPE_CHECKING:` blocks
count for cycles (a type named for the checker is a dependency too), not for the layers."""

from __future__ import annotations

import ast
import functools
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


def _imports(tree: ast.AST, type_checking: bool = False):
    """Every Import/ImportFrom node, skipping the bodies of `if TYPE_CHECKING:` unless `type_checking`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(modules: dict[str, Path], type_checking: bool = False) -> dict[str, set[str]]:
    """module -> the lib modules it imports (a package's submodule when `from pkg import submodule`); with
    `type_checking`, the imports made only for type checkers too."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path)), type_checking):
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


@functools.cache
def lib_graph() -> dict[str, set[str]]:
    """lib/'s import graph, built once for the tests below (one parse of every module, not one per test)."""
    return import_graph(lib_modules())


def test_lib_has_no_import_cycle():
    """Not even through an import made only for type checking: a module that names another's type for the
    checker depends on it as much as one that imports it to run."""
    cycle = find_cycle(import_graph(lib_modules(), type_checking=True))
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
    assert import_graph(modules, type_checking=True)["lib.b"] == {"lib.a", "lib.sub"}


# The data flow's layers, earliest first (docs/architecture.md). A module may import its own
# layer and earlier ones only; every module of lib/ is placed (test_layers_place_every_module).
LAYERS = [
    {"lib.errors", "lib.env", "lib.fileio", "lib.resources", "lib.units", "lib.progress", "lib.parallel", "lib.redact",
     "lib.float8", "lib.pipeline", "lib.context_parallel"},
    {"lib.config"},
    {"lib.hardware"},
    {"lib.plan", "lib.models", "lib.data", "lib.metrics"},
    # what a step and a run are made of, beside the chain: the task, one step, threads, checkpoints, processes
    {"lib.task", "lib.step", "lib.threads", "lib.tracking", "lib.checkpoint", "lib.resumable", "lib.oom", "lib.monitor",
     "lib.distributed", "lib.torchrun_output", "lib.export", "lib.sample", "lib.runs"},
    {"lib.memory", "lib.steptime"},
    {"lib.planning", "lib.probe"},
    {"lib.hyperparams", "lib.trainer", "lib.extension"},
    {"lib.report", "lib.run_report", "lib.recommend", "lib.lr_finder", "lib.hpo", "lib.validation"},
    {"lib.api", "lib.cli", "lib.__main__", "lib.randcheck"},
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
    graph = lib_graph()
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


def layout_entries(text: str) -> list[str]:
    """The paths docs/layout.md's tree names: each line's first column ('lib/probe.py, oom.py' is lib/probe.py
    and lib/oom.py; 'lib/lr_finder.py, hpo/' lib/lr_finder.py and lib/hpo/), and the module after a ';' in a
    description ('torchrun_output.py: ...' beside lib/distributed.py)."""
    block = text.split("```", 2)[1]
    paths = []
    for line in block.splitlines():
        if not line.strip() or line.startswith(" "):  # a description's continuation
            continue
        column, description = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        folder = ""
        for token in (t.strip() for t in column.split(",")):
            if "/" in token.rstrip("/") or not folder:
                folder = token.rstrip("/").rsplit("/", 1)[0] if "/" in token.rstrip("/") else ""
                paths.append(token)
            else:
                paths.append(f"{folder}/{token}")
        if folder:
            paths += [f"{folder}/{m}" for m in re.findall(r"; (\w+\.py):", description)]
    return [p for p in paths if "<" not in p and "*" not in p]


def test_docs_layout_names_paths_that_exist_and_every_package():
    """docs/layout.md's tree: every path it names exists, and every package and module of lib/ is named there
    (a package by its folder; a module by its file)."""
    named = layout_entries((ROOT / "docs" / "layout.md").read_text())
    assert len(named) > 40
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/layout.md names paths that do not exist: {missing}"
    listed = {p.rstrip("/") for p in named}
    unnamed = sorted(str(p.relative_to(ROOT)) for p in sorted(LIB.iterdir())
                     if (p.is_dir() and not p.name.startswith("__") and str(p.relative_to(ROOT)) not in listed)
                     or (p.suffix == ".py" and not p.name.startswith("__") and str(p.relative_to(ROOT)) not in listed))
    assert not unnamed, f"docs/layout.md does not name: {unnamed}"


def test_the_layout_reader_expands_bare_names_to_their_folder():
    text = "```\nlib/probe.py, oom.py   what\nlib/x/, y/   z\nlib/d.py   a; e.py: b\n                 more\n```"
    assert layout_entries(text) == ["lib/probe.py", "lib/oom.py", "lib/x/", "lib/y/", "lib/d.py", "lib/e.py"]


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


# --------------------------------------------------------------------------
# The layers docs/architecture.md lists are LAYERS


def path_module(path: str) -> str:
    """lib/config/ -> lib.config, lib/errors.py -> lib.errors."""
    return path.rstrip("/").removesuffix(".py").replace("/", ".")


def documented_layers(text: str) -> list[set[str]]:
    """The numbered list after 'Imports follow the same order', each item's `lib/...` paths as module names."""
    layers: list[set[str]] = []
    for line in text.split("Imports follow the same order", 1)[1].splitlines():
        item = re.match(r"\d+\. (.*)", line)
        if item:
            layers.append({path_module(p) for p in re.findall(r"`(lib/[^`\s]*)`", item.group(1))})
        elif layers and not line.strip():
            break
    return layers


def test_the_layers_the_architecture_lists_are_the_ones_checked():
    documented = documented_layers((ROOT / "docs" / "architecture.md").read_text())
    assert documented == LAYERS, "docs/architecture.md's numbered layers differ from LAYERS: " + "; ".join(
        f"layer {i + 1}: doc {sorted(d)} vs LAYERS {sorted(l)}"
        for i, (d, l) in enumerate(zip(documented, LAYERS)) if d != l) + (
        f" (doc has {len(documented)} layers, LAYERS {len(LAYERS)})" if len(documented) != len(LAYERS) else "")


def test_the_layer_reader_reads_items_until_the_list_ends():
    text = ("Imports follow the same order, in layers:\n\n1. `lib/a.py`, `lib/b/` (a note, `x.y`)\n"
            "2. `lib/c/`: and more\n\nBeside: `lib/d.py`\n")
    assert documented_layers(text) == [{"lib.a", "lib.b"}, {"lib.c"}]


# --------------------------------------------------------------------------
# Only lib/planning/ changes a plan

def plan_replacements(path: Path, root: Path = ROOT) -> list[str]:
    """`replace(<a plan>, ...)` and `dataclasses.replace(<a plan>, ...)` in one file: a call whose first argument
    names a plan (plan, self.plan, old_plan, ...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        if (isinstance(func, ast.Name) and func.id == "replace") or (
                isinstance(func, ast.Attribute) and func.attr == "replace" and isinstance(func.value, ast.Name)
                and func.value.id == "dataclasses"):
            first = ast.unparse(node.args[0])
            if "plan" in first.lower():
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} replace({first}, ...)")
    return found


def _plan_edits_outside_planning() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in sorted(LIB.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith("lib/planning/") and (found := plan_replacements(path)):
            out[rel] = found
    return out


def test_only_planning_changes_a_plan():
    found = _plan_edits_outside_planning()
    new = [w for where in found.values() for w in where]
    assert not new, "plans changed outside lib/planning/ (add a function to lib/planning/edits.py or ladder.py " \
                    "and call it):\n" + "\n".join(new)


def test_the_plan_edit_finder_sees_both_spellings(tmp_path):
    sample = tmp_path / "lib" / "x.py"
    sample.parent.mkdir()
    sample.write_text("import dataclasses\nfrom dataclasses import replace\n"
                      "a = dataclasses.replace(self.plan, eval_batch=1)\nb = replace(old_plan, micro_batch=2)\n"
                      "c = dataclasses.replace(config, source='x')\nd = 'plan'.replace('p', 'q')\n")
    assert plan_replacements(sample, tmp_path) == ["lib/x.py:3 replace(self.plan, ...)",
                                                    "lib/x.py:4 replace(old_plan, ...)"]


# --------------------------------------------------------------------------
# The environment reaches planning only through planning.Settings


def test_the_environment_reaches_planning_only_through_settings():
    """lib/planning/request.py's Settings.from_environment is the one way in: no other planning module imports
    lib.env, reads os.environ or calls from_environment itself (resolve() and lib/api.py take their documented
    default through settings_or_environment)."""
    graph = lib_graph()
    offenders = []
    for name, path in lib_modules().items():
        if not name.startswith("lib.planning") or name == "lib.planning.request":
            continue
        if "lib.env" in graph[name]:
            offenders.append(f"{name} imports lib.env")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "from_environment"):
                offenders.append(f"{name}:{node.lineno} .{node.attr}")
    assert offenders == []


# --------------------------------------------------------------------------
# Only lib/hardware/ asks NVML, psutil or torch.cuda for device properties

DEVICE_PROPERTIES = ("get_device_properties", "get_device_name", "get_device_capability")
PROBE_MODULES = ("pynvml", "psutil")
# The one exception docs/architecture.md states: validation's CudaDevice.name(), over the torch.cuda it is
# handed (a test's fake answers it).
DEVICE_QUERY_EXCEPTIONS = {("lib/validation/measure.py", "get_device_name")}


def device_queries(path: Path, root: Path = ROOT) -> set[tuple[str, str]]:
    """(file, what) for each torch.cuda device-property call and each pynvml / psutil import in one file."""
    rel = path.relative_to(root).as_posix()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in DEVICE_PROPERTIES:
            found.add((rel, node.attr))
        elif isinstance(node, ast.Import):
            found |= {(rel, a.name.split(".")[0]) for a in node.names if a.name.split(".")[0] in PROBE_MODULES}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in PROBE_MODULES:
            found.add((rel, node.module.split(".")[0]))
    return found


def test_only_hardware_queries_device_properties_nvml_and_psutil():
    found = set().union(*(device_queries(p) for p in sorted(LIB.rglob("*.py")) if "hardware" not in
                          p.relative_to(LIB).parts[:1]))
    assert found == DEVICE_QUERY_EXCEPTIONS


def test_the_device_query_finder_sees_calls_and_imports(tmp_path):
    sample = tmp_path / "lib" / "x.py"
    sample.parent.mkdir()
    sample.write_text("import psutil\nfrom pynvml import nvmlInit\nimport torch\n"
                      "n = torch.cuda.get_device_properties(0).name\nm = torch.cuda.memory_allocated(0)\n")
    assert device_queries(sample, tmp_path) == {("lib/x.py", "psutil"), ("lib/x.py", "pynvml"),
                                                ("lib/x.py", "get_device_properties")}
