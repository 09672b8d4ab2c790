"""The resolver: (config, hardware, model, world size) -> Plan, a pure function.

Order matters: device, then precision, compile and TF32 (the batch depends on
whether compile is on), then the largest micro-batch that fits from a
swappable batch policy, then (the memory planner) the micro-batch up to it,
and gradient checkpointing on or off, with the highest samples/s that
lib.steptime predicts, and gradient accumulation so that

    effective batch = micro-batch x accumulation x world size

equals the target (a micro-batch that does not divide a process's share
makes the last one of each step short). World size is the number of training
processes (WORLD_SIZE under torchrun), not the number of GPUs in the machine.
Every plan ends with its predicted step time, samples/s, run time and energy
(`with_predictions`).

Nothing here detects hardware or reads files; `apply_hyperparams` is the
convenience entry (the seed's name) that detects, resolves and prints.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from .config import Config
from .errors import PlanError
from .hardware import GPUInfo, HardwareProfile, gib
from .fastest import CHECKPOINTING_MODELS, choose_fastest, with_predictions
from .parallel import is_sharded
from .plan import BatchChoice, BatchPolicy, ModelDescription, Plan  # noqa: F401  (the resolver's API)
from .strategy import candidates as strategy_candidates, pick as pick_strategy
from .threads import decide_cpu_threads, decide_loader_workers, using_threads

# GPUs where torch.compile is known to misbehave (the primary seed's list).
COMPILE_DENY = {
    "W7900": "known ROCm torch.compile issues on the Radeon PRO W7900",
    "MI210": "torch.compile stability issues on the Instinct MI210",
}


# --------------------------------------------------------------------------
# The seed's tier policy (CONFIG_HYPER_PARAM_POLICY_TIERS); lib.planner holds the default one.

# The seed's per-model scale factors: samples per step relative to GPT-2.
MODEL_SCALE = {"gpt2": 1.0, "resnet50": 1.5, "resnet18": 2.0, "lenet5": 4.0}

# The seed's tiers: (usable GiB at least, batch with compile on, batch with compile off).
MEMORY_TIERS = ((128, 256, 128), (64, 128, 64), (32, 32, 16), (16, 16, 8), (8, 8, 4), (4, 4, 2), (0, 2, 1))

CPU_BASE_BATCH = 16


@dataclass(frozen=True)
class TierPolicy:
    """The primary seed's heuristic: 80% of free memory, a tier table, a model scale factor."""

    name: str = "tiers"
    safety: float = 0.8

    def max_micro_batch(self, *, hardware, model, device_type, compile, precision):
        scale = MODEL_SCALE.get(model.name, 1.0)  # a custom model: as GPT-2, the most conservative
        if device_type == "cpu":
            batch = int(CPU_BASE_BATCH * scale)
            return batch, f"CPU base batch {CPU_BASE_BATCH} x {model.name} scale {scale:g} = {batch}"
        gpu = hardware.primary_gpu
        usable = gib(gpu.free_bytes) * self.safety
        for floor, with_compile, without in MEMORY_TIERS:
            if usable >= floor:
                base = with_compile if compile else without
                break
        batch = max(1, int(base * scale))
        tier = f"{floor}GiB+" if floor else "<4GiB"
        return batch, (f"{gib(gpu.free_bytes):.1f}GiB free x {self.safety:.0%} = {usable:.1f}GiB usable -> "
                       f"tier {tier}, base {base} (compile {'on' if compile else 'off'}) x {model.name} "
                       f"scale {scale:g} = {batch}")

    def choose(self, *, hardware, model, device_type, compile, precision, **_) -> BatchChoice:
        cap, why = self.max_micro_batch(hardware=hardware, model=model, device_type=device_type,
                                        compile=compile, precision=precision)
        return BatchChoice(max_micro=cap, reason=why, eval_batch=2 * cap, eval_reason=(
            "twice the largest safe micro-batch: evaluation keeps no activations for backward"))


DEFAULT_POLICY = TierPolicy()


def policy_for(config: Config) -> BatchPolicy:
    """The batch policy AUTO mode selects: CONFIG_HYPER_PARAM_POLICY_PLANNER (default) or _TIERS."""
    if config.hyperparam_policy == "tiers":
        return DEFAULT_POLICY
    from .planner import PLANNER

    return PLANNER


