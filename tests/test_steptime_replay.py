"""Step time by replay: the committed H100 measurements (docs/validation/) and real steps on this CPU, put
through lib.steptime's predictor.

Uncalibrated (datasheet peaks x the family's per-op-class efficiencies, lib/steptime/device.py): every
step-time case of every committed H100 run within UNCALIBRATED_TOLERANCE. Calibrated on one micro-batch
(the model's single factor, as lib.steptime.calibrate applies it), the other micro-batches of the same
model and harness within TRANSFER_TOLERANCE: the H100 pairs the diagnostics measured, and a tiny model
timed here. `python -m tests.test_steptime_replay` prints the table docs/time.md quotes.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from lib import config as kc
from lib.hardware import resolve_hardware
from lib.steptime import Counts, StepTimeModel, count_step, gpu_device, step_time_model
from lib.steptime.device import cpu_device

ROOT = Path(__file__).resolve().parent.parent
VALIDATION = ROOT / "docs" / "validation"
DIAGNOSTICS = VALIDATION / "diagnostics-2026-11-23"
UNCALIBRATED_TOLERANCE = 0.25
EAGER_SINCE = "2026-11-26"
TRANSFER_TOLERANCE = 0.10
# The step-time check's configs (lib/validation/steptime_check.py, budget.COMMON): each model's defconfig on
# CUDA; AUTO planned bf16, TF32 and compile on the H100.
CHECK = {"MAX_STEPS": 14, "EPOCHS": 1000, "MONITOR": False, "DATALOADER_WORKERS_MANUAL": True,
         "DATALOADER_WORKERS": 0, "LOG_INTERVAL": 5, "DEVICE_CUDA": True}


def step_time_cases() -> list[dict]:
    """Every committed H100 step-time case: file, model, micro-batch, accumulation, measured ms (the
    uncalibrated run's: the one the prediction was made for)."""
    cases = []
    for path in sorted(VALIDATION.glob("nvidia-h100-*.json")):
        doc = json.loads(path.read_text())
        check = doc["checks"].get("step-time") or {}
        for model, case in sorted(check.get("figures", {}).get("cases", {}).items()):
            if "measured_ms" in case:
                cases.append({"file": path.name, "model": model, "micro_batch": case["micro_batch"],
                              "grad_accum": case["grad_accum"], "measured_ms": case["measured_ms"],
                              "predicted_then_ms": case["predicted_ms"],
                              # the check has run eager since the runs of 2026-11-26 (steptime_check.SETTINGS)
                              "compiled": doc["environment"]["date"] < EAGER_SINCE})
    return cases


@lru_cache(maxsize=None)
def h100_model(name: str, compile: bool = True, trainer: bool = True) -> StepTimeModel:
    """The uncalibrated model of `name` as the step-time check planned it on the H100 (bf16, TF32). Without
    the trainer (`trainer=False`): the diagnostics' bare loops, which time the step and nothing around it."""
    config = kc.derive(kc.read_config(kc.DEFCONFIG_DIR / name), CHECK)
    model = step_time_model(config, resolve_hardware(gpu="h100"), device_type="cuda", precision="bf16", tf32=True,
                            compile=compile)
    assert model is not None and model.correction == 1.0  # the datasheet model, nothing calibrated
    return model if trainer else dataclasses.replace(model, device=dataclasses.replace(model.device,
                                                                                       step_overhead_s=0.0))


def uncalibrated_errors() -> list[tuple[dict, float, float]]:
    out = []
    for case in step_time_cases():
        predicted = h100_model(case["model"], case["compiled"]).seconds(case["micro_batch"], case["grad_accum"]) * 1e3
        out.append((case, predicted, (predicted - case["measured_ms"]) / case["measured_ms"]))
    return out


def test_every_committed_h100_step_time_case_is_within_25_percent_uncalibrated():
    rows = uncalibrated_errors()
    assert len(rows) == 15 and {c["model"] for c, _, _ in rows} == {"gpt2-tiny", "resnet18", "gpt2"}
    worst = max(rows, key=lambda r: abs(r[2]))
    assert abs(worst[2]) <= UNCALIBRATED_TOLERANCE, worst


# --------------------------------------------------------------------------
# Calibrated at one micro-batch, predicted at another: the H100 pairs


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (DIAGNOSTICS / name).read_text().splitlines() if line.strip()]


