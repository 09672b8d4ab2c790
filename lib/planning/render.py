"""How a plan reads: the line training starts with, the compile line, the memory lines. One place, so the
command line, the Python API and the facade in lib/hyperparams.py print the same words."""

from __future__ import annotations

from ..config import Config
from ..hardware import HardwareProfile, gib
from ..plan import ModelDescription, Plan
from ..units import format_bytes


def model_label(model: ModelDescription) -> str:
    return f"{model.name}-{model.preset}" if model.preset else model.name


def summary_line(plan: Plan, hardware: HardwareProfile, model: ModelDescription) -> str:
    """The one line training starts with, e.g.
    Hyperparams: AUTO mode - GPU: NVIDIA H100 (80.0GB total, 72.3GB free) x 1, model=resnet18, compile=ON
    -> batch=64, grad_acc=8 (effective=512, target=512)

    batch x grad_acc x processes is the effective batch: where the last micro-batch of a step is short, the
    batch says so ('batch=21 (last 8), grad_acc=25': 21 x 24 + 8 = 512; lib.units.batch_split)."""
    if plan.device_type == "cpu":
        where = (f"CPU: {hardware.cpu.name} ({hardware.cpu.physical_cores} cores, "
                 f"{gib(hardware.cpu.ram_available_bytes):.1f}GiB RAM free)"
                 + (f" x {plan.world_size} processes" if plan.world_size > 1 else ""))
    else:
        gpu = hardware.primary_gpu
        where = (f"GPU: {gpu.name} ({gib(gpu.total_bytes):.1f}GiB total, {gib(gpu.free_bytes):.1f}GiB free) "
                 f"x {plan.world_size}")
    split = plan.split
    head = f"Hyperparams: {plan.mode.upper()} mode - {where}, model={model_label(model)}, " \
           f"compile={'ON' if plan.compile else 'OFF'} -> batch={split.compact()}, grad_acc={split.count} "
    target = f"target={plan.target_effective_batch}" if plan.mode == "auto" else "as configured"
    return head + f"(effective={plan.effective_batch}, {target})"


def compile_line(plan: Plan) -> str:
    return f"Compile: {plan.reasons['compile']}"


def start_lines(plan: Plan, hardware: HardwareProfile, model: ModelDescription, *, threads: bool = True) -> list[str]:
    """What training prints before it starts: the summary, compile, CPU threads and the plan's notes."""
    lines = [summary_line(plan, hardware, model), compile_line(plan)]
    if threads:
        lines.append(f"CPU threads: {plan.cpu_threads} ({plan.reasons['cpu_threads']})")
    return lines + [f"Note: {note}" for note in plan.notes]


def size(n: int | None) -> str:
    if n is None:
        return "-"
    return format_bytes(n, 1)


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


