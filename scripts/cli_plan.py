"""Subcommands that show plans: plan and check-hardware."""

from __future__ import annotations

import json

from kfit_env import ensure_config, hardware_from_env, plan_for
from lib import config as kconfig


def format_plan(plan, config, hardware, model) -> str:
    from lib.hyperparams import compile_line, summary_line

    target = f" (target {plan.target_effective_batch})" if plan.target_effective_batch else " (MANUAL)"
    rows = [
        ("device", f"{plan.device_type} ({plan.device_name})", plan.reasons["device"]),
        ("precision", plan.precision + (" + grad scaler" if plan.grad_scaler else ""), plan.reasons["precision"]),
        ("compile", f"on ({plan.compile_mode})" if plan.compile else "off", plan.reasons["compile"]),
        ("micro-batch", str(plan.micro_batch), plan.reasons["micro_batch"]),
        ("grad accumulation", str(plan.grad_accum), plan.reasons["grad_accum"]),
        ("effective batch", f"{plan.effective_batch}{target}",
         f"{plan.micro_batch} x {plan.grad_accum} x {plan.world_size} process(es)"),
        ("eval batch", str(plan.eval_batch), plan.reasons["eval_batch"]),
        ("tf32", "on" if plan.tf32 else "off", plan.reasons["tf32"]),
        ("cudnn benchmark", "on" if plan.cudnn_benchmark else "off", plan.reasons["cudnn_benchmark"]),
        ("loader workers", f"{plan.num_workers}{' + pinned memory' if plan.pin_memory else ''}",
         plan.reasons["workers"]),
    ]
    lines = [f"Plan for {config.source} ({model.name}{'-' + model.preset if model.preset else ''}) "
             f"on {hardware.source} hardware, policy {plan.policy}:"]
    width = max(len(r[0]) for r in rows)
    for name, value, why in rows:
        lines.append(f"  {name:<{width}}  {value:<18} {why}")
    lines += [f"  note: {n}" for n in plan.notes]
    lines += [summary_line(plan, hardware, model), compile_line(plan)]
    return "\n".join(lines)


def cmd_plan(args) -> int:
    hardware = hardware_from_env()  # before ensure_config: a refused request writes nothing
    config = ensure_config()
    model, plan = plan_for(config, hardware)
    if args.format == "json":
        print(json.dumps({**plan.to_dict(), "hardware": hardware.to_dict()}, indent=2, sort_keys=True))
    else:
        print(format_plan(plan, config, hardware, model))
    return 0


def cmd_check_hardware(args) -> int:
    from lib.hardware import gib

    hardware = hardware_from_env()
    if args.format == "json":
        print(hardware.to_json())
        return 0
    cpu = hardware.cpu
    print(f"Hardware ({hardware.source}): torch {hardware.torch_version}"
          + (f", CUDA {hardware.cuda_version}" if hardware.cuda_version else "")
          + (f", ROCm/HIP {hardware.hip_version}" if hardware.hip_version else ""))
    if not hardware.gpus:
        print("  GPU: none that torch can use")
    for gpu in hardware.gpus:
        cc = ".".join(map(str, gpu.compute_capability)) if gpu.compute_capability else gpu.arch
        print(f"  GPU {gpu.index}: {gpu.name} [{gpu.backend}, {cc}] {gib(gpu.total_bytes):.1f}GB total, "
              f"{gib(gpu.free_bytes):.1f}GB free; bf16 {'yes' if gpu.supports_bf16 else 'no'}, "
              f"TF32 {'yes' if gpu.supports_tf32 else 'no'}")
    print(f"  CPU: {cpu.name}, {cpu.physical_cores} physical / {cpu.logical_cores} logical cores")
    print(f"  RAM: {gib(cpu.ram_total_bytes):.1f}GB total, {gib(cpu.ram_available_bytes):.1f}GB available")
    print(f"  disk: {gib(hardware.disk_free_bytes):.1f}GB free")
    if hardware.disk_free_bytes < 5 * 2**30:
        print("  warning: less than 5GB of disk free: checkpoints may not fit")
    print(f"  power: {'battery' if hardware.on_battery else 'mains' if hardware.on_battery is False else 'no battery'}")
    for note in hardware.notes:
        print(f"  note: {note}")
    path = kconfig.config_path()
    if path.exists():
        config = kconfig.read_config(path)
        model, plan = plan_for(config, hardware)
        print()
        print("Recommendation for the current config:")
        print(format_plan(plan, config, hardware, model))
    return 0




def register(sub) -> None:
    for name, func, text in (("plan", cmd_plan, "resolve the plan without training"),
                             ("check-hardware", cmd_check_hardware, "report the hardware and the plan")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--format", choices=("text", "json"), default=None,
                       help="output format (default: $FORMAT, else text)")
        p.set_defaults(func=func)