def h100_pairs() -> list[tuple[str, str, bool, dict[int, float]]]:
    """(what, model, compiled, micro-batch -> measured ms) of one harness each, from the committed files.

    phase_times.jsonl: forward+backward of GPT-2-tiny at 64 and 8, eager and compiled (median of 30, synced).
    ResNet-18 eager steps: 512 from phase_times.jsonl, 256 from the compile check's eager throughput (the
    median over its eight runs: every H100 JSON and diagnostics' compile-*.json; each call two steps).
    """
    phases = {line["case"]: line for line in _jsonl("phase_times.jsonl")}
    pairs = []
    for compiled in (False, True):
        key = "compiled" if compiled else "eager"
        pairs.append(("forward+backward", "gpt2-tiny", compiled,
                      {b: phases[f"gpt2-tiny bf16 {b}"][key]["fwd_bwd_ms"] for b in (64, 8)}))
    rates = []
    for path in [*VALIDATION.glob("nvidia-h100-*.json"), *DIAGNOSTICS.glob("compile-*.json")]:
        model = json.loads(path.read_text())["checks"].get("compile", {}).get("figures", {}).get("models", {})
        if "resnet18" in model:
            assert model["resnet18"]["batch"] == 256
            rates.append(model["resnet18"]["eager"]["samples_per_s"])
    assert len(rates) == 8
    pairs.append(("step", "resnet18", False, {512: phases["resnet18 bf16 512"]["eager"]["step_ms"],
                                              256: 256 / statistics.median(rates) * 1e3}))
    return pairs


def predicted_ms(model: StepTimeModel, what: str, batch: int) -> float:
    return (model.micro_seconds(batch) if what == "forward+backward" else model.seconds(batch, 1)) * 1e3


def transfer_errors() -> list[tuple[str, int, int, float]]:
    """(case, calibrated at, predicted at, error) both ways for every H100 pair."""
    out = []
    for what, name, compiled, measured in h100_pairs():
        model = h100_model(name, compiled, trainer=False)
        predicted = {b: predicted_ms(model, what, b) for b in measured}
        for at in measured:
            for other in measured:
                if other != at:
                    guess = predicted[other] * measured[at] / predicted[at]  # one factor, as calibrate applies
                    out.append((f"{name} {'compiled' if compiled else 'eager'} {what}", at, other,
                                (guess - measured[other]) / measured[other]))
    return out


def test_h100_calibration_at_one_micro_batch_carries_to_another():
    rows = transfer_errors()
    assert len(rows) == 6
    worst = max(rows, key=lambda r: abs(r[3]))
    assert abs(worst[3]) <= TRANSFER_TOLERANCE, worst


# --------------------------------------------------------------------------
# The same on this CPU: a tiny model timed here, independently of the predictor

SIZES = (16, 128)


def tiny_net():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 10))


def tiny_task():
    from types import SimpleNamespace

    def example_batch(n):
        return torch.randn(n, 256), torch.randint(0, 10, (n,))

    return SimpleNamespace(build=lambda ckpt: tiny_net(), example_batch=example_batch, train=[0], eval=[0],
                           loss=torch.nn.functional.cross_entropy)


def lenet_task():
    from lib.steptime.count import task_for

    return task_for(kc.read_config(kc.DEFCONFIG_DIR / "lenet5"))


CPU_MODELS = {"mlp": tiny_task, "lenet5": lenet_task}


def measured_steps(task, rounds: int = 30) -> dict[int, list[float]]:
    """CPU seconds of a real AdamW step (forward, backward, optimizer) per size in each of `rounds`, the
    sizes interleaved round by round (alternating which goes first), after a warm-up round. The process's CPU time (time.process_time; one
    torch thread), not the wall clock: other processes only ever add to a step's wall time, and more to a
    long step's than to a short one's. On this shared 2-core machine at load 6-8 the fastest wall time of
    the MLP's step at 128 was 2.4x its CPU time, at 16 1.0x, so wall times made the sizes disagree by
    the load, not by the step (the xfail this test was: 6.0 and 8.7 ms one run, 3.6 and 15.5 the next)."""
    from lib.step import make_optimizer

    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")  # AdamW, as the counts
    torch.manual_seed(0)
    model = task.build(False)
    model.train()
    optimizer = make_optimizer(config, model)
    batches = {b: task.example_batch(b) for b in SIZES}
    times: dict[int, list[float]] = {b: [] for b in SIZES}

    def step(b):
        x, y = batches[b]
        task.loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for round_ in range(rounds + 1):
        for b in SIZES if round_ % 2 else SIZES[::-1]:
            start = time.process_time()
            step(b)
            if round_:
                times[b].append(time.process_time() - start)
    return times


