"""The entry point a training script calls at start: read the config, resolve what depends on the machine, apply it.

    from lib.hyperparams import apply_hyperparams
    apply_hyperparams(config, verbose=True, model_type="resnet18")

`config` is kfit's own Config, or any object of the script's whose attributes are Kconfig symbol names without
the CONFIG_ prefix (TARGET_EFFECTIVE_BATCH, HYPER_PARAM_AUTO, COMPILE_AUTO, ...; a module built from a .config,
a namespace). On the script's object the resolved values are set: BATCH_SIZE (the micro-batch),
GRADIENT_ACCUMULATION, COMPILE_MODEL, and EFFECTIVE_BATCH, PRECISION, GRADIENT_CHECKPOINTING, DATALOADER_WORKERS.
The lines training starts with are printed:

    Hyperparams: AUTO mode - GPU: NVIDIA H100 (79.2GiB total, 78.6GiB free) x 1, model=resnet18, compile=ON
    -> batch=64, grad_acc=8 (effective=512, target=512)
    Compile: Enabled (GPU 'NVIDIA H100 80GB HBM3' has good torch.compile support)

This module is a thin facade over the one door to a plan (lib/planning/door.py, make_plan); the machine is
detected by lib/hardware/. `resolve` (the door with positional arguments), `ModelDescription`, `TierPolicy` and
the decision functions are here for scripts that want the parts.
"""

from __future__ import annotations

from typing import Any

from .config import Config
from .errors import ConfigError, PlanError
from .hardware import HardwareProfile
from .models.registry import MODELS
from .plan import BatchChoice, BatchPolicy, ModelDescription, Plan
from .planning import Settings, make_plan
from .planning.decisions import (COMPILE_DENY, auto_detect_compile as _decide_compile, calculate_gradient_accumulation,
                                 decide_device, decide_gradient_sync, decide_precision, decide_tf32)
from .planning.render import compile_line, summary_line
from .planning.throughput import with_predictions
from .planning.tiers import TierPolicy, policy_for

__all__ = [
    "BatchChoice", "BatchPolicy", "COMPILE_DENY", "ModelDescription", "Plan", "Settings",
    "TierPolicy", "apply_hyperparams", "auto_detect_compile", "auto_detect_hyperparams",
    "calculate_gradient_accumulation", "compile_line", "decide_device", "decide_gradient_sync",
    "decide_precision", "decide_tf32", "get_gpu_info", "policy_for", "resolve",
    "summary_line", "with_predictions",
]

# A model without a defconfig of its own name starts from this one (model_type="llama" -> llama-tiny).

# What apply_hyperparams sets on a script's config object under AUTO: outputs there, never read as inputs.
APPLIED = ("BATCH_SIZE", "GRADIENT_ACCUMULATION", "COMPILE_MODEL", "EFFECTIVE_BATCH", "PRECISION",
           "GRADIENT_CHECKPOINTING", "DATALOADER_WORKERS")


def get_gpu_info(hardware: HardwareProfile | None = None) -> dict[str, Any]:
    """This machine's GPUs as a dict: has_gpu, gpu_name, gpu_count, total_gb/free_gb (of the first),
    vendor, bf16; and the HardwareProfile they came from under "profile"."""
    from .hardware import detect

    hardware = hardware or detect()
    gpu = hardware.primary_gpu
    info: dict[str, Any] = {"has_gpu": gpu is not None, "gpu_count": len(hardware.gpus), "profile": hardware,
                            "accelerator": hardware.accelerator}
    if gpu is not None:
        info.update(gpu_name=gpu.name, vendor=gpu.vendor, total_gb=gpu.total_bytes / 2**30,
                    free_gb=gpu.free_bytes / 2**30, bf16=gpu.supports_bf16)
    else:
        info.update(gpu_name=None, vendor=None, total_gb=0.0, free_gb=0.0, bf16=False)
    return info


def auto_detect_compile(config: Any, gpu_info: dict | None = None, verbose: bool = False) -> bool:
    """Whether torch.compile should be on for this config on this machine (the deny list, CPU and MPS off)."""
    config = as_config(config)
    hardware = (gpu_info or get_gpu_info())["profile"]
    device_type, _ = decide_device(config, hardware)
    gpu = hardware.primary_gpu if device_type in ("cuda", "mps") else None
    on, _, why = _decide_compile(config, device_type, gpu)
    if verbose:
        print(f"Compile: {why}")
    return on


def auto_detect_hyperparams(config: Any, gpu_info: dict | None = None, model_type: str | None = None,
                            world_size: int | None = None) -> dict[str, Any]:
    """The resolved batch_size (micro-batch), gradient_accumulation, effective_batch and compile, with the plan
    and the rationale line; nothing is applied."""
    config = as_config(config, model_type)
    hardware = (gpu_info or get_gpu_info())["profile"]
    model, plan = make_plan(config, hardware, world_size=world_size or _ranks())
    return {"batch_size": plan.micro_batch, "gradient_accumulation": plan.grad_accum,
            "effective_batch": plan.effective_batch, "compile": plan.compile, "plan": plan,
            "gpu_info": gpu_info, "rationale": summary_line(plan, hardware, model)}


