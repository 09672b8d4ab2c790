"""Step time by replay: the committed H100 measurements (docs/validation/), put through lib.steptime's
predictor (the same on this CPU, timed here, is make bench-steptime's).

Uncalibrated (datasheet peaks x the family's per-op-class efficiencies, lib/steptime/device.py): every
step-time case of every committed H100 run within UNCALIBRATED_TOLERANCE. Calibrated on one micro-batch
(the model's single factor, as lib.steptime.calibrate applies it), the other micro-batches of the same
model and harness within TRANSFER_TOLERANCE: the H100 pairs the diagnostics measured. `python -m tests.test_steptime_replay` prints the table docs/time.md quotes.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

from lib import config as kc
from lib.hardware import resolve_hardware
from lib.steptime import StepTimeModel, calibrated, gpu_device, step_time_model
from lib.validation.report import in_run_order

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
    for path in in_run_order(VALIDATION.glob("nvidia-h100-*.json")):
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
    assert len(rows) == 21 and {c["model"] for c, _, _ in rows} == {"gpt2-tiny", "resnet18", "gpt2"}
    worst = max(rows, key=lambda r: abs(r[2]))
    assert abs(worst[2]) <= UNCALIBRATED_TOLERANCE, worst


SWEEP = VALIDATION / "diagnostics-2026-11-26" / "batch_sweep.jsonl"  # scripts/diagnostics/batch_sweep.py's
SWEEP_LOSS = SWEEP.with_name("batch_sweep_loss.jsonl")  # ... SWEEP=loss: the loss compiled with the model


def _sweep() -> list[dict]:
    """The batch sweeps' steps as kfit runs them, each with its file's name. Compiled, kfit compiles the loss
    with the model (lib/step.py forward_loss): the first sweep's compiled GPT-2 124M steps, its model compiled
    alone, are left out; GPT-2-tiny's and ResNet-18's are kept, their losses over 256 and 10 classes a small
    part of the step."""
    rows = []
    for path in (SWEEP, SWEEP_LOSS):
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else None
            if r and (not r["compiled"] or r.get("loss_compiled", r["model"] != "gpt2-50k")):
                rows.append({**r, "file": path.name})
    return rows


@lru_cache(maxsize=None)
def vocab_model(rows: int, compiled: bool, unaligned_as_aligned: bool = False) -> StepTimeModel:
    """GPT-2 124M with a head of `rows` rows, bf16, as a bare loop runs it (no trainer around the step).
    `unaligned_as_aligned`: the head's matmuls at the aligned ones' share, as before they were counted apart."""
    from lib.validation import vocab

    config = vocab.make_config(Path(tempfile.mkdtemp()), vocab.MODEL, vocab_size=rows)
    model = step_time_model(config, resolve_hardware(gpu="h100"), device_type="cuda", precision="bf16",
                            compile=compiled)
    device = dataclasses.replace(model.device, step_overhead_s=0.0)
    if unaligned_as_aligned:
        device = dataclasses.replace(device, unaligned_efficiency=1.0, unaligned_compiled_efficiency=1.0)
    return dataclasses.replace(model, device=device)


def vocab_cases(unaligned_as_aligned: bool = False) -> list[tuple[str, int, int, bool, float, float]]:
    """(source, head rows, micro-batch, compiled, measured ms, predicted ms) of GPT-2 124M on its 50,257-token
    vocabulary, bf16, bare loops: every committed compile check's eager and compiled steps at micro-batch 16
    (two steps a call, so its samples/s is a step's), and the batch sweep's steps at 4-16, with the head as it
    is and padded to 50,304 rows."""
    from lib.validation import vocab

    measured = []
    for path in in_run_order(VALIDATION.glob("nvidia-h100-*.json")):
        case = json.loads(path.read_text())["checks"].get("compile", {}).get("figures", {}).get("models", {}).get(
            vocab.MODEL)
        if case and case.get("loss_compiled"):
            rate = case["compiled"]["samples_per_s"]
            measured.append((path.name, vocab.GPT2_VOCAB, case["batch"], True, case["batch"] / rate * 1e3))
        if case:
            rate = case["eager"]["samples_per_s"]
            measured.append((path.name, vocab.GPT2_VOCAB, case["batch"], False, case["batch"] / rate * 1e3))
    measured += [(r["file"], r["rows"], r["micro_batch"], r["compiled"], r["step_ms"]) for r in _sweep()
                 if r["model"] == vocab.MODEL]
    return [(name, rows, batch, compiled, ms,
             vocab_model(rows, compiled, unaligned_as_aligned).seconds(batch, 1) * 1e3)
            for name, rows, batch, compiled, ms in measured]


@pytest.mark.slow  # GPT-2 124M's step counted on fake tensors at two batches, two heads: about two minutes cold
def test_the_50257_token_head_is_timed_at_its_unaligned_share():
    """The head's matmuls (a 50,257-wide dimension, not a whole number of 16 bytes) run at their own share of
    the bf16 peak (lib/steptime/device.py), set by the same steps with the head padded to 50,304 rows: every
    committed GPT-2 124M step on that vocabulary, eager and compiled, padded or not, within the uncalibrated
    tolerance, and the padding's measured gain within a tenth of the predicted one, eager and compiled."""
    rows = vocab_cases()
    assert len(rows) == 13
    for name, head, batch, compiled, measured, predicted in rows:
        assert abs(predicted / measured - 1) <= UNCALIBRATED_TOLERANCE, (name, head, batch, compiled, measured, predicted)
    by = {(name, head, batch, compiled): (m, p) for name, head, batch, compiled, m, p in rows
          if name in (SWEEP.name, SWEEP_LOSS.name)}
    for (name, head, batch, compiled), (m, p) in by.items():
        if head != 50257:
            continue
        padded_m, padded_p = by[(name, 50304, batch, compiled)]
        assert (p / padded_p) / (m / padded_m) == pytest.approx(1, abs=0.10), (batch, compiled, m / padded_m, p / padded_p)


# --------------------------------------------------------------------------
# Calibrated at one micro-batch, predicted at another: the H100 pairs


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (DIAGNOSTICS / name).read_text().splitlines() if line.strip()]


