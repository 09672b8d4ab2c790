"""Llama 3.2 1B at 8k context on one GPU: selective checkpointing, compile and float8 against the plan.

The checks before this one measure models of 124M parameters at most; the options large runs depend on
(per-op selective checkpointing, float8 matmuls through torchao, compile of a checkpointed model) change the
planned memory and step time of a model the size users grow into. Each case here is a short real run of
kfit's trainer on the llama3.2-1b defconfig (its 128,256-token head; the embedded text, whose ids all lie
below it, trains it: no download), context CONTEXT, micro-batch 1, bf16, the hyperparameters set by hand so
every case plans the same batch. For each: the plan's predicted peak against torch.cuda.max_memory_reserved
over the run, and over its training steps alone (read when its evaluation at the end begins), and its
predicted step (uncalibrated: every case plans with a fresh calibration, the memory
traces kept) against the trainer's measured `step_time` event.

It passes when every measured case is within MEMORY_TOLERANCE of its memory and TIME_TOLERANCE of its step.
The cases run in CASES' order, the most wanted first, until the budget ends.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from ..redact import shown
from .report import Context, Result, failed, passed, skipped

DEFCONFIG = "llama3.2-1b"
CONTEXT = 8192
MEMORY_TOLERANCE = 0.10
TIME_TOLERANCE = 0.20  # uncalibrated: the datasheet roofline (lib/steptime/device.py), nothing measured here


@dataclass(frozen=True)
class Case:
    name: str
    compile: bool = False
    checkpointing: str | None = None  # ACTIVATION_CHECKPOINT_<this>; None: off
    float8: str | None = None  # FLOAT8_<this>; None: off

    def assignments(self) -> dict:
        settings = {"HYPER_PARAM_MANUAL": True, "BATCH_SIZE": 1, "GRADIENT_ACCUMULATION": 1,
                    "PRECISION_BF16": True, "LLAMA_BLOCK_SIZE": CONTEXT, "COMPILE_MANUAL": True,
                    "COMPILE_MODEL": self.compile, "GRADIENT_CHECKPOINTING": self.checkpointing is not None,
                    "PROBE_NEVER": True, "EVAL_INTERVAL": 1000000}
        if self.checkpointing:
            settings[f"ACTIVATION_CHECKPOINT_{self.checkpointing}"] = True
        settings[f"FLOAT8_{self.float8 or 'OFF'}"] = True
        return settings


# float8's two recipes beside their bf16 baseline first (a ratio needs all three from one machine), then eager
CASES = (Case("compiled selective-op", compile=True, checkpointing="SELECTIVE_OP"),
         Case("compiled selective-op float8", compile=True, checkpointing="SELECTIVE_OP", float8="TENSORWISE"),
         Case("compiled selective-op float8 rowwise", compile=True, checkpointing="SELECTIVE_OP", float8="ROWWISE"),
         Case("selective-op", checkpointing="SELECTIVE_OP"),
         Case("full", checkpointing="FULL"),
         Case("none"))
QUICK = 1


def error(predicted: float | None, measured: float | None) -> float | None:
    if not predicted or not measured:
        return None
    return round((predicted - measured) / measured, 4)


@contextlib.contextmanager
def peaks_before_evaluation(ctx: Context):
    """The peaks (reserved, allocated) when the run's first evaluation begins, in the dict it yields: what
    the training steps reached, apart from the evaluation's own allocations after them (the H200's first
    run of this check measured the whole run's and could not tell them apart)."""
    from ..trainer.evaluation import Evaluator

    seen: dict = {}
    original = Evaluator.__call__

    def first(self, *args, **kwargs):
        if "reserved" not in seen:
            seen["reserved"], seen["allocated"] = ctx.cuda.peaks()
        return original(self, *args, **kwargs)

    Evaluator.__call__ = first
    try:
        yield seen
    finally:
        Evaluator.__call__ = original


