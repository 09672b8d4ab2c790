"""End-to-end tests through real `make`: real Makefile, real kconfiglib, real (short) training.

Every test runs `make -f <repo>/Makefile <target>` with its working directory in a
pytest tmp_path, so the .config, ./defconfig and runs/ land there and the
developer's own checkout is never touched (checked around the whole module).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from lib.config import DEFAULT_SHARE

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = ROOT / "Makefile"
DEFCONFIG_NAMES = sorted(p.name for p in (ROOT / "defconfigs").iterdir() if p.is_file())
FRAGMENT_NAMES = sorted(p.name for p in (ROOT / "defconfigs" / "fragments").iterdir() if p.is_file())
TARGETS = ("menuconfig", "olddefconfig", "savedefconfig", "listnewconfig", "plan", "check-hardware",
           "train", "test", "clean", "mrproper")

# Variables the Makefile or kfit read from the environment (and make's own, which would carry
# command-line assignments of an enclosing `make test KCONFIG_CONFIG=...` into ours).
_CLEARED = ("KCONFIG_CONFIG", "FRAGMENTS", "FORMAT", "HW", "GPU", "FREE_GB", "GPUS", "WORLD_SIZE", "NODES", "CPUS",
            "TIME", "PARTITION", "ACCOUNT", "ARRAY", "HPO_STUDY", "CORPUS", "VOCAB", "TOKENIZER",
            "RESUME", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "RANK",
            "KFIT_INJECT_OOM", "KFIT_INJECT_OOM_ABOVE", "KFIT_INJECT_OOM_RANK", "TRIALS", "RUNS", "BATCH",
            "APPLY", "HPO_STORAGE", "DEFCONFIG", "OUT", "PYTEST_ARGS", "TORCH_SPEC", "PYTHON", "VENV", "MAKEFLAGS", "MFLAGS", "GNUMAKEFLAGS",
            "MAKELEVEL", "MAKEOVERRIDES")

pytestmark = pytest.mark.slow


def make(cwd: Path, *args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    full_env.update(env or {})
    return subprocess.run(["make", "--no-print-directory", "-f", str(MAKEFILE), *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{result.args} failed:\n{result.stdout}\n{result.stderr}"
    return result


def failed(result: subprocess.CompletedProcess, *needles: str) -> subprocess.CompletedProcess:
    assert result.returncode != 0, f"{result.args} unexpectedly succeeded:\n{result.stdout}"
    assert "error:" in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in stderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result


def line_starting(text: str, prefix: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"expected one line starting {prefix!r} in:\n{text}"
    return lines[0]


# --------------------------------------------------------------------------
# The developer's checkout is never touched


def _snapshot():
    files = {name: (ROOT / name).read_bytes() if (ROOT / name).is_file() else None
             for name in (".config", ".config.old", "defconfig")}
    runs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "runs").rglob("*")) if (ROOT / "runs").is_dir() else None
    return files, runs


@pytest.fixture(scope="module", autouse=True)
def checkout_untouched():
    before = _snapshot()
    yield
    after = _snapshot()
    assert after[0] == before[0], "the checkout's .config/.config.old/defconfig changed"
    assert after[1] == before[1], "the checkout's runs/ changed"


# --------------------------------------------------------------------------
# 1. help


def test_help_lists_targets_defconfigs_and_fragments(tmp_path):
    out = ok(make(tmp_path, "help")).stdout
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.strip()}
    for target in TARGETS:
        assert target in listed, f"target {target} missing from help:\n{out}"
    for name in DEFCONFIG_NAMES + FRAGMENT_NAMES:
        assert name in listed, f"{name} missing from help:\n{out}"
    assert not any(tmp_path.iterdir()), "help wrote files"


# --------------------------------------------------------------------------
# 2. config targets round trip


def test_lenet5_defconfig_forms_listnewconfig_savedefconfig_olddefconfig(tmp_path):
    config = tmp_path / ".config"
    out = ok(make(tmp_path, "lenet5-defconfig")).stdout
    assert "configuration written to .config" in out
    first = config.read_bytes()
    ok(make(tmp_path, "defconfig-lenet5"))
    assert config.read_bytes() == first
    ok(make(tmp_path, "defconfig"))  # the default defconfig is lenet5
    assert config.read_bytes() == first

    listed = ok(make(tmp_path, "listnewconfig"))
    assert listed.stdout == "" and listed.stderr == ""

    ok(make(tmp_path, "savedefconfig"))
    assert (tmp_path / "defconfig").read_bytes() == (ROOT / "defconfigs" / "lenet5").read_bytes()
    assert config.read_bytes() == first

    ok(make(tmp_path, "olddefconfig"))
    assert config.read_bytes() == first
    assert (tmp_path / ".config.old").read_bytes() == first
    assert ok(make(tmp_path, "listnewconfig")).stdout == ""  # still valid and complete


# --------------------------------------------------------------------------
# 3 and 4. smoke training through make train


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """defconfig-<name> FRAGMENTS="cpu-smoke ..." then make train, once per model for the module."""
    runs: dict[str, tuple[Path, subprocess.CompletedProcess]] = {}

    def run(name: str):
        if name not in runs:
            cwd = tmp_path_factory.mktemp(name)
            ok(make(cwd, f"defconfig-{name}", "FRAGMENTS=cpu-smoke"))
            runs[name] = (cwd, make(cwd, "train"))
        return runs[name]

    return run


SMOKE = {
    # defconfig: (model in the summary line, run dir prefix, final metric)
    "lenet5": ("lenet5", "lenet5", "accuracy"),
    "gpt2-tiny": ("gpt2-tiny", "gpt2-tiny", "perplexity"),
    "resnet18": ("resnet18", "resnet18", "accuracy"),
}


def _trusted_checkpoint(path: Path) -> dict:
    # The file was just written by this test's own run; the weights_only=True load is tested separately.
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.mark.parametrize("name", list(SMOKE))
def test_smoke_train(smoke, name):
    model, prefix, metric = SMOKE[name]
    cwd, result = smoke(name)
    ok(result)
    out = result.stdout
    hyper = line_starting(out, "Hyperparams: AUTO mode - CPU:")
    assert f"model={model}," in hyper and "compile=OFF" in hyper, hyper
    assert line_starting(out, "Compile: Disabled")
    done = line_starting(out, "Done:")
    assert done.startswith("Done: 3 steps"), done
    assert re.search(rf"{metric} \d+(\.\d+)?%?;", done), done

    run_dirs = [p for p in (cwd / "runs" / "smoke").iterdir()]
    assert len(run_dirs) == 1 and run_dirs[0].name.startswith(prefix + "-"), run_dirs
    run_dir = run_dirs[0]
    assert str(run_dir.relative_to(cwd)) in done
    assert {"checkpoint.pt", "config", "plan.json", "hardware.json", "metrics.jsonl"} <= {
        p.name for p in run_dir.iterdir()}

    config_text = (cwd / ".config").read_text()
    assert (run_dir / "config").read_text() == config_text
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["device_type"] == "cpu" and plan["compile"] is False
    assert plan["micro_batch"] * plan["grad_accum"] == plan["effective_batch"] == plan["target_effective_batch"]
    assert json.loads((run_dir / "hardware.json").read_text())["gpus"] == []

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    finals = [r for r in records if r.get("final")]  # events (the run's end) may follow it
    assert len(finals) == 1 and metric in finals[0], records
    final = finals[0]
    if metric == "accuracy":
        assert 0.0 <= final["accuracy"] <= 1.0
    else:
        assert final["perplexity"] > 1.0

    ckpt = _trusted_checkpoint(run_dir / "checkpoint.pt")
    assert ckpt["config"] == config_text
    assert ckpt["plan"] == plan
    assert ckpt["plan"]["micro_batch"] > 0 and ckpt["plan"]["grad_accum"] > 0
    assert ckpt["step"] == 3 and metric in ckpt["eval"]


def test_checkpoint_loads_with_weights_only(smoke):
    cwd, result = smoke("lenet5")
    ok(result)
    [path] = (cwd / "runs" / "smoke").glob("*/checkpoint.pt")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert ckpt["config"] == (cwd / ".config").read_text()
    assert {"micro_batch", "grad_accum"} <= set(ckpt["plan"])
    assert isinstance(ckpt["model"], dict) and all(isinstance(v, torch.Tensor) for v in ckpt["model"].values())


# --------------------------------------------------------------------------
# 5. a fresh directory: train applies the default defconfig


def test_train_without_config_applies_default_and_learns(tmp_path):
    fresh = tmp_path / "fresh.config"
    result = ok(make(tmp_path, "train", env={"KCONFIG_CONFIG": str(fresh)}))
    assert f"No {fresh} found: applying the default defconfig 'lenet5'" in result.stdout
    assert fresh.is_file() and not (tmp_path / ".config").exists()
    done = line_starting(result.stdout, "Done:")
    accuracy = float(re.search(r"accuracy (\d+(?:\.\d+)?)%", done).group(1))
    assert accuracy >= 95.0, done


# --------------------------------------------------------------------------
# 6. plans for another machine


def test_plan_resnet18_on_h100_json_planner(tmp_path):
    ok(make(tmp_path, "resnet18-defconfig"))
    plan = json.loads(ok(make(tmp_path, "plan", "GPU=h100", "FREE_GB=70", "FORMAT=json")).stdout)
    assert plan["policy"] == "planner" and plan["effective_batch"] == 512
    assert plan["micro_batch"] * plan["grad_accum"] == 512
    assert 0 < plan["predicted_peak_bytes"] <= plan["budget_bytes"] == int(70 * 2**30 * DEFAULT_SHARE)
    assert plan["memory_breakdown"] and plan["compile"] is True and plan["precision"] == "bf16"


def test_plan_resnet18_on_h100_json_tiers(tmp_path):
    ok(make(tmp_path, "resnet18-defconfig", 'FRAGMENTS=tier-policy'))
    before = (tmp_path / ".config").read_bytes()
    plan = json.loads(ok(make(tmp_path, "plan", "GPU=h100", "FREE_GB=70", "FORMAT=json")).stdout)
    assert plan["policy"] == "tiers"
    assert plan["micro_batch"] == 64
    assert plan["grad_accum"] == 8
    assert plan["effective_batch"] == 512
    assert plan["target_effective_batch"] == 512
    assert plan["compile"] is True
    assert plan["precision"] == "bf16"
    assert plan["device_type"] == "cuda"
    assert plan["world_size"] == 1

    plan4 = json.loads(ok(make(tmp_path, "plan", "GPU=h100", "FREE_GB=70", "GPUS=4", "FORMAT=json",
                               env={"WORLD_SIZE": "4"})).stdout)
    assert plan4["world_size"] == 4
    assert plan4["micro_batch"] == 64
    assert plan4["grad_accum"] == 2
    assert plan4["effective_batch"] == 512
    assert (tmp_path / ".config").read_bytes() == before


def test_plan_gpt2_on_h100_text(tmp_path):
    ok(make(tmp_path, "gpt2-defconfig"))
    out = ok(make(tmp_path, "plan", "GPU=h100", "FREE_GB=70")).stdout
    assert "catalog:h100" in line_starting(out, "Plan for .config (gpt2-124m)")
    assert "cuda (NVIDIA H100" in line_starting(out, "  device ")
    assert "Enabled" in line_starting(out, "  compile  ")
    assert "Hyperparams:" not in out and out.count("Plan for ") == 1  # the plan once


# --------------------------------------------------------------------------
# 7. bad input fails, names the symbol and changes nothing


BAD_FRAGMENTS = {
    "unknown-symbol": ("CONFIG_NO_SUCH_SYMBOL=y\n", ("NO_SUCH_SYMBOL",)),
    "out-of-range": ("CONFIG_EPOCHS=0\n", ("CONFIG_EPOCHS", "range")),
    "unmet-dependency": ("CONFIG_BATCH_SIZE=64\n", ("CONFIG_BATCH_SIZE", "HYPER_PARAM_MANUAL")),
}


@pytest.fixture
def lenet5_dir(tmp_path):
    ok(make(tmp_path, "lenet5-defconfig"))
    return tmp_path


@pytest.mark.parametrize("case", list(BAD_FRAGMENTS))
def test_bad_fragment_is_rejected_and_config_kept(lenet5_dir, case):
    text, needles = BAD_FRAGMENTS[case]
    bad = lenet5_dir / "fragments" / case
    bad.parent.mkdir()
    bad.write_text(text)
    config = lenet5_dir / ".config"
    before = config.read_bytes()
    failed(make(lenet5_dir, "defconfig-lenet5", f"FRAGMENTS=cpu-smoke {bad}"), str(bad), *needles)
    assert config.read_bytes() == before
    assert not (lenet5_dir / ".config.old").exists()


def test_bad_defconfig_given_by_path_is_rejected(lenet5_dir):
    bad = lenet5_dir / "mine"
    bad.write_text((ROOT / "defconfigs" / "lenet5").read_text() + "CONFIG_EPOCHS=0\n")
    before = (lenet5_dir / ".config").read_bytes()
    # make's pattern rules keep the directory: <dir>/mine-defconfig has the stem <dir>/mine.
    failed(make(lenet5_dir, f"{bad}-defconfig"), str(bad), "CONFIG_EPOCHS")
    assert (lenet5_dir / ".config").read_bytes() == before


MALFORMED = {
    "int": (r"^CONFIG_EPOCHS=40$", "CONFIG_EPOCHS=forty", "EPOCHS"),
    "number-string": (r'^CONFIG_LEARNING_RATE="3e-3"$', 'CONFIG_LEARNING_RATE="fast"', "CONFIG_LEARNING_RATE"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_hand_edited_malformed_config_fails_everywhere(lenet5_dir, case):
    pattern, replacement, symbol = MALFORMED[case]
    config = lenet5_dir / ".config"
    text, n = re.subn(pattern, replacement, config.read_text(), flags=re.M)
    assert n == 1
    config.write_text(text)
    before = config.read_bytes()
    for target in ("train", "plan", "olddefconfig"):
        failed(make(lenet5_dir, target), symbol)
        assert config.read_bytes() == before, target
    assert not (lenet5_dir / "runs").exists()


def test_unknown_defconfig_lists_the_available_ones(tmp_path):
    result = failed(make(tmp_path, "nosuch-defconfig"), "nosuch")
    for name in DEFCONFIG_NAMES:
        assert name in result.stderr
    assert not (tmp_path / ".config").exists()


# --------------------------------------------------------------------------
# 8. KCONFIG_CONFIG


def test_kconfig_config_selects_the_file(tmp_path):
    ok(make(tmp_path, "lenet5-defconfig", env={"KCONFIG_CONFIG": "other.config"}))
    assert (tmp_path / "other.config").is_file()
    assert not (tmp_path / ".config").exists()

    ok(make(tmp_path, "lenet5-defconfig", "KCONFIG_CONFIG=third.config"))  # as a make variable
    assert (tmp_path / "third.config").read_bytes() == (tmp_path / "other.config").read_bytes()
    assert not (tmp_path / ".config").exists()

    out = ok(make(tmp_path, "plan", env={"KCONFIG_CONFIG": "other.config"})).stdout
    assert line_starting(out, "Plan for other.config (lenet5)")
    assert not (tmp_path / ".config").exists()


# --------------------------------------------------------------------------
# 9. hardware profiles


def test_plan_with_saved_hardware_profile(lenet5_dir):
    profile = lenet5_dir / "profile.json"
    profile.write_text(ok(make(lenet5_dir, "check-hardware", "FORMAT=json")).stdout)
    assert "cpu" in json.loads(profile.read_text())
    out = ok(make(lenet5_dir, "plan", f"HW={profile}")).stdout
    assert line_starting(out, "Plan for .config (lenet5)")
    assert f"file:{profile}" in out
    assert line_starting(out, "  device ").split()[1] == "cpu"

    corrupt = lenet5_dir / "corrupt.json"
    corrupt.write_text(profile.read_text()[: len(profile.read_text()) // 2])
    failed(make(lenet5_dir, "plan", f"HW={corrupt}"), str(corrupt))


# --------------------------------------------------------------------------
# 10. training refuses a simulated machine


def test_train_refuses_simulated_hardware(lenet5_dir):
    failed(make(lenet5_dir, "train", "GPU=h100"), "HW= and GPU= describe another machine")
    assert not (lenet5_dir / "runs").exists()


def test_train_without_torchrun_refuses_a_world_size(lenet5_dir):
    failed(make(lenet5_dir, "train", "WORLD_SIZE=4"), "WORLD_SIZE=4", "GPUS=")
    assert not (lenet5_dir / "runs").exists()


def test_unknown_format_is_an_error(lenet5_dir):
    failed(make(lenet5_dir, "plan", "FORMAT=xml"), "FORMAT='xml'")
    assert ok(make(lenet5_dir, "plan", "FORMAT=JSON")).stdout.lstrip().startswith("{")


def test_a_refused_plan_request_writes_no_config(tmp_path):
    failed(make(tmp_path, "plan", "GPU=bogus"), "bogus")
    assert not (tmp_path / ".config").exists()


def test_mrproper_removes_the_selected_config(tmp_path):
    env = {"KCONFIG_CONFIG": "mine.config"}
    ok(make(tmp_path, "lenet5-defconfig", env=env))
    ok(make(tmp_path, "olddefconfig", env=env))
    assert (tmp_path / "mine.config.old").exists()
    ok(make(tmp_path, "mrproper", env=env))
    assert not (tmp_path / "mine.config").exists() and not (tmp_path / "mine.config.old").exists()


# --------------------------------------------------------------------------
# 11. user errors through the command line make runs (issue 16): one 'error:' line naming the problem and
# the fix, exit status 2, no traceback, nothing written


def kfit(cwd: Path, *args: str, env: dict | None = None, script: str = "kfit.py",
         timeout: int = 300) -> subprocess.CompletedProcess:
    """scripts/<script> as make's recipes run it, with make's variables in the environment."""
    full_env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    full_env.update(env or {})
    return subprocess.run([str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "scripts" / script), *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def refused(result: subprocess.CompletedProcess, *needles: str) -> str:
    failed(result, *needles)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def files(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None for p in directory.rglob("*")}


def test_non_utf8_config_or_fragment_is_one_error_everywhere(lenet5_dir):
    config = lenet5_dir / ".config"
    lines = config.read_text().count("\n")
    config.write_bytes(config.read_bytes() + b"# caf\xe9\n")
    (lenet5_dir / "frag").write_bytes(b"CONFIG_EPOCHS=3 # \xff\n")
    before = files(lenet5_dir)
    for args in (("plan",),):  # the other commands: tests/test_bad_input.py, in-process
        line = refused(kfit(lenet5_dir, *args), f".config: line {lines + 1}, byte 6", "0xe9 is not UTF-8",
                       "must be UTF-8 text")
        assert "kconfiglib" not in line
    (lenet5_dir / ".config").write_bytes(before[".config"].replace(b"# caf\xe9\n", b""))
    refused(kfit(lenet5_dir, "mergeconfig", "frag"), "frag: line 1, byte 19", "0xff is not UTF-8")
    assert files(lenet5_dir) == {**before, ".config": before[".config"].replace(b"# caf\xe9\n", b"")}


def test_kconfig_config_naming_a_directory_is_one_error_and_moves_nothing(tmp_path):
    (tmp_path / "adir").mkdir()
    for args in (("plan",), ("defconfig", "lenet5")):  # the others: tests/test_bad_input.py, in-process
        result = kfit(tmp_path, *args, env={"KCONFIG_CONFIG": "adir"})
        refused(result, "KCONFIG_CONFIG=adir is a directory", "KCONFIG_CONFIG=adir/.config")
        assert "no such file" not in result.stderr and result.stdout == "", args
        assert files(tmp_path) == {"adir": None}, args  # defconfig used to move it aside to adir.old


def test_plan_without_a_config_plans_the_default_in_memory_and_writes_nothing(tmp_path, kfit_here):
    # kfit's plan command in this process (conftest's kfit_here): what it prints and writes, not the process
    out = ok(kfit_here(tmp_path, "plan")).stdout
    assert line_starting(out, "Plan for defconfigs/lenet5 (lenet5)")
    assert "note: no .config: this plans the default defconfig 'lenet5' in memory and writes nothing" in out
    plan = json.loads(ok(kfit_here(tmp_path, "plan", FORMAT="json")).stdout)  # JSON, nothing before it
    assert any("in memory" in note for note in plan["notes"])
    assert not any(tmp_path.iterdir())


BENCH_MEMORY_CUDA = pytest.param(
    "bench_memory.py", (), {"DEVICE": "cuda"}, ("DEVICE=cuda", "no CUDA GPU", "DEVICE=cpu"),
    marks=pytest.mark.skipif(torch.cuda.is_available(), reason="refused only without a GPU"), id="bench-memory-cuda")

BAD_VARIABLES = [
    # kfit's own commands: tests/test_bad_input.py (in-process, the same checks)
    ("bench_monitor.py", (), {"STEPS": "abc"}, ("STEPS='abc'", "whole number >= 1")),
    ("bench_monitor.py", (), {"STEPS": "0"}, ("STEPS='0'", "whole number >= 1")),
    ("bench_memory.py", (), {"DEVICE": "tpu"}, ("DEVICE='tpu'", "auto, cpu, cuda")),
    BENCH_MEMORY_CUDA,
]


@pytest.mark.parametrize("script, args, env, needles", BAD_VARIABLES,
                         ids=[p.id if hasattr(p, "id") else f"{'-'.join(p[1]) or p[0]}-{'-'.join(p[2])}"
                              for p in BAD_VARIABLES])
def test_a_bad_variable_is_one_error_naming_it_and_what_is_accepted(lenet5_dir, script, args, env, needles):
    before = files(lenet5_dir)
    refused(kfit(lenet5_dir, *args, env=env, script=script), *needles)
    assert files(lenet5_dir) == before


def test_plan_report_checks_its_output_before_planning(lenet5_dir):
    for out, needle in (("/nonexistent/d/r.html", "/nonexistent/d does not exist"),
                        ("/dev/null/r.html", "/dev/null is not a directory"), (str(lenet5_dir), "is a directory")):
        result = kfit(lenet5_dir, "plan-report", env={"OUT": out})
        refused(result, f"OUT={out}", needle)
        assert "plan-matrix" not in result.stderr  # no progress: refused before a minute of planning


def test_mixed_gpus_plan_for_the_smallest_everywhere(lenet5_dir, kfit_here):
    # kfit's commands in this process (conftest's kfit_here): the plans they print, not the process
    profiles = {gpu: json.loads(ok(kfit_here(lenet5_dir, "check-hardware", GPU=gpu, FORMAT="json")).stdout)
                for gpu in ("h100", "a10g")}
    mixed = {**profiles["h100"], "gpus": [profiles["h100"]["gpus"][0], {**profiles["a10g"]["gpus"][0], "index": 1}]}
    (lenet5_dir / "mixed.json").write_text(json.dumps(mixed))
    planned = json.loads(ok(kfit_here(lenet5_dir, "plan", HW="mixed.json", WORLD_SIZE="2", FORMAT="json")).stdout)
    smallest = json.loads(ok(kfit_here(lenet5_dir, "plan", GPU="a10g", GPUS="2", FORMAT="json")).stdout)
    assert planned["device_name"] == "NVIDIA A10G" and planned["budget_bytes"] == smallest["budget_bytes"]
    assert planned["micro_batch"] == smallest["micro_batch"]
    assert planned["budget_bytes"] < profiles["h100"]["gpus"][0]["free_bytes"] * DEFAULT_SHARE * 0.9  # not the H100's
    assert any("sized for the smallest, GPU 1 NVIDIA A10G" in note for note in planned["notes"])
    report = ok(kfit_here(lenet5_dir, "check-hardware", HW="mixed.json", GPUS="2")).stdout
    assert "plans for GPU 0" not in report and "planned for the smallest, GPU 1 NVIDIA A10G" in report
    assert "note: the 2 GPUs the processes use differ" in report  # the plan for GPUS=2 says so too


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "abc"}, {"RESUME": "maybe"}, {"NNODES": "0"}],
                         ids=lambda env: "-".join(f"{k}={v}" for k, v in env.items()))
def test_train_refuses_a_bad_variable_before_writing_the_default_config(tmp_path, env):
    refused(kfit(tmp_path, "train", env=env), next(iter(env)))
    assert not any(tmp_path.iterdir())
