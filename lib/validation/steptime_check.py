"""Step time: lib.steptime's prediction against the trainer's measured steps, before and after calibration.

For each case the plan is resolved with a fresh step-time calibration (nothing calibrated on this machine
yet: the roofline from the catalog's datasheet peaks on a GPU, the CPU micro-benchmark on a CPU), then the
trainer runs a short real run. Its `step_time` event in metrics.jsonl holds the median of its timed steps
and the plan's prediction; the trainer calibrates with them. A second run, planned again (now
calibrated) and measured the same way, shows the calibrated error. The check passes when every
calibrated error is within CALIBRATED_TOLERANCE; the uncalibrated errors are reported as found, so the
datasheet efficiencies in lib/steptime/device.py can be corrected from them.

Its time (90 s budgeted, 96-168 s taken on an H100 in every run of 2026-11-23) went mostly to what
surrounds the timed steps, not to them: the cache directory started empty, so each plan traced its model's
memory and counted its FLOPs again (GPT-2 124M: 33 s on a 2-core CPU); PROBE_AUTO then probed each model
on the device before its first run, compiling a dynamic-batch copy of it; compile AUTO compiled the model
again in each of the two runs (GPT-2 124M: 23-29 s the first time); and GPT-2 124M's steps of 512
sequences (0.7 s each) ran 14 times per run, with an evaluation at each epoch's end (EVAL_INTERVAL 0), and
its 409 training windows make an epoch shorter than one step. Now the fresh cache keeps the memory traces and counted FLOPs already made
(`fresh_calibration`: calibration, this CPU's measured figures and probe results start empty), the runs do
not probe (PROBE_NEVER: the probe is not what is checked here), run eager (the compiled prediction is
the mfu check's, against a measured compiled GPT-2), evaluate once at the end, and GPT-2 124M trains
an effective batch of 128, so its timed window is the trainer's 3 s like the others'.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
from pathlib import Path

from .budget import environ, make_config, run_training
from .report import Context, Result, failed, passed, skipped

CASES = {"cuda": (("gpt2-tiny", {}), ("resnet18", {}), ("gpt2", {"TARGET_EFFECTIVE_BATCH": 128})),
         "cpu": (("lenet5", {}), ("gpt2-tiny", {"GPT2_BLOCK_SIZE": 64}))}
# every case: eager, no probe, one evaluation at the end (the module's docstring says why)
SETTINGS = {"COMPILE_MANUAL": True, "COMPILE_MODEL": False, "PROBE_NEVER": True, "EVAL_INTERVAL": 1000000}
KEPT = ("memory", "steptime/counts-*.json")  # of the usual cache: what no measurement of this machine made
QUICK = 1  # cases in quick mode
STEPS = 14  # the trainer times steps 3-12 (4-13 compiled); one more so it has them all
MAX_STEPS = 300  # a run of steps the plan predicts short is made long enough for the trainer's 3 s window
# A CPU shares its cores with whatever else runs: in make check on 2 cores (the other test worker in FSDP and
# torchrun runs) two identical LeNet-5 runs measured 148 and 86 ms a step (+73%), so the CPU check proves the
# mechanics (calibrate, then predict the repeat) and only a GPU holds the prediction to a tight bound.
CALIBRATED_TOLERANCE = {"cuda": 0.15, "cpu": 1.0}


def step_time_event(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next((e for e in events if e.get("event") == "step_time"), None)


def error(predicted: float | None, measured: float | None) -> float | None:
    if not predicted or not measured:
        return None
    return round((predicted - measured) / measured, 4)


def steps_for(plan) -> int:
    """Steps of a run whose timed ones cover the trainer's window (lib.trainer.timing: at least STEPS steps
    and MIN_SECONDS of them, after the warm-up), by the plan's predicted step time; at most MAX_STEPS.
    LeNet-5's 14 steps on a CPU were under half a second, and a loaded machine moved them 2x."""
    from ..trainer import timing

    predicted = plan.predicted_step_seconds
    timed = max(timing.STEPS, math.ceil(timing.MIN_SECONDS / predicted)) if predicted else timing.STEPS
    return max(STEPS, min(MAX_STEPS, timing.SKIP + 1 + timed + 1))