def run_case(ctx: Context, case: Case) -> dict:
    """One short run of the trainer: its plan's predictions beside the measured peak (of its steps, and of
    the whole run with its evaluation at the end) and step."""
    import torch

    from .budget import make_config
    from .steptime_check import timed_run
    from ..hardware import resolve_hardware

    config = make_config(ctx, DEFCONFIG, "scale-" + case.name.replace(" ", "-"), case.assignments())
    ctx.cuda.reset_peaks()
    try:
        with peaks_before_evaluation(ctx) as steps:
            config, plan, event = timed_run(config, resolve_hardware())
        reserved, allocated = ctx.cuda.peaks()
    finally:
        if case.compile:
            torch.compiler.reset()  # dynamo's cache holds the compiled model: the next case's memory
        ctx.cuda.release()
    out = {"micro_batch": plan.micro_batch, "context": CONTEXT, "compiled": plan.compile,
           "checkpointing": case.checkpointing if plan.gradient_checkpointing else None,
           "float8": plan.float8, "steps": config.max_steps,
           "predicted_peak_mib": round(plan.predicted_peak_bytes / 2**20, 1),
           "measured_reserved_mib": round(reserved / 2**20, 1), "measured_allocated_mib": round(allocated / 2**20, 1),
           "memory_error": error(plan.predicted_peak_bytes, reserved),
           # the whole run's peak may be its evaluation's: the plan predicts that apart
           "predicted_eval_peak_mib": plan.eval_predicted_peak_bytes and round(plan.eval_predicted_peak_bytes / 2**20, 1),
           "run_memory_error": error(max(plan.predicted_peak_bytes, plan.eval_predicted_peak_bytes or 0), reserved),
           "steps_reserved_mib": steps.get("reserved") and round(steps["reserved"] / 2**20, 1),
           "steps_allocated_mib": steps.get("allocated") and round(steps["allocated"] / 2**20, 1),
           "steps_memory_error": steps.get("reserved") and error(plan.predicted_peak_bytes, steps["reserved"]),
           "predicted_ms": plan.predicted_step_seconds and round(plan.predicted_step_seconds * 1e3, 2)}
    if event:
        seconds = event["measured_step_seconds"]
        out.update(measured_ms=round(seconds * 1e3, 2), time_error=error(plan.predicted_step_seconds, seconds),
                   tokens_per_s=round(plan.micro_batch * plan.grad_accum * CONTEXT / seconds, 1),
                   predicted_mfu=plan.predicted_mfu and round(plan.predicted_mfu, 4))
    return out


def judge(cases: dict[str, dict]) -> Result:
    measured = {n: c for n, c in cases.items() if "memory_error" in c}
    if not measured:
        return failed("no case ran: " + "; ".join(f"{n}: {c.get('not_run') or c.get('error')}"
                                                 for n, c in cases.items()), cases=cases)
    problems = []
    parts = []
    for name, c in measured.items():
        part = (f"{name} {c['measured_reserved_mib'] / 1024:.1f} GiB ({c['memory_error']:+.1%})")
        if c.get("time_error") is not None:
            part += f" {c['measured_ms']:.0f} ms ({c['time_error']:+.1%})"
            if abs(c["time_error"]) > TIME_TOLERANCE:
                problems.append(f"{name}'s step off by {c['time_error']:+.0%}")
        else:
            problems.append(f"{name} timed no step")
        if c["memory_error"] is None or abs(c["memory_error"]) > MEMORY_TOLERANCE:
            problems.append(f"{name}'s memory off by {c['memory_error']:+.0%}")
        parts.append(part)
    problems += [f"{n}: {c['error']}" for n, c in cases.items() if "error" in c]
    text = f"{DEFCONFIG} at {CONTEXT} tokens, bf16, micro-batch 1: " + ", ".join(parts)
    figures = {"cases": cases, "memory_tolerance": MEMORY_TOLERANCE, "time_tolerance": TIME_TOLERANCE}
    if problems:
        return failed(f"{text}; " + "; ".join(problems), **figures)
    return passed(text, **figures)


def check_scale(ctx: Context, run=run_case) -> Result:
    """(run: the tests' stand-in for one case's real run)"""
    if ctx.device != "cuda":
        return skipped("DEVICE=cpu: a 1B model at 8k context is a GPU's case (make plan predicts it here)")
    from ..memory import default_cache_dir
    from .steptime_check import fresh_calibration

    cases: dict[str, dict] = {}
    for case in CASES[:QUICK] if ctx.quick else CASES:
        if ctx.out_of_time():
            cases[case.name] = {"not_run": "time budget"}
            continue
        with fresh_calibration(default_cache_dir()):  # each case's step predicted uncalibrated
            try:
                cases[case.name] = run(ctx, case)
            except Exception as err:  # noqa: BLE001 - one case's failure is its row; the others run
                cases[case.name] = {"error": f"{type(err).__name__}: {shown(' '.join(str(err).split()), 300)}"}
        ctx.log(f"  scale {case.name:<30} {json.dumps(cases[case.name])}")
    return judge(cases)
