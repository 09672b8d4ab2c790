"""Seeing plans: the memory lines of `make plan`, check-hardware's warnings and advice, the
defconfig x machine matrix (`make plan-matrix`) and its HTML report (`make plan-report`)."""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from . import config as kconfig, fileio
from .errors import KfitError
from .hardware import HardwareProfile, catalog, from_catalog, resolve_hardware
from .plan import Plan
from .planning import make_plan
from .models.registry import can_checkpoint
from .planning.render import size
from .units import GiB, format_bytes, gib
from .models.registry import label as model_label

if TYPE_CHECKING:
    from .planning import Settings

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


# --------------------------------------------------------------------------
# check-hardware


def hardware_warnings(hardware: HardwareProfile) -> list[str]:
    """What the user should act on: memory held by others, mixed GPUs, little disk, battery."""
    warnings = []
    for gpu in hardware.gpus:
        used = gpu.total_bytes - gpu.free_bytes
        # Our own context accounts for about CONTEXT_RESERVE_BYTES; 1 GiB beyond that is someone else's.
        if used > catalog.CONTEXT_RESERVE_BYTES + 2**30:
            warnings.append(f"GPU {gpu.index} ({gpu.name}): {gib(used):.1f}GiB of {gib(gpu.total_bytes):.1f}GiB is in "
                            "use, more than a CUDA context takes: other processes hold memory (nvidia-smi); the "
                            "plan only counts what is free")
    _, mixed = hardware.for_processes(len(hardware.gpus))
    if mixed:
        warnings.append(mixed.replace("the processes use ", "", 1).replace("the plan is sized",
                                                                        "a run on all of them is planned", 1))
    if hardware.disk_free_bytes < 5 * 2**30:
        warnings.append(f"only {gib(hardware.disk_free_bytes):.1f}GiB of disk free: checkpoints may not fit")
    if hardware.on_battery:
        warnings.append("running on battery: training drains it and runs slower; plug in for long runs")
    return warnings


