"""The run checks its plan's micro-batch (lib/trainer/trial.py): outside the predicted interval, the runner-ups
are timed with steps that train, and the run continues at the fastest, as a resume does."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lib import config as kc
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.trainer import Trainer, train
from lib.trainer.trial import SKIP, TRIAL_STEPS, WARMUP, Trial

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def _plan(**fields):
    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")
    plan = resolve(config, resolve_hardware(gpu="cpu"), ModelDescription.from_config(config))
    return dataclasses.replace(plan, **{"micro_batch": 64, "grad_accum": 8, "predicted_step_seconds": 0.1,
                                        "predicted_step_uncertainty": 0.1,
                                        "alternatives": ((128, 4, 0.11), (256, 2, 0.12)), **fields})


def _feed(trial: Trial, seconds: dict[int, float], steps: int) -> list[tuple[int, int]]:
    """Steps of the size the trial runs at, each taking seconds[size]: the (step, size) of every switch."""
    micro, switches = trial.current, []
    for step in range(steps):
        to = trial.record(micro, seconds[micro])
        if to is not None:
            switches.append((step + 1, to))
            micro = to
    return switches


def test_a_plans_runner_ups_survive_plan_json_and_a_checkpoint_alike():
    from lib.plan import Plan

    plan = _plan()
    data = plan.to_dict()
    assert json.loads(json.dumps(data)) == data  # a checkpoint's plan (this dict) equals plan.json's
    assert Plan.from_dict(json.loads(json.dumps(data))) == plan
    assert _plan(alternatives=()).to_dict()["alternatives"] == []


def test_steps_inside_the_interval_leave_the_plan_alone():
    trial = Trial(_plan(), world_size=1, resumed=False)
    assert trial.active and _feed(trial, {64: 0.105}, 50) == [] and not trial.active


@pytest.mark.parametrize("fastest", [64, 128, 256])
def test_outside_the_interval_each_runner_up_is_timed_and_the_fastest_kept(fastest):
    seconds = {64: 0.2, 128: 0.3, 256: 0.25}
    seconds[fastest] = 0.15
    trial = Trial(_plan(), world_size=1, resumed=False)
    switches = _feed(trial, seconds, 100)
    first = SKIP + TRIAL_STEPS
    second = first + WARMUP + TRIAL_STEPS
    assert switches == [(first, 128), (second, 256), (second + WARMUP + TRIAL_STEPS, fastest)]
    assert trial.fastest() == fastest and not trial.active and "measured against 100.0 ms predicted" in trial.outside


def test_nothing_is_tried_where_it_cannot_be_timed_alone_or_was_decided_before():
    assert not Trial(_plan(), world_size=2, resumed=False).active  # the ranks would have to agree
    assert not Trial(_plan(compile=True), world_size=1, resumed=False).active  # a recompile per size
    assert not Trial(_plan(alternatives=()), world_size=1, resumed=False).active
    assert not Trial(_plan(predicted_step_seconds=None), world_size=1, resumed=False).active
    assert not Trial(_plan(), world_size=1, resumed=True).active  # the checkpoint's micro-batch stands
    trial = Trial(_plan(), world_size=1, resumed=False)
    trial.record(64, 1.0)
    assert trial.record(32, 1.0) is None and not trial.active  # out-of-memory recovery halved it: its choice


def _config(tmp_path, name: str, **settings):
    config = kc.make_defconfig("lenet5", out=tmp_path / f"{name}.config")
    return kc.derive(config, {"DEVICE_CPU": True, "TARGET_EFFECTIVE_BATCH": 64, "EPOCHS": 6, "MONITOR": False,
                              "OUTPUT_DIR": str(tmp_path / name), "LOG_INTERVAL": 1, **settings})


def _events(run_dir, kind: str) -> list[dict]:
    return [e for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if e.get("event") == kind]


def _losses(run_dir) -> list[float]:
    return [e["loss"] for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in e and "event" not in e and "eval_loss" not in e]


def test_a_run_started_on_a_wrong_plan_switches_early_and_trains_as_a_run_started_right(tmp_path):
    cpu = resolve_hardware(gpu="cpu")
    right_config = _config(tmp_path, "right")
    right = resolve(right_config, cpu, ModelDescription.from_config(right_config))
    assert right.alternatives == ()  # no timing in tests (KFIT_STEPTIME_MEASURE=0): nothing to try
    right = dataclasses.replace(right, micro_batch=64, grad_accum=1)
    right_run = train(right_config, right, cpu, log=lambda line: None)

    # the same effective batch cut into 32 micro-batches of 2, predicted far faster than it runs
    wrong_config = _config(tmp_path, "wrong")
    wrong = dataclasses.replace(right, micro_batch=2, grad_accum=32, predicted_step_seconds=1e-6,
                                predicted_step_uncertainty=0.1, alternatives=((64, 1, 1e-6), (32, 2, 1e-6)))
    lines: list[str] = []
    run = train(wrong_config, wrong, cpu, log=lines.append)
    [switch] = _events(run.run_dir, "micro_batch_switch")
    assert switch["planned_micro_batch"] == 2 and switch["micro_batch"] in (64, 32)
    assert switch["step"] <= 0.1 * run.steps, (switch["step"], run.steps)
    assert sorted(switch["timed_step_seconds"]) == ["2", "32", "64"]
    assert run.steps == right_run.steps and run.samples == right_run.samples  # the same effective batch
    assert _losses(run.run_dir) == pytest.approx(_losses(right_run.run_dir), rel=1e-3)
    assert run.final_eval["eval_loss"] == pytest.approx(right_run.final_eval["eval_loss"], rel=1e-3)
    saved = json.loads((run.run_dir / "plan.json").read_text())
    assert saved["micro_batch"] == switch["micro_batch"] and "by the run's own steps" in saved["reasons"]["micro_batch"]
    assert saved["effective_batch"] == 64


class Stop(Exception):
    pass


def test_a_resume_continues_at_the_micro_batch_the_run_switched_to(tmp_path):
    cpu = resolve_hardware(gpu="cpu")
    config = _config(tmp_path, "run", MAX_STEPS=30, CHECKPOINT_INTERVAL_STEPS=True, CHECKPOINT_EVERY_STEPS=20,
                     EVAL_INTERVAL=24)
    plan = resolve(config, cpu, ModelDescription.from_config(config))
    wrong = dataclasses.replace(plan, micro_batch=2, grad_accum=32, predicted_step_seconds=1e-6,
                                predicted_step_uncertainty=0.1, alternatives=((64, 1, 1e-6), (32, 2, 1e-6)))

    def crash(step, epoch, result):  # the run dies at step 24, after its checkpoint at 20
        raise Stop

    trainer = Trainer(config, wrong, cpu, log=lambda line: None, on_eval=crash)
    with pytest.raises(Stop):
        trainer.fit()
    [switch] = _events(trainer.run_dir, "micro_batch_switch")
    lines: list[str] = []
    resumed = train(config, wrong, cpu, log=lines.append, resume=trainer.run_dir)
    assert resumed.run_dir == trainer.run_dir and resumed.steps == 30
    [resume] = _events(resumed.run_dir, "resume")
    assert f"micro-batch {switch['micro_batch']})" in resume["message"] and "from step 20" in resume["message"]
    assert len(_events(resumed.run_dir, "micro_batch_switch")) == 1  # no second trial
