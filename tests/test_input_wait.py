"""Input diagnostics: the trainer times each step's wait for the data loader, the monitor records its share
and warns past a threshold naming the setting that helps; CONFIG_DATA_PREFETCH_FACTOR reaches the DataLoader."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lib import config as kc
from lib.errors import ConfigError, KfitError
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.monitor import INPUT_WAIT_STEPS, Monitor, input_wait_fix
from lib.trainer import train
from lib.trainer.windows import InputWait, loader

pytestmark = pytest.mark.usefixtures("one_thread")

SLOW_FACTORY = textwrap.dedent('''
    import time

    import torch

    class SlowDigits(torch.utils.data.Dataset):
        """A map-style dataset whose every item takes DELAY_S to read, as from a slow disk."""

        DELAY_S = 0.003

        def __len__(self):
            return 400

        def __getitem__(self, i):
            time.sleep(self.DELAY_S)
            x = torch.full((4,), float(i % 7))
            return x, x.sum().reshape(1)

    def build():
        return torch.nn.Linear(4, 1), SlowDigits(), torch.nn.functional.mse_loss
''')

CPU = resolve_hardware(gpu="cpu")


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    (tmp_path / "slow_models.py").write_text(SLOW_FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "slow_models"
    sys.modules.pop("slow_models", None)


def custom_config(tmp_path, factory: str, **extra):
    lines = ["CONFIG_MODEL_CUSTOM=y", f'CONFIG_CUSTOM_MODEL_FACTORY="{factory}"', "CONFIG_DEVICE_CPU=y",
             f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"', "CONFIG_MONITOR=n"]
    lines += [f"CONFIG_{k}={v}" for k, v in extra.items()]
    (tmp_path / "defconfig").write_text("\n".join(lines) + "\n")
    return kc.make_defconfig(str(tmp_path / "defconfig"), out=tmp_path / ".config")


def test_a_slow_loader_is_warned_about_with_the_setting_that_helps(tmp_path, slow_module):
    config = custom_config(tmp_path, f"{slow_module}:build", EPOCHS=1, HYPER_PARAM_MANUAL="y", BATCH_SIZE=8,
                           GRADIENT_ACCUMULATION=1, LOG_INTERVAL=10, WARMUP_STEPS=0)
    plan = resolve(config, CPU, ModelDescription.from_config(config))
    assert plan.num_workers == 0  # AUTO on a CPU: every batch is read in the training process
    lines: list[str] = []
    result = train(config, plan, CPU, run_dir=tmp_path / "run", log=lines.append)
    assert result.steps == 45  # 360 training samples (the last 10% evaluate) in steps of 8
    warnings = [line for line in lines if "waiting for the data loader" in line]
    assert len(warnings) == 1, lines
    assert warnings[0].startswith("warning: steps ") and "CONFIG_DATALOADER_WORKERS" in warnings[0] \
        and "make bench-data" in warnings[0]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    event = next(r for r in records if r.get("warning") == "input_wait")
    assert event["input_wait_fraction"] > 0.5  # 8 x 3 ms of sleep against a Linear(4, 1) step
    steps = [r for r in records if "loss" in r and "eval_loss" not in r]
    assert steps and all(0.5 < r["input_wait_fraction"] <= 1 for r in steps)
    # every batch but the epoch's first (the loader starting) slept 8 x 3 ms in __getitem__
    assert sum(r["input_wait_s"] for r in steps) >= 0.003 * 8 * 44
    print(warnings[0])


def step_monitor(tmp_path, plan=None) -> tuple[Monitor, list[str]]:
    lines: list[str] = []
    monitor = Monitor(tmp_path, 100, "cpu", CPU, log=lines.append, enabled=False, plan=plan)
    return monitor, lines


def test_the_warning_judges_a_window_of_steps(tmp_path):
    monitor, lines = step_monitor(tmp_path)
    step = 0
    for step in range(1, 3 * INPUT_WAIT_STEPS):  # 15% of each step: no warning however long
        monitor.update(step, 1, 1.0, 0.1, step * 8, input_wait_s=0.015, step_s=0.1)
    for _ in range(2):  # the last 20 steps: 18 x 15% + 2 x 50% = 18.5%
        step += 1
        monitor.update(step, 1, 1.0, 0.1, step * 8, input_wait_s=0.05, step_s=0.1)
    assert not lines
    for _ in range(5):  # 20.25% at the first of these: warned once
        step += 1
        monitor.update(step, 1, 1.0, 0.1, step * 8, input_wait_s=0.05, step_s=0.1)
    assert len(lines) == 1 and f"steps {step - 4 - INPUT_WAIT_STEPS + 1}-{step - 4} spent 20% of their time" in lines[0]
    monitor.log_entry({"step": step, "epoch": 1, "loss": 1.0, "lr": 0.1})
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["input_wait_fraction"] == pytest.approx((59 * 0.015 + 7 * 0.05) / 6.6, abs=1e-4)
    monitor.close()


def test_the_fix_follows_the_loader_as_planned(make_config):
    none = resolve(make_config(""), CPU, ModelDescription.from_config(make_config("")))
    assert "CONFIG_DATALOADER_WORKERS_MANUAL=y" in input_wait_fix(none)
    workers = make_config("CONFIG_DATALOADER_WORKERS_MANUAL=y\nCONFIG_DATALOADER_WORKERS=3\n"
                          "CONFIG_DATA_PREFETCH_FACTOR=4\n")
    plan = resolve(workers, CPU, ModelDescription.from_config(workers))
    assert (plan.num_workers, plan.prefetch_factor) == (3, 4)
    assert "CONFIG_DATALOADER_WORKERS (now 3) or CONFIG_DATA_PREFETCH_FACTOR (now 4)" in input_wait_fix(plan)


def test_prefetch_factor_reaches_the_data_loader(make_config):
    config = make_config("CONFIG_DATALOADER_WORKERS_MANUAL=y\nCONFIG_DATALOADER_WORKERS=1\n"
                         "CONFIG_DATA_PREFETCH_FACTOR=5\n")
    plan = resolve(config, CPU, ModelDescription.from_config(config))
    data = torch.arange(10)  # indexed by a list of samples, as a BatchSplit is
    made = loader(data, [[0, 1], [2, 3]], plan)
    assert (made.num_workers, made.prefetch_factor) == (1, 5)
    feed = iter(made)
    assert isinstance(feed, InputWait) and [int(x) for x in next(feed)] == [0, 1]
    assert feed.first_s is not None and feed.take() == 0.0  # the first batch is the loader starting
    next(feed)
    assert feed.take() > 0 and feed.take() == 0.0
    default = resolve(make_config("CONFIG_DATALOADER_WORKERS_MANUAL=y\nCONFIG_DATALOADER_WORKERS=1\n"), CPU,
                      ModelDescription.from_config(config))
    assert loader(data, [[0]], default).prefetch_factor == 2  # 0 = AUTO: torch's default


def test_prefetch_without_workers_is_refused_or_noted(make_config):
    with pytest.raises(ConfigError, match=r"CONFIG_DATA_PREFETCH_FACTOR=4 needs data loader worker processes: "
                                          r"set CONFIG_DATALOADER_WORKERS above 0"):
        make_config("CONFIG_DATALOADER_WORKERS_MANUAL=y\nCONFIG_DATALOADER_WORKERS=0\nCONFIG_DATA_PREFETCH_FACTOR=4\n")
    auto = make_config("CONFIG_DATA_PREFETCH_FACTOR=4\n")  # AUTO chooses no workers on a CPU
    plan = resolve(auto, CPU, ModelDescription.from_config(auto))
    assert plan.prefetch_factor == 0
    assert any("CONFIG_DATA_PREFETCH_FACTOR=4 is unused" in note for note in plan.notes)


# --------------------------------------------------------------------------
# make bench-data (scripts/bench_data.py)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import bench_data  # noqa: E402


def test_bench_data_at_a_tiny_size_ends_with_the_summary_line(tmp_path):
    config = kc.make_defconfig("lenet5", out=tmp_path / ".config")
    assert config.model == "lenet5"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "SET")}
    env.update(KCONFIG_CONFIG=str(tmp_path / ".config"), WORKERS="0,1", PREFETCH="1,3", BATCH="8", BATCHES="6",
               ROUNDS="1")
    result = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT), "bench-data"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[1].split() == ["workers", "prefetch", "batches/s", "samples/s", "start", "ms"]
    assert [line.split()[:2] for line in lines[2:5]] == [["0", "-"], ["1", "1"], ["1", "3"]]
    assert re.fullmatch(r"data-loader: best workers=[01] prefetch=[013] batches_per_s=\d+\.\d", lines[-1])


def test_bench_data_picks_the_fewest_workers_among_ties_and_names_bad_lists(monkeypatch):
    points = [bench_data.Point(0, 0, [100.0]), bench_data.Point(1, 2, [104.0]), bench_data.Point(2, 4, [200.0]),
              bench_data.Point(4, 1, [195.0])]
    assert bench_data.best_point(points).label() == "workers=2 prefetch=4"
    assert bench_data.best_point(points[:2]).label() == "workers=0 prefetch=0"  # within 5%: no worker at all
    assert bench_data.summary(points[2]) == "data-loader: best workers=2 prefetch=4 batches_per_s=200.0"
    monkeypatch.setenv("WORKERS", "0,two")
    with pytest.raises(KfitError, match=r"WORKERS='0,two' must be whole numbers >= 0 separated by commas"):
        bench_data.counts("WORKERS", [0, 1, 2], 0)
