"""Learning-rate schedules (CONFIG_LR_SCHEDULE_*), the decay groups (CONFIG_WEIGHT_DECAY_EMBEDDINGS) and which
optimizers run fused: each schedule's shape checked over generated runs, a user's function trained with."""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lib import config as kc
from lib.errors import ConfigError
from lib.step import FUSED, decay_groups, fused_on, make_optimizer
from lib.trainer import lr_at
from lib.trainer.schedule import schedule_function
from tests.helpers import run

pytestmark = pytest.mark.usefixtures("one_thread")
BASE = kc.defconfig_config("lenet5")


def schedule(name: str, **more):
    return kc.derive(BASE, {f"LR_SCHEDULE_{name.upper()}": True, "LEARNING_RATE": "0.5", **more})


COSINE = schedule("cosine")  # varied field by field below: the property is lr_at's, not the reader's
runs = st.tuples(st.integers(0, 50), st.integers(1, 400))  # (warm-up steps, total steps)
ratios = st.sampled_from(["0", "0.05", "0.1", "0.5", "1"])


@settings(max_examples=200, deadline=None)
@given(runs, ratios, st.sampled_from(["cosine", "linear", "wsd"]), st.sampled_from(["0.1", "0.2", "0.5", "1"]))
def test_decaying_schedules_warm_up_then_fall_monotonically_to_the_floor(run_shape, ratio, name, fraction):
    warmup, total = run_shape
    config = dataclasses.replace(COSINE, lr_schedule=name, warmup_steps=warmup, lr_min_ratio=float(ratio),
                                 lr_decay_fraction=float(fraction) if name == "wsd" else None)
    rates = [lr_at(config, s, total) for s in range(total + 1)]
    peak, floor = 0.5, 0.5 * float(ratio)
    for s in range(min(warmup, total)):
        assert rates[s] == pytest.approx(peak * (s + 1) / warmup)  # linear warm-up
    after = rates[warmup:] if warmup <= total else []
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:]))  # never rises after warm-up
    assert all(floor - 1e-12 <= r <= peak + 1e-12 for r in after) and all(r <= peak for r in rates)
    if warmup < total:
        assert rates[total] == pytest.approx(floor)  # ends at the floor at the last step
        assert rates[warmup] == pytest.approx(peak)
    if name == "wsd" and warmup < total:  # stable at the peak until the decay's share begins
        stable = warmup + int((total - warmup) * (1 - float(fraction)))
        assert all(r == pytest.approx(peak) for r in rates[warmup:stable + 1])


def test_the_default_cosine_is_the_one_runs_trained_with():
    """LR_MIN_RATIO's default 0.1 is the floor cosine always had: existing runs' rates are unchanged."""
    config = schedule("cosine", WARMUP_STEPS=4)
    assert config.lr_min_ratio == 0.1
    old = [0.5 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - 4) / 16)))) for s in range(4, 21)]
    assert [lr_at(config, s, 20) for s in range(4, 21)] == pytest.approx(old)


