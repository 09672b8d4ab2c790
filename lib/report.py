"""Seeing plans: the memory lines of `make plan`, check-hardware's warnings and advice, the
defconfig x machine matrix (`make plan-matrix`) and its HTML report (`make plan-report`)."""

from __future__ import annotations

import html
import math
import re
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from . import config as kconfig
from .errors import KfitError
from .hardware import HardwareProfile, catalog, format_size, from_catalog, gib, resolve_hardware
from .hyperparams import ModelDescription, Plan, resolve

TEMPLATES = Path(__file__).resolve().parent / "templates"
COLORS = {"parameters": "#4e79a7", "buffers": "#9c755f", "gradients": "#f28e2b", "optimizer_state": "#e15759",
          "activations": "#76b7b2", "temporaries": "#59a14f", "workspace": "#edc948", "batch": "#b07aa1"}
# The device and strategy terms (lib.memory.predict's overheads), each its own muted colour so that
# several on one bar stay apart; a term added later gets OVERHEAD_COLOR.
OVERHEAD_COLORS = {"host_heap": "#bab0ac", "sharded_host_heap": "#d7b5a6", "blas_workspace": "#a0cbe8",
                   "attention_workspace": "#86bcb6", "allocator_fragmentation": "#79706e",
                   "cudagraph_pool": "#d4a6c8", "ddp_buckets": "#ffbe7d", "ddp_flat_gradients": "#ff9d9a",
                   "cpu_offload": "#8cd17d"}
OVERHEAD_COLOR = "#bab0ac"
CATEGORY_ORDER = (*COLORS, *OVERHEAD_COLORS)  # one order for every bar and legend on the page


def size(n: int | None) -> str:
    if n is None:
        return "-"
    return format_size(n)


def memory_lines(plan: Plan, width: int = 30) -> list[str]:
    """The planner's prediction as text: peak vs budget, then one bar per breakdown category."""
    if plan.predicted_peak_bytes is None:
        return []
    share = plan.predicted_peak_bytes / plan.budget_bytes
    lines = [f"  memory: predicted peak {size(plan.predicted_peak_bytes)} at micro-batch {plan.micro_batch} = "
             f"{share:.0%} of the budget {size(plan.budget_bytes)}; evaluation at {plan.eval_batch}: "
             f"{size(plan.eval_predicted_peak_bytes)}"]
    for name, value in plan.memory_breakdown.items():
        bar = "#" * max(1, round(width * value / plan.predicted_peak_bytes)) if value else ""
        lines.append(f"    {name:<24} {size(value):>9}  {bar}")
    return lines


# --------------------------------------------------------------------------
# check-hardware


def hardware_warnings(hardware: HardwareProfile) -> list[str]:
    """What the user should act on: memory held by others, mixed GPUs, little disk, battery."""
    warnings = []
    for gpu in hardware.gpus:
        used = gpu.total_bytes - gpu.free_bytes
        # Our own context accounts for about CONTEXT_RESERVE_BYTES; 1 GiB beyond that is someone else's.
        if used > catalog.CONTEXT_RESERVE_BYTES + 2**30:
            warnings.append(f"GPU {gpu.index} ({gpu.name}): {gib(used):.1f}GB of {gib(gpu.total_bytes):.1f}GB is in "
                            "use, more than a CUDA context takes: other processes hold memory (nvidia-smi); the "
                            "plan only counts what is free")
    if len({(g.name, g.total_bytes) for g in hardware.gpus}) > 1:
        warnings.append("the GPUs differ: training plans for GPU 0; set CUDA_VISIBLE_DEVICES to identical ones")
    if hardware.disk_free_bytes < 5 * 2**30:
        warnings.append(f"only {gib(hardware.disk_free_bytes):.1f}GB of disk free: checkpoints may not fit")
    if hardware.on_battery:
        warnings.append("running on battery: training drains it and runs slower; plug in for long runs")
    return warnings


