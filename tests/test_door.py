"""One door to the plan (lib/planning/door.py): every plan kfit makes goes through make_plan, which derives the
model description and counts the processes itself; the two facades (lib/hyperparams.py for a training script,
lib/api.py for Python) are thin wrappers over it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOOR = "lib/planning/door.py"
# The resolver's own internals: the request it builds for the ladder's rungs
RESOLVER = "lib/planning/resolver.py"


def _calls(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every call in a file: `resolve_request(...)` -> "resolve_request",
    `ModelDescription.from_config(...)` -> "ModelDescription.from_config"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        parts, func = [], node.func
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if isinstance(func, ast.Name):
            parts.append(func.id)
        found.append((node.lineno, ".".join(reversed(parts))))
    return found


def _sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if "diagnostics" not in p.parts)


def offenders(paths: list[Path], names: set[str], allowed: set[str]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} {name}" for path in paths
            if str(path.relative_to(ROOT)) not in allowed
            for line, name in _calls(path) if name in names or name.rpartition(".")[2] in names]


def test_only_the_door_builds_a_plan_request():
    """The resolver is entered through make_plan only: no module of kfit, benchmark or script builds a
    PlanRequest or calls resolve_request itself."""
    assert offenders(_sources("lib", "scripts"), {"resolve_request", "PlanRequest"}, {DOOR, RESOLVER}) == []


def test_only_the_door_derives_the_model_description():
    """ModelDescription.from_config in one place: a plan for a model other than the config's cannot be made."""
    assert offenders(_sources("lib"), {"ModelDescription.from_config"}, {DOOR}) == []


def test_no_module_plans_through_the_facade():
    """lib/hyperparams.py's resolve and apply_hyperparams are for training scripts of other repositories:
    kfit's own modules, benchmarks and scripts plan through lib.planning.make_plan."""
    facade = {"resolve", "apply_hyperparams", "auto_detect_hyperparams"}
    found = []
    for path in _sources("lib", "scripts"):
        rel = str(path.relative_to(ROOT))
        if rel == "lib/hyperparams.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("hyperparams"):
                found += [f"{rel}:{node.lineno} imports {a.name}" for a in node.names if a.name in facade]
    assert found == []


def test_the_offender_finder_sees_both_spellings(tmp_path):
    (tmp_path / "lib").mkdir()
    bad = tmp_path / "lib" / "bad.py"
    bad.write_text("from x import resolve_request, PlanRequest, ModelDescription\n"
                   "a = resolve_request(PlanRequest(1))\nb = planning.resolver.resolve_request(2)\n"
                   "m = ModelDescription.from_config(c)\n")
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        found = offenders([bad], {"resolve_request", "PlanRequest", "ModelDescription.from_config"}, set())
    finally:
        ROOT = root
    assert sorted(found) == ["lib/bad.py:2 PlanRequest", "lib/bad.py:2 resolve_request",
                             "lib/bad.py:3 planning.resolver.resolve_request",
                             "lib/bad.py:4 ModelDescription.from_config"]


@pytest.fixture
def door_calls(monkeypatch):
    """Each resolve, with whether make_plan made it (the door's stack frame)."""
    import inspect

    from lib.planning import door

    inner, calls = door.resolve_request, []

    def counted(request):
        calls.append(any(frame.function == "make_plan" and frame.filename.endswith(DOOR)
                         for frame in inspect.stack()))
        return inner(request)

    monkeypatch.setattr(door, "resolve_request", counted)
    monkeypatch.setenv("KFIT_STEPTIME_MEASURE", "0")
    return calls


def test_every_entry_plans_through_the_door(door_calls, tmp_path, kfit_here):
    """The Python API, the facade a training script calls, the reports and the command line: each resolve of
    theirs is make_plan's (HPO, recommend, validation and the LR finder call make_plan too, as the tests above
    check of every module)."""
    from lib import api, hyperparams
    from lib.hardware import resolve_hardware
    from lib.report import recommendations

    config = api.load_config("lenet5", overrides={"DEVICE_CPU": True})
    cpu = resolve_hardware(gpu="cpu")
    entries = {}

    def entry(name, run):
        before = len(door_calls)
        run()
        entries[name] = door_calls[before:]

    entry("api.resolve_plan", lambda: api.resolve_plan(config, gpu="h100"))
    entry("hyperparams.apply_hyperparams",
          lambda: hyperparams.apply_hyperparams(config, verbose=False, hardware=cpu))
    entry("hyperparams.resolve", lambda: hyperparams.resolve(config, cpu))
    entry("report.recommendations",
          lambda: recommendations(config, cpu, api.resolve_plan(config, cpu), 1))
    written = tmp_path / ".config"
    written.write_text(config.text)
    entry("kfit plan", lambda: kfit_here(tmp_path, "plan", KCONFIG_CONFIG=str(written), GPU="a10g"))
    entry("kfit check-hardware", lambda: kfit_here(tmp_path, "check-hardware", KCONFIG_CONFIG=str(written)))
    assert all(entries.values()) and all(all(made) for made in entries.values()), entries


def test_a_plan_names_the_configs_model_and_processes():
    """The door derives both: the facade refuses a model the config does not train."""
    from lib import api, hyperparams
    from lib.errors import PlanError
    from lib.hardware import resolve_hardware
    from lib.plan import ModelDescription
    from lib.planning import make_plan

    config = api.load_config("lenet5")
    planned = make_plan(config, resolve_hardware(gpu="h100", gpus=4), settings=None)
    assert planned.model == ModelDescription.from_config(config) and planned.plan.world_size == 4
    assert make_plan(config, resolve_hardware(gpu="h100", gpus=4), gpus=2, nodes=2).plan.world_size == 4
    with pytest.raises(PlanError, match="the config names the model"):
        hyperparams.resolve(config, resolve_hardware(gpu="cpu"), ModelDescription("resnet18"))
