"""The Python API (lib/api.py, `kfit.*` when installed): docs/api_example.py runs as written, and each
function keeps its word."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lib as kfit
from lib.errors import ConfigError, KfitError

ROOT = Path(__file__).resolve().parent.parent


def test_the_example_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("KCONFIG_CONFIG", "GPU", "GPUS", "HW", "FREE_GB",
                                                            "WORLD_SIZE", "RESUME", "NNODES")}
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "api_example.py"), str(tmp_path / "runs")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("on an H100: cuda, bf16,") and lines[1].startswith("on this machine: cpu,")
    assert lines[2].startswith("lenet5 + cpu-smoke: 2 steps in"), done.stdout
    (run,) = (tmp_path / "runs").iterdir()
    assert {"checkpoint.pt", "config", "plan.json", "metrics.jsonl"} <= {p.name for p in run.iterdir()}
    assert "CONFIG_MAX_STEPS=2" in (run / "config").read_text()
    assert not (tmp_path / ".config").exists()  # the API writes no config


def readme_python() -> str:
    """README.md's Python example: the fenced block after "The same steps from Python"."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index("The same steps from Python"):]
    start = after.index("```python\n") + len("```python\n")
    return after[start:after.index("\n```", start)]


def test_the_readme_example_runs_as_written_in_the_projects_environment(tmp_path):
    """`import kfit` in .venv (make env installs the checkout editable), from outside the checkout, as a user
    copying README.md's block into a file would run it."""
    (tmp_path / "example.py").write_text(readme_python())
    env = {k: v for k, v in os.environ.items() if k not in ("KCONFIG_CONFIG", "GPU", "GPUS", "HW", "FREE_GB",
                                                            "WORLD_SIZE", "RESUME", "NNODES", "PYTHONPATH")}
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[1] == "bf16" and lines[1] == "cpu"  # the H100's plan, then this machine's
    assert lines[-1].startswith("runs/lenet5-") and lines[-1].split()[1] == "2"  # the run directory, steps, eval
    (run,) = (tmp_path / "runs").iterdir()
    assert (run / "checkpoint.pt").is_file() and "CONFIG_MAX_STEPS=2" in (run / "config").read_text()


def test_load_config_sources_fragments_and_overrides(tmp_path):
    base = kfit.load_config("lenet5")
    assert base.model == "lenet5" and base.source == "lenet5"
    smoke = kfit.load_config("lenet5", {"CONFIG_SEED": 3}, fragments=["cpu-smoke"])
    assert (smoke.device, smoke.max_steps, smoke.seed, smoke.source) == ("cpu", 3, 3, "lenet5 + cpu-smoke")
    path = tmp_path / "my.config"
    path.write_text(smoke.text)
    assert kfit.load_config(path).text == smoke.text and kfit.load_config(smoke, {"SEED": 4}).seed == 4
    with pytest.raises(ConfigError, match="CONFIG_NOT_A_SYMBOL is not a kfit option"):
        kfit.load_config("lenet5", {"NOT_A_SYMBOL": 1})
    with pytest.raises(ConfigError, match="unknown defconfig 'nope'"):
        kfit.load_config("nope")
    with pytest.raises(ConfigError, match="not to a loaded Config"):
        kfit.load_config(base, fragments=["fp32"])


def test_resolve_plan_is_the_command_lines_plan(tmp_path, monkeypatch):
    """kfit.resolve_plan(config, gpu=, free_gb=, gpus=) is `kfit plan --gpu --free-gb --gpus`'s plan."""
    from lib.cli import main

    config = kfit.load_config("lenet5")
    path = tmp_path / ".config"
    kfit.config.make_defconfig("lenet5", out=path)
    for name in ("GPU", "GPUS", "HW", "FREE_GB", "WORLD_SIZE", "NNODES", "FORMAT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("signal.signal", lambda *args: None)  # main() would reset SIGPIPE for pytest
    out = tmp_path / "plan.json"
    with open(out, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["plan", "--config", str(path), "--gpu", "a100-40gb", "--free-gb", "30", "--gpus", "2",
                     "--format", "json"]) == 0
    monkeypatch.undo()
    shown = json.loads(out.read_text())
    plan = kfit.resolve_plan(config, gpu="a100-40gb", free_gb=30, gpus=2).to_dict()
    assert plan["world_size"] == shown["world_size"] == 2
    for key in ("micro_batch", "grad_accum", "effective_batch", "precision", "strategy", "budget_bytes",
                "predicted_peak_bytes", "device_name"):
        assert plan[key] == shown[key], key
    with pytest.raises(KfitError, match="not both"):
        kfit.resolve_plan(config, kfit.machine(gpu="h100"), gpu="h100")


def test_import_is_cheap():
    code = "import lib, sys; lib.load_config; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
