"""How a plan reads: the line training starts with, the compile line, the memory lines. One place, so the
command line, the Python API and the facade in lib/hyperparams.py print the same words."""

from __future__ import annotations

from ..hardware import HardwareProfile, gib
from ..plan import ModelDescription, Plan


def model_label(model: ModelDescription) -> str:
    return f"{model.name}-{model.preset}" if model.preset else model.name


def summary_line(plan: Plan, hardware: HardwareProfile, model: ModelDescription) -> str:
    """The one line training starts with, e.g.
    Hyperparams: AUTO mode - GPU: NVIDIA H100 (80.0GB total, 72.3GB free) x 1, model=resnet18, compile=ON
    -> batch=64, grad_acc=8 (effective=512, target=512)
    """
    if plan.device_type == "cpu":
        where = (f"CPU: {hardware.cpu.name} ({hardware.cpu.physical_cores} cores, "
                 f"{gib(hardware.cpu.ram_available_bytes):.1f}GiB RAM free)")
    else:
        gpu = hardware.primary_gpu
        where = (f"GPU: {gpu.name} ({gib(gpu.total_bytes):.1f}GiB total, {gib(gpu.free_bytes):.1f}GiB free) "
                 f"x {plan.world_size}")
    head = f"Hyperparams: {plan.mode.upper()} mode - {where}, model={model_label(model)}, " \
           f"compile={'ON' if plan.compile else 'OFF'} -> batch={plan.micro_batch}, grad_acc={plan.grad_accum} "
    if plan.mode == "auto":
        return head + f"(effective={plan.effective_batch}, target={plan.target_effective_batch})"
    return head + f"(effective={plan.effective_batch}, as configured)"


def compile_line(plan: Plan) -> str:
    return f"Compile: {plan.reasons['compile']}"


def start_lines(plan: Plan, hardware: HardwareProfile, model: ModelDescription, *, threads: bool = True) -> list[str]:
    """What training prints before it starts: the summary, compile, CPU threads and the plan's notes."""
    lines = [summary_line(plan, hardware, model), compile_line(plan)]
    if threads:
        lines.append(f"CPU threads: {plan.cpu_threads} ({plan.reasons['cpu_threads']})")
    return lines + [f"Note: {note}" for note in plan.notes]
