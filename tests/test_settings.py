"""Where kfit reads its surroundings: the command line parses the environment once (lib/cli/invocation.py), and
lib/env.py is the one settings module the rest of lib/ asks; nothing else in lib/ reads os.environ."""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parent.parent / "lib"
# plus everything under lib/cli/. The C allocators' own variables (PYTORCH_CUDA_ALLOC_CONF, MALLOC_*), which
# lib/hardware/allocator.py reads and sets, go through lib/env.py's environ() too.
ALLOWED = {LIB / "env.py"}


def environment_reads(path: Path, root: Path = LIB.parent) -> list[str]:
    """`os.environ`, `os.getenv`, `os.putenv` and `from os import environ/getenv` in one file, with line numbers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                and node.attr in ("environ", "getenv", "putenv", "environb"):
            found.append(f"{path.relative_to(root)}:{node.lineno} os.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                any(a.name in ("environ", "getenv") for a in node.names):
            found.append(f"{path.relative_to(root)}:{node.lineno} from os import")
    return sorted(found, key=lambda f: int(f.split(":")[1].split()[0]))


def test_only_the_command_line_and_the_settings_module_read_the_environment():
    offenders = [read for path in sorted(LIB.rglob("*.py")) if path not in ALLOWED and "cli" not in path.parts
                 for read in environment_reads(path)]
    assert offenders == []


def test_the_check_finds_a_read(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nA = os.environ.get('X')\nfrom os import getenv\n")
    assert environment_reads(sample, tmp_path) == ["sample.py:2 os.environ", "sample.py:3 from os import"]


def test_kfit_train_parses_its_variables_once_and_plans_with_their_settings(tmp_path, monkeypatch):
    """`kfit train` reads GPUS=, RESUME=, the overrides, ... into one Invocation at its start and hands it down:
    the machine, the config's overrides and the plan all take that one (the plan its Settings, never the API's
    default)."""
    from types import SimpleNamespace

    import lib.api
    import lib.hardware
    import lib.planning
    from lib.cli import train
    from lib.cli.invocation import Invocation

    cpu = lib.hardware.resolve_hardware(gpu="cpu")
    parses, planned = [], []
    parse = Invocation.from_environment.__func__
    monkeypatch.setattr(Invocation, "from_environment",
                        classmethod(lambda cls, env=None: parses.append(env) or parse(cls, env)))
    monkeypatch.setattr(lib.hardware, "resolve_hardware", lambda **kwargs: cpu)
    monkeypatch.setattr(lib.planning, "make_plan", lambda config, machine, **kw: planned.append(kw) or (
        "model", SimpleNamespace(strategy="none", device_type="cpu")))
    monkeypatch.setattr(lib.api, "train_planned", lambda *a, **kw: SimpleNamespace(
        final_eval={"accuracy": 1.0}, steps=1, epochs=1.0, seconds=0.1, run_dir="runs/x"))
    monkeypatch.setenv("KCONFIG_CONFIG", str(tmp_path / ".config"))
    monkeypatch.setenv("KFIT_SET", '[["EPOCHS", "1"]]')
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert train.cmd_train(SimpleNamespace()) == 0
    assert len(parses) == 1
    assert planned[0]["settings"].omp_threads == 3
