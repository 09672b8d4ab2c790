"""The out-of-memory ladder: the one list of what a plan changes when memory runs out, for the resolver and the
trainer alike.

Halving comes first (`halved`): it keeps the step's math. When the micro-batch is 1 (or CONFIG_OOM_MAX_HALVINGS
is spent) and the step still runs out of memory, the next rung is taken, in this order, each only where
CONFIG_OOM_LADDER_<RUNG> allows it and where it applies:

  checkpointing  gradient checkpointing on (models that have a way: lib/models/registry.py, checkpointing_for)
  autocast       bf16 autocast, fp16 with a gradient scaler on a GPU without bf16: float32 runs of
                 CONFIG_PRECISION_AUTO only, on CUDA/ROCm or the CPU (not MPS)
  offload        FSDP2's CPU offload: sharded runs on a CUDA GPU, taken by the relaunch (no rank can
                 redo a sharded step alone)

The resolver takes the first two before training where micro-batch 1 is predicted not to fit
(`pre_training`); the trainer takes them after the device ran out of memory (`next_rung`). A rung changes how
a step is computed, never which samples it sees nor how many: the effective batch, the accumulation and the
sample order stay. The micro-batch stays where halving left it: the device just proved that more did not fit.
Each rung taken is one event in metrics.jsonl ("oom_rung") with the memory predictor's peak before and after,
and is kept in the checkpoint's Progress.rungs, so a resumed run computes its steps the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator

from ..config import Config
from ..config.typed import LADDER_RUNGS
from ..hardware import HardwareProfile
from ..models.registry import can_checkpoint as model_can_checkpoint
from ..parallel import is_sharded
from ..plan import Plan

_WHAT = {"checkpointing": "gradient checkpointing on", "autocast": "{precision} autocast",
         "offload": "sharded state offloaded to the CPU (FSDP2 CPUOffloadPolicy)"}
# the rungs a plan can take before training: offload needs a sharded run that failed (the relaunch)
BEFORE_TRAINING = ("checkpointing", "autocast")


@dataclass(frozen=True)
class Rung:
    name: str
    plan: Plan  # the plan with the rung taken
    what: str  # "gradient checkpointing on", for the message


def changes(config: Config, name: str, *, device_type: str, precision: str, gradient_checkpointing: bool,
            strategy: str = "none", cpu_offload: bool = False, supports_bf16: bool = True,
            can_checkpoint: bool = True, pipeline: int = 1) -> dict | None:
    """The plan fields rung `name` changes, or None where it does not apply (or is already in effect): fp16's
    gradient scaler not under pipeline stages (`pipeline` > 1), whose overflow check sees one stage's gradients
    (decisions.decide_pipeline refuses it as a setting)."""
    if name == "checkpointing" and can_checkpoint and not gradient_checkpointing:
        return {"gradient_checkpointing": True}
    if name == "autocast" and config.precision == "auto" and precision == "fp32" and device_type in ("cuda", "cpu"):
        chosen = "fp16" if device_type == "cuda" and not supports_bf16 else "bf16"  # CPU autocast: bf16
        if chosen == "fp16" and pipeline > 1:
            return None
        return {"precision": chosen, "grad_scaler": chosen == "fp16"}
    if name == "offload" and is_sharded(strategy) and device_type == "cuda" and not cpu_offload:
        return {"cpu_offload": True}
    return None


def _bf16(plan: Plan, hardware: HardwareProfile | None) -> bool:
    gpu = hardware.primary_gpu if hardware is not None and plan.device_type == "cuda" else None
    return gpu is None or gpu.supports_bf16


def taken(config: Config, plan: Plan, name: str, hardware: HardwareProfile | None = None,
          can_checkpoint: bool | None = None) -> Plan | None:
    """The plan with rung `name` taken, or None where it does not apply (or is already in effect).
    can_checkpoint: None asks the model registry."""
    if can_checkpoint is None:
        can_checkpoint = model_can_checkpoint(config)
    change = changes(config, name, device_type=plan.device_type, precision=plan.precision,
                     gradient_checkpointing=plan.gradient_checkpointing, strategy=plan.strategy,
                     cpu_offload=plan.cpu_offload, supports_bf16=_bf16(plan, hardware), can_checkpoint=can_checkpoint,
                     pipeline=plan.pipeline_parallel)
    return dataclasses.replace(plan, **change) if change is not None else None


def pre_training(config: Config, *, device_type: str, precision: str, supports_bf16: bool = True
                 ) -> Iterator[tuple[str, str, Config]]:
    """The rungs the resolver may take before training, in the ladder's order, each as (name, what, the config
    with it and every earlier one taken), for a plan in which micro-batch 1 is predicted not to fit."""
    current, checkpointing = config, config.gradient_checkpointing
    for name in config.oom_ladder:
        if name not in BEFORE_TRAINING:
            continue
        change = changes(config, name, device_type=device_type, precision=precision,
                         gradient_checkpointing=checkpointing, supports_bf16=supports_bf16,
                         can_checkpoint=model_can_checkpoint(config), pipeline=config.pipeline_parallel)
        if change is None:
            continue
        if "gradient_checkpointing" in change:
            checkpointing = True
            current = dataclasses.replace(current, gradient_checkpointing=True)
        if "precision" in change:
            current = dataclasses.replace(current, precision=change["precision"])
        yield name, _WHAT[name].format(precision=change.get("precision", precision)), current


def next_rung(config: Config, plan: Plan, hardware: HardwareProfile | None, done: list[str], *,
              can_checkpoint: bool | None = None) -> Rung | None:
    """The first rung, in the ladder's order, that the config allows, that applies, and not yet taken."""
    for name in config.oom_ladder:
        if name in done:
            continue
        after = taken(config, plan, name, hardware, can_checkpoint)
        if after is not None:
            return Rung(name, with_reason(after, name), _WHAT[name].format(precision=after.precision))
    return None


