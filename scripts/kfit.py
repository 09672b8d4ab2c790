#!/usr/bin/env python3
"""kfit's command line: every make target is a thin wrapper over a subcommand here.

Machine selection for plan/check-hardware comes from the environment, as make
passes it: HW=profile.json, or GPU=<catalog key> with FREE_GB=, GPUS=; and
WORLD_SIZE= for the number of training processes. KCONFIG_CONFIG selects the
config file, as in the kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib import config as kconfig  # noqa: E402
from lib.errors import KfitError  # noqa: E402


def _env_number(name: str, kind: type[int] | type[float]):
    """A numeric environment variable (as make passes FREE_GB=, GPUS=), or None when unset."""
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return kind(value)
    except ValueError:
        raise KfitError(f"{name}={value!r} is not a {'whole ' if kind is int else ''}number") from None


def hardware_from_env(allow_simulated: bool = True):
    from lib.hardware import resolve_hardware

    hw, gpu = os.environ.get("HW") or None, os.environ.get("GPU") or None
    if not allow_simulated and (hw or gpu):
        raise KfitError("HW= and GPU= describe another machine, but training runs on this one: unset them "
                        "(use 'make plan HW=... / GPU=...' to see another machine's plan)")
    return resolve_hardware(hw=hw, gpu=gpu, free_gb=_env_number("FREE_GB", float),
                            gpus=_env_number("GPUS", int))


def ensure_config() -> "kconfig.Config":
    """Read the .config; on a fresh clone with none, apply the default defconfig and say so."""
    path = kconfig.config_path()
    if not path.exists():
        print(f"No {path} found: applying the default defconfig '{kconfig.DEFAULT_DEFCONFIG}' "
              f"(as 'make {kconfig.DEFAULT_DEFCONFIG}-defconfig' would)")
        return kconfig.make_defconfig(kconfig.DEFAULT_DEFCONFIG, out=path)
    return kconfig.read_config(path)


# --------------------------------------------------------------------------
# Config targets


def cmd_defconfig(args) -> int:
    fragments = args.fragments.split() if args.fragments else []
    out = kconfig.config_path()
    notes: list[str] = []
    kconfig.make_defconfig(args.name, fragments, out, notes)
    for note in notes:
        print(f"note: {note}")
    merged = f" + {', '.join(fragments)}" if fragments else ""
    print(f"# configuration written to {out} (defconfig {args.name}{merged})")
    return 0


def cmd_olddefconfig(args) -> int:
    path = kconfig.config_path()
    kconfig.olddefconfig(path)
    print(f"# configuration written to {path}")
    return 0


def cmd_savedefconfig(args) -> int:
    out = kconfig.savedefconfig(kconfig.config_path(), Path(args.output))
    print(f"# minimal configuration written to {out}")
    return 0


def cmd_listnewconfig(args) -> int:
    for line in kconfig.listnewconfig(kconfig.config_path()):
        print(line)
    return 0


def cmd_menuconfig(args) -> int:
    import menuconfig  # kconfiglib's curses interface

    path = kconfig.config_path()
    if path.exists():
        kconfig.read_config(path)  # refuse to silently "fix" a config whose values do not take
    os.environ["KCONFIG_CONFIG"] = str(path)  # menuconfig loads and saves the file this names
    import kconfiglib

    menuconfig.menuconfig(kconfiglib.Kconfig(str(kconfig.KCONFIG)))
    if path.exists():
        kconfig.read_config(path)
    return 0


def cmd_defconfigs(args) -> int:
    """Names for the Makefile's help and pattern rules."""
    names = kconfig.fragment_names() if args.fragments else kconfig.defconfig_names()
    print(" ".join(names))
    return 0


# --------------------------------------------------------------------------
# Plan, hardware, train


def _plan(config, hardware, world_size: int | None = None):
    from lib.hyperparams import ModelDescription, resolve, world_size_from_env

    model = ModelDescription.from_config(config)
    return model, resolve(config, hardware, model, world_size or world_size_from_env())


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
    model, plan = _plan(config, hardware)
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
        model, plan = _plan(config, hardware)
        print()
        print("Recommendation for the current config:")
        print(format_plan(plan, config, hardware, model))
    return 0


def cmd_train(args) -> int:
    from lib.hyperparams import compile_line, summary_line
    from lib.trainer import train

    from lib.hyperparams import world_size_from_env

    hardware = hardware_from_env(allow_simulated=False)
    if world_size_from_env() > 1:
        raise KfitError(f"WORLD_SIZE={world_size_from_env()}: this version trains in one process; multi-process "
                        "training (torchrun, DDP) is not built yet. Unset WORLD_SIZE; 'make plan WORLD_SIZE=N' "
                        "shows what N processes would run.")
    config = ensure_config()
    model, plan = _plan(config, hardware)
    print(summary_line(plan, hardware, model))
    print(compile_line(plan))
    for note in plan.notes:
        print(f"Note: {note}")
    try:
        result = train(config, plan, hardware)
    except FloatingPointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    metric = (f"accuracy {result.final_eval['accuracy']:.2%}" if "accuracy" in result.final_eval
              else f"perplexity {result.final_eval['perplexity']:.2f}")
    print(f"Done: {result.steps} steps, {result.epochs:.1f} epochs in {result.seconds:.1f}s; {metric}; "
          f"run in {result.run_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `make plan | head` ends quietly, like other CLIs
    parser = argparse.ArgumentParser(prog="kfit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("defconfig", help="write .config from defconfigs/NAME (+ fragments)")
    p.add_argument("name")
    p.add_argument("--fragments", default=os.environ.get("FRAGMENTS", ""),
                   help="space-separated fragment names from defconfigs/fragments/ (or paths)")
    p.set_defaults(func=cmd_defconfig)
    sub.add_parser("olddefconfig", help="validate .config, fill in new symbols").set_defaults(func=cmd_olddefconfig)
    p = sub.add_parser("savedefconfig", help="write the minimal config to ./defconfig")
    p.add_argument("--output", default="defconfig")
    p.set_defaults(func=cmd_savedefconfig)
    sub.add_parser("listnewconfig", help="list symbols .config does not set").set_defaults(func=cmd_listnewconfig)
    sub.add_parser("menuconfig", help="edit .config in a terminal UI").set_defaults(func=cmd_menuconfig)
    p = sub.add_parser("list", help="list defconfig (or fragment) names")
    p.add_argument("--fragments", action="store_true")
    p.set_defaults(func=cmd_defconfigs)
    for name, func, text in (("plan", cmd_plan, "resolve the plan without training"),
                             ("check-hardware", cmd_check_hardware, "report the hardware and the plan")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--format", choices=("text", "json"), default=None,
                       help="output format (default: $FORMAT, else text)")
        p.set_defaults(func=func)
    sub.add_parser("train", help="train as configured").set_defaults(func=cmd_train)
    args = parser.parse_args(argv)
    try:
        if getattr(args, "format", "") is None:
            args.format = (os.environ.get("FORMAT") or "text").lower()
            if args.format not in ("text", "json"):
                raise KfitError(f"FORMAT={os.environ['FORMAT']!r}: choose text or json")
        return args.func(args)
    except KfitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
