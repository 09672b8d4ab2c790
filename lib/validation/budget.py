"""Planning under a squeezed free memory, and recovering from a real out-of-memory.

squeezed-budget: something else holds all but a chosen amount of memory. CUDA:
a tensor in this process holds everything free but SQUEEZE_FREE_BYTES, and
kfit plans GPT-2 124M (bf16) for the free memory detect() then sees. CPU: the
profile's RAM available is set to what micro-batch SQUEEZE_CPU_BATCH of LeNet-5
needs over the memory profile (what FREE_GB= does for a GPU). It trains STEPS
steps; it passes with no out-of-memory and the measured peak (CUDA: max
reserved less the held bytes; CPU: the profiler's peak of a step at the planned
micro-batch) within the plan's budget.

oom-recovery: a micro-batch beyond memory. CUDA: micro-batch OOM_MICRO of GPT-2
124M (fp32, TF32 off) while a hold leaves memory halfway between the predicted
peaks of OOM_MICRO / 2 and OOM_MICRO, a real CUDA out-of-memory; CPU: the
injector (KFIT_INJECT_OOM, lib.oom). It passes when training halved the
micro-batch, kept the effective batch, and ended with the weights of an
uninterrupted run within WEIGHT_ATOL. Both runs use SGD: AdamW divides each
gradient by its own running scale, so a parameter whose gradient is rounding
noise moves by the full learning rate either way; on an H100 two identical
AdamW runs (GPT-2, fp32, 20 steps) ended 1.8e-3 apart, two SGD runs 7.5e-9
apart, and SGD at 8 x 2 against 4 x 4 also 7.5e-9.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from pathlib import Path

import torch

from .. import config as kconfig
from ..memory import MemoryPredictor

from .measure import measure_cpu
from .report import Context, Result, failed, passed
from ..env import environ as process_environ
from ..units import batch_split

STEPS = 20
GiB, MiB = 2**30, 2**20
SQUEEZE_FREE_BYTES = 5 * GiB  # GPT-2 124M bf16 at context 1024: a budget of about 4 sequences
SQUEEZE_CPU_BATCH = 12
OOM_MICRO, OOM_ACCUM = {"cuda": 8, "cpu": 16}, 2
INJECTED_STEPS = "3,7"
WEIGHT_ATOL, WEIGHT_RTOL = 1e-4, 1e-4
COMMON = {"MAX_STEPS": STEPS, "EPOCHS": 1000, "MONITOR": False, "DATALOADER_WORKERS_MANUAL": True,
          "DATALOADER_WORKERS": 0, "LOG_INTERVAL": 5}


def make_config(ctx: Context, base: str, name: str, assignments: dict) -> kconfig.Config:
    config = kconfig.make_defconfig(base, out=ctx.workdir / f"{name}.config")
    device = "DEVICE_CUDA" if ctx.device == "cuda" else "DEVICE_CPU"
    return kconfig.derive(config, {**COMMON, device: True, "OUTPUT_DIR": str(ctx.workdir / "runs"),
                                   "RUN_NAME": name, **assignments})


def oom_events(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line.get("event") == "oom_recovery"]


def run_training(config, plan, hardware):
    from ..trainer import train

    lines: list[str] = []
    return train(config, plan, hardware, log=lines.append)


@contextlib.contextmanager
def environ(**values: str):
    saved = {k: process_environ().get(k) for k in values}
    process_environ().update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                process_environ().pop(k, None)
            else:
                process_environ()[k] = v


# --------------------------------------------------------------------------
# squeezed-budget


def judge_squeeze(*, steps: int, events: list[dict], peak: int, plan, free: int, held: int) -> Result:
    share = plan.target_effective_batch // plan.world_size if plan.target_effective_batch else None
    split = batch_split(plan.effective_batch, plan.micro_batch, plan.world_size)
    figures = {"free_bytes": free, "held_bytes": held, "budget_bytes": plan.budget_bytes,
               "micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum, "last_micro_batch": split.last_micro_batch,
               "effective_batch": plan.effective_batch,
               "predicted_peak_bytes": plan.predicted_peak_bytes, "measured_peak_bytes": peak, "steps": steps,
               "oom_events": len(events)}
    text = (f"{free / MiB:.1f} MiB free -> budget {plan.budget_bytes / MiB:.1f} MiB -> micro-batches "
            f"{split.text()}; {steps} steps, peak {peak / MiB:.1f} MiB "
            f"({peak / plan.budget_bytes:.0%} of the budget, predicted {plan.predicted_peak_bytes / MiB:.1f})")
    problems = []
    if steps < STEPS:
        problems.append(f"trained {steps} of {STEPS} steps")
    if events:
        problems.append(f"ran out of memory {len(events)} time(s)")
    if peak > plan.budget_bytes:
        problems.append("the peak is above the budget")
    if share is not None and plan.micro_batch >= share:
        problems.append("the squeeze did not limit the micro-batch (set a smaller free amount)")
    return failed(f"{text}; " + "; ".join(problems), **figures) if problems else passed(text, **figures)


def check_squeezed(ctx: Context, predictor: MemoryPredictor | None = None) -> Result:
    from ..hardware import resolve_hardware
    from ..planning import make_plan

    held = 0
    if ctx.device == "cuda":
        config = make_config(ctx, "gpt2", "squeezed", {"TARGET_EFFECTIVE_BATCH": 32, "COMPILE_MANUAL": True,
                                                       "COMPILE_MODEL": False})
        held = ctx.cuda.hold(SQUEEZE_FREE_BYTES)
        free = ctx.cuda.free_and_total()[0]
        hardware = resolve_hardware()  # detect(): what this process now sees free
    else:
        config = make_config(ctx, "lenet5", "squeezed", {"TARGET_EFFECTIVE_BATCH": 128})
        need = (predictor or MemoryPredictor()).predict(config, batch=SQUEEZE_CPU_BATCH, device_type="cpu",
                                                        precision="fp32").peak_bytes
        free = math.ceil(need / config.memory_profile)
        base = resolve_hardware(gpu="cpu")
        hardware = dataclasses.replace(base, cpu=dataclasses.replace(base.cpu, ram_available_bytes=free))
    plan = make_plan(config, hardware).plan
    if ctx.device == "cuda":
        ctx.cuda.reset_peaks()
    result = run_training(config, plan, hardware)
    if ctx.device == "cuda":
        peak = ctx.cuda.peaks()[0] - held
        ctx.cuda.release()
    else:
        from ..task import load_task

        peak = measure_cpu(load_task(config), config, batch=plan.micro_batch, precision=plan.precision)
    return judge_squeeze(steps=result.steps, events=oom_events(result.run_dir), peak=peak, plan=plan, free=free,
                         held=held)


# --------------------------------------------------------------------------
# oom-recovery


def weight_difference(a: dict, b: dict) -> tuple[float, bool]:
    """(max |a - b| over every tensor, whether all are close within WEIGHT_ATOL / WEIGHT_RTOL)."""
    worst, close = 0.0, a.keys() == b.keys()
    for name in a.keys() & b.keys():
        x, y = a[name].float(), b[name].float()
        worst = max(worst, float((x - y).abs().max()) if x.numel() else 0.0)
        close = close and torch.allclose(x, y, atol=WEIGHT_ATOL, rtol=WEIGHT_RTOL)
    return worst, close


def judge_recovery(*, clean, recovered, events: list[dict], effective_batch: int, plan_after: dict,
                   difference: tuple[float, bool], leave: int | None = None) -> Result:
    worst, close = difference
    effective = plan_after["micro_batch"] * plan_after["grad_accum"] * plan_after["world_size"]
    figures = {"oom_events": [{k: e.get(k) for k in ("step", "micro_batch", "message")} for e in events],
               "micro_batch_after": plan_after["micro_batch"], "grad_accum_after": plan_after["grad_accum"],
               "effective_batch_after": effective, "effective_batch": effective_batch,
               "steps": [clean.steps, recovered.steps], "samples": [clean.samples, recovered.samples],
               "max_abs_weight_diff": worst, "atol": WEIGHT_ATOL, "rtol": WEIGHT_RTOL, "leave_bytes": leave}
    if not events:
        return failed("no out-of-memory happened" + (f" with {leave / MiB:.0f} MiB left free" if leave else ""),
                      **figures)
    problems = []
    if (recovered.steps, recovered.samples) != (clean.steps, clean.samples):
        problems.append(f"trained {recovered.samples} samples in {recovered.steps} steps, the uninterrupted run "
                        f"{clean.samples} in {clean.steps}")
    if effective != effective_batch:
        problems.append(f"the effective batch changed to {effective}")
    if not close:
        problems.append(f"final weights differ from the uninterrupted run's by up to {worst:.2e}")
    text = (f"{len(events)} out-of-memory: micro-batch -> {plan_after['micro_batch']} x {plan_after['grad_accum']} "
            f"(effective {effective} kept); {recovered.steps} steps; weights within {worst:.1e} of an "
            "uninterrupted run")
    return failed(f"{text}; " + "; ".join(problems), **figures) if problems else passed(text, **figures)


def check_oom_recovery(ctx: Context, predictor: MemoryPredictor | None = None) -> Result:
    from ..checkpoint import FINAL, load_checkpoint
    from ..hardware import resolve_hardware
    from ..planning import make_plan

    micro = OOM_MICRO[ctx.device]
    settings = {"HYPER_PARAM_MANUAL": True, "BATCH_SIZE": micro, "GRADIENT_ACCUMULATION": OOM_ACCUM,
                "OPTIMIZER_SGD": True, "LEARNING_RATE": 1e-3, "EVAL_BATCH_SIZE": micro // 2}
    if ctx.device == "cuda":  # fp32 without TF32: splitting a batch then changes only float rounding
        settings.update(PRECISION_FP32=True, TF32_OFF=True, COMPILE_MANUAL=True, COMPILE_MODEL=False)
    base = "gpt2" if ctx.device == "cuda" else "lenet5"
    hardware = resolve_hardware() if ctx.device == "cuda" else resolve_hardware(gpu="cpu")
    runs, leave = {}, None
    for name in ("oom-clean", "oom-recovered"):
        config = make_config(ctx, base, name, settings)
        plan = make_plan(config, hardware).plan
        if name == "oom-recovered" and ctx.device == "cuda":
            predictor = predictor or MemoryPredictor()
            small, large = (predictor.predict(config, batch=b, device_type="cuda", precision="fp32").peak_bytes
                            for b in (micro // 2, micro))
            leave = (small + large) // 2
            ctx.cuda.hold(leave)
        inject = {"KFIT_INJECT_OOM": INJECTED_STEPS} if name == "oom-recovered" and ctx.device == "cpu" else {}
        with environ(**inject):
            runs[name] = run_training(config, plan, hardware)
        if ctx.cuda is not None:
            ctx.cuda.release()
    clean, recovered = runs["oom-clean"], runs["oom-recovered"]
    weights = [load_checkpoint(r.run_dir / FINAL)["model"] for r in (clean, recovered)]
    plan_after = json.loads((recovered.run_dir / "plan.json").read_text())
    return judge_recovery(clean=clean, recovered=recovered, events=oom_events(recovered.run_dir),
                          effective_batch=plan.effective_batch, plan_after=plan_after,
                          difference=weight_difference(*weights), leave=leave)