def step_ratio(times: dict[int, list[float]]) -> float:
    """The large size's step over the small one's: the median of the rounds' ratios, each of two steps taken
    back to back. CPU time still moves with the load here (a VM's stolen time, shared caches: the MLP's
    fastest step at 16 was 3.3, 3.9 and 4.9 ms in three runs a minute apart), and the fastest of each size
    came from different moments, so their ratio moved by 25%; a round's two steps share their moment."""
    small, large = SIZES
    return statistics.median(t1 / t0 for t0, t1 in zip(times[small], times[large]))


def cpu_model(task, cache_dir: Path) -> StepTimeModel:
    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")
    phases = {b: count_step(task, config, batch=b, precision="fp32", device_type="cpu",
                            gradient_checkpointing=False)[0] for b in (1, 2)}
    parameters = sum(p.numel() for p in task.build(False).parameters())
    counts = Counts(phases=phases, parameters=parameters, train_samples=1, eval_samples=1)
    return StepTimeModel(counts=counts, device=cpu_device(resolve_hardware(gpu="cpu"), cache_dir), precision="fp32")


def cpu_transfer(cache_dir: Path) -> dict[str, dict]:
    """Per CPU model: measured and predicted step seconds at SIZES, and the error calibrated at one size of
    the other, both ways (one factor, as lib.steptime.calibrate applies it)."""
    out = {}
    for name, make_task in CPU_MODELS.items():
        task = make_task()
        model = cpu_model(task, cache_dir)  # this CPU's figures measured afresh (about a second) the first time
        times = measured_steps(task)
        measured = {b: statistics.median(t) for b, t in times.items()}
        predicted = {b: model.seconds(b, 1) for b in SIZES}
        small, large = SIZES
        ratio = step_ratio(times)  # measured[large] / measured[small]
        up = predicted[large] / predicted[small] / ratio - 1  # calibrated at small, predicting large
        out[name] = {"measured": measured, "predicted": predicted, "ratio": ratio,
                     "errors": {(small, large): up, (large, small): 1 / (1 + up) - 1}}
    return out


@pytest.mark.xfail(strict=False, reason=(
    "not yet: measured in CPU time, paired round by round, the MLP carries from 16 to 128 within 4-15% and "
    "LeNet-5 within 10-21% (the model's LeNet-5 step is 4.0x from 16 to 128, measured 4.4-4.8x at load 8.5 on "
    "2 cores, 3.7-4.4x at load 6); the CPU figures themselves (device.measure_cpu) moved up to 2.6x between "
    "runs a minute apart on this machine, so a CPU plan still relies on measure.py's real timings"))
@pytest.mark.usefixtures("one_thread")
def test_cpu_calibration_at_one_micro_batch_carries_to_another(tmp_path):
    rows = cpu_transfer(tmp_path)
    assert all(abs(e) <= TRANSFER_TOLERANCE for row in rows.values() for e in row["errors"].values()), rows


def main() -> None:
    rows = uncalibrated_errors()
    print("uncalibrated (committed H100 step-time cases):")
    for case, predicted, err in rows:
        print(f"  {case['file']:<48} {case['model']:<10} {case['micro_batch']:>4} x {case['grad_accum']}  "
              f"measured {case['measured_ms']:8.2f} ms  then {case['predicted_then_ms']:8.2f} "
              f"({(case['predicted_then_ms'] - case['measured_ms']) / case['measured_ms']:+.0%})  "
              f"now {predicted:8.2f} ({err:+.1%})")
    before = [abs(c["predicted_then_ms"] - c["measured_ms"]) / c["measured_ms"] for c, _, _ in rows]
    after = [abs(e) for _, _, e in rows]
    print(f"  max {max(before):.1%} -> {max(after):.1%}, mean {statistics.mean(before):.1%} -> "
          f"{statistics.mean(after):.1%}")
    print("calibrated at one micro-batch (H100 pairs):")
    for what, at, other, err in transfer_errors():
        print(f"  {what:<40} at {at:>4} -> {other:>4}: {err:+.1%}")


if __name__ == "__main__":
    main()
