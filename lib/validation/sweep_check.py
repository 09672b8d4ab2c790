"""The plan's micro-batch against its neighbours, timed on the device: is the planner's choice the fastest?

kfit plans GPT-2 124M on GPT-2's 50,257-token vocabulary (the gpt2 defconfig's effective batch of 512,
eager: compile would cost a compile per size) for this GPU, then times real optimizer steps at the
plan's micro-batch and at the balanced sizes nearest half and twice it (twice it only up to the largest
micro-batch the plan says fits, and the next smaller size where none larger fits): each step runs every
micro-batch of the effective batch, as the trainer splits it, then the optimizer. One model serves every
size, smallest first. The check passes when the plan's choice reaches TOLERANCE of the best samples/s
measured: a planner within 5% of the best is choosing well; below it, its step-time model ranks the
sizes wrongly on this GPU (the figures show by how much).

With DEVICE=cpu it is skipped: a CPU plan already times real steps at its candidates when it plans.
"""

from __future__ import annotations

import time

from ..redact import shown
from . import vocab
from .report import Context, Result, failed, passed, skipped

TOLERANCE = 0.95  # the plan's samples/s over the best measured
WARM_STEPS, TIMED_STEPS = 1, 2  # an optimizer step of GPT-2 124M x 512 sequences is about 1.5 s on an H100
SETTINGS = {"COMPILE_MANUAL": True, "COMPILE_MODEL": False, "PROBE_NEVER": True}


def nearest(sizes: list[int], target: float) -> int:
    """The size closest to `target` (the smaller on a tie)."""
    return min(sizes, key=lambda s: (abs(s - target), s))


def sizes_to_time(micro: int, cap: int, share: int) -> list[int]:
    """The plan's micro-batch and the balanced sizes (lib.steptime.balanced_micro_batches: those the planner
    chooses among) nearest half and twice it, twice it no larger than `cap` (the largest that fits) or
    `share`, or where none is larger the next smaller size: ascending, distinct."""
    from ..steptime import balanced_micro_batches

    top = max(micro, min(cap, share))
    sizes = balanced_micro_batches(share, top)
    chosen = {micro, nearest(sizes, micro / 2)}
    larger = [s for s in sizes if s > micro]
    if larger:
        chosen.add(nearest(larger, 2 * micro))
    else:  # the plan's is the largest balanced size that fits: the next smaller one instead
        chosen.add(max([s for s in sizes if s < micro], default=micro))
    return sorted(chosen)


def time_steps(ctx: Context, config, task, plan, sizes: list[int], step_seconds=None) -> dict[int, dict]:
    """{micro-batch: samples/s of real optimizer steps}; an out-of-memory or other error is that size's figure."""
    import torch

    from ..memory import step_optimizer
    from ..step import autocast_for, seed_everything
    from ..units import batch_split

    seed_everything(0)
    device = ctx.cuda.device
    model = task.build(plan.gradient_checkpointing).train().to(device)
    optimizer = step_optimizer(config, model, "cuda")
    x, y = (t.to(device) for t in task.example_batch(max(sizes)))
    autocast = autocast_for(plan)
    share = plan.effective_batch // plan.world_size

    def step(split) -> None:
        for n in split.sizes:
            with autocast:
                loss = task.loss(model(x[:n]), y[:n]) * (n / share)
            loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed(split) -> float:
        for _ in range(WARM_STEPS):
            step(split)
        ctx.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(TIMED_STEPS):
            step(split)
        ctx.cuda.synchronize()
        return (time.perf_counter() - start) / TIMED_STEPS

    out: dict[int, dict] = {}
    for micro in sizes:
        split = batch_split(share, micro)
        if ctx.out_of_time():
            out[micro] = {"not_run": "time budget"}
            continue
        try:
            seconds = (step_seconds or timed)(split)
        except torch.OutOfMemoryError as err:
            out[micro] = {"error": f"OutOfMemoryError: {shown(' '.join(str(err).split()), 120)}"}
            optimizer.zero_grad(set_to_none=True)
            ctx.cuda.release()
            continue
        out[micro] = {"split": split.text(), "step_s": round(seconds, 4),
                      "samples_per_s": round(share * plan.world_size / seconds, 2)}
        ctx.log(f"  micro-batch {split.text():<24} {seconds * 1e3:9.1f} ms/step  {out[micro]['samples_per_s']:9.1f}/s")
    return out


def judge(chosen: int, measured: dict[int, dict], figures: dict) -> Result:
    rates = {m: r["samples_per_s"] for m, r in measured.items() if "samples_per_s" in r}
    figures = {**figures, "sizes": measured, "tolerance": TOLERANCE}
    if chosen not in rates:
        return failed(f"the plan's micro-batch {chosen} was not measured: {measured.get(chosen)}", **figures)
    best = max(rates, key=rates.get)
    ratio = rates[chosen] / rates[best]
    figures.update(best_micro_batch=best, chosen_over_best=round(ratio, 4))
    text = (f"{vocab.LABEL}: plan {chosen} at {rates[chosen]:,.1f}/s, "
            + ", ".join(f"{m} {r:,.1f}/s" for m, r in sorted(rates.items()) if m != chosen)
            + f"; chosen/best {ratio:.3f}")
    if len(rates) < 2:
        return skipped(f"{text}: no other size measured", **figures)
    if ratio >= TOLERANCE:
        return passed(text, **figures)
    return failed(f"{text}: below {TOLERANCE}", **figures)


def check_sweep(ctx: Context) -> Result:
    if ctx.device != "cuda":
        return skipped("DEVICE=cpu: a CPU plan times real steps at its candidate micro-batches already")
    from ..hardware import resolve_hardware
    from ..planning import make_plan
    from ..task import load_task

    config = vocab.make_config(ctx.workdir, "sweep", SETTINGS)
    plan = make_plan(config, resolve_hardware()).plan
    share = plan.effective_batch // plan.world_size
    sizes = sizes_to_time(plan.micro_batch, plan.max_micro_batch or plan.micro_batch, share)
    measured = time_steps(ctx, config, load_task(config), plan, sizes)
    figures = {"micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum, "effective_batch": plan.effective_batch,
               "max_micro_batch": plan.max_micro_batch, "precision": plan.precision,
               "gradient_checkpointing": plan.gradient_checkpointing, "plan_reason": plan.reasons.get("micro_batch")}
    return judge(plan.micro_batch, measured, figures)