def recommendations(config: kconfig.Config, hardware: HardwareProfile, plan: Plan, world_size: int = 1) -> list[str]:
    """Advice for this config on this machine, each naming the Kconfig option."""
    advice = []
    gpu = hardware.primary_gpu
    if plan.device_type == "cuda" and plan.precision == "fp32" and gpu.supports_bf16:
        advice.append(f"{gpu.name} supports bfloat16: CONFIG_PRECISION_AUTO (or _BF16) halves activation memory")
    if plan.policy == "planner":
        share_per_process = -(-plan.effective_batch // plan.world_size)
        capped = (plan.max_micro_batch or share_per_process) < share_per_process
        if capped and not plan.gradient_checkpointing and config.model in ("gpt2", "resnet18", "resnet50"):
            advice.append(f"memory caps the micro-batch at {plan.max_micro_batch}: CONFIG_GRADIENT_CHECKPOINTING=y "
                          "trades compute for activation memory and allows a larger one")
        for symbol, share in (("CONSERVATIVE", 0.5), ("BALANCED", 0.75), ("EXTREME", 0.95)):
            if share == config.memory_profile:
                continue
            other_config = kconfig.derive(config, {f"MEMORY_PROFILE_{symbol}": True})
            try:
                other = resolve(other_config, hardware, ModelDescription.from_config(other_config), world_size,
                                nodes=plan.nodes)
            except KfitError:
                continue  # a smaller share that does not fit is no advice
            changed = (other.micro_batch, other.grad_accum, other.gradient_checkpointing, other.strategy) != (
                plan.micro_batch, plan.grad_accum, plan.gradient_checkpointing, plan.strategy)
            if changed:  # a profile that leaves the plan as it is changes nothing worth saying
                advice.append(f"CONFIG_MEMORY_PROFILE_{symbol} ({share:.0%}): micro-batch {other.micro_batch} x "
                              f"accumulation {other.grad_accum}, predicted peak "
                              f"{size(other.predicted_peak_bytes)} of {size(other.budget_bytes)}")
    elif plan.mode == "auto":
        advice.append("CONFIG_HYPER_PARAM_POLICY_PLANNER sizes the batch from a traced step of this model "
                      "instead of the tier table")
    return advice


# --------------------------------------------------------------------------
# The matrix


@dataclass(frozen=True)
class MatrixRow:
    defconfig: str
    machine: str  # catalog key or "cpu"
    plan: Plan | None
    error: str | None = None


def machines(cpu_profile: HardwareProfile | None = None) -> list[tuple[str, HardwareProfile]]:
    """Every catalog GPU (attached to this machine's CPU) and this machine's CPU alone."""
    cpu_profile = cpu_profile or resolve_hardware(gpu="cpu")
    cpu = cpu_profile.cpu  # one reading of available RAM for the whole matrix
    return [(key, from_catalog(key, cpu=cpu)) for key in catalog.catalog_keys()] + [("cpu", cpu_profile)]


class Progress:
    """Progress of a slow loop on stderr, naming the item being worked on: a tqdm bar on a terminal,
    else one plain line per item that traced (cached items are instant and print nothing)."""

    def __init__(self, total: int, label: str, policy=None, unit: str = "plan") -> None:
        self.total, self.label, self.done = total, label, 0
        self._policy = policy
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, file=sys.stderr, unit=unit, leave=False)

    def _traces(self) -> int:
        from .planner import PLANNER, PlannerPolicy

        policy = PLANNER if self._policy is None else self._policy
        return policy.predictor.traces if isinstance(policy, PlannerPolicy) else 0

    @contextmanager
    def item(self, name: str):
        if self._bar is not None:
            self._bar.set_postfix_str(name)
        traces, start = self._traces(), time.perf_counter()
        try:
            yield
        finally:
            self.done += 1
            traced = self._traces() - traces
            if self._bar is not None:
                self._bar.update()
            elif traced:
                print(f"{self.label} {self.done}/{self.total}: {name}: {traced} trace(s) in "
                      f"{time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def plan_matrix(defconfigs: list[str] | None = None, targets: list[tuple[str, HardwareProfile]] | None = None,
                policy=None, label: str = "plan-matrix") -> list[MatrixRow]:
    """The plan of every defconfig on every machine (a PlanError becomes the row's error),
    with progress on stderr (Progress)."""
    rows = []
    targets = targets or machines()
    names = defconfigs or kconfig.defconfig_names()
    progress = Progress(len(names) * len(targets), label, policy)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            config = kconfig.make_defconfig(name, out=Path(tmp) / f"{name}.config")
            model = ModelDescription.from_config(config)
            for key, hardware in targets:
                with progress.item(f"{name} on {key}"):
                    try:
                        rows.append(MatrixRow(name, key, resolve(config, hardware, model, 1, policy)))
                    except KfitError as err:
                        rows.append(MatrixRow(name, key, None, str(err)))
    progress.close()
    return rows


# Models that outgrow one device, planned for several processes: (defconfig, preset fragment, GPU, processes).
SCALE_OUT = (("gpt2", "CONFIG_GPT2_PRESET_774M=y", "a10g", 4), ("gpt2", "CONFIG_GPT2_PRESET_1558M=y", "a10g", 4))


def scale_out_rows(policy=None) -> list[MatrixRow]:
    """The SCALE_OUT plans: each process's share of a model a replica would not fit (lib.strategy picks DDP
    or a sharded strategy), with progress like plan_matrix."""
    from .hardware import resolve_hardware

    rows = []
    progress = Progress(len(SCALE_OUT), "plan-matrix (scale-out)", policy)
    with tempfile.TemporaryDirectory() as tmp:
        for name, assignment, gpu, processes in SCALE_OUT:
            (Path(tmp) / "fragment").write_text(assignment + "\n")
            config = kconfig.make_defconfig(name, [str(Path(tmp) / "fragment")], out=Path(tmp) / "config")
            model = ModelDescription.from_config(config)
            label, machine = f"{name}-{config.gpt2_preset}", f"{gpu} x{processes}"
            with progress.item(f"{label} on {machine}"):
                try:
                    plan = resolve(config, resolve_hardware(gpu=gpu, gpus=processes), model, processes, policy)
                    rows.append(MatrixRow(label, machine, plan))
                except KfitError as err:
                    rows.append(MatrixRow(label, machine, None, str(err)))
    progress.close()
    return rows


def format_matrix(rows: list[MatrixRow]) -> str:
    head = ("defconfig", "machine", "micro", "accum", "effective", "eval", "compile", "precision",
            "strategy", "predicted peak", "budget", "share")
    table = [head]
    for r in rows:
        p = r.plan
        if p is None:
            table.append((r.defconfig, r.machine, "-", "-", "-", "-", "-", "-", "-", "does not fit", "", ""))
            continue
        share = f"{p.predicted_peak_bytes / p.budget_bytes:.0%}" if p.predicted_peak_bytes else "-"
        table.append((r.defconfig, r.machine, str(p.micro_batch), str(p.grad_accum), str(p.effective_batch),
                      str(p.eval_batch), "on" if p.compile else "off", p.precision, p.strategy,
                      size(p.predicted_peak_bytes), size(p.budget_bytes), share))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i < 2 or i in (6, 7, 8) else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in table]
    return "\n".join(lines)