# --------------------------------------------------------------------------
# The decisions, in order.


def decide_device(config: Config, hardware: HardwareProfile) -> tuple[str, str]:
    accel = hardware.accelerator
    if config.device == "cpu":
        return "cpu", "CONFIG_DEVICE_CPU: training on the CPU as configured"
    if config.device == "cuda":
        if accel not in ("cuda", "rocm"):
            why = "; ".join(hardware.notes) or "this machine has no CUDA or ROCm GPU that torch can use"
            raise PlanError(f"CONFIG_DEVICE_CUDA is set but {why}. Select CONFIG_DEVICE_AUTO (falls back to "
                            "the CPU) or CONFIG_DEVICE_CPU, or install a CUDA/ROCm build of torch (README).")
        return "cuda", f"CONFIG_DEVICE_CUDA: {hardware.primary_gpu.name}"
    if accel in ("cuda", "rocm"):
        return "cuda", f"AUTO: {accel.upper()} GPU {hardware.primary_gpu.name} found"
    if accel == "mps":
        return "mps", "AUTO: Apple MPS found"
    return "cpu", "AUTO: no GPU that torch can use" + (f" ({'; '.join(hardware.notes)})" if hardware.notes else "")


def decide_precision(config: Config, device_type: str, gpu: GPUInfo | None) -> tuple[str, str]:
    if config.precision == "bf16" and device_type == "cuda" and not gpu.supports_bf16:
        raise PlanError(f"CONFIG_PRECISION_BF16 is set but {gpu.name} does not support bfloat16. "
                        "Select CONFIG_PRECISION_AUTO (fp16 with gradient scaling here) or CONFIG_PRECISION_FP16.")
    if config.precision != "auto":
        return config.precision, f"CONFIG_PRECISION_{config.precision.upper()} as configured"
    if device_type == "cuda":
        if gpu.supports_bf16:
            return "bf16", f"AUTO: {gpu.name} supports bfloat16"
        return "fp16", f"AUTO: {gpu.name} lacks bfloat16: float16 with a gradient scaler"
    if device_type == "mps":
        return "fp32", "AUTO: float32 on Apple MPS (autocast there is limited)"
    return "fp32", "AUTO: float32 on the CPU"


def auto_detect_compile(config: Config, device_type: str, gpu: GPUInfo | None) -> tuple[bool, str | None, str]:
    """Whether to torch.compile, the mode, and why (the seed's auto_detect_compile)."""
    if config.compile_mode == "manual":
        if config.compile_model:
            return True, config.compile_kind, f"MANUAL: CONFIG_COMPILE_MODEL=y, mode {config.compile_kind}"
        return False, None, "MANUAL: CONFIG_COMPILE_MODEL is not set"
    if device_type == "cpu":
        return False, None, ("Disabled (CPU: torch.compile was measured slower than eager for these models "
                             "on CPUs, after a 20+ s first compile)")
    if device_type == "mps":
        return False, None, "Disabled (Apple MPS: torch.compile support is immature)"
    for key, why in COMPILE_DENY.items():
        if key in gpu.name.upper():
            return False, None, f"Disabled (GPU '{gpu.name}' is on the deny list: {why})"
    if gpu.vendor == "nvidia" and (gpu.compute_capability or (0, 0)) < (7, 0):
        cc = ".".join(map(str, gpu.compute_capability or (0, 0)))
        return False, None, f"Disabled (GPU '{gpu.name}' has compute capability {cc}; Triton needs 7.0+)"
    return True, "default", f"Enabled (GPU '{gpu.name}' has good torch.compile support)"


