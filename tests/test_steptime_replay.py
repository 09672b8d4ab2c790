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
        check = json.loads(path.read_text())["checks"].get("step-time") or {}
        for model, case in sorted(check.get("figures", {}).get("cases", {}).items()):
            if "measured_ms" in case:
                cases.append({"file": path.name, "model": model, "micro_batch": case["micro_batch"],
                              "grad_accum": case["grad_accum"], "measured_ms": case["measured_ms"],
                              "predicted_then_ms": case["predicted_ms"]})
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
        predicted = h100_model(case["model"]).seconds(case["micro_batch"], case["grad_accum"]) * 1e3
        out.append((case, predicted, (predicted - case["measured_ms"]) / case["measured_ms"]))
    return out


def test_every_committed_h100_step_time_case_is_within_25_percent_uncalibrated():
    rows = uncalibrated_errors()
    assert len(rows) == 12 and {c["model"] for c, _, _ in rows} == {"gpt2-tiny", "resnet18", "gpt2"}
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
    median over its seven runs: every H100 JSON and diagnostics' compile-*.json; each call two steps).
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
    assert len(rates) == 7
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


def measured_steps(rounds: int = 30) -> dict[int, float]:
    """Seconds of a real AdamW step (forward, backward, optimizer) per size: the fastest of `rounds`, the sizes
    interleaved round by round so that a busy machine slows both alike, after a warm-up round. The fastest,
    as lib/steptime/measure.py takes: other processes only ever slow a step down (on this shared 2-core
    machine the median moved 2-4x with the load, the fastest far less)."""
    from lib.step import make_optimizer

    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")  # AdamW, as the counts
    model = tiny_net()
    optimizer = make_optimizer(config, model)
    batches = {b: tiny_task().example_batch(b) for b in SIZES}
    times: dict[int, list[float]] = {b: [] for b in SIZES}

    def step(b):
        x, y = batches[b]
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for round_ in range(rounds + 1):
        for b in SIZES if round_ % 2 else SIZES[::-1]:
            start = time.perf_counter()
            step(b)
            if round_:
                times[b].append(time.perf_counter() - start)
    return {b: min(t) for b, t in times.items()}


def cpu_model(cache_dir: Path) -> StepTimeModel:
    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")
    phases = {b: count_step(tiny_task(), config, batch=b, precision="fp32", device_type="cpu",
                            gradient_checkpointing=False)[0] for b in (1, 2)}
    counts = Counts(phases=phases, parameters=sum(p.numel() for p in tiny_net().parameters()), train_samples=1,
                    eval_samples=1)
    return StepTimeModel(counts=counts, device=cpu_device(resolve_hardware(gpu="cpu"), cache_dir), precision="fp32")


@pytest.mark.xfail(strict=False, reason=(
    "not yet: the CPU model's shape (measure_cpu's 768x768 matmul rate and tiny-add op cost) does not carry "
    "from 16 to 128 here: the fastest real steps took 6.0 and 8.7 ms, the model 4.6 and 12.8 ms (+92% / -48% "
    "calibrated at one, on a machine at load 8 on 2 cores); a CPU plan relies on measure.py's real timings"))
@pytest.mark.usefixtures("one_thread")
def test_cpu_calibration_at_one_micro_batch_carries_to_another(tmp_path):
    model = cpu_model(tmp_path)  # this CPU's figures measured afresh (about a second)
    measured = measured_steps()
    predicted = {b: model.seconds(b, 1) for b in SIZES}
    small, large = SIZES
    errors = {(at, other): predicted[other] * measured[at] / predicted[at] / measured[other] - 1
              for at, other in ((small, large), (large, small))}
    assert all(abs(e) <= TRANSFER_TOLERANCE for e in errors.values()), (errors, measured, predicted)


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
