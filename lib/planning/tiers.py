"""The tier policy (CONFIG_HYPER_PARAM_POLICY_TIERS): a share of free memory, a tier table and a per-model scale
factor, with no prediction. The memory planner (memory_policy.py) is the default; this one stays for users who
want the simple rule, and as the baseline the planner is measured against."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Config
from ..hardware import gib
from ..models.registry import MODELS
from ..plan import BatchChoice, BatchPolicy

# (usable GiB at least, batch with compile on, batch with compile off)
MEMORY_TIERS = ((128, 256, 128), (64, 128, 64), (32, 32, 16), (16, 16, 8), (8, 8, 4), (4, 4, 2), (0, 2, 1))

CPU_BASE_BATCH = 16

# samples per step relative to GPT-2 (lib/models/registry.py); an unknown model is planned as GPT-2
MODEL_SCALE = {name: spec.tier_scale for name, spec in MODELS.items() if spec.tier_scale is not None}


@dataclass(frozen=True)
class TierPolicy:
    """80% of free memory, a tier table, a model scale factor."""

    name: str = "tiers"
    safety: float = 0.8

    def max_micro_batch(self, *, hardware, model, device_type, compile, precision):
        scale = MODEL_SCALE.get(model.name, 1.0)
        if device_type == "cpu":
            batch = int(CPU_BASE_BATCH * scale)
            return batch, f"CPU base batch {CPU_BASE_BATCH} x {model.name} scale {scale:g} = {batch}"
        gpu = hardware.primary_gpu
        usable = gib(gpu.free_bytes) * self.safety
        for floor, with_compile, without in MEMORY_TIERS:
            if usable >= floor:
                base = with_compile if compile else without
                break
        batch = max(1, int(base * scale))
        tier = f"{floor}GiB+" if floor else "<4GiB"
        return batch, (f"{gib(gpu.free_bytes):.1f}GiB free x {self.safety:.0%} = {usable:.1f}GiB usable -> "
                       f"tier {tier}, base {base} (compile {'on' if compile else 'off'}) x {model.name} "
                       f"scale {scale:g} = {batch}")

    def choose(self, *, hardware, model, device_type, compile, precision, **_) -> BatchChoice:
        cap, why = self.max_micro_batch(hardware=hardware, model=model, device_type=device_type,
                                        compile=compile, precision=precision)
        return BatchChoice(max_micro=cap, reason=why, eval_batch=2 * cap, eval_reason=(
            "twice the largest safe micro-batch: evaluation keeps no activations for backward"))


TIERS = TierPolicy()


def policy_for(config: Config) -> BatchPolicy:
    """The batch policy AUTO mode selects: CONFIG_HYPER_PARAM_POLICY_PLANNER (the default) or _TIERS."""
    if config.hyperparam_policy == "tiers":
        return TIERS
    from .memory_policy import PLANNER

    return PLANNER