def resolve(config: Config, hardware: HardwareProfile, model: ModelDescription | None = None, world_size: int = 1,
            policy: BatchPolicy | None = None, nodes: int = 1, settings: Settings | None = None) -> Plan:
    """The plan for `config` on `hardware` with `world_size` processes over `nodes` machines (make_plan, with the
    positional arguments scripts have called it with). model: the config's, if given (the door derives it from
    the config; another model is an error). policy: the batch policy (None: the config's). settings: None takes
    this process's."""
    planned = make_plan(config, hardware, world_size=world_size, nodes=nodes, settings=settings, policy=policy)
    if model is not None and model.name != planned.model.name:
        raise PlanError(f"model {model.name!r} but the config trains {config.model!r}: the config names the model")
    return planned.plan


def _ranks() -> int:
    """Training processes: WORLD_SIZE as torchrun sets it for each rank, else 1."""
    from .env import env_number

    return env_number("WORLD_SIZE", int, 1, minimum=1)


def apply_hyperparams(config: Any, verbose: bool = True, model_type: str | None = None,
                      hardware: HardwareProfile | None = None, world_size: int | None = None) -> Plan:
    """Detect the machine (or take `hardware`), resolve the plan for `world_size` processes (default: WORLD_SIZE
    under torchrun, else 1; a rank plans its share of the effective batch), set the resolved
    values on `config` (a script's own object; kfit's Config is frozen and is left as it is), print the start
    lines when `verbose`, and return the Plan."""
    kfit_config = as_config(config, model_type)
    hardware = hardware or get_gpu_info()["profile"]
    model, plan = make_plan(kfit_config, hardware, world_size=world_size or _ranks())
    if not isinstance(config, Config):
        values = {"BATCH_SIZE": plan.micro_batch, "GRADIENT_ACCUMULATION": plan.grad_accum,
                  "COMPILE_MODEL": plan.compile, "EFFECTIVE_BATCH": plan.effective_batch,
                  "PRECISION": plan.precision, "GRADIENT_CHECKPOINTING": plan.gradient_checkpointing,
                  "DATALOADER_WORKERS": plan.num_workers}
        prefix = "CONFIG_" if any(n.startswith("CONFIG_") for n in dir(config)) else ""
        for name, value in values.items():
            name = prefix + name
            before = getattr(config, name, None)
            if isinstance(value, bool) and isinstance(before, str):  # a .config's 'y' / 'n' stays a string
                value = "y" if value else "n"
            setattr(config, name, value)
    if verbose:
        print(summary_line(plan, hardware, model))
        print(compile_line(plan))
        for note in plan.notes:
            print(f"Note: {note}")
    return plan


def _symbol_text(value: Any) -> str:
    if isinstance(value, bool):
        return "y" if value else "n"
    return str(value)


def as_config(config: Any, model_type: str | None = None) -> Config:
    """kfit's Config for `config`: itself, or the defconfig of `model_type` (or of the object's MODEL_* choice)
    with every Kconfig symbol the object sets to another value taken on top, as strictly as a fragment."""
    from . import config as kconfig

    if isinstance(config, Config):
        if model_type is not None and model_type != config.model:
            raise PlanError(f"model_type={model_type!r} but the config trains {config.model!r} (CONFIG_MODEL_"
                            f"{config.model.upper()}): pass the configured model or change the config")
        return config
    attrs = {name.removeprefix("CONFIG_"): getattr(config, name) for name in dir(config)
             if name.isupper() and not name.startswith("_") and getattr(config, name) is not None}  # None: unset
    chosen = [name.removeprefix("MODEL_").lower() for name, v in attrs.items()
              if name.startswith("MODEL_") and _symbol_text(v) == "y"]
    if len(chosen) > 1 and model_type is None:
        raise ConfigError(f"apply_hyperparams: the config object selects {len(chosen)} models "
                          f"({', '.join('MODEL_' + c.upper() + '=y' for c in chosen)}): keep one, or pass model_type")
    name = model_type or (chosen[0] if chosen else None)
    spec = MODELS.get(name) if name is not None else None
    name = spec.defconfig or name if spec is not None else name
    if name is None:
        raise ConfigError("apply_hyperparams: name the model (model_type='resnet18') or set MODEL_<NAME>=y on the "
                          "config object")
    if name not in kconfig.defconfig_names():
        raise ConfigError(f"model_type={name!r}: kfit has no defconfig of that name; choose one of "
                          f"{', '.join(kconfig.defconfig_names())}")
    base = kconfig.defconfig_config(name)
    auto = _symbol_text(attrs.get("HYPER_PARAM_AUTO", base.symbols.get("HYPER_PARAM_AUTO"))) == "y"
    overrides = {sym: value for sym, value in attrs.items()
                 if sym in base.symbols and _symbol_text(value) != base.symbols[sym]
                 and not (auto and sym in APPLIED) and not sym.startswith("MODEL_")}
    return kconfig.derive(base, overrides) if overrides else base