@pytest.fixture
def schedules(tmp_path, monkeypatch):
    (tmp_path / "my_schedules.py").write_text(
        "def halve_every_ten(step):\n    return 0.5 ** (step // 10)\n"
        "def by_total(step, total_steps):\n    return 1 - step / total_steps\n"
        "def negative(step):\n    return -1.0\n"
        "def text(step):\n    return 'fast'\n"
        "def broken(step):\n    raise KeyError('epoch')\n"
        "rate = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    schedule_function.cache_clear()
    yield "my_schedules"
    sys.modules.pop("my_schedules", None)
    schedule_function.cache_clear()


def test_a_users_function_of_one_or_two_arguments_gives_the_multiplier(schedules):
    one = schedule("custom", LR_SCHEDULE_FUNCTION=f"{schedules}:halve_every_ten")
    assert [lr_at(one, s, 100) for s in (0, 9, 10, 25)] == [0.5, 0.5, 0.25, 0.125]
    two = schedule("custom", LR_SCHEDULE_FUNCTION=f"{schedules}:by_total")
    assert lr_at(two, 30, 40) == pytest.approx(0.5 * 0.25)
    example = schedule("custom")  # the default: scripts/schedule_example.py's inverse square root
    assert example.lr_schedule_function == "scripts.schedule_example:inverse_sqrt" and example.warmup_steps == 0
    assert lr_at(example, 99, 1000) == pytest.approx(0.5) and lr_at(example, 399, 1000) == pytest.approx(0.25)


@pytest.mark.parametrize("name, words", [
    ("negative", "returned -1.0 at step 0: return a finite multiplier >= 0"),
    ("text", "returned str at step 0, not a number"), ("broken", "raised KeyError at step 0: 'epoch'"),
    ("rate", "is a int, not a function"), ("missing", "cannot be loaded (AttributeError"),
])
def test_a_bad_schedule_function_is_one_error_before_the_run(schedules, tmp_path, name, words):
    config = kc.derive(schedule("custom", LR_SCHEDULE_FUNCTION=f"{schedules}:{name}"),
                       {"OUTPUT_DIR": str(tmp_path / "runs"), "DEVICE_CPU": True, "MAX_STEPS": 2})
    with pytest.raises(ConfigError, match=f'CONFIG_LR_SCHEDULE_FUNCTION="{schedules}:{name}" .*'
                                          if name in ("rate", "missing") else None) as caught:
        run(config)
    assert words in str(caught.value)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # refused before the run


def test_a_malformed_function_name_is_refused_by_the_config(tmp_path):
    (tmp_path / "d").write_text('CONFIG_LR_SCHEDULE_CUSTOM=y\nCONFIG_LR_SCHEDULE_FUNCTION="no colon"\n')
    with pytest.raises(ConfigError, match='CONFIG_LR_SCHEDULE_FUNCTION="no colon" must look like'):
        kc.make_defconfig(str(tmp_path / "d"), out=tmp_path / ".config")


def test_a_run_logs_the_rates_its_schedule_gives(schedules, tmp_path):
    config = kc.derive(schedule("custom", LR_SCHEDULE_FUNCTION=f"{schedules}:halve_every_ten"),
                       {"OUTPUT_DIR": str(tmp_path / "runs"), "DEVICE_CPU": True, "MAX_STEPS": 12,
                        "LOG_INTERVAL": 1, "HYPER_PARAM_MANUAL": True, "BATCH_SIZE": 16,
                        "GRADIENT_ACCUMULATION": 1})
    _, result = run(config)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["lr"] for r in rows if "lr" in r}
    assert logged[1] == 0.5 and logged[10] == 0.5 and logged[11] == 0.25  # step n logs the rate of step n-1


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2's


def test_decay_groups_leave_out_embeddings_only_when_asked():
    model = Tied()
    names = {id(p): n for n, p in model.named_parameters()}
    on = decay_groups(BASE, model)
    off = decay_groups(kc.derive(BASE, {"WEIGHT_DECAY_EMBEDDINGS": False}), model)
    assert [names[id(p)] for p in on[0]["params"]] == ["wte.weight", "proj.weight"]
    assert [names[id(p)] for p in off[0]["params"]] == ["proj.weight"]
    assert [names[id(p)] for p in off[1]["params"]] == ["wte.weight", "proj.bias", "norm.weight", "norm.bias"]
    assert (off[0]["weight_decay"], off[1]["weight_decay"]) == (BASE.weight_decay, 0.0)
    assert all(d["weight_decay"] == 0.0 for d in decay_groups(BASE, model)[1:])


def test_existing_defconfigs_keep_decaying_embeddings():
    for name in ("gpt2", "gpt2-tiny", "llama-125m", "llama-tiny", "lenet5", "resnet18"):
        assert kc.defconfig_config(name).weight_decay_embeddings, name


@pytest.mark.parametrize("optimizer, name, cuda, cpu", [
    ("ADAMW", None, True, True), ("ADAM", None, True, True), ("SGD", None, False, False),
    ("CUSTOM", "AdamW", True, True), ("CUSTOM", "Adagrad", False, False), ("CUSTOM", "my.mod:build", False, False),
])
def test_which_optimizers_run_fused(optimizer, name, cuda, cpu):
    config = kc.derive(BASE, {f"OPTIMIZER_{optimizer}": True, **({"OPTIMIZER_NAME": name} if name else {})})
    assert (fused_on(config, "cuda"), fused_on(config, "cpu")) == (cuda, cpu)
    if name == "AdamW":  # named by class, it is built fused as the built-in one is
        built = make_optimizer(config, torch.nn.Linear(3, 2))
        assert isinstance(built, torch.optim.AdamW) and built.defaults["fused"]
    assert set(FUSED) == {"adam", "adamw"}