@contextlib.contextmanager
def fresh_calibration(usual: Path):
    """KFIT_CACHE_DIR in a temporary directory holding what of `usual` (kfit's cache) no measurement of
    this machine made: the memory traces and the counted FLOPs (KEPT)."""
    with tempfile.TemporaryDirectory(prefix="kfit-steptime-") as tmp:
        for pattern in KEPT:
            for path in usual.glob(pattern):
                target = Path(tmp) / path.relative_to(usual)
                target.parent.mkdir(parents=True, exist_ok=True)
                if path.is_dir() and not path.is_symlink():
                    shutil.copytree(path, target, symlinks=True)
                elif path.is_file() and not path.is_symlink():
                    shutil.copyfile(path, target)
        with environ(KFIT_CACHE_DIR=tmp):
            yield Path(tmp)


def timed_run(config, hardware):
    """(config run, plan, the trainer's step_time event) of a short real run of `config`, its MAX_STEPS set
    so the trainer's timed window is covered (`steps_for`)."""
    from .. import config as kconfig
    from ..planning import make_plan

    plan = make_plan(config, hardware).plan
    steps = steps_for(plan)
    if steps != config.max_steps:
        config = kconfig.derive(config, {"MAX_STEPS": steps})
        plan = make_plan(config, hardware).plan
    result = run_training(config, plan, hardware)
    return config, plan, step_time_event(result.run_dir)


def run_case(ctx: Context, name: str, assignments: dict, attempt: str):
    """(plan, the trainer's step_time event) of one short real run."""
    from ..hardware import resolve_hardware

    config = make_config(ctx, name, f"steptime-{name}-{attempt}", {"MAX_STEPS": STEPS, **SETTINGS, **assignments})
    return timed_run(config, resolve_hardware())[1:]


def judge(device: str, cases: dict[str, dict]) -> Result:
    measured = {n: c for n, c in cases.items() if c.get("calibrated_error") is not None}
    if not measured:
        return failed("no case reported a step time", cases=cases)
    worst = max(abs(c["calibrated_error"]) for c in measured.values())
    raw = [abs(c["uncalibrated_error"]) for c in measured.values() if c.get("uncalibrated_error") is not None]
    text = ", ".join(f"{n} {c['measured_ms']:.1f} ms: {c['uncalibrated_error']:+.0%} uncalibrated, "
                     f"{c['calibrated_error']:+.0%} calibrated" for n, c in measured.items())
    figures = {"cases": cases, "max_calibrated_error": worst, "max_uncalibrated_error": max(raw, default=None),
               "tolerance": CALIBRATED_TOLERANCE[device]}
    if worst <= CALIBRATED_TOLERANCE[device]:
        return passed(text, **figures)
    return failed(f"{text}: calibrated error above {CALIBRATED_TOLERANCE[device]:.0%}", **figures)


def check_step_time(ctx: Context) -> Result:
    cases: dict[str, dict] = {}
    chosen = CASES[ctx.device][:QUICK] if ctx.quick else CASES[ctx.device]
    from ..memory import default_cache_dir

    with fresh_calibration(default_cache_dir()):  # nothing calibrated here yet
        for name, assignments in chosen:
            if ctx.out_of_time():
                cases[name] = {"not_run": "time budget"}
                continue
            plan, first = run_case(ctx, name, assignments, "uncalibrated")
            if first is None:
                cases[name] = {"not_run": "the run timed no steps", "micro_batch": plan.micro_batch}
                continue
            again, second = run_case(ctx, name, assignments, "calibrated")
            case = {"micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum,
                    "measured_ms": round(first["measured_step_seconds"] * 1e3, 2),
                    "predicted_ms": first["predicted_step_seconds"] and round(first["predicted_step_seconds"] * 1e3, 2),
                    "uncalibrated_error": error(first["predicted_step_seconds"], first["measured_step_seconds"]),
                    "source": plan.reasons.get("step_time")}
            if second is not None and again.micro_batch == second.get("micro_batch"):
                case.update(calibrated_ms=round(second["predicted_step_seconds"] * 1e3, 2),
                            measured_again_ms=round(second["measured_step_seconds"] * 1e3, 2),
                            calibrated_error=error(second["predicted_step_seconds"],
                                                   second["measured_step_seconds"]))
            cases[name] = case
            ctx.log(f"  step-time {name:<10} {json.dumps(case)}")
            if ctx.cuda is not None:
                ctx.cuda.release()
    if not any("measured_ms" in c for c in cases.values()):
        return skipped("no case run: " + "; ".join(f"{n}: {c.get('not_run')}" for n, c in cases.items()))
    return judge(ctx.device, cases)
