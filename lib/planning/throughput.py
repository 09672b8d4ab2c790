"""The fastest plan that fits: among the micro-batches (and gradient-checkpointing settings) the batch
policy's memory cap allows, the one lib.steptime predicts the most samples/s for; and every plan's
predicted step time, throughput, run time and energy (`with_predictions`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import Config
from ..errors import PlanError
from ..hardware import HardwareProfile
from ..models.registry import can_checkpoint
from ..plan import BatchChoice, BatchPolicy, Plan
from .request import ChooseArgs


@dataclass(frozen=True)
class _Option:
    """A micro-batch cap from the batch policy under one gradient-checkpointing setting."""

    checkpointing: bool
    choice: BatchChoice


def _other_checkpointing(config: Config, choice: BatchChoice, share: int) -> bool:
    """Whether the other checkpointing setting could help: the model has it, and it is on (recomputing
    costs time) or memory caps the micro-batch below the share (it would let a larger one fit)."""
    # the registry last: a custom model's answer may build the factory's model (under the meta device)
    return (config.gradient_checkpointing or choice.max_micro < share) and can_checkpoint(config)


def _within(candidate) -> str:
    return f"±{candidate.uncertainty:.0%}"


def _speed_reason(choice, ranked, share: int, cap: int, source: str, timed: bool) -> str:
    """Why this micro-batch: the choice and its interval, a tie it won, the runner-up, the largest that fits,
    the largest that divides the share (the rule before step-time prediction), each with its samples/s."""
    why = f"fastest predicted of {len(ranked)} candidates ({source}): {choice.describe()} ({_within(choice)})"
    from ..steptime import ties

    best = ranked[0]
    said = [choice]
    if best is not choice:
        tied = len(ties(ranked))
        rule = ("the highest samples/s at worst (the low end of its interval)" if timed else
                "fewer, larger micro-batches (what a busy host slows least)")
        others = "" if tied <= 2 else f" and {tied - 2} more"
        why += (f"; a tie broken: {best.describe()} ({_within(best)}){others} overlap its interval, and the tie "
                f"goes to {rule}"
                if choice.gradient_checkpointing == best.gradient_checkpointing else
                f"; {best.describe()} ({_within(best)}) overlaps its interval, and the configured checkpointing "
                "is kept")
        said.append(best)
    same = [c for c in ranked if c.gradient_checkpointing == choice.gradient_checkpointing]
    for label, found in (("runner-up", next((c for c in ranked if c not in said), None)),
                         ("the largest that fits", next((c for c in same if c.micro_batch == cap), None)),
                         ("the largest divisor of the share", max(
                             (c for c in same if share % c.micro_batch == 0), key=lambda c: c.micro_batch,
                             default=None))):
        if found is not None and found not in said:
            why += f"; {label} {found.describe()}"
            said.append(found)
    return why


ALTERNATIVES = 2  # runner-ups a plan keeps for a run to time where its first steps miss the prediction


def choose_fastest(config: Config, policy: BatchPolicy, choice: BatchChoice, args: ChooseArgs, *, tf32: bool,
                   measure: bool = True):
    """(candidate, its option, its step-time model, reason, the runner-ups' (micro-batch, accumulation, step
    seconds)) with the highest predicted samples/s among the
    micro-batches (and checkpointing settings) that fit under `args` (its strategy included); None where the
    device's speed is unknown. measure: time real micro-batches on this CPU where not cached yet."""
    from ..steptime import candidates, fastest, step_time_model

    hardware, world_size, target = args.hardware, args.world_size, args.target
    share = target // world_size
    ranked, models = [], {}

    def model_for(checkpointing: bool):
        return step_time_model(config, hardware, device_type=args.device_type, precision=args.precision, tf32=tf32,
                               compile=args.compile, gradient_checkpointing=checkpointing, world_size=world_size,
                               measure_up_to=min(choice.max_micro, share) if measure else None,
                               strategy=args.strategy, local_world_size=args.local_world_size,
                               per_micro_batch=measure, tensor=args.tensor, pipeline=args.pipeline,
                               nodes=args.nodes, context=args.context)  # timing off: no run moves the choice (reproducible plans)

    def add(option: _Option, model) -> None:
        models[option.checkpointing] = (model, option)
        ranked.extend(candidates(model, share=share, cap=min(option.choice.max_micro, share),
                                 world_size=world_size, gradient_checkpointing=option.checkpointing))

    model = model_for(config.gradient_checkpointing)
    if model is None:
        return None
    add(_Option(config.gradient_checkpointing, choice), model)
    if _other_checkpointing(config, choice, share):
        other = dataclasses.replace(config, gradient_checkpointing=not config.gradient_checkpointing)
        alt = model_for(other.gradient_checkpointing)
        # the memory search for the other setting only where, unbounded by memory, it could be faster
        bound = candidates(alt, share=share, cap=share, world_size=world_size,
                           gradient_checkpointing=other.gradient_checkpointing)
        if max(c.samples_per_second for c in bound) > max(c.samples_per_second for c in ranked):
            try:
                add(_Option(other.gradient_checkpointing, args.choose(policy, other)), alt)
            except PlanError:
                pass  # the other setting does not fit at all
    timed = any(m.measured for m, _ in models.values())
    best, ranked = fastest(ranked, config.gradient_checkpointing, timed=timed)
    model, option = models[best.gradient_checkpointing]
    cap = min(option.choice.max_micro, share)
    # the runner-ups a run may time (lib/trainer/trial.py); none where timing is off (KFIT_STEPTIME_MEASURE=0)
    alternatives = tuple((c.micro_batch, c.grad_accum, c.seconds) for c in ranked if measure and c is not best
                         and c.gradient_checkpointing == best.gradient_checkpointing)[:ALTERNATIVES]
    return best, option, model, _speed_reason(best, ranked, share, cap, model.source, timed), alternatives