_REASON_KEY = {"checkpointing": "gradient_checkpointing", "autocast": "precision", "offload": "strategy"}


def with_reason(plan: Plan, name: str) -> Plan:
    """The plan's reasons say which rung changed what."""
    reasons = dict(plan.reasons)
    reasons["oom_ladder"] = ", ".join(filter(None, [reasons.get("oom_ladder"), name]))
    key = _REASON_KEY[name]
    reasons[key] = f"{reasons.get(key, '')}; out-of-memory ladder: {_WHAT[name].format(precision=plan.precision)}"
    return dataclasses.replace(plan, reasons=reasons)


def reapply(config: Config, plan: Plan, done: list[str], hardware: HardwareProfile | None,
            can_checkpoint: bool | None = None) -> Plan:
    """The plan with the rungs a checkpoint's run had taken (those that apply here)."""
    for name in done:
        after = taken(config, plan, name, hardware, can_checkpoint)
        plan = with_reason(after, name) if after is not None else plan
    return plan


def halved(plan: Plan, micro_batch: int, window_size: int, world_size: int, why: str) -> Plan:
    """The plan at a smaller micro-batch (halving, the ladder's first step): the accumulation that keeps the
    step's `window_size` samples over `world_size` processes."""
    share = math.ceil(window_size / world_size)
    return dataclasses.replace(
        plan, micro_batch=micro_batch, grad_accum=math.ceil(share / micro_batch),
        reasons={**plan.reasons, "micro_batch": plan.reasons.get("micro_batch", "") + f"; halved to {micro_batch} {why}"})


def predicted_peaks(config: Config, before: Plan, after: Plan) -> tuple[int, int] | None:
    """The memory predictor's peak of one step at the current micro-batch, before and after a rung; None
    where it cannot say (a model it cannot trace, say): the rung is still taken."""
    try:
        from .memory_policy import PLANNER

        def peak(plan: Plan) -> int:
            return PLANNER.predictor.predict(
                config, batch=plan.micro_batch, device_type=plan.device_type, precision=plan.precision,
                gradient_checkpointing=plan.gradient_checkpointing,
                compile_mode=plan.compile_mode if plan.compile else None, strategy=plan.strategy,
                world_size=plan.data_parallel, local_world_size=plan.local_data_parallel,
                cpu_offload=plan.cpu_offload, tensor=plan.tensor_parallel).peak_bytes

        return peak(before), peak(after)
    except Exception:  # noqa: BLE001 - the prediction only informs the message
        return None


def exhausted(config: Config, done: list[str]) -> str:
    """What the ladder tried, for the message when nothing is left."""
    forbidden = [r for r in LADDER_RUNGS if r not in config.oom_ladder]
    parts = [f"rungs taken: {', '.join(done)}" if done else "no rung of the out-of-memory ladder applied"]
    if forbidden:
        parts.append("not allowed: " + ", ".join(f"CONFIG_OOM_LADDER_{r.upper()}" for r in forbidden))
    return "; ".join(parts)