def recommendations(config: kconfig.Config, hardware: HardwareProfile, plan: Plan, world_size: int = 1, *,
                    settings: "Settings | None" = None) -> list[str]:
    """Advice for this config on this machine, each naming the Kconfig option. settings: the planning settings
    the other memory profiles are planned with (the command's; None: this process's, as make_plan)."""
    advice = []
    gpu = hardware.primary_gpu
    if plan.device_type == "cuda" and plan.precision == "fp32" and gpu.supports_bf16:
        advice.append(f"{gpu.name} supports bfloat16: CONFIG_PRECISION_AUTO (or _BF16) halves activation memory")
    if plan.policy == "planner":
        share_per_process = -(-plan.effective_batch // plan.data_parallel)
        capped = (plan.max_micro_batch or share_per_process) < share_per_process
        if capped and not plan.gradient_checkpointing and can_checkpoint(config):
            advice.append(f"memory caps the micro-batch at {plan.max_micro_batch}: CONFIG_GRADIENT_CHECKPOINTING=y "
                          "trades compute for activation memory and allows a larger one")
        for symbol, share in kconfig.MEMORY_PROFILES.items():
            if share == config.memory_profile:
                continue
            other_config = kconfig.derive(config, {f"MEMORY_PROFILE_{symbol}": True})
            try:
                other = make_plan(other_config, hardware, world_size=world_size, nodes=plan.nodes,
                                  settings=settings).plan
            except KfitError:
                continue  # a smaller share that does not fit is no advice
            changed = (other.micro_batch, other.grad_accum, other.gradient_checkpointing, other.strategy) != (
                plan.micro_batch, plan.grad_accum, plan.gradient_checkpointing, plan.strategy)
            if changed:  # a profile that leaves the plan as it is changes nothing worth saying
                advice.append(f"CONFIG_MEMORY_PROFILE_{symbol} ({share:.0%}): micro-batches {other.split.text()}, "
                              f"predicted peak "
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


def machines(cpu_profile: HardwareProfile | None = None, gpus: int = 1) -> list[tuple[str, HardwareProfile]]:
    """Every catalog GPU (`gpus` of it, attached to this machine's CPU) and this machine's CPU alone."""
    cpu_profile = cpu_profile or resolve_hardware(gpu="cpu")
    cpu = cpu_profile.cpu  # one reading of available RAM for the whole matrix
    return [(key, from_catalog(key, cpu=cpu, gpus=gpus)) for key in catalog.catalog_keys()] + [("cpu", cpu_profile)]


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
        from .planning.memory_policy import PLANNER, PlannerPolicy

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

    def completed(self, name: str, detail: str) -> None:
        """An item done elsewhere (a pool's worker): the bar moves, or one plain line says what and how long."""
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(name)
            self._bar.update()
        else:
            print(f"{self.label} {self.done}/{self.total}: {name} {detail}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def plan_matrix(defconfigs: list[str] | None = None, targets: list[tuple[str, HardwareProfile]] | None = None,
                policy=None, label: str = "plan-matrix", world_size: int = 1, *,
                settings: "Settings | None" = None, jobs: int = 1) -> list[MatrixRow]:
    """The plan of every defconfig on every machine for `world_size` processes (a PlanError becomes the
    row's error), with progress on stderr (Progress); settings as recommendations'. `jobs` > 1: the
    defconfigs planned in that many processes at once (`parallel_jobs`), sharing the traces on disk."""
    targets = targets or machines()
    names = defconfigs or kconfig.defconfig_names()
    if jobs > 1 and len(names) > 1 and policy is None:
        return _parallel_matrix(names, targets, label, world_size, settings, jobs)
    rows = []
    progress = Progress(len(names) * len(targets), label, policy)
    for name in names:
        rows.extend(_defconfig_rows(name, targets, policy, world_size, settings, progress))
    progress.close()
    return rows


def _defconfig_rows(name: str, targets: list[tuple[str, HardwareProfile]], policy, world_size: int,
                    settings: "Settings | None", progress: "Progress | None" = None) -> list[MatrixRow]:
    """One defconfig's row on every machine."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        config = kconfig.make_defconfig(name, out=Path(tmp) / f"{name}.config")
        for key, hardware in targets:
            with progress.item(f"{name} on {key}") if progress is not None else _nothing():
                try:
                    plan = make_plan(config, hardware, world_size=world_size, policy=policy, settings=settings).plan
                    rows.append(MatrixRow(name, key, plan))
                except KfitError as err:
                    rows.append(MatrixRow(name, key, None, str(err)))
    return rows


def _cpu_rows(name: str, targets: list[tuple[str, HardwareProfile]], world_size: int,
              settings: "Settings") -> list[MatrixRow]:
    """_defconfig_rows on this machine's CPU with timing off, and its chart's points taken into the cache
    (render_report draws them for the CPU column)."""
    rows = _defconfig_rows(name, targets, None, world_size, settings)
    with tempfile.TemporaryDirectory() as tmp:
        config = kconfig.make_defconfig(name, out=Path(tmp) / f"{name}.config")
        for row in rows:
            if row.plan is not None and row.plan.predicted_peak_bytes is not None:
                _curve_points(config, row.plan)
    return rows


@contextmanager
def _nothing():
    yield


def parallel_jobs() -> int:
    """Processes for a whole matrix: one per usable core (a plan is one core's work: tracing, counting)."""
    from .hardware.host import usable_cores

    return max(1, int(usable_cores()))


def _parallel_matrix(names: list[str], targets, label: str, world_size: int, settings, jobs: int) -> list[MatrixRow]:
    """plan_matrix's rows with the defconfigs spread over `jobs` fresh processes, progress by defconfig.

    This machine's CPU is planned from the step-time model and the timings already cached, not by timing
    real steps (a CPU plan's timing takes 3-10 s of the idle cores for each model and setting, which the
    pool's other processes would disturb; `make plan` takes them): its card says which
    (reasons["micro_batch"]). Its threads follow the one reading of idle cores made before the pool started
    (`machines`), as `make plan`'s would."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from dataclasses import replace

    from .planning.memory_policy import trace_in_process
    from .planning.request import settings_or_environment

    remote = [t for t in targets if t[0] != "cpu"]
    local = [t for t in targets if t[0] == "cpu"]
    untimed = replace(settings_or_environment(settings), measure=False)
    done: dict[str, list[MatrixRow]] = {name: [] for name in names}
    start = time.perf_counter()
    # fresh interpreters (spawn): a fork of a process that imported torch may hang in its threads
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=spawn, initializer=trace_in_process) as pool:
        futures = {}
        for name, on_gpus in _longest_first(names, bool(local)):
            job = (_defconfig_rows, name, remote, None, world_size, settings) if on_gpus else (
                _cpu_rows, name, local, world_size, untimed)
            futures[pool.submit(*job)] = name
        progress = Progress(len(futures), label, unit="job")
        for future in as_completed(futures):
            name = futures[future]
            rows = future.result()
            done[name] += rows
            where = "this CPU" if rows and rows[0].machine == "cpu" else f"{len(rows)} machine(s)"
            progress.completed(f"{name} on {where}", f"({time.perf_counter() - start:.1f}s in all)")
        progress.close()
    order = [key for key, _ in targets]
    return [row for name in names for row in sorted(done[name], key=lambda r: order.index(r.machine))]


def _longest_first(names: list[str], cpu: bool) -> list[tuple[str, bool]]:
    """(defconfig, on the GPUs or this CPU) in an order that lets a pool finish soonest, the longest jobs
    first: the language models on the GPUs (their plans trace the most: 8-14 s here for a Llama 3 or GPT-2
    124M on 20 GPUs), then on this CPU (4-8 s), then the others, the largest first by the registry's
    tier_scale (samples a step relative to GPT-2: the fewer, the larger the model; a factory's counted as
    GPT-2), each on this CPU before the GPUs (ResNet-50 about 4 s each, LeNet-5 under 1 s), so that the last
    jobs to start are short."""
    from .models.registry import spec_for

    with tempfile.TemporaryDirectory() as tmp:
        specs = {name: spec_for(kconfig.make_defconfig(name, out=Path(tmp) / name).model) for name in names}

    def key(job: tuple[str, bool]):
        spec, on_gpus = specs[job[0]], job[1]
        if spec.text:
            return (0, not on_gpus, 0.0)
        return (1, spec.tier_scale or 1.0, on_gpus)

    jobs = [(name, True) for name in names] + [(name, False) for name in names if cpu]
    return sorted(jobs, key=key)


# Models that outgrow one device, planned for several processes: (defconfig, preset fragment, GPU, processes).
# (defconfig, assignment, catalog GPU, GPUs per machine, machines)
SCALE_OUT = (("gpt2", "CONFIG_GPT2_PRESET_774M=y", "a10g", 4, 1), ("gpt2", "CONFIG_GPT2_PRESET_1558M=y", "a10g", 4, 1),
             ("gpt2", "CONFIG_GPT2_PRESET_1558M=y", "h100", 8, 2))


def scale_out_rows(policy=None, *, settings: "Settings | None" = None) -> list[MatrixRow]:
    """The SCALE_OUT plans: each process's share of a model a replica would not fit (lib.planning.strategy picks DDP
    or a sharded strategy), with progress like plan_matrix; settings as recommendations'."""
    from .hardware import resolve_hardware

    rows = []
    progress = Progress(len(SCALE_OUT), "plan-matrix (scale-out)", policy)
    with tempfile.TemporaryDirectory() as tmp:
        for name, assignment, gpu, processes, nodes in SCALE_OUT:
            (Path(tmp) / "fragment").write_text(assignment + "\n")
            config = kconfig.make_defconfig(name, [str(Path(tmp) / "fragment")], out=Path(tmp) / "config")
            label = model_label(config)
            machine = f"{gpu} x{processes}" if nodes == 1 else f"{nodes} x {gpu} x{processes}"
            with progress.item(f"{label} on {machine}"):
                try:
                    plan = make_plan(config, resolve_hardware(gpu=gpu, gpus=processes), world_size=processes * nodes,
                                     policy=policy, nodes=nodes, settings=settings).plan
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
        table.append((r.defconfig, r.machine, p.split.compact(), str(p.split.count), str(p.effective_batch),
                      str(p.eval_batch), "on" if p.compile else "off", p.precision, p.strategy,
                      size(p.predicted_peak_bytes), size(p.budget_bytes), share))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i < 2 or i in (6, 7, 8) else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in table]
    return "\n".join(lines)


# --------------------------------------------------------------------------
# The HTML report
#
# Sizes on the page are binary and written so (GiB, MiB), as the trainer's progress line writes them;
# the page says once that 1 GiB = 2^30 bytes. Charts are SVGs with a viewBox drawn at width 100%, so
# they shrink with the window; their labels live in HTML legends under them, where they cannot collide
# with a curve.


def _binary_size(n: int | None) -> str:
    """For the HTML page: '1.23 GiB', '37.1 MiB'; a negative term (CPU offload's) a GiB or more in GiB too."""
    if n is None:
        return "-"
    return "-" + format_bytes(-n, 1, sep=" ") if n <= -GiB else format_bytes(n, 1, sep=" ")


def _color(name: str) -> str:
    return COLORS.get(name) or OVERHEAD_COLORS.get(name, OVERHEAD_COLOR)


def _ordered(names) -> list[str]:
    """Breakdown categories in CATEGORY_ORDER (unknown ones after, by name), whatever order a plan has."""
    rank = {name: i for i, name in enumerate(CATEGORY_ORDER)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))


