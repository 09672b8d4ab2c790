"""The recommend subcommand: three configurations for this (or a described) machine (lib/recommend.py).

Machine and processes as for plan (HW=, GPU=, FREE_GB=, GPUS=, WORLD_SIZE=, or their flags);
FORMAT=json; WRITE=1 writes each as a minimal defconfig, recommended-<mode>, in
defconfigs/ (or OUT=dir), trainable with 'make recommended-<mode>-defconfig';
OUT=<name>.html writes the three side by side as an HTML page.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .common import apply_hint, hardware_from_env, new_defconfig_dir, plan_for, processes
from .. import config as kconfig
from ..env import env_bool
from ..errors import KfitError
from .flags import MACHINE, command


def _base() -> tuple[kconfig.Config, Path | None, str | None]:
    """(config, its file or None, note): the .config, or without one the GPT-2 defconfig in memory."""
    path = kconfig.config_path()
    if path.exists():
        return kconfig.read_config(path), path, None
    return (kconfig.defconfig_config("gpt2"), kconfig.defconfig_file("gpt2"),
            f"no {path}: recommending for the GPT-2 family (the gpt2 defconfig); writing nothing to {path}")


def _shapes(config):
    """Every GPT-2 preset with its parameter count for this config's data (its vocabulary)."""
    import torch

    from ..models import GPT2_PRESETS, build_model, count_parameters
    from ..recommend import Shape
    from ..task import load_task

    vocab = load_task(config).info.vocab_size
    out = []
    for preset in GPT2_PRESETS:
        with torch.device("meta"):
            model = build_model("gpt2", gpt2_preset=preset, block_size=1024, vocab_size=vocab)
        out.append(Shape(preset, count_parameters(model)))
    return out


def _device_flops(config, hardware, nproc: int) -> float:
    """The reachable FLOP/s of all processes, in the best precision the device runs (the step-time model's)."""
    from ..hyperparams import decide_device
    from ..steptime.calibrate import steptime_dir
    from ..steptime.device import device_for

    device_type, _ = decide_device(config, hardware)
    device = device_for(hardware, device_type, steptime_dir())
    if device is None:
        raise KfitError(f"no throughput figures for {hardware.primary_gpu.name if hardware.primary_gpu else device_type}"
                        ": kfit's catalog does not know this device, so it cannot predict times to recommend from")
    bf16 = device_type == "cpu" or (hardware.primary_gpu is not None and hardware.primary_gpu.supports_bf16)
    return max(device.fp32_flops, device.half_flops if bf16 else 0.0) * nproc


def _free_bytes(hardware, device_type: str) -> int:
    if device_type == "cuda" and hardware.primary_gpu is not None:
        return hardware.primary_gpu.free_bytes
    return hardware.cpu.ram_available_bytes


def _data_source(config, hardware):
    """The data directory as lib.recommend's slow-disk warning reads it; None for built-in data, or a
    described machine (HW=, GPU=), whose disk is not this one's."""
    if config.dataset != "dir" or os.environ.get("HW") or os.environ.get("GPU"):
        return None
    from ..hardware import details
    from ..recommend import DataSource
    from ..task import load_task

    directory = Path(config.data_dir).expanduser()
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    samples = max(1, load_task(config).info.train_samples)
    speed, _ = details.read_speed(directory)
    return DataSource(bytes=size, bytes_per_sample=size / samples, read_bytes_per_s=speed,
                      ram_available=hardware.cpu.ram_available_bytes)


