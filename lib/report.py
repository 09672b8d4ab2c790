"""Seeing plans: the memory lines of `make plan`, check-hardware's warnings and advice, the
defconfig x machine matrix (`make plan-matrix`) and its HTML report (`make plan-report`)."""

from __future__ import annotations

import html
import math
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
OVERHEAD_COLOR = "#bab0ac"  # the device terms of lib.memory.device_overheads


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
        if plan.grad_accum > 1 and not config.gradient_checkpointing and config.model in ("gpt2", "resnet18",
                                                                                             "resnet50"):
            advice.append(f"memory caps the micro-batch at {plan.max_micro_batch}: CONFIG_GRADIENT_CHECKPOINTING=y "
                          "trades compute for activation memory and allows a larger one")
        for symbol, share in (("CONSERVATIVE", 0.5), ("BALANCED", 0.75), ("EXTREME", 0.95)):
            if share == config.memory_profile:
                continue
            other_config = kconfig.derive(config, {f"MEMORY_PROFILE_{symbol}": True})
            other = resolve(other_config, hardware, ModelDescription.from_config(other_config), world_size)
            advice.append(f"CONFIG_MEMORY_PROFILE_{symbol} ({share:.0%}): micro-batch {other.micro_batch} x "
                          f"accumulation {other.grad_accum}, predicted peak {size(other.predicted_peak_bytes)} "
                          f"of {size(other.budget_bytes)}")
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


# --------------------------------------------------------------------------
# The HTML report


def _breakdown_bar(plan: Plan, width: int = 500, height: int = 22) -> dict:
    """Stacked bar of the breakdown (full width = the predicted peak), and the peak's share of the budget."""
    x, segments = 0.0, []
    for name, value in plan.memory_breakdown.items():
        w = value * width / plan.predicted_peak_bytes
        segments.append({"x": round(x, 1), "w": round(w, 2), "color": COLORS.get(name, OVERHEAD_COLOR),
                         "name": name, "size": size(value)})
        x += w
    share = plan.predicted_peak_bytes / plan.budget_bytes
    return {"width": width, "height": height, "segments": segments, "share": f"{share:.1%}",
            "share_w": round(min(1.0, share) * width, 1)}


def _nice_ticks(top: float, count: int = 4) -> list[float]:
    raw = top / count
    step = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * step for m in (1, 2, 2.5, 5, 10) if m * step >= raw)
    return [i * step for i in range(int(top / step) + 1)]


def _peak_curve(points: list[tuple[int, int]], plan: Plan, width: int = 500, height: int = 230) -> dict:
    """Peak vs batch: traced points, the straight-line fit through them, the budget, the chosen micro-batch."""
    pad_l, pad_b, pad_t, pad_r = 62, 34, 12, 14
    # Around the decision: twice the memory cap when memory binds, else a few times the batch used.
    binding = plan.max_micro_batch and plan.max_micro_batch < plan.micro_batch * 2 and \
        "would need" in plan.reasons["micro_batch"]
    xmax = 2 * plan.max_micro_batch if binding else 4 * plan.micro_batch
    shown = [(b, p) for b, p in points if b <= xmax]
    n = len(points)
    mean_b, mean_p = sum(b for b, _ in points) / n, sum(p for _, p in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points) or 1
    slope = sum((b - mean_b) * (p - mean_p) for b, p in points) / var  # least squares: peak ~ a + slope * batch
    fit = lambda b: mean_p + slope * (b - mean_b)  # noqa: E731
    ymax = max(max(p for _, p in shown), fit(xmax), plan.budget_bytes) * 1.08
    sx = lambda b: round(pad_l + b / xmax * (width - pad_l - pad_r), 1)  # noqa: E731
    sy = lambda y: round(height - pad_b - y / ymax * (height - pad_b - pad_t), 1)  # noqa: E731
    unit, div = ("GB", 2**30) if ymax >= 2**30 else ("MB", 2**20)
    return {"width": width, "height": height, "left": pad_l, "bottom": height - pad_b, "right": width - pad_r,
            "top": pad_t, "line": " ".join(f"{sx(b)},{sy(p)}" for b, p in shown),
            "fit": {"x1": sx(0), "y1": sy(fit(0)), "x2": sx(xmax), "y2": sy(fit(xmax))},
            "dots": [{"x": sx(b), "y": sy(p), "title": f"batch {b}: {size(p)}"} for b, p in shown],
            "budget_y": sy(plan.budget_bytes), "budget": size(plan.budget_bytes),
            "chosen": {"x": sx(plan.micro_batch), "y": sy(plan.predicted_peak_bytes),
                       "label": f"{plan.micro_batch}: {size(plan.predicted_peak_bytes)}"},
            "yticks": [{"y": sy(t * div), "label": f"{t:g}{unit}"} for t in _nice_ticks(ymax / div)],
            "xticks": [{"x": sx(t), "label": f"{t:g}"} for t in _nice_ticks(xmax)]}


def _curve_points(config: kconfig.Config, plan: Plan) -> list[tuple[int, int]]:
    """Predicted peaks at the batch sizes the planner traced (all cached), plus 1 and the chosen one."""
    from .planner import PLANNER

    predictor = PLANNER.predictor
    batches = predictor.cached_batches(config, device_type=plan.device_type, precision=plan.precision)
    return [(b, predictor.predict(config, batch=b, device_type=plan.device_type, precision=plan.precision,
                                  compile_mode=plan.compile_mode).peak_bytes)
            for b in sorted(set(batches) | {1, plan.micro_batch})]


def render_report(rows: list[MatrixRow], focus: str, out: Path) -> Path:
    """Write the self-contained HTML report: the matrix, then per defconfig its plan on `focus`."""
    import jinja2

    from .planner import PLANNER

    cards = []
    shown = [r for r in rows if r.machine == focus and r.plan is not None and r.plan.predicted_peak_bytes is not None]
    progress = Progress(len(shown), "plan-report charts", unit="chart")
    with tempfile.TemporaryDirectory() as tmp:
        for r in shown:
            config = kconfig.make_defconfig(r.defconfig, out=Path(tmp) / f"{r.defconfig}.config")
            with progress.item(f"{r.defconfig} on {focus}"):
                points = _curve_points(config, r.plan)
            cards.append({"defconfig": r.defconfig, "plan": r.plan, "bar": _breakdown_bar(r.plan),
                          "curve": _peak_curve(points, r.plan),
                          "breakdown": [(k, size(v), COLORS.get(k, OVERHEAD_COLOR))
                                        for k, v in r.plan.memory_breakdown.items()]})
    progress.close()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    page = env.get_template("plan_report.html.j2").render(
        rows=rows, focus=focus, cards=cards, size=size, machines=sorted({r.machine for r in rows},
                                                                         key=lambda m: (m == "cpu", m)),
        defconfigs=sorted({r.defconfig for r in rows}), generated=datetime.now().strftime("%Y-%m-%d %H:%M"),
        cache=str(PLANNER.predictor.cache_dir), escape=html.escape)
    out.write_text(page)
    return out

