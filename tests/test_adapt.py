"""Adapting instead of stopping: the out-of-memory ladder, a lost device, heat and a low battery."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from lib import config as kc
from lib.hardware import resolve_hardware
from lib.hardware.host import BatteryState
from lib.hardware.runtime import is_device_lost
from lib.hyperparams import ModelDescription, resolve
from lib.oom import OutOfMemory
from lib.task import load_task
from lib.planning import ladder
from lib.trainer import Trainer
from lib.trainer.conditions import Sensors
from lib.trainer.evaluation import Evaluator
from lib.trainer.resume import BATTERY_EXIT, DEVICE_LOST_EXIT, StoppedToResume, auto_interval_s
from tests.helpers import CPU, assert_same_weights, kfit_script, manual, run

KFIT = kfit_script()  # scripts/kfit.py's main, as make runs it
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def events(run_dir, kind: str) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if line.get("event") == kind]


def plan_for(config):
    return resolve(config, CPU, ModelDescription.from_config(config))


# -- the out-of-memory ladder ----------------------------------------------------


def test_the_ladder_takes_allowed_rungs_in_order(make_config):
    gpt2 = make_config(manual(4, 1), base="gpt2-tiny")
    plan = plan_for(gpt2)
    first = ladder.next_rung(gpt2, plan, CPU, [])
    assert first.name == "checkpointing" and first.plan.gradient_checkpointing and first.plan.precision == "fp32"
    second = ladder.next_rung(gpt2, first.plan, CPU, ["checkpointing"])
    assert second.name == "autocast" and second.plan.precision == "bf16" and not second.plan.grad_scaler
    assert ladder.next_rung(gpt2, second.plan, CPU, ["checkpointing", "autocast"]) is None  # offload: FSDP only
    # a GPU without bf16 gets fp16 with a gradient scaler
    t4 = resolve_hardware(gpu="T4")
    fp32_gpu = dataclasses.replace(plan, device_type="cuda", gradient_checkpointing=True)
    fp16 = ladder.next_rung(gpt2, fp32_gpu, t4, ["checkpointing"])
    assert fp16.plan.precision == "fp16" and fp16.plan.grad_scaler
    forbidden = make_config(manual(4, 1, "# CONFIG_OOM_LADDER_CHECKPOINTING is not set\n"), base="gpt2-tiny")
    assert ladder.next_rung(forbidden, plan, CPU, []).name == "autocast"
    by_hand = make_config(manual(4, 1, "CONFIG_PRECISION_FP32=y\n"), base="gpt2-tiny")
    assert ladder.next_rung(by_hand, first.plan, CPU, ["checkpointing"]) is None  # a precision chosen by hand stays


def test_at_micro_batch_1_the_ladder_switches_checkpointing_on_with_the_same_steps(make_config, monkeypatch):
    monkeypatch.setattr(Evaluator, "__call__", lambda self, *args: {"eval_loss": 0.0})  # GPT-2's eval split: seconds
    text = manual(8, 1, "CONFIG_MAX_STEPS=2\nCONFIG_LOG_INTERVAL=1\nCONFIG_LEARNING_RATE=\"1e-3\"\n")
    config = make_config(text, base="gpt2-tiny")
    task = load_task(config)  # tokenised once for both runs
    clean, clean_result = run(config, task=task)
    monkeypatch.setenv("KFIT_INJECT_OOM_ABOVE", "0")  # every micro-batch fails until a rung is taken
    adapted, result = run(make_config(text, base="gpt2-tiny"), task=task)
    assert adapted.progress.rungs == ["checkpointing"] and adapted.model.grad_checkpointing
    assert adapted.plan.micro_batch == 1 and adapted.plan.grad_accum == 8 and adapted.plan.effective_batch == 8
    assert result.samples == clean_result.samples == 16
    assert_same_weights(adapted.model, clean.model, atol=2e-5)  # the same samples, the same math
    [rung] = events(result.run_dir, "oom_rung")
    assert rung["rung"] == "checkpointing" and rung["effective_batch"] == 8 and rung["predicted_saving_bytes"] > 0
    assert "predicted peak" in rung["message"]
    assert json.loads((result.run_dir / "plan.json").read_text())["gradient_checkpointing"] is True


def test_without_checkpointing_the_ladder_takes_bf16_then_stops_with_what_it_tried(make_config, monkeypatch):
    monkeypatch.setenv("KFIT_INJECT_OOM_ABOVE", "0")
    trainer, result = run(make_config(manual(4, 1, "CONFIG_MAX_STEPS=1\n")))  # LeNet-5: no checkpointing
    assert trainer.progress.rungs == ["autocast"] and trainer.plan.precision == "bf16" and result.samples == 4
    assert [e["rung"] for e in events(result.run_dir, "oom_rung")] == ["autocast"]
    with pytest.raises(OutOfMemory, match="micro-batch 1.*no rung.*not allowed: .*CONFIG_OOM_LADDER_AUTOCAST"):
        run(make_config(manual(4, 1, "CONFIG_MAX_STEPS=1\n# CONFIG_OOM_LADDER_AUTOCAST is not set\n")))


# -- a lost device -----------------------------------------------------------------


def test_device_lost_errors_are_recognised():
    assert is_device_lost(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_device_lost(RuntimeError("CUDA error: uncorrectable ECC error encountered"))
    assert is_device_lost(RuntimeError("CUDA error: unspecified launch failure"))
    assert not is_device_lost(RuntimeError("CUDA error: device-side assert triggered"))  # the program's bug
    assert not is_device_lost(torch.OutOfMemoryError("CUDA out of memory"))


def test_a_lost_device_checkpoints_and_the_resume_replans_with_the_same_effective_batch(make_config, monkeypatch,
                                                                                       capsys):
    common = "CONFIG_MAX_STEPS=4\nCONFIG_LOG_INTERVAL=1\nCONFIG_OPTIMIZER_ADAMW=y\nCONFIG_LEARNING_RATE=\"1e-3\"\n"
    clean, _ = run(make_config(manual(16, 1, common)))
    config = make_config(manual(8, 2, common))
    gpu_plan = dataclasses.replace(plan_for(config), device_name="NVIDIA H100 80GB HBM3")  # the GPU to lose
    monkeypatch.setenv("KFIT_INJECT_DEVICE_LOST", "3")
    with pytest.raises(StoppedToResume) as stop:
        Trainer(config, gpu_plan, CPU, log=lambda line: None).fit()
    assert stop.value.exit_code == DEVICE_LOST_EXIT and stop.value.step == 2
    assert stop.value.path.name == "checkpoint-2.pt" and stop.value.path.is_file()
    [error] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "unspecified launch failure" in error and "holds step 2" in error and "'make train" in error
    run_dir = stop.value.path.parent
    assert events(run_dir, "device_lost")[0]["resume_step"] == 2

    monkeypatch.delenv("KFIT_INJECT_DEVICE_LOST")
    lines: list[str] = []
    cpu_config = make_config(manual(4, 4, common))  # the CPU's own plan: another micro-batch, the same 16
    resumed = Trainer(cpu_config, plan_for(cpu_config), CPU, log=lines.append, resume=run_dir)
    result = resumed.fit()
    assert result.run_dir == run_dir and result.steps == 4 and result.samples == 64
    assert resumed.progress.micro_batch == 4 and resumed.plan.grad_accum == 4
    assert any("Resuming on cpu" in line and "micro-batch 8 -> 4" in line for line in lines)
    assert_same_weights(resumed.model, clean.model, atol=1e-5)


# -- heat and battery, from fake sources ---------------------------------------------


class FakeGpu:
    """A GPU at `temp_c` that cools by 5C with every pause poll (Sensors.sleep)."""

    index = 0

    def __init__(self, temp_c: int, throttle: tuple[str, ...] = ()) -> None:
        self.temp_c, self.throttle, self.polls = temp_c, list(throttle), 0

    def read(self) -> dict:
        return {"temp_c": self.temp_c, "throttle": list(self.throttle)}

    def sleep(self, seconds: float) -> None:
        self.polls += 1
        self.temp_c -= 5
        self.throttle = []

    def close(self) -> None:
        pass


def test_a_hot_gpu_pauses_after_a_checkpoint_until_it_cools(make_config):
    gpu = FakeGpu(90)
    config = make_config(manual(8, 1, "CONFIG_MAX_STEPS=3\nCONFIG_THERMAL_PAUSE=y\n"))  # pause at 87C, resume below 75C
    lines: list[str] = []
    result = Trainer(config, plan_for(config), CPU, log=lines.append, sensors=Sensors(gpu=gpu, sleep=gpu.sleep)).fit()
    assert result.steps == 3 and gpu.polls == 4  # 90 -> 85 -> 80 -> 75 -> 70: below 75 after four polls
    [pause], [resume] = events(result.run_dir, "thermal_pause"), events(result.run_dir, "thermal_resume")
    assert pause["step"] == 1 and pause["temp_c"] == 90 and pause["path"].endswith("checkpoint-1.pt")
    assert resume["temp_c"] == 70 and resume["time"] >= pause["time"]
    assert any("paused after step 1" in line for line in lines) and any("resuming after" in line for line in lines)

    throttled = FakeGpu(80, ("hw_thermal",))  # below 87C, but the board slows its clocks for heat
    Trainer(config, plan_for(config), CPU, log=lines.append,
            sensors=Sensors(gpu=throttled, sleep=throttled.sleep)).fit()
    assert throttled.polls == 2  # throttle gone at 75C, then below 75C
    warm = FakeGpu(95)  # CONFIG_THERMAL_WARN (the default) never pauses
    Trainer(make_config(manual(8, 1, "CONFIG_MAX_STEPS=2\n")), plan_for(config), CPU, log=lines.append,
            sensors=Sensors(gpu=warm, sleep=warm.sleep)).fit()
    assert warm.polls == 0


def test_a_low_battery_checkpoints_more_often_and_may_stop_with_the_resume_command(make_config):
    states = [BatteryState(50, True), BatteryState(15, True), BatteryState(15, False)]
    config = make_config(manual(8, 1, "CONFIG_MAX_STEPS=4\nCONFIG_BATTERY_LOW_PERCENT=20\n"))
    trainer = Trainer(config, plan_for(config), CPU, log=lambda line: None,
                      sensors=Sensors(battery=lambda: states.pop(0), battery_every_s=0))
    intervals: list[float | None] = []
    usual = trainer.checkpoint_interval_s

    def recorded() -> float | None:  # asked before each step (and once at the start)
        intervals.append(usual())
        return intervals[-1]

    trainer.checkpoint_interval_s = recorded
    result = trainer.fit()
    assert result.steps == 4 and not states  # read after steps 1-3 (after the last one the run ends anyway)
    # low from the check after step 2, plugged in after step 3: step 3 checkpoints after 2 minutes
    # (BATTERY_CHECKPOINT_MINUTES), the others after AUTO's interval
    assert intervals[-2] == 120.0 and intervals.count(120.0) == 1
    assert [e["event"] for e in events(result.run_dir, "battery_low") + events(result.run_dir, "battery_ok")] == [
        "battery_low", "battery_ok"]

    stop = make_config(manual(8, 1, "CONFIG_MAX_STEPS=4\nCONFIG_BATTERY_STOP=y\n"))
    with pytest.raises(StoppedToResume) as stopped:
        Trainer(stop, plan_for(stop), CPU, log=lambda line: None,
                sensors=Sensors(battery=lambda: BatteryState(10, True), battery_every_s=0)).fit()
    # read after step 1; every rank agrees in step 2's collective, so all stop after step 2
    assert stopped.value.exit_code == BATTERY_EXIT and stopped.value.step == 2
    assert stopped.value.path.name == "checkpoint-2.pt" and stopped.value.path.is_file()
    assert "'make train" in str(stopped.value) and "10%" in str(stopped.value)


def test_the_auto_checkpoint_interval_bounds_lost_work_to_a_share_of_the_predicted_run(make_config):
    config = make_config("")  # AUTO: at most 10 minutes, at most 2% of the predicted run
    assert auto_interval_s(config, None) == 600.0  # no prediction: the minutes alone
    assert auto_interval_s(config, 5 * 3600) == 360.0  # 2% of 5 hours
    assert auto_interval_s(config, 100 * 3600) == 600.0  # the minutes bind
    assert auto_interval_s(config, 600) == 60.0  # never more often than once a minute
    assert auto_interval_s(make_config("CONFIG_CHECKPOINT_LOST_WORK_PERCENT=10\n"), 3600) == 360.0


def test_a_sharded_run_relaunches_with_the_rung_its_marker_names(make_config):
    """Under FSDP no rank can redo a step alone: the out-of-memory marker names the rung, and the relaunched
    run takes it before building (and sharding) the model."""
    config = make_config(manual(4, 1, "CONFIG_MAX_STEPS=2\n"))
    first = Trainer(config, plan_for(config), CPU, log=lambda line: None)
    first.progress.micro_batch = 1  # halving can go no further
    first.mark_oom(0, torch.OutOfMemoryError("CUDA out of memory"))
    first.directory.release()
    marker = json.loads((first.run_dir / "oom.json").read_text())
    assert marker["rungs"] == ["autocast"] and marker["micro_batch"] == 1  # LeNet-5 has no checkpointing
    relaunched = Trainer(config, plan_for(config), CPU, log=lambda line: None, resume=first.run_dir)
    assert relaunched.plan.precision == "bf16" and relaunched.progress.rungs == ["autocast"]
    assert relaunched.progress.micro_batch == 1 and relaunched.plan.grad_accum == 4
    result = relaunched.fit()
    assert result.samples == 8 and [e["rung"] for e in events(result.run_dir, "oom_rung")] == ["autocast"]


def test_make_train_exits_3_with_the_resume_command_and_the_next_one_resumes(tmp_path, monkeypatch, capsys):
    """Through the command line, as 'make train' runs it: the exit code and the one error line."""
    fragment = tmp_path / "fragment"
    fragment.write_text('CONFIG_DEVICE_AUTO=y\nCONFIG_MAX_STEPS=3\nCONFIG_TARGET_EFFECTIVE_BATCH=16\n'
                        'CONFIG_OUTPUT_DIR="runs"\n')
    kc.make_defconfig("lenet5", [str(fragment)], out=tmp_path / ".config")
    monkeypatch.chdir(tmp_path)
    for key in ("KCONFIG_CONFIG", "RESUME", "GPUS", "WORLD_SIZE", "KFIT_INJECT_OOM", "KFIT_INJECT_OOM_ABOVE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KFIT_INJECT_DEVICE_LOST", "2")
    assert KFIT.main(["train"]) == DEVICE_LOST_EXIT
    out, err = capsys.readouterr()
    [error] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in out + err and "holds step 1; resume with 'make train'" in error
    monkeypatch.delenv("KFIT_INJECT_DEVICE_LOST")
    assert KFIT.main(["train"]) == 0
    out, _ = capsys.readouterr()
    assert "from step 1 (checkpoint-1.pt" in out and "Done: 3 steps" in out