def h100_pairs() -> list[tuple[str, StepTimeModel, dict[int, float]]]:
    """(what, the bare loop's model, micro-batch -> measured ms) of one harness each, from the committed files.

    phase_times.jsonl (2026-11-23): forward+backward of GPT-2-tiny at 64 and 8, eager and compiled (median of
    30, synced; the model's step is then its forward and backward alone). ResNet-18 eager steps: 512 from
    phase_times.jsonl, 256 from the compile check's eager throughput (the median over its ten runs: every
    H100 JSON and diagnostics' compile-*.json; each call two steps). The batch sweep (2026-11-26): whole
    steps of GPT-2-tiny, ResNet-18 and GPT-2 124M on 50,257 tokens (head padded or not) at 2-6 micro-batches.
    """
    phases = {line["case"]: line for line in _jsonl("phase_times.jsonl")}
    pairs = []
    for compiled in (False, True):
        key = "compiled" if compiled else "eager"
        bare = h100_model("gpt2-tiny", compiled, trainer=False)
        pairs.append((f"gpt2-tiny {key} forward+backward", dataclasses.replace(bare, measured_optimizer={1: 0.0}),
                      {b: phases[f"gpt2-tiny bf16 {b}"][key]["fwd_bwd_ms"] for b in (64, 8)}))
    rates = []
    for path in [*VALIDATION.glob("nvidia-h100-*.json"), *DIAGNOSTICS.glob("compile-*.json")]:
        model = json.loads(path.read_text())["checks"].get("compile", {}).get("figures", {}).get("models", {})
        if "resnet18" in model:
            assert model["resnet18"]["batch"] == 256
            rates.append(model["resnet18"]["eager"]["samples_per_s"])
    assert len(rates) == 10
    pairs.append(("resnet18 eager step", h100_model("resnet18", False, trainer=False),
                  {512: phases["resnet18 bf16 512"]["eager"]["step_ms"], 256: 256 / statistics.median(rates) * 1e3}))
    series: dict[tuple, dict[int, float]] = {}
    for r in _sweep():
        series.setdefault((r["file"], r["model"], r["rows"], r["compiled"]), {})[r["micro_batch"]] = r["step_ms"]
    for (file, name, rows, compiled), measured in series.items():
        if len(measured) > 1:
            pairs.append((_label(name, rows, compiled, "sweep" if file == SWEEP.name else "loss sweep"),
                          _sweep_model(name, rows, compiled), measured))
    for path in sorted(VALIDATION.glob(f"diagnostics-*/{PAIRED_SWEEP}")):
        for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip()):
            if "H100" in r["device"]:
                pairs.append((_label(r["model"], r["rows"], r["compiled"], f"paired sweep, {path.parent.name}"),
                              _sweep_model(r["model"], r["rows"], r["compiled"]), paired_steps(r["rounds_step_ms"])))
    return pairs


