"""The learning rate for the effective batch: the range test's rate at the batch it measured, converted to the
run's effective batch by a stated rule (linear for SGD, square root for the Adam family, CONFIG_LR_SCALING_* to
choose), and APPLY=1 writes the converted rate."""

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from lib import config as kc, lr_finder


@pytest.mark.parametrize("optimizer, setting, rule, factor", [
    ("SGD", "AUTO", "linear", 8.0),
    ("ADAM", "AUTO", "sqrt", math.sqrt(8)),
    ("ADAMW", "AUTO", "sqrt", math.sqrt(8)),
    ("ADAMW", "LINEAR", "linear", 8.0),
    ("SGD", "SQRT", "sqrt", math.sqrt(8)),
    ("SGD", "NONE", "none", 1.0),
])
def test_the_rule_by_optimizer_and_by_choice(tmp_path, optimizer, setting, rule, factor):
    fragment = tmp_path / "fragment"
    fragment.write_text(f"CONFIG_OPTIMIZER_{optimizer}=y\nCONFIG_LR_SCALING_{setting}=y\n")
    config = kc.make_defconfig("lenet5", [str(fragment)], out=tmp_path / "config")
    scaling = lr_finder.scaling_for(config, 64, 512)
    assert scaling.rule == rule and scaling.factor == pytest.approx(factor)
    assert scaling.convert(0.01) == pytest.approx(0.01 * factor)
    assert f"CONFIG_LR_SCALING_{setting}" in scaling.describe() and f"x{factor:.3g}" in scaling.describe()


def test_the_same_batch_keeps_the_rate():
    for rule in lr_finder.RULES:
        assert lr_finder.Scaling(rule, "test", 512, 512).convert(0.02) == pytest.approx(0.02)


def test_an_unknown_rule_is_refused_by_the_config(tmp_path):
    fragment = tmp_path / "fragment"
    fragment.write_text("CONFIG_LR_SCALING_CUBE=y\n")
    from lib.errors import ConfigError

    with pytest.raises(ConfigError, match="LR_SCALING_CUBE"):
        kc.make_defconfig("lenet5", [str(fragment)], out=tmp_path / "config")


@pytest.fixture
def find_lr(tmp_path, monkeypatch, capsys):
    """kfit find-lr in this process on a LeNet-5 config (effective batch 128 on the CPU), the sweep replaced by
    one whose suggestion is 0.01 at whatever batch it is asked for."""
    from lib.cli import main

    fragment = tmp_path / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\n'
                        "CONFIG_HYPER_PARAM_POLICY_TIERS=y\nCONFIG_TARGET_EFFECTIVE_BATCH=128\n")
    config = tmp_path / ".config"
    kc.make_defconfig("lenet5", [str(fragment)], out=config)
    asked = []

    def sweep(cfg, plan, *, batch, runs=1, task=None):
        asked.append(batch)
        return [lr_finder.RangeTest(lrs=(1e-4, 1e-3, 3e-2, 1.0), losses=(2.3, 2.0, 1.0, 9.0),
                                    smoothed=(2.3, 2.1, 1.5, 3.0), stop_reason="diverged", seconds=0.1,
                                    min_lr=3e-2, steepest_lr=1e-3, suggestion=0.01)]

    monkeypatch.setattr(lr_finder, "find_lr", sweep)

    def run(*args, **env):
        with monkeypatch.context() as m:
            m.chdir(tmp_path)
            for name in ("KFIT_OVERRIDES", "KFIT_SET", "BATCH", "APPLY", "RUNS", "HW", "GPU", "GPUS", "WORLD_SIZE"):
                m.delenv(name, raising=False)
            m.setenv("KCONFIG_CONFIG", str(config))
            for name, value in env.items():
                m.setenv(name, value)
            capsys.readouterr()
            code = main(["find-lr", *args])
            out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["kfit", "find-lr", *args], code, out, err)
    return run, config, asked


def test_find_lr_prints_both_rates_and_apply_writes_the_converted_one(find_lr, tmp_path):
    run, config, asked = find_lr
    before = config.read_bytes()
    result = run(BATCH="32")  # AdamW measured at 32, trained at 128: x sqrt(4) = x2
    assert result.returncode == 0, result.stderr
    assert asked == [32] and config.read_bytes() == before  # without APPLY=1 nothing is written
    assert "Suggested learning rate at the measured batch 32: 0.01" in result.stdout
    assert ("Suggested learning rate at the effective batch 128: 0.02 (square-root scaling "
            "(CONFIG_LR_SCALING_AUTO, adamw): x sqrt(128 / 32) = x2)") in result.stdout
    saved = json.loads(next((tmp_path / "runs").glob("lr-finder-*/result.json")).read_text())
    assert (saved["batch"], saved["suggestion"], saved["effective_batch"]) == (32, 0.01, 128)
    assert saved["scaling"]["rule"] == "sqrt" and saved["effective_suggestion"] == pytest.approx(0.02)

    result = run("--set", "LR_SCALING=LINEAR", BATCH="32", APPLY="1")  # the linear rule chosen: x4
    assert result.returncode == 0, result.stderr
    assert "at the effective batch 128: 0.04 (linear scaling (CONFIG_LR_SCALING_LINEAR): x 128 / 32 = x4)" \
        in result.stdout
    assert kc.read_config(config).learning_rate == 0.04  # the converted rate, through the strict writer
    assert re.search(r"# CONFIG_LEARNING_RATE=\"?0\.04\"? written to", result.stdout), result.stdout


def test_without_accumulation_the_two_rates_agree(find_lr):
    run, config, asked = find_lr
    result = run("--set", "LR_SCALING_LINEAR=y")  # the plan's micro-batch is the whole effective batch here
    assert result.returncode == 0, result.stderr
    plan_batch = asked[-1]
    measured = re.search(rf"at the measured batch {plan_batch}: (\S+)", result.stdout).group(1)
    converted = re.search(r"at the effective batch (\d+): (\S+) ", result.stdout)
    if int(converted.group(1)) == plan_batch:
        assert converted.group(2) == measured and "= x1" in result.stdout