def _breakdown_bar(plan: Plan, width: int = 500, height: int = 22) -> dict:
    """Stacked bar of the breakdown (full width = the positive terms, which are the peak unless some
    state is offloaded) and the peak's share of the budget."""
    parts = {k: v for k, v in plan.memory_breakdown.items() if v > 0}
    total = sum(parts.values()) or 1
    x, segments = 0.0, []
    for name in _ordered(parts):
        w = parts[name] * width / total
        segments.append({"x": round(x, 1), "w": round(w, 2), "color": _color(name), "name": name,
                         "size": _binary_size(parts[name])})
        x += w
    share = plan.predicted_peak_bytes / plan.budget_bytes
    return {"width": width, "height": height, "segments": segments, "share": f"{share:.1%}",
            "share_w": round(min(1.0, share) * width, 1)}


def _breakdown_legend(plans: list[Plan]) -> list[list[tuple[str, str, str]]]:
    """Per plan, (category, size, colour) for every category any plan has, in one order: each legend
    entry then sits in the same place on every card (size None where a plan lacks the category)."""
    names = _ordered({k for p in plans for k in p.memory_breakdown})
    return [[(n, _binary_size(p.memory_breakdown[n]) if n in p.memory_breakdown else None, _color(n))
             for n in names] for p in plans]


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Round steps (1, 2, 2.5, 5 x 10^k) from 0 up to `top`, about `count` of them."""
    raw = top / count
    step = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * step for m in (1, 2, 2.5, 5, 10) if m * step >= raw)
    return [i * step for i in range(int(top / step + 1e-9) + 1)]


def _fit(points: list[tuple[int, int]]):
    """Least squares through the traced points: peak ~ a + slope * batch."""
    n = len(points)
    mean_b, mean_p = sum(b for b, _ in points) / n, sum(p for _, p in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points) or 1
    slope = sum((b - mean_b) * (p - mean_p) for b, p in points) / var
    return lambda b: mean_p + slope * (b - mean_b)


def _zero_crossing(fit, xmax: float) -> float:
    """Where the fit line enters the chart (y >= 0): 0 unless its intercept is negative."""
    slope = (fit(xmax) - fit(0)) / xmax
    return 0.0 if fit(0) >= 0 or slope <= 0 else min(xmax, -fit(0) / slope)


BUDGET_IN_VIEW = 1.6  # draw the budget when it is at most this many times the data's top, else note it


def _peak_curve(points: list[tuple[int, int]], plan: Plan, width: int = 500, height: int = 230) -> dict:
    """Peak vs batch: traced points, the straight-line fit through them, the budget, the chosen micro-batch.

    The y axis spans what the chart shows, from 0: a 30 MiB model under a 16 GiB budget would otherwise
    be a flat line at 0. The budget is drawn only when it is near that range; else the legend says how far
    above it is."""
    pad_l, pad_b, pad_t, pad_r = 52, 36, 10, 12
    # Around the decision: twice the memory cap when memory binds, else a few times the batch used.
    binding = plan.max_micro_batch and plan.max_micro_batch < plan.micro_batch * 2 and \
        "would need" in plan.reasons["micro_batch"]
    xmax = 2 * plan.max_micro_batch if binding else 4 * plan.micro_batch
    shown = [(b, p) for b, p in points if b <= xmax]
    fit = _fit(points)
    data_top = max(max(p for _, p in shown), fit(xmax), plan.predicted_peak_bytes)
    budget_drawn = plan.budget_bytes <= BUDGET_IN_VIEW * data_top
    ymax = 1.08 * (max(data_top, plan.budget_bytes) if budget_drawn else data_top)
    sx = lambda b: round(pad_l + b / xmax * (width - pad_l - pad_r), 1)  # noqa: E731
    sy = lambda y: round(height - pad_b - y / ymax * (height - pad_b - pad_t), 1)  # noqa: E731
    unit, div = ("GiB", 2**30) if ymax >= 2 * 2**30 else ("MiB", 2**20)  # ticks of 0.25 GiB read worse
    x0 = _zero_crossing(fit, xmax)
    budget = _binary_size(plan.budget_bytes)
    return {"width": width, "height": height, "left": pad_l, "bottom": height - pad_b, "right": width - pad_r,
            "top": pad_t, "unit": unit, "line": " ".join(f"{sx(b)},{sy(p)}" for b, p in shown),
            "fit": {"x1": sx(x0), "y1": sy(max(0.0, fit(x0))), "x2": sx(xmax), "y2": sy(fit(xmax))},
            "dots": [{"x": sx(b), "y": sy(p), "title": f"batch {b}: {_binary_size(p)}"} for b, p in shown],
            "budget_y": sy(plan.budget_bytes) if budget_drawn else None,
            "budget": budget if budget_drawn else
            f"{budget}, above the chart ({plan.budget_bytes / data_top:.0f}\u00d7 its largest value)",
            "chosen": {"x": sx(plan.micro_batch), "y": sy(plan.predicted_peak_bytes),
                       "label": f"micro-batch {plan.micro_batch}: {_binary_size(plan.predicted_peak_bytes)}"},
            "yticks": [{"y": sy(t * div), "label": f"{t:g}"} for t in nice_ticks(ymax / div)],
            "xticks": [{"x": sx(t), "label": f"{t:g}"} for t in nice_ticks(xmax)]}


def _curve_points(config: kconfig.Config, plan: Plan) -> list[tuple[int, int]]:
    """Predicted peaks at the batch sizes the planner traced (all cached), plus 1 and the chosen one."""
    from .planning.memory_policy import PLANNER

    from .threads import using_threads

    predictor = PLANNER.predictor
    # at the plan's threads: a CPU trace is keyed by them (the planner's traces are the cached ones)
    with using_threads(plan.cpu_threads if plan.device_type == "cpu" else None):
        batches = predictor.cached_batches(config, device_type=plan.device_type, precision=plan.precision)
        return [(b, predictor.predict(config, batch=b, device_type=plan.device_type, precision=plan.precision,
                                      compile_mode=plan.compile_mode).peak_bytes)
                for b in sorted(set(batches) | {1, plan.micro_batch})]


def _columns(rows: list[MatrixRow], focus: str) -> list[str]:
    """The matrix's machines: the focus first (it is the one detailed below), the CPU last."""
    return sorted({r.machine for r in rows}, key=lambda m: (m != focus, m == "cpu", m))