PAIRED_SWEEP = "batch_sweep_paired.jsonl"  # batch_sweep.py's SWEEP=paired: a series' sizes timed in turn per round


def paired_steps(rounds_step_ms: dict[str, list[float]]) -> dict[int, float]:
    """A paired sweep's series as one step per micro-batch: the largest size at its median round, the others
    at the median of their rounds' ratios to it (a round's sizes were timed in turn: they share the moment,
    which a host-bound step's rounds did not, 30-50% apart)."""
    rounds = {int(b): ms for b, ms in rounds_step_ms.items()}
    anchor = rounds[max(rounds)]
    level = statistics.median(anchor)
    return {b: level * statistics.median(t / a for t, a in zip(ms, anchor)) for b, ms in rounds.items()}


def _sweep_model(name: str, rows: int | None, compiled: bool) -> StepTimeModel:
    return vocab_model(rows, compiled) if rows else h100_model(name, compiled, trainer=False)


def _label(name: str, rows: int | None, compiled: bool, source: str) -> str:
    return f"{name}{f' {rows}' if rows else ''} {'compiled' if compiled else 'eager'} step ({source})"


def test_a_paired_sweeps_sizes_are_the_median_of_their_rounds_ratios_to_the_largest():
    # the host slows by a third in round two: both sizes with it; one slow step at 8 in round three
    rounds = {"8": [10.0, 13.3, 14.0, 10.0, 10.1], "32": [12.0, 16.0, 12.0, 12.0, 12.2]}
    steps = paired_steps(rounds)
    assert steps[32] == 12.0 and steps[8] == pytest.approx(12.0 * 10.0 / 12.0, rel=0.01)
    # timed one size after the other, a size's median is its own moment's: 10.1 / 12.0
    assert statistics.median(rounds["8"]) / statistics.median(rounds["32"]) == pytest.approx(0.842, abs=1e-3)


def transfer_errors(bound_aware: bool = True) -> list[tuple[str, int, int, float]]:
    """(case, calibrated at, predicted at, error) both ways for every H100 pair. `bound_aware`: calibrated as
    lib.steptime.calibrated does; else one factor over the whole step, as before."""
    out = []
    for what, model, measured in h100_pairs():
        for at in measured:
            if bound_aware:
                fitted = calibrated(model, measured[at] / 1e3, at, 1)
            else:
                fitted = dataclasses.replace(model, correction=measured[at] / 1e3 / model.seconds(at, 1))
            for other in measured:
                if other != at:
                    guess = fitted.seconds(other, 1) * 1e3
                    out.append((what, at, other, (guess - measured[other]) / measured[other]))
    return out


