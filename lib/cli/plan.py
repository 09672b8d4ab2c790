"""Subcommands that show plans: plan, check-hardware, plan-matrix and plan-report."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .common import config_to_plan, hardware_from_env, parsed
from .flags import MACHINE, command
from .. import config as kconfig
from ..errors import KfitError
from ..redact import shown

# lib.planning (and torch with it) is imported by the commands that use it, not with this module: kfit's parser
# imports every command's module, and a config target or a refused variable then starts in about 0.5 s, not 3 s.


def format_plan(*args, **kwargs) -> str:
    """lib.planning.render.format_plan (scripts/cli_plan.py's name for it)."""
    from ..planning.render import format_plan as render

    return render(*args, **kwargs)


def time_rows(*args, **kwargs):
    """lib.planning.render.time_rows (scripts/cli_plan.py's name for it)."""
    from ..planning.render import time_rows as rows

    return rows(*args, **kwargs)


def cmd_plan(args) -> int:
    from ..planning import make_plan

    run = parsed(None)
    hardware = hardware_from_env(run=run)
    config, note = config_to_plan(run)
    model, plan = make_plan(config, hardware, **run.plan_args())
    if note:
        from ..planning import edits

        plan = edits.with_note(plan, note)
    if args.format == "json":
        print(json.dumps({**plan.to_dict(), "hardware": hardware.to_dict()}, indent=2, sort_keys=True))
    else:
        print(format_plan(plan, config, hardware, model))
    return 0


def _data_dir(config_path) -> str | None:
    """The config's data directory, None for built-in data (or a config the plan will refuse)."""
    if not config_path.exists():
        return None
    try:
        config = kconfig.read_config(config_path)
    except KfitError:
        return None  # the plan below says what is wrong with it
    return config.data_dir if config.dataset == "dir" else None


def _details(found: dict) -> list[str]:
    """Seed 002's profiler items (lib/hardware/details.collect), "unknown" where this machine does not say."""
    from ..hardware import format_size

    def known(value, fmt=str):
        return fmt(value) if value is not None else "unknown"

    def yes(v):
        return "yes" if v else "no"

    cpu, data = found["cpu"], found["data"]
    lines = [f"CPU details: {known(cpu['arch'])}, clock {known(cpu['clock_mhz'], lambda v: f'{v} MHz')}, "
             f"NUMA nodes {known(cpu['numa_nodes'])}; swap "
             f"{known(cpu['swap_bytes'], lambda v: format_size(v) if v else 'none')}; memory bandwidth "
             f"{known(cpu['memory_bandwidth_bytes_per_s'], lambda v: f'{v / 1e9:.1f} GB/s')} (a 256 MiB copy)"]
    if data["directory"]:
        speed = data["read_bytes_per_s"]
        lines.append(f"data: {data['directory']} on {known(data['disk'])}, sequential read "
                     + (f"{speed / 1e6:.0f} MB/s ({data['read']})" if speed else f"unknown ({data['read']})"))
    else:
        lines.append(f"data: built in (in memory); the working directory is on {known(data['disk'])}")
    for gpu in found["gpus"]:
        lines.append(f"GPU {gpu['index']} power: limit {known(gpu['power_limit_watts'], lambda v: f'{v:.0f} W')}, "
                     f"drawing {known(gpu['power_draw_watts'], lambda v: f'{v:.0f} W')}; INT8 "
                     f"{known(gpu['int8'], yes)}, FP8 {known(gpu['fp8'], yes)}")
    return lines


def cmd_check_hardware(args) -> int:
    from ..hardware import details, gib
    from ..hardware.profile import DETAILS_KEY
    from ..report import hardware_warnings, recommendations

    path = kconfig.config_path()  # a bad KCONFIG_CONFIG is refused before the report starts
    hardware = hardware_from_env()
    measured_here = not (os.environ.get("HW") or os.environ.get("GPU"))  # details describe this machine only
    found = details.collect(hardware, _data_dir(path)) if measured_here else None
    if args.format == "json":
        print(json.dumps({**hardware.to_dict(), DETAILS_KEY: found}, indent=2))
        return 0
    cpu = hardware.cpu
    print(f"Hardware ({hardware.source}): torch {hardware.torch_version}"
          + (f", CUDA {hardware.cuda_version}" if hardware.cuda_version else "")
          + (f", ROCm/HIP {hardware.hip_version}" if hardware.hip_version else ""))
    if not hardware.gpus:
        print("  GPU: none that torch can use")
    for gpu in hardware.gpus:
        cc = ".".join(map(str, gpu.compute_capability)) if gpu.compute_capability else gpu.arch
        print(f"  GPU {gpu.index}: {gpu.name} [{gpu.backend}, {cc}] {gib(gpu.total_bytes):.1f}GiB total, "
              f"{gib(gpu.free_bytes):.1f}GiB free; bf16 {'yes' if gpu.supports_bf16 else 'no'}, "
              f"TF32 {'yes' if gpu.supports_tf32 else 'no'}")
    print(f"  CPU: {cpu.name}, {cpu.physical_cores} physical / {cpu.logical_cores} logical cores")
    print(f"  RAM: {gib(cpu.ram_total_bytes):.1f}GiB total, {gib(cpu.ram_available_bytes):.1f}GiB available")
    print(f"  disk: {gib(hardware.disk_free_bytes):.1f}GiB free")
    print(f"  power: {'battery' if hardware.on_battery else 'mains' if hardware.on_battery is False else 'no battery'}")
    if found:
        for line in _details(found):
            print(f"  {line}")
    for note in hardware.notes:
        print(f"  note: {note}")
    for warning in hardware_warnings(hardware):
        print(f"  warning: {warning}")
    if path.exists():
        config = kconfig.read_config(path)
        from ..planning import make_plan

        model, plan = make_plan(config, hardware, **parsed(None).plan_args())
        print()
        print(format_plan(plan, config, hardware, model))
        advice = recommendations(config, hardware, plan, plan.world_size)
        if advice:
            print()
            print("Recommendations:")
            for line in advice:
                print(f"  - {line}")
    return 0


def cmd_plan_matrix(args) -> int:
    from ..report import format_matrix, parallel_jobs, plan_matrix, scale_out_rows

    from .common import env_number
    from ..report import machines

    start = time.perf_counter()
    # as everywhere: GPUS=N training processes, N GPUs on each catalog machine
    gpus = env_number("GPUS", int, minimum=1)
    jobs = parallel_jobs()
    rows = (plan_matrix(targets=machines(gpus=gpus), world_size=gpus, jobs=jobs) if gpus
            else plan_matrix(jobs=jobs) + scale_out_rows())
    if args.format == "json":
        print(json.dumps([{"defconfig": r.defconfig, "machine": r.machine, "error": r.error,
                           "plan": r.plan.to_dict() if r.plan else None} for r in rows], indent=2))
        return 0
    print(format_matrix(rows))
    fits = sum(1 for r in rows if r.plan)
    print(f"{len(rows)} plans ({fits} fit) in {time.perf_counter() - start:.1f}s")
    return 0


def _focus_machine() -> str:
    """The matrix column the report details: GPU=, else this machine's GPU if the catalog knows it, else cpu."""
    from ..hardware import catalog
    from ..errors import HardwareError

    if os.environ.get("GPU"):
        return "cpu" if os.environ["GPU"].lower() == "cpu" else catalog.lookup(os.environ["GPU"]).key
    hardware = hardware_from_env()
    try:
        return catalog.lookup(hardware.primary_gpu.name).key if hardware.gpus else "cpu"
    except HardwareError:
        return "h100"


def cmd_plan_report(args) -> int:
    from ..report import check_writable, parallel_jobs, plan_matrix, render_report

    out = Path(os.environ.get("OUT") or "plan-report.html")
    check_writable(out)
    focus = _focus_machine()
    render_report(plan_matrix(jobs=parallel_jobs()), focus, out)
    print(f"plan report written to {shown(out)} (details for {focus}; open it in a browser)")
    return 0


def register(sub) -> None:
    command(sub, "plan", "resolve the plan without training", *MACHINE, "FORMAT", func=cmd_plan)
    command(sub, "check-hardware", "report the hardware and the plan", *MACHINE, "FORMAT", func=cmd_check_hardware)
    command(sub, "plan-matrix", "every defconfig on every catalog GPU and the CPU", "GPUS", "FORMAT",
            func=cmd_plan_matrix, help={"GPUS": "N GPUs on each catalog machine, N training processes"})
    command(sub, "plan-report", "the plan matrix and memory charts as HTML", "OUT", "HW", "GPU", "FREE_GB", "GPUS",
            func=cmd_plan_report, help={"OUT": "the HTML file to write (default plan-report.html)",
                                        "GPU": "the catalog GPU to detail (default: this machine's)"})