def format_plan(plan: Plan, config: Config, hardware: HardwareProfile, model: ModelDescription) -> str:
    """The plan as a table: each decision, its value and why; the predicted time and memory; the notes."""
    target = f" (target {plan.target_effective_batch})" if plan.target_effective_batch else " (MANUAL)"
    split = plan.split
    rows = [
        ("device", f"{plan.device_type} ({plan.device_name})", plan.reasons["device"]),
        ("precision", plan.precision + (" + grad scaler" if plan.grad_scaler else ""), plan.reasons["precision"]),
        *([("float8", f"{plan.float8} linear layers", plan.reasons.get("float8", ""))] if plan.float8 else []),
        ("compile", f"on ({plan.compile_mode})" if plan.compile else "off", plan.reasons["compile"]),
        ("micro-batch", split.compact(), plan.reasons["micro_batch"]),
        ("grad accumulation", str(split.count), plan.reasons["grad_accum"]),
        ("effective batch", f"{plan.effective_batch}{target}", f"each step {split.text()}"),
        *([("processes", f"{plan.world_size // plan.nodes} x {plan.nodes} machines",
             f"{plan.world_size // plan.nodes} per machine on each of {plan.nodes} machines = {plan.world_size}")]
          if plan.nodes > 1 else []),
        *([("tensor parallel", f"{plan.tensor_parallel} per group", plan.reasons["tensor_parallel"])]
          if plan.tensor_parallel > 1 or plan.reasons.get("tensor_parallel", "").startswith("AUTO") else []),
        *([_pipeline_row(plan)] if plan.pipeline_parallel > 1
          or plan.reasons.get("pipeline_parallel", "").startswith("AUTO") else []),
        *([("context parallel", f"{plan.context_parallel} per group" if plan.context_parallel > 1 else "none",
            plan.reasons["context_parallel"])]
          if plan.context_parallel > 1 or plan.reasons.get("context_parallel", "").startswith("AUTO") else []),
        ("strategy", plan.strategy + (" + CPU offload" if plan.cpu_offload else ""),
         plan.reasons.get("strategy", "")),
        *([("communication", "per step", plan.reasons["communication"])] if "communication" in plan.reasons else []),
        *([("gradient sync", f"per {plan.gradient_sync.replace('_', '-')}", plan.reasons["gradient_sync"])]
          if "gradient_sync" in plan.reasons else []),
        ("eval batch", str(plan.eval_batch), plan.reasons["eval_batch"]),
        ("tf32", "on" if plan.tf32 else "off", plan.reasons["tf32"]),
        ("cudnn benchmark", "on" if plan.cudnn_benchmark else "off", plan.reasons["cudnn_benchmark"]),
        ("loader workers", f"{plan.num_workers}{' + pinned memory' if plan.pin_memory else ''}"
         + (f", prefetch {plan.prefetch_factor}" if plan.prefetch_factor else ""),
         plan.reasons["workers"]),
        ("cpu threads", str(plan.cpu_threads), plan.reasons["cpu_threads"]),
        ("checkpointing", "on" if plan.gradient_checkpointing else "off",
         plan.reasons.get("gradient_checkpointing", "")),
        *time_rows(plan),
    ]
    lines = [f"Plan for {config.source} ({model.name}{'-' + model.preset if model.preset else ''}) "
             f"on {hardware.source} hardware, policy {plan.policy}:"]
    width = max(len(r[0]) for r in rows)
    for name, value, why in rows:
        lines.append(f"  {name:<{width}}  {value:<18} {why}")
    lines += memory_lines(plan)
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)  # the one-line summary is training's start line: the table says it all here


def time_rows(plan: Plan) -> list[tuple[str, str, str]]:
    """The predicted step time, throughput, run time and energy (lib.steptime), or why there are none."""
    from ..monitor import format_seconds

    why = plan.reasons.get("step_time", "")
    if plan.predicted_step_seconds is None:
        return [("step time", "unknown", why)] if why else []
    energy = (f"{plan.predicted_energy_kwh:.2g} kWh" if plan.predicted_energy_kwh is not None else "unknown")
    return [("step time", f"{plan.predicted_step_seconds * 1e3:.1f} ms", why),
            ("throughput", f"{plan.predicted_samples_per_second:,.0f} samples/s", "over all processes"),
            ("run time", format_seconds(plan.predicted_run_seconds), "the configured epochs/steps, evaluations "
             "included (CONFIG_TIME_LIMIT caps it)"),
            ("energy", energy, "the device's power limit x the run time (an upper bound)"),
            *([("MFU", f"{plan.predicted_mfu:.1%}", plan.reasons.get("mfu", ""))]
              if plan.predicted_mfu is not None else [])]


def _pipeline_row(plan: Plan) -> tuple[str, str, str]:
    """The pipeline's stages and schedule, and the share of a step its bubble idles (lib/pipeline.py)."""
    from ..pipeline import bubble_share, micro_batches

    if plan.pipeline_parallel == 1:  # AUTO kept none
        return ("pipeline parallel", "none", plan.reasons["pipeline_parallel"])
    share = -(-plan.effective_batch // plan.data_parallel)
    n, size = micro_batches(share, plan.micro_batch, plan.pipeline_parallel, plan.pipeline_schedule)
    bubble = bubble_share(plan.pipeline_schedule, plan.pipeline_parallel, n)
    return ("pipeline parallel", f"{plan.pipeline_parallel} stages, {plan.pipeline_schedule}",
            f"{plan.reasons['pipeline_parallel']}; {n} micro-batches of {size} a step, the bubble "
            f"{bubble:.0%} of it")