def test_h100_calibration_at_one_micro_batch_carries_to_another():
    """The diagnostics' pairs of 2026-11-23 within TRANSFER_TOLERANCE; over every pair, the sweep's too,
    calibrating the bound that limits the step does better than one factor over the whole step (max and
    mean), and no worse on any series by more than three points (near the corner, where the host and
    device times overlap, steptime.model.OVERLAP_P, the two calibrations differ by a little either way).
    With that overlap, 79 of the 96 within 10% (71 with the plain max). The sweep's worst is not within 10%
    (docs/time.md). A paired sweep committed (batch_sweep.py SWEEP=paired) adds its series to `rows`: then
    the counts here are to be set again, from what its transfers show."""
    rows, before = transfer_errors(), transfer_errors(bound_aware=False)
    first = [r for r in rows if "sweep" not in r[0]]  # the diagnostics' pairs of 2026-11-23
    assert len(first) == 6 and len(rows) == 96
    worst = max(first, key=lambda r: abs(r[3]))
    assert abs(worst[3]) <= TRANSFER_TOLERANCE, worst
    now, then = [abs(r[3]) for r in rows], [abs(r[3]) for r in before]
    assert max(now) < max(then) and statistics.mean(now) < statistics.mean(then)
    for case in {r[0] for r in rows}:
        assert max(abs(r[3]) for r in rows if r[0] == case) <= max(abs(r[3]) for r in before if r[0] == case) + 0.03
    assert sum(e <= TRANSFER_TOLERANCE for e in now) >= 79 and statistics.mean(now) < 0.075


# --------------------------------------------------------------------------
# The same on this CPU: a tiny model timed here, independently of the predictor

# The same on this CPU is a measurement, not a test: make bench-steptime (lib/validation/steptime_transfer.py)
# times real steps independently of the predictor; beside other work its figures move by more than the 10%
# goal (docs/time.md), so the suite checks its mechanics (tests/test_bench_steptime.py), not its figures.


def mfu_plan_line() -> str:
    """What `make plan` predicts for the mfu check's config (lib/validation/mfu_check.py) on an H100."""
    from lib.hyperparams import ModelDescription, resolve
    from lib.validation import mfu_check, vocab

    config = vocab.make_config(Path(tempfile.mkdtemp()), "mfu", {
        "HYPER_PARAM_MANUAL": True, "BATCH_SIZE": mfu_check.BATCH, "GRADIENT_ACCUMULATION": 1, "COMPILE_MANUAL": True,
        "COMPILE_MODEL": True, "PRECISION_BF16": True, "DEVICE_CUDA": True})
    plan = resolve(config, resolve_hardware(gpu="h100"), ModelDescription.from_config(config))
    return (f"{plan.predicted_samples_per_second:.1f} samples/s, predicted MFU {plan.predicted_mfu:.1%} "
            f"(trainer included)")


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
    print("calibrated at one micro-batch (H100 pairs): one factor over the whole step, and on its bound:")
    for (what, at, other, before), (*_, err) in zip(transfer_errors(False), transfer_errors()):
        print(f"  {what:<44} at {at:>4} -> {other:>4}: {before:+7.1%}  {err:+7.1%}")
    for name, rows in (("one factor", transfer_errors(False)), ("on its bound", transfer_errors())):
        errors = [abs(r[3]) for r in rows]
        print(f"  {name}: max {max(errors):.1%}, mean {statistics.mean(errors):.1%}, within 10%: "
              f"{sum(e <= TRANSFER_TOLERANCE for e in errors)} of {len(errors)}")
    print("GPT-2 124M on 50,257 tokens (head as is, or padded to 50,304 rows), bf16, bare loops:")
    for (name, head, batch, compiled, measured, before), (*_, now) in zip(vocab_cases(True), vocab_cases()):
        print(f"  {name:<42} {head:>6} {batch:>3} {'compiled' if compiled else 'eager':<9} measured {measured:7.2f} ms"
              f"  head as aligned {before:7.2f} ({(before - measured) / measured:+.1%})  now {now:7.2f} "
              f"({(now - measured) / measured:+.1%})")
    print("the mfu check's plan (GPT-2 124M, 50,257 tokens, bf16, compiled, micro-batch 16) on an H100:")
    print(f"  {mfu_plan_line()}")


if __name__ == "__main__":
    main()
