"""The out-of-memory ladder: what a run changes once halving the micro-batch can go no further.

Halving comes first (stepper.py): it keeps the step's math. When the micro-batch is 1 (or
CONFIG_OOM_MAX_HALVINGS is spent) and the step still runs out of memory, the next rung is taken,
in this order, each only where CONFIG_OOM_LADDER_<RUNG> allows it and where it applies:

  checkpointing  gradient checkpointing on (models that have it: GPT-2, ResNet)
  autocast       bf16 autocast, fp16 with a gradient scaler on a GPU without bf16: float32 runs of
                 CONFIG_PRECISION_AUTO only, on CUDA/ROCm or the CPU (not MPS)
  offload        FSDP2's CPU offload: sharded runs on a CUDA GPU, taken by the relaunch (no rank can
                 redo a sharded step alone)

A rung changes how a step is computed, never which samples it sees nor how many: the effective
batch, the accumulation and the sample order stay. The micro-batch stays where halving left it:
the device just proved that more did not fit. Each rung taken is one event in metrics.jsonl
("oom_rung") with the memory predictor's peak before and after, and is kept in the checkpoint's
Progress.rungs, so a resumed run computes its steps the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import Config
from ..config.typed import LADDER_RUNGS
from ..hardware import HardwareProfile
from ..parallel import is_sharded
from ..plan import Plan

_WHAT = {"checkpointing": "gradient checkpointing on", "autocast": "{precision} autocast",
         "offload": "sharded state offloaded to the CPU (FSDP2 CPUOffloadPolicy)"}


@dataclass(frozen=True)
class Rung:
    name: str
    plan: Plan  # the plan with the rung taken
    what: str  # "gradient checkpointing on", for the message


def taken(config: Config, plan: Plan, name: str, hardware: HardwareProfile, can_checkpoint: bool = True
          ) -> Plan | None:
    """The plan with rung `name` taken, or None where it does not apply (or is already in effect)."""
    if name == "checkpointing" and can_checkpoint and not plan.gradient_checkpointing:
        return dataclasses.replace(plan, gradient_checkpointing=True)
    if (name == "autocast" and config.precision == "auto" and plan.precision == "fp32"
            and plan.device_type in ("cuda", "cpu")):
        gpu = hardware.primary_gpu if plan.device_type == "cuda" else None
        precision = "fp16" if gpu is not None and not gpu.supports_bf16 else "bf16"  # CPU autocast: bf16
        return dataclasses.replace(plan, precision=precision, grad_scaler=precision == "fp16")
    if name == "offload" and is_sharded(plan.strategy) and plan.device_type == "cuda" and not plan.cpu_offload:
        return dataclasses.replace(plan, cpu_offload=True)
    return None


def next_rung(config: Config, plan: Plan, hardware: HardwareProfile, done: list[str], *,
              can_checkpoint: bool = True) -> Rung | None:
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


def reapply(config: Config, plan: Plan, done: list[str], hardware: HardwareProfile,
            can_checkpoint: bool = True) -> Plan:
    """The plan with the rungs a checkpoint's run had taken (those that apply here)."""
    for name in done:
        after = taken(config, plan, name, hardware, can_checkpoint)
        plan = with_reason(after, name) if after is not None else plan
    return plan


def predicted_peaks(config: Config, before: Plan, after: Plan) -> tuple[int, int] | None:
    """The memory predictor's peak of one step at the current micro-batch, before and after a rung; None
    where it cannot say (a model it cannot trace, say): the rung is still taken."""
    try:
        from ..planner import PLANNER

        def peak(plan: Plan) -> int:
            return PLANNER.predictor.predict(
                config, batch=plan.micro_batch, device_type=plan.device_type, precision=plan.precision,
                gradient_checkpointing=plan.gradient_checkpointing,
                compile_mode=plan.compile_mode if plan.compile else None, strategy=plan.strategy,
                world_size=plan.world_size, local_world_size=plan.world_size // plan.nodes,
                cpu_offload=plan.cpu_offload).peak_bytes

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
