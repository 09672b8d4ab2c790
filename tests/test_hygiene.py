"""Code hygiene across lib/ and scripts/: a module's private names stay its own (an underscore name
imported by another module is a shared helper in disguise; give it a public name in a module both
can import). A module's length is a hint, not a rule: it is as long as its one job needs, and is cut
where responsibilities part, never to get under a number (the 450-line cap this file held is retired)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib"

# Known leftovers in files being rewritten elsewhere (the lead's); empty these as they are fixed.
# (path relative to the checkout, imported name)
PRIVATE_IMPORT_LEFTOVERS: set[tuple[str, str]] = set()


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(path: Path, root: Path = ROOT) -> list[tuple[int, str, str]]:
    """(line, name, source module) for each underscore name `path` imports from another lib module:
    `from .x import _y`, `from lib.x import _y`, `from . import _x`, at any depth (function-level imports
    run too). Dunder names are public; torch's private modules are torch's business, not lib's."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[:len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        if base == name or base.split(".")[0] != "lib":
            continue  # a module importing from itself is no crossing
        found.extend((node.lineno, alias.name, base) for alias in node.names if _is_private(alias.name))
    return sorted(found)


def _lib_private_imports(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(file, name) -> ['file:line name from module', ...] over lib/."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted((root / "lib").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for line, name, source in private_imports(path, root):
            out.setdefault((rel, name), []).append(f"{rel}:{line} imports {name} from {source}")
    return out


def test_no_private_name_is_imported_across_modules_in_lib():
    found = _lib_private_imports()
    new = {key: where for key, where in found.items() if key not in PRIVATE_IMPORT_LEFTOVERS}
    assert not new, "private names imported across modules:\n" + "\n".join(
        w for where in new.values() for w in where)


def test_the_private_import_allow_list_names_only_what_is_still_there():
    stale = PRIVATE_IMPORT_LEFTOVERS - set(_lib_private_imports())
    assert not stale, f"fixed, so take them off PRIVATE_IMPORT_LEFTOVERS: {sorted(stale)}"


def test_the_private_import_finder_sees_every_form(tmp_path):
    pkg = tmp_path / "lib"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import public, _hidden\n")
    (pkg / "sub" / "_impl.py").write_text("from torch.utils._pytree import tree_map\nthing = 1\n")
    (pkg / "sub" / "b.py").write_text("from __future__ import annotations\nfrom . import _impl\n"
                                      "from .. import sub as __all__\n"
                                      "def f():\n    from lib.sub.b import _self_ok\n"
                                      "    from lib.a import _priv\n")
    (pkg / "a.py").write_text("from torch._guards import x\nfrom .sub import _hidden as h, __version__\n"
                              "from .sub.b import _hidden\n")
    found = {p.relative_to(tmp_path).as_posix(): [(n, s) for _, n, s in private_imports(p, tmp_path)]
             for p in pkg.rglob("*.py")}
    assert found["lib/sub/__init__.py"] == [("_hidden", "lib.sub.b")]
    assert found["lib/sub/b.py"] == [("_impl", "lib.sub"), ("_priv", "lib.a")]
    assert found["lib/a.py"] == [("_hidden", "lib.sub"), ("_hidden", "lib.sub.b")]
    assert found["lib/sub/_impl.py"] == [] and found["lib/__init__.py"] == []


# --------------------------------------------------------------------------
# The model registry answers "which models ...": no list of model names stands in for it

# Known leftovers in files owned elsewhere, each to ask lib/models/registry.py instead (spec_for(name).text);
# empty these as they are fixed. (path relative to the checkout, the code)
MODEL_LIST_LEFTOVERS: set[tuple[str, str]] = set()


def _model_names() -> set[str]:
    from lib.models.registry import MODELS

    return set(MODELS)


def model_name_lists(path: Path, names: set[str], root: Path = ROOT) -> list[tuple[str, str]]:
    """(file, code) for each place that lists models by name where the registry should answer: a membership
    test of a `.model` against literal names (`config.model in ("gpt2", "llama")`), a chain of equality tests of
    `.model` (`m.model == "a" or m.model == "b"`), one such test (`config.model != "llama"`), and any tuple, list, set or dict literal holding two or more
    of the registry's names as strings (keys or values)."""
    rel = path.relative_to(root).as_posix()
    found = []

    def is_model(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "model") or (
            isinstance(node, ast.Name) and node.id == "model")

    def named(nodes) -> int:
        return sum(isinstance(n, ast.Constant) and n.value in names for n in nodes)

    inside: set[int] = set()  # the literal of a membership test already reported with it
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if id(node) in inside:
            continue
        if isinstance(node, ast.Compare) and is_model(node.left) and any(
                isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
                isinstance(c, (ast.Tuple, ast.List, ast.Set)) and named(c.elts) for c in node.comparators):
            found.append((rel, ast.unparse(node)))
            inside |= {id(c) for c in node.comparators}
        elif isinstance(node, ast.Compare) and is_model(node.left) and any(
                isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops) and named(node.comparators):
            found.append((rel, ast.unparse(node)))  # one family named: what the registry's spec says instead
        elif isinstance(node, ast.BoolOp) and sum(
                isinstance(v, ast.Compare) and is_model(v.left) and named(v.comparators) for v in node.values) >= 2:
            found.append((rel, ast.unparse(node)))
            inside |= {id(v) for v in node.values}
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and named(node.elts) >= 2:
            found.append((rel, ast.unparse(node)))
        elif isinstance(node, ast.Dict) and (named(node.keys) >= 2 or named(node.values) >= 2):
            found.append((rel, ast.unparse(node)))
    return found


# Literal tables keyed by defconfig names (which share the models' names) rather than by models.
DEFCONFIG_TABLES = {"lib/validation/memory_check.py", "lib/recommend.py", "lib/hyperparams.py"}


def _lib_model_lists() -> set[tuple[str, str]]:
    names = _model_names()
    found = set()
    for path in sorted(LIB.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("lib/models/"):
            continue  # the models themselves, and the registry
        found |= {(f, code) for f, code in model_name_lists(path, names)
                  if f not in DEFCONFIG_TABLES or ".model" in code}
    return found


def test_no_list_of_model_names_where_the_registry_answers():
    new = sorted(_lib_model_lists() - MODEL_LIST_LEFTOVERS)
    assert not new, "models listed by name (ask lib/models/registry.py: spec_for(name), can_checkpoint, " \
                    "a ModelSpec field):\n" + "\n".join(f"{f}: {code}" for f, code in new)


def test_the_model_list_leftovers_are_still_there():
    stale = MODEL_LIST_LEFTOVERS - _lib_model_lists()
    assert not stale, f"fixed, so take them off MODEL_LIST_LEFTOVERS: {sorted(stale)}"


def test_the_model_list_finder_sees_every_form(tmp_path):
    sample = tmp_path / "lib" / "x.py"
    sample.parent.mkdir()
    sample.write_text('one = config.model == "gpt2"\n'
                      'ok = config.model == spec.name\n'
                      'a = config.model in ("gpt2", "resnet18")\n'
                      'b = plan.model not in ["llama"]\n'
                      'c = m.model == "gpt2" or m.model == "llama"\n'
                      'd = {"LENET5": "lenet5", "GPT2": "gpt2"}\n'
                      'e = ("resnet50", 1)\n')
    found = [code for _, code in model_name_lists(sample, {"gpt2", "resnet18", "resnet50", "llama", "lenet5"},
                                                   tmp_path)]
    assert sorted(found) == sorted([
        "config.model == 'gpt2'", "config.model in ('gpt2', 'resnet18')", "plan.model not in ['llama']",
        "m.model == 'gpt2' or m.model == 'llama'", "{'LENET5': 'lenet5', 'GPT2': 'gpt2'}"])


def test_the_trainer_has_no_pass_through_methods():
    """Trainer holds its parts (directory, engine, recovery, checkpoints, evaluator) and runs the loop: a
    method that only hands its own arguments to one part's method is that part's, and its callers call the
    part (a method that joins two parts, as interrupt and mark_oom do, is the Trainer's)."""
    import ast
    import inspect

    from lib.trainer import loop

    tree = ast.parse(inspect.getsource(loop.Trainer))
    passing = []
    for node in tree.body[0].body:
        if not isinstance(node, ast.FunctionDef) or node.decorator_list:  # properties: the parts' state, read
            continue
        body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if len(body) == 1 and isinstance(body[0], (ast.Return, ast.Expr)) and isinstance(body[0].value, ast.Call):
            func = body[0].value.func
            own = {a.arg for a in node.args.args}
            handed = [*body[0].value.args, *(k.value for k in body[0].value.keywords)]
            if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
                    and isinstance(func.value.value, ast.Name) and func.value.value.id == "self"
                    and all(isinstance(a, ast.Name) and a.id in own for a in handed)):
                passing.append(f"{node.name} -> self.{func.value.attr}.{func.attr}")
    assert not passing, passing