def check_writable(out: Path, variable: str = "OUT") -> None:
    """A KfitError unless `out` can be written: checked before a minute of planning, not after it."""
    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise KfitError(f"{variable}={out} is a directory: name a file in it, e.g. {variable}={out / 'report.html'}")
    if not parent.is_dir():
        raise KfitError(f"{variable}={out}: {parent} {'is not a directory' if parent.exists() else 'does not exist'}"
                        ": create that directory, or name a file in an existing one")
    try:  # by trying: permissions alone do not tell (root, read-only or special file systems)
        if os.path.lexists(out):  # appends nothing: the file is unchanged; a link, FIFO or device is refused
            os.close(fileio.open_nofollow(out, os.O_WRONLY | os.O_APPEND))
        else:
            fd, probe = tempfile.mkstemp(prefix=".kfit-", dir=parent)
            os.close(fd)
            os.unlink(probe)
    except fileio.UnsafeFileError:
        raise
    except OSError as err:
        raise KfitError(f"{variable}={out} cannot be written ({err.strerror}): name a file in a directory you "
                        "can write to") from None


def render_report(rows: list[MatrixRow], focus: str, out: Path) -> Path:
    """Write the self-contained HTML report: the matrix, then per defconfig its plan on `focus`."""
    import jinja2

    from .planning.memory_policy import PLANNER

    cards = []
    shown = [r for r in rows if r.machine == focus and r.plan is not None and r.plan.predicted_peak_bytes is not None]
    progress = Progress(len(shown), "plan-report charts", unit="chart")
    with tempfile.TemporaryDirectory() as tmp:
        for r in shown:
            config = kconfig.make_defconfig(r.defconfig, out=Path(tmp) / f"{r.defconfig}.config")
            with progress.item(f"{r.defconfig} on {focus}"):
                points = _curve_points(config, r.plan)
            cards.append({"defconfig": r.defconfig, "plan": r.plan, "bar": _breakdown_bar(r.plan),
                          "curve": _peak_curve(points, r.plan)})
    progress.close()
    for card, legend in zip(cards, _breakdown_legend([c["plan"] for c in cards])):
        card["breakdown"] = legend
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    page = env.get_template("plan_report.html.j2").render(
        rows=rows, focus=focus, cards=cards, size=_binary_size, machines=_columns(rows, focus),
        defconfigs=sorted({r.defconfig for r in rows}), generated=datetime.now().strftime("%Y-%m-%d %H:%M"),
        cache=str(PLANNER.predictor.cache_dir))
    try:
        fileio.write_text(out, page)
    except fileio.UnsafeFileError:
        raise
    except OSError as err:  # checked before the work (check_writable), but the disk may have filled since
        raise KfitError(f"cannot write the report to {out} ({err.strerror}): free space or choose another "
                        "OUT=") from None
    return out