def _write(recs, source: Path, out_dir: Path) -> list[Path]:
    """Each recommendation as a minimal, strictly valid defconfig: recommended-<mode> in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="kfit-recommend-") as tmp:
        for rec in recs:
            full = Path(tmp) / f"{rec.mode.name}.config"
            if source.parent == kconfig.DEFCONFIG_DIR:  # no .config: the gpt2 defconfig, expanded
                kconfig.make_defconfig(source.name, out=full)
            else:
                shutil.copyfile(source, full)
            kconfig.apply_assignments(full, rec.assignments)
            target = out_dir / f"recommended-{rec.mode.name}"
            kconfig.savedefconfig(full, target)
            written.append(target)
    return written


def _hours(seconds: float | None) -> str:
    from ..monitor import format_duration

    return format_duration(seconds) if seconds else "unknown (no step-time figures for this device)"


def _text(rec) -> list[str]:
    from ..hardware import format_size

    plan, mode = rec.plan, rec.mode
    lines = [f"{mode.name}  ({mode.share:.0%} of free memory)"]
    if rec.parameters:
        lines.append(f"  model     gpt2 {rec.config.gpt2_preset}: {rec.parameters / 1e6:.1f}M parameters, "
                     f"context {rec.config.gpt2_block_size}")
    else:
        lines.append(f"  model     {rec.config.model}")
    lines.append(f"  batch     micro-batch {plan.micro_batch} x {plan.grad_accum} x {plan.world_size} process(es) "
                 f"= {plan.effective_batch}; {plan.precision}, checkpointing "
                 f"{'on' if plan.gradient_checkpointing else 'off'}, strategy {plan.strategy}")
    if plan.predicted_peak_bytes and plan.budget_bytes:
        lines.append(f"  memory    predicted peak {format_size(plan.predicted_peak_bytes)} of a "
                     f"{format_size(plan.budget_bytes)} budget ({plan.predicted_peak_bytes / plan.budget_bytes:.0%})")
    if rec.tokens:
        lines.append(f"  tokens    {rec.tokens:,} ({mode.tokens_per_parameter} per parameter) = {rec.steps:,} steps")
    energy = f", {rec.energy_kwh:.3g} kWh at {rec.watts:.0f} W (the power limit)" if rec.energy_kwh else ""
    lines.append(f"  time      {_hours(rec.seconds)}{energy}")
    lines += [f"  why       {r}" for r in rec.reasons]
    if rec.out_of_reach:
        lines.append(f"  out of reach: {rec.out_of_reach}")
    lines += [f"  warning   {w}" for w in rec.warnings]
    return lines


def cmd_recommend(args) -> int:
    from ..hyperparams import decide_device
    from ..recommend import MODES, SCORE_HIGH, SCORE_LOW, recommend_fixed, recommend_gpt2, score, warnings_for

    from ..report import check_writable

    write = env_bool("WRITE", False)
    out = os.environ.get("OUT") or None
    page = Path(out) if out and out.endswith(".html") else None
    out_dir = Path(out) if out and not page else new_defconfig_dir()
    if page:
        check_writable(page)  # before the planning, not after it
    if write and out_dir.exists() and not out_dir.is_dir():
        raise KfitError(f"OUT={out}: not a directory: WRITE=1 writes recommended-<mode> files into a directory "
                        "(OUT=<name>.html writes the HTML page)")
    hardware = hardware_from_env()
    base, source, note = _base()
    nproc, _ = processes(base, hardware)
    device_type, _ = decide_device(base, hardware)
    flops = _device_flops(base, hardware, nproc)

    def plan(config):
        return plan_for(config, hardware)[1]

    recs, dataset_tokens = [], None
    if base.model == "gpt2":
        shapes = _shapes(base)
        for mode in MODES:
            recs.append(recommend_gpt2(base, shapes, plan=plan, derive=kconfig.derive, flops=flops,
                                       budget=_free_bytes(hardware, device_type), processes=nproc, mode=mode))
        from ..task import load_task

        info = load_task(base).info
        dataset_tokens = info.train_samples * info.block_size
    else:
        recs = [recommend_fixed(base, plan=plan, derive=kconfig.derive, mode=mode) for mode in MODES]
    data = _data_source(base, hardware)
    for rec in recs:
        rec.warnings = warnings_for(rec, on_battery=hardware.on_battery, dataset_tokens=dataset_tokens, data=data)
    value = score(flops)
    definition = (f"reachable training FLOP/s ({flops:.3g}, {nproc} process(es)) on a log scale from "
                  f"{SCORE_LOW:.0e} (0: a 2-core laptop CPU) to {SCORE_HIGH:.2g} (10: 8 H100s in bf16)")
    written = _write(recs, source, out_dir) if write else []
    machine = hardware.primary_gpu.name if device_type == "cuda" else hardware.cpu.name
    if page:
        from ..recommend import render_page

        page.write_text(render_page(recs, score_value=value, definition=definition, machine=machine,
                                    processes=nproc, free_bytes=_free_bytes(hardware, device_type)))
        written.append(page)
    if args.format == "json":
        print(json.dumps({"score": value, "score_definition": definition, "note": note,
                          "recommendations": [r.to_dict() for r in recs],
                          "written": [str(p) for p in written]}, indent=2, sort_keys=True))
        return 0
    if note:
        print(f"note: {note}")
    print(f"Recommended configurations for {machine} ({nproc} process(es)), model {base.model}")
    print(f"Performance score: {value}/10: {definition}")
    for rec in recs:
        print()
        print("\n".join(_text(rec)))
    for path in written:
        print(f"# written {path}" + ("" if path == page else f": {apply_hint(path)}"))
    return 0


def register(sub) -> None:
    command(sub, "recommend", "three configurations for this machine: conservative, balanced, extreme", *MACHINE,
            "FORMAT", "WRITE", "OUT", func=cmd_recommend,
            help={"OUT": "with --write, the directory for the defconfigs (default defconfigs/); NAME.html: "
                         "write the three side by side as an HTML page"})