def calculate_gradient_accumulation(target: int, max_micro: int, world_size: int = 1) -> tuple[int, int, str]:
    """Split a target effective batch into (micro-batch, accumulation), and explain.

    When the target divides evenly among the processes, the effective batch is
    exactly the target: the micro-batch is the largest divisor of the
    per-process share that fits. Otherwise the micro-batch and accumulation
    that come closest are used, and the reason says how far off.
    """
    if world_size < 1 or max_micro < 1 or target < 1:
        raise ValueError("target, max_micro and world_size must be >= 1")
    if target % world_size == 0:
        share = target // world_size
        micro = next(m for m in range(min(max_micro, share), 0, -1) if share % m == 0)
        why = f"{share} per process / micro-batch {micro}"
        if 2 * micro < min(max_micro, share):
            why += (f"; the target has no divisor between {min(max_micro, share) // 2} and "
                    f"{min(max_micro, share)}, so the micro-batch is small: a target such as "
                    f"{math.ceil(share / max_micro) * max_micro * world_size} would run faster")
        return micro, share // micro, why
    if target < world_size:
        raise PlanError(f"the target effective batch {target} is smaller than the {world_size} processes: "
                        f"each process needs at least one sample; raise CONFIG_TARGET_EFFECTIVE_BATCH")
    best = None
    for micro in range(min(max_micro, target // world_size), 0, -1):
        accum = max(1, round(target / (micro * world_size)))
        error = abs(micro * accum * world_size - target)
        if best is None or error < best[0]:
            best = (error, micro, accum)
    _, micro, accum = best
    effective = micro * accum * world_size
    return micro, accum, (f"the target {target} is not divisible by the world size {world_size}: "
                          f"closest is {micro} x {accum} x {world_size} = {effective} "
                          f"({(effective - target) / target:+.1%})")


def decide_tf32(config: Config, gpu: GPUInfo | None, on_gpu: bool) -> tuple[bool, str]:
    if config.tf32 == "auto":
        tf32 = bool(on_gpu and gpu.supports_tf32)
        return tf32, "AUTO: " + (f"{gpu.name} has TF32 tensor cores" if tf32 else "no TF32 hardware")
    return config.tf32 == "on", f"CONFIG_TF32_{config.tf32.upper()}"


# FSDP2 keeps the gradients a process computes under set_requires_gradient_sync(False) whole (unsharded) until
# the sync: in the reduce dtype, fp32, for every parameter.
UNSHARDED_GRADIENT_BYTES = 4


def decide_gradient_sync(at, memory: dict) -> tuple[str, str, dict]:
    """Under FSDP with accumulation: reduce-scatter once per step when the whole gradients the earlier
    micro-batches keep fit beside the predicted peak, else after every micro-batch. Returns (gradient_sync,
    why, the memory fields with that term)."""
    whole = UNSHARDED_GRADIENT_BYTES * at.trace.parameters
    budget = memory["budget_bytes"]
    if budget is None or memory["predicted_peak_bytes"] + whole <= budget:
        breakdown = {**memory["memory_breakdown"], "accumulated_gradients": whole}
        return "step", (f"once per step: the {whole / 2**20:,.0f} MiB of whole fp32 gradients kept between "
                        "micro-batches fit the budget"), {
            **memory, "predicted_peak_bytes": memory["predicted_peak_bytes"] + whole, "memory_breakdown": breakdown}
    return "micro_batch", (f"after every micro-batch: keeping {whole / 2**20:,.0f} MiB of whole fp32 gradients "
                           "between micro-batches would not fit the budget"), memory


# The memory planner's refusal when even micro-batch 1 does not fit (lib/planner.py PlannerPolicy._no_fit).
NO_FIT = "does not fit even at micro-batch 1"


def resolve(config: Config, hardware: HardwareProfile, model: ModelDescription, world_size: int = 1,
            policy: BatchPolicy | None = None, nodes: int = 1) -> Plan:
    """The plan for training `model` under `config` on `hardware` with `world_size` processes over
    `nodes` machines, sharing the model as lib.strategy decides. Where the memory planner predicts that
    not even micro-batch 1 fits, the out-of-memory ladder's rungs that the config allows are taken before
    training (`planned_on_the_ladder`), as training would take them after running out of memory."""
    try:
        return _resolve(config, hardware, model, world_size, policy, nodes)
    except PlanError as err:
        if NO_FIT not in str(err):
            raise
        return planned_on_the_ladder(config, hardware, model, world_size, policy, nodes, err)


def ladder_configs(config: Config, hardware: HardwareProfile) -> list[tuple[str, Config]]:
    """The ladder's rungs that apply before training, each with the config that takes it and those before it
    (lib/trainer/ladder.py has the order): checkpointing on, then bf16 (fp16 on a GPU without it) autocast."""
    device_type, _ = decide_device(config, hardware)
    gpu = hardware.primary_gpu if device_type == "cuda" else None
    steps, current = [], config
    if "checkpointing" in config.oom_ladder and not config.gradient_checkpointing \
            and config.model in CHECKPOINTING_MODELS:
        current = dataclasses.replace(current, gradient_checkpointing=True)
        steps.append(("gradient checkpointing on", current))
    if "autocast" in config.oom_ladder and config.precision == "auto" and device_type in ("cuda", "cpu") \
            and decide_precision(config, device_type, gpu)[0] == "fp32":
        current = dataclasses.replace(current, precision="bf16")  # fp32 under AUTO: a CPU, or a GPU with bf16
        steps.append(("bf16 autocast", current))
    return steps


def planned_on_the_ladder(config: Config, hardware: HardwareProfile, model: ModelDescription, world_size: int,
                          policy: BatchPolicy | None, nodes: int, no_fit: PlanError) -> Plan:
    """The plan with the fewest of the ladder's rungs under which micro-batch 1 is predicted to fit; `no_fit`
    (the planner's refusal, with what would help) when none does."""
    taken: list[str] = []
    for what, rung_config in ladder_configs(config, hardware):
        taken.append(what)
        try:
            plan = _resolve(rung_config, hardware, model, world_size, policy, nodes)
        except PlanError as err:
            if NO_FIT not in str(err):
                raise
            continue
        why = f"out-of-memory ladder: micro-batch 1 is predicted not to fit without {', '.join(taken)}"
        reasons = {**plan.reasons, "oom_ladder": f"before training: {', '.join(taken)}"}
        for key, rung in (("gradient_checkpointing", "gradient checkpointing on"), ("precision", "bf16 autocast")):
            if rung in taken:
                reasons[key] = f"AUTO, {why}"
        note = f"the memory planner predicts that not even micro-batch 1 fits as configured: {why} " \
               "(CONFIG_OOM_LADDER_*)"
        return dataclasses.replace(plan, notes=(*plan.notes, note), reasons=reasons)
    raise no_fit


def _resolve(config: Config, hardware: HardwareProfile, model: ModelDescription, world_size: int = 1,
             policy: BatchPolicy | None = None, nodes: int = 1) -> Plan:
    """resolve() as configured, without the ladder.

    `policy` defaults to the one the config selects (`policy_for`). The planner
    reads and writes its trace cache, and lib.steptime its counts, CPU figures
    and (on this machine's CPU, once) real micro-batch timings, which only
    changes how long this takes.
    """
    if world_size < 1:
        raise PlanError(f"world size must be at least 1, got {world_size}")
    if nodes < 1 or world_size % nodes:
        raise PlanError(f"{world_size} processes cannot be spread evenly over {nodes} machines")
    notes: list[str] = []
    reasons: dict[str, str] = {}
    hardware, mixed = hardware.for_processes(world_size // nodes)  # mixed GPUs: the smallest, for every process
    if mixed:
        notes.append(mixed)

    device_type, reasons["device"] = decide_device(config, hardware)
    gpu = hardware.primary_gpu if device_type in ("cuda", "mps") else None
    on_gpu = device_type == "cuda"
    precision, reasons["precision"] = decide_precision(config, device_type, gpu)
    compile_on, compile_mode, reasons["compile"] = auto_detect_compile(config, device_type, gpu)
    tf32, reasons["tf32"] = decide_tf32(config, gpu, on_gpu)
    idle = hardware.cpu.idle_cores  # step timings taken while planning run at the threads training will
    cpu_threads, reasons["cpu_threads"] = decide_cpu_threads(config, device_type, hardware, world_size,
                                                             idle_cores=idle)
    workers, reasons["workers"] = decide_loader_workers(config, device_type, hardware, world_size, idle_cores=idle)
    timing_threads = cpu_threads if device_type == "cpu" else None

    if device_type == "cuda" and world_size > hardware.identical_gpu_count and hardware.identical_gpu_count:
        notes.append(f"{world_size} processes but only {hardware.identical_gpu_count} identical GPU(s): "
                     "processes will share GPUs or use different models")

    memory: dict = {}
    sync = "step"
    checkpointing = config.gradient_checkpointing
    speed_model = None
    offload = bool(config.fsdp_cpu_offload and device_type == "cuda")
    if config.hyperparam_mode == "manual":
        options, reasons["strategy"] = strategy_candidates(config, world_size, nodes)
        strategy = options[0]
        if len(options) > 1:
            reasons["strategy"] = "AUTO without the memory planner (MANUAL batch): DDP"
        micro, accum = config.batch_size, config.gradient_accumulation
        target = None
        policy_name = "manual"
        reasons["micro_batch"] = "MANUAL: CONFIG_BATCH_SIZE"
        reasons["grad_accum"] = "MANUAL: CONFIG_GRADIENT_ACCUMULATION"
        if config.eval_batch_size:
            eval_batch, reasons["eval_batch"] = config.eval_batch_size, "MANUAL: CONFIG_EVAL_BATCH_SIZE"
        else:
            eval_batch = 2 * micro
            reasons["eval_batch"] = "twice the micro-batch: evaluation keeps no activations for backward"
        effective = micro * accum * world_size
    else:
        target = config.target_effective_batch
        policy = policy or policy_for(config)
        policy_name = policy.name
        choose = dict(hardware=hardware, model=model, device_type=device_type, compile=compile_on,
                      compile_mode=compile_mode, precision=precision, world_size=world_size, target=target,
                      local_world_size=world_size // nodes, cpu_offload=offload)

        def speed(strategy: str, choice: BatchChoice):
            """The memory planner: the fastest micro-batch that fits under `strategy`, with its samples/s."""
            if choice.predict is None or target % world_size:
                return None
            try:
                with using_threads(timing_threads):
                    fast = choose_fastest(config, hardware, policy, choice, device_type=device_type,
                                          precision=precision, tf32=tf32, compile_on=compile_on,
                                          world_size=world_size, target=target, strategy=strategy,
                                          local_world_size=world_size // nodes,
                                          choose={**choose, "strategy": strategy})
            except Exception as err:  # noqa: BLE001 - a step-time failure must not stop planning
                note = (f"step time not predicted ({type(err).__name__}: {err}); the micro-batch is the "
                        "largest that divides the target")
                if note not in notes:
                    notes.append(note)
                return None
            return (fast[0].samples_per_second, fast) if fast is not None else None

        strategy, choice, fast, reasons["strategy"] = pick_strategy(
            config, policy, choose, world_size=world_size, nodes=nodes, target=target, speed=speed)
        cap, reasons["micro_batch"] = choice.max_micro, choice.reason
        if fast is not None:
            best, option, speed_model, why = fast
            micro, accum, checkpointing, choice = best.micro_batch, best.grad_accum, option.checkpointing, option.choice
            share = target // world_size
            reasons["micro_batch"] = f"{choice.reason}; {why}"
            last = share - (accum - 1) * micro
            reasons["grad_accum"] = f"{share} per process / micro-batch {micro}" + (
                f": {accum - 1} x {micro} + {last} (the short one weighs its samples)" if last != micro else "")
            effective = target
        else:
            micro, accum, reasons["grad_accum"] = calculate_gradient_accumulation(target, cap, world_size)
            if micro < cap:
                reasons["micro_batch"] += f"; {micro} used (largest that divides the target)"
            effective = micro * accum * world_size
        eval_batch, reasons["eval_batch"] = choice.eval_batch, choice.eval_reason
        if choice.predict is not None:
            at = choice.predict(micro)
            memory = dict(max_micro_batch=choice.max_micro, predicted_peak_bytes=at.peak_bytes,
                          budget_bytes=choice.budget_bytes, memory_breakdown=at.breakdown,
                          eval_predicted_peak_bytes=choice.eval_peak_bytes)
            if is_sharded(strategy) and accum > 1:
                sync, reasons["gradient_sync"], memory = decide_gradient_sync(at, memory)
    if checkpointing != config.gradient_checkpointing:
        reasons["gradient_checkpointing"] = (
            f"AUTO: {'on' if checkpointing else 'off'} against CONFIG_GRADIENT_CHECKPOINTING="
            f"{'y' if config.gradient_checkpointing else 'n'}: predicted faster (see micro-batch)")
    else:
        reasons["gradient_checkpointing"] = f"CONFIG_GRADIENT_CHECKPOINTING={'y' if checkpointing else 'n'}"

    if config.cudnn_benchmark == "auto":
        cudnn_benchmark = on_gpu
        reasons["cudnn_benchmark"] = "AUTO: " + ("fixed input shapes on a GPU" if on_gpu else "not a CUDA device")
    else:
        cudnn_benchmark = config.cudnn_benchmark == "on"
        reasons["cudnn_benchmark"] = f"CONFIG_CUDNN_BENCHMARK_{config.cudnn_benchmark.upper()}"
    if compile_on and device_type == "cpu":
        notes.append("torch.compile on a CPU was measured slower than eager for small models here")
    if hardware.on_battery:
        notes.append("running on battery: training will be slower and drain it; plug in for long runs")

    plan = Plan(
        mode=config.hyperparam_mode, policy=policy_name, device_type=device_type, accelerator=(
            hardware.accelerator if device_type != "cpu" else "cpu"),
        device_name=gpu.name if gpu else hardware.cpu.name, world_size=world_size,
        micro_batch=micro, grad_accum=accum, effective_batch=effective, target_effective_batch=target,
        eval_batch=eval_batch, compile=compile_on, compile_mode=compile_mode, precision=precision,
        grad_scaler=precision == "fp16", tf32=tf32, cudnn_benchmark=cudnn_benchmark,
        gradient_checkpointing=checkpointing, num_workers=workers, cpu_threads=cpu_threads,
        pin_memory=on_gpu, model=model.name, reasons=reasons, notes=tuple(notes), strategy=strategy, nodes=nodes,
        cpu_offload=offload and is_sharded(strategy), gradient_sync=sync, **memory)
    with using_threads(timing_threads):
        return with_predictions(config, hardware, plan, speed_model)


# --------------------------------------------------------------------------
# The lines printed at training start.


def _model_label(model: ModelDescription) -> str:
    return f"{model.name}-{model.preset}" if model.preset else model.name


def summary_line(plan: Plan, hardware: HardwareProfile, model: ModelDescription) -> str:
    """The seed's one-line summary, e.g.
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
    head = f"Hyperparams: {plan.mode.upper()} mode - {where}, model={_model_label(model)}, " \
           f"compile={'ON' if plan.compile else 'OFF'} -> batch={plan.micro_batch}, grad_acc={plan.grad_accum} "
    if plan.mode == "auto":
        return head + f"(effective={plan.effective_batch}, target={plan.target_effective_batch})"
    return head + f"(effective={plan.effective_batch}, as configured)"


def compile_line(plan: Plan) -> str:
    return f"Compile: {plan.reasons['compile']}"


def world_size_from_env() -> int:
    """Training processes: WORLD_SIZE as torchrun sets it, else 1."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        size = int(value)
    except ValueError:
        raise PlanError(f"WORLD_SIZE={value!r} is not a whole number") from None
    if size < 1:
        raise PlanError(f"WORLD_SIZE={value!r} must be at least 1")
    return size


def apply_hyperparams(config: Config, verbose: bool = True, model_type: str | None = None,
                      hardware: HardwareProfile | None = None, world_size: int | None = None) -> Plan:
    """Detect the hardware, resolve the plan and print the seed's lines (the seed's entry point).

    Config is frozen, so the result is returned as a Plan rather than written into the config.
    """
    from .hardware import detect

    model = ModelDescription.from_config(config)
    if model_type is not None and model_type != model.name:
        raise PlanError(f"model_type={model_type!r} but the config trains {model.name!r} (CONFIG_MODEL_"
                        f"{model.name.upper()}): pass the configured model or change the config")
    hardware = hardware or detect()
    plan = resolve(config, hardware, model, world_size or world_size_from_env())
    if verbose:
        print(summary_line(plan, hardware, model))
        print(compile_line(plan))
        for note in plan.notes:
            print(f"Note: {note}")
    return plan