def with_predictions(config: Config, hardware: HardwareProfile, plan: Plan, speed_model=None) -> Plan:
    """The plan with its predicted step time, throughput, run time and energy (lib.steptime), and why;
    as it was, with a note, where the device's speed is unknown."""
    from ..steptime import model_for_plan, plan_predictions
    from ..steptime.calibrate import for_gradient_sync

    try:
        speed_model = for_gradient_sync(speed_model, plan) or model_for_plan(config, hardware, plan)
    except Exception as err:  # noqa: BLE001 - a step-time failure must not stop planning
        return dataclasses.replace(plan, notes=(*plan.notes, f"step time not predicted ({type(err).__name__}: {err})"))
    if speed_model is None:
        why = (f"unknown: no speed figures for {plan.device_name} (lib/hardware/catalog.py lists the GPUs "
               "kfit knows)")
        return dataclasses.replace(plan, reasons={**plan.reasons, "step_time": why})
    fields, why = plan_predictions(config, plan, speed_model)
    planned = dataclasses.replace(plan, reasons={**plan.reasons, "step_time": why}, **fields,
                                  predicted_step_uncertainty=speed_model.uncertainty(plan.micro_batch))
    mfu, mfu_why = model_flops_utilisation(planned, speed_model)
    reasons = {**planned.reasons, "mfu": mfu_why}
    if speed_model.communication is not None:  # the collectives the step time assumes, and over which links
        reasons["communication"] = speed_model.communication.describe()
    return dataclasses.replace(planned, predicted_mfu=mfu, reasons=reasons)


def model_flops_utilisation(plan: Plan, speed_model) -> tuple[float | None, str]:
    """The predicted model FLOPs utilisation: the step's counted FLOPs per sample (matmuls, convolutions and
    attention: forward and backward, recomputation included under gradient checkpointing) x the predicted
    samples/s, over the datasheet peak of the plan's precision on every device (a CPU: its measured peak)."""
    if plan.predicted_samples_per_second is None:
        return None, "unknown: no predicted throughput"
    device = speed_model.device
    per_sample = speed_model.counts.micro_batch(plan.micro_batch).flops / plan.micro_batch
    peak = device.peak_flops(plan.precision, plan.tf32)
    # every process's device; on a CPU each process's measured peak is at its own threads (plan.cpu_threads)
    devices = plan.world_size
    mfu = per_sample * plan.predicted_samples_per_second / (peak * devices)
    where = (f"the {plan.precision}{' TF32' if plan.tf32 and plan.precision == 'fp32' else ''} datasheet peak "
             f"{peak / 1e12:,.1f} TFLOP/s x {devices}" if device.kind == "gpu"
             else f"this CPU's measured {plan.precision} peak {peak / 1e9:,.1f} GFLOP/s at {plan.cpu_threads} "
             f"thread(s) x {devices} process(es)")
    return mfu, (f"{per_sample / 1e9:,.3g} GFLOP per sample x {plan.predicted_samples_per_second:,.1f} samples/s "
                 f"over {where}")
