"""The recommend subcommand: three configurations for this (or a described) machine (lib/recommend.py).

Machine and processes as for plan (HW=, GPU=, FREE_GB=, GPUS=, WORLD_SIZE=, or their flags);
FORMAT=json; WRITE=1 writes each as a minimal defconfig, recommended-<mode>, in
defconfigs/ (or OUT=dir), trainable with 'make recommended-<mode>-defconfig'; for a language
model, the other family's choice beside it as recommended-<mode>-<family>;
OUT=<name>.html writes the three side by side as an HTML page.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .common import apply_hint, hardware_from_env, new_defconfig_dir, parsed
from .. import config as kconfig, fileio
from ..env import env_bool
from ..errors import KfitError
from ..redact import shown
from ..recommend import FAMILIES
from .flags import MACHINE, command


def _base() -> tuple[kconfig.Config, Path | None, str | None]:
    """(config, its file or None, note): the .config, or without one the GPT-2 defconfig in memory."""
    path = kconfig.config_path()
    if path.exists():
        return kconfig.read_config(path), path, None
    return (kconfig.defconfig_config("gpt2"), kconfig.defconfig_file("gpt2"),
            f"no {path}: recommending for the GPT-2 family (the gpt2 defconfig); writing nothing to {path}")


def _shapes(config, family: str, vocab: int):
    """Every preset of a family (its registry entry's presets) with its parameter count for this config's data
    (its vocabulary; Llama tied as the config says)."""
    import torch

    from ..models import count_parameters
    from ..models.registry import spec_for, vocab_rows
    from ..recommend import Shape

    spec = spec_for(family)
    vocab = vocab_rows(vocab, config.pad_vocab)
    out = []
    for preset in spec.presets():
        with torch.device("meta"):
            model = spec.sized(config, preset, vocab)
        out.append(Shape(preset, count_parameters(model), family))
    return out


def corpus_tokens(config) -> int | None:
    """The training tokens of the tokenized corpus the config trains on (CONFIG_DATASET_DIR with a meta.json,
    as make data writes it): meta.json's train_tokens, else train.bin's size in its dtype; None without one."""
    if config.dataset != "dir" or not config.data_dir:
        return None
    directory = Path(config.data_dir).expanduser()
    meta_path, train = directory / "meta.json", directory / "train.bin"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(fileio.read_text(meta_path))
    except (OSError, ValueError, RecursionError):
        return None  # the data loader says what is wrong with it
    count = meta.get("train_tokens") if isinstance(meta, dict) else None
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        return count
    if train.is_file():
        return train.stat().st_size // (4 if isinstance(meta, dict) and meta.get("dtype") == "uint32" else 2)
    return None


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
    """Each recommendation as a minimal, strictly valid defconfig: recommended-<mode> in out_dir, the other
    family's beside it as recommended-<mode>-<family>."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    named = [(rec, rec.mode.name) for rec in recs]
    named += [(alt, f"{rec.mode.name}-{alt.shape.family}") for rec in recs for alt in rec.alternatives]
    for _, name in named:  # every file checked before the first is written: a refusal leaves OUT as it was
        fileio.write_target(out_dir / f"recommended-{name}")
    with tempfile.TemporaryDirectory(prefix="kfit-recommend-") as tmp:
        for rec, name in named:
            full = Path(tmp) / f"{name}.config"
            if source.parent == kconfig.DEFCONFIG_DIR:  # no .config: the gpt2 defconfig, expanded
                kconfig.make_defconfig(source.name, out=full)
            else:
                fileio.copy_file(source, full)
            kconfig.apply_assignments(full, rec.assignments)
            target = out_dir / f"recommended-{name}"
            kconfig.savedefconfig(full, target)
            written.append(target)
    return written


def _hours(seconds: float | None) -> str:
    from ..monitor import format_duration

    return format_duration(seconds) if seconds else "unknown (no step-time figures for this device)"


def _text(rec, title: str | None = None) -> list[str]:
    from ..hardware import format_size

    plan, mode = rec.plan, rec.mode
    lines = [f"{title or mode.name}  ({mode.share:.0%} of free memory)"]
    if rec.shape:
        lines.append(f"  model     {rec.shape.name}: {rec.parameters / 1e6:.1f}M parameters, context {mode.context}")
    else:
        lines.append(f"  model     {rec.config.model}")
    lines.append(f"  batch     micro-batches {plan.split.text()}; {plan.precision}, checkpointing "
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
    lines += [f"  note      {n}" for n in rec.notes]
    for alt in rec.alternatives:
        lines += ["", *_text(alt, f"{mode.name}, the {FAMILIES[alt.shape.family]} family instead")]
    return lines


def _language_models(base, *, plan, flops, budget, nproc) -> tuple[list, list, int]:
    """Each mode's choice in the configured family, the other family's beside it; the shapes of both and the
    training tokens the budgets are weighed against (a tokenized corpus's real count, else the windows')."""
    from ..errors import PlanError
    from ..recommend import MODES, recommend_family
    from ..task import load_task

    info = load_task(base).info
    shapes = {family: _shapes(base, family, info.vocab_size) for family in FAMILIES}
    other = next(f for f in FAMILIES if f != base.model)
    recs = []

    def choose(family, mode):
        return recommend_family(base, shapes[family], plan=plan, derive=kconfig.derive, flops=flops,
                                budget=budget, processes=nproc, mode=mode)

    for mode in MODES:
        rec = choose(base.model, mode)
        try:
            rec.alternatives.append(choose(other, mode))
        except PlanError as err:
            rec.notes.append(f"no {FAMILIES[other]} size here: {err}")
        recs.append(rec)
    tokens = corpus_tokens(base) or info.train_samples * info.block_size
    return recs, [s for family in shapes.values() for s in family], tokens


def cmd_recommend(args) -> int:
    from ..hyperparams import decide_device
    from ..recommend import MODES, SCORE_HIGH, SCORE_LOW, recommend_fixed, score, warnings_for

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
    from ..planning import make_plan, processes

    run = parsed(None)
    hardware = hardware_from_env(run=run)
    base, source, note = _base()
    nproc, _ = processes(base, hardware, world_size=run.world_size, gpus=run.gpus, nodes=run.planned_nodes)
    device_type, _ = decide_device(base, hardware)
    flops = _device_flops(base, hardware, nproc)

    def plan(config):
        return make_plan(config, hardware, **run.plan_args()).plan

    shapes, dataset_tokens = [], None
    if base.model in FAMILIES:
        recs, shapes, dataset_tokens = _language_models(base, plan=plan, flops=flops, nproc=nproc,
                                                        budget=_free_bytes(hardware, device_type))
    else:
        recs = [recommend_fixed(base, plan=plan, derive=kconfig.derive, mode=mode) for mode in MODES]
    data = _data_source(base, hardware)
    corpus = corpus_tokens(base) is not None
    for rec in (r for top in recs for r in (top, *top.alternatives)):
        rec.warnings = warnings_for(rec, on_battery=hardware.on_battery, dataset_tokens=dataset_tokens, data=data,
                                    shapes=shapes, corpus=corpus)
    value = score(flops)
    definition = (f"reachable training FLOP/s ({flops:.3g}, {nproc} process(es)) on a log scale from "
                  f"{SCORE_LOW:.0e} (0: a 2-core laptop CPU) to {SCORE_HIGH:.2g} (10: 8 H100s in bf16)")
    written = _write(recs, source, out_dir) if write else []
    machine = hardware.primary_gpu.name if device_type == "cuda" else hardware.cpu.name
    if page:
        from ..recommend import render_page

        fileio.write_text(page, render_page(recs, score_value=value, definition=definition, machine=machine,
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
        print(f"# written {shown(path)}" + ("" if path == page else f": {apply_hint(path)}"))
    return 0


def register(sub) -> None:
    command(sub, "recommend", "three configurations for this machine: conservative, balanced, extreme", *MACHINE,
            "FORMAT", "WRITE", "OUT", func=cmd_recommend,
            help={"OUT": "with --write, the directory for the defconfigs (default defconfigs/); NAME.html: "
                         "write the three side by side as an HTML page"})
