"""The plan's decisions before the batch: device, precision, compile, TF32, cuDNN's benchmark; and after it,
how a target effective batch splits into micro-batch x accumulation x processes, and when FSDP syncs gradients.

Each returns its value with the reason the plan shows beside it.
"""

from __future__ import annotations

import math

from ..config import Config
from ..errors import PlanError
from ..hardware import GPUInfo, HardwareProfile
from ..units import batch_split


# GPUs where torch.compile is known to misbehave.
COMPILE_DENY = {
    "W7900": "known ROCm torch.compile issues on the Radeon PRO W7900",
    "MI210": "torch.compile stability issues on the Instinct MI210",
}


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


def refuse_slow_precision(config: Config, device_type: str, precision: str) -> None:
    """A PlanError where the precision would train on torch's slow reference kernels: float16 convolutions on
    the CPU (no fast CPU kernel in torch: a 64-channel 3x3 convolution's forward and backward measured some
    200x slower than in float32 or bfloat16 on a 2-core Xeon with AVX512-FP16, LeNet-5's whole step 8x).
    float16 linear layers and attention run at float32's speed there, so language models keep it."""
    if device_type != "cpu" or precision != "fp16":
        return
    import torch

    from ..memory.fake import model_features
    from ..models.registry import spec_for
    from ..steptime.count import task_for

    task = task_for(config)  # loaded outside the meta device: its data is real
    with torch.device("meta"):
        model = task.build(False)
    if "conv" in model_features(model):  # the memory planner's own answer to "has it convolutions"
        raise PlanError(f"CONFIG_PRECISION_FP16 on the CPU: {spec_for(config.model).named}'s "
                        "convolutions have no fast float16 kernels there (a step runs several to hundreds of "
                        "times slower than in float32): select CONFIG_PRECISION_BF16 or CONFIG_PRECISION_AUTO")


def auto_detect_compile(config: Config, device_type: str, gpu: GPUInfo | None) -> tuple[bool, str | None, str]:
    """Whether to torch.compile, the mode, and why."""
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


# float8 tensor cores: NVIDIA's compute capability 8.9 (Ada: L4, L40S) and later (Hopper, Blackwell)
FLOAT8_CAPABILITY = (8, 9)


def decide_float8(config: Config, device_type: str, gpu: GPUInfo | None) -> tuple[str | None, str]:
    """The float8 recipe the linear layers train with (None: off), and why; a float8 choice on a device
    without float8 tensor cores is a PlanError naming the setting."""
    if config.float8 == "off":
        return None, "CONFIG_FLOAT8_OFF"
    symbol = f"CONFIG_FLOAT8_{config.float8.upper()}"
    capability = tuple(gpu.compute_capability) if gpu is not None and gpu.compute_capability else None
    if device_type != "cuda" or gpu is None or gpu.vendor != "nvidia" or capability is None \
            or capability < FLOAT8_CAPABILITY:
        where = (f"{gpu.name} (compute capability {capability[0]}.{capability[1]})" if capability else
                 gpu.name if gpu is not None and device_type != "cpu" else "this plan's device, the CPU,")
        raise PlanError(f"{symbol} needs float8 tensor cores (an NVIDIA GPU of compute capability 8.9 or later: "
                        f"L4, L40S, H100, H200, B200); {where} has none: set CONFIG_FLOAT8_OFF")
    return config.float8, (f"{symbol}: {gpu.name} (compute capability {capability[0]}.{capability[1]}) has "
                           "float8 tensor cores; the linear layers' matrix multiplies run in float8")


def _unsplit(name: str, degree: int, world_size: int, whole: str, verb: str, where: str = "") -> tuple[int, str] | None:
    """What a layout degree (CONFIG_TP, _PP, _CP) decides before its own checks: (1, why) where nothing is split
    (degree 1, or one process: the same run, whose checkpoints resume under the split and its under it); None
    where the degree's own checks follow. AUTO (0) is the resolver's (resolver._auto_layout), never here."""
    if degree == 0:
        raise ValueError(f"CONFIG_{name}=0 (AUTO) is resolved by trying each degree (resolver._auto_layout)")
    if degree == 1:
        return 1, f"CONFIG_{name}=1: {whole}"
    if world_size == 1:
        return 1, (f"one process: nothing to {verb} (CONFIG_{name}={degree} applies with {degree} or more "
                   f"processes{where})")
    return None


def tensor_parallel_candidates(config: Config, world_size: int, nodes: int) -> list[int]:
    """The degrees CONFIG_TP=0 (AUTO) plans: 1, and every power of two up to a machine's processes that
    divides them and splits the model (its family's TensorParallel.problem)."""
    from ..models.registry import spec_for

    support = spec_for(config.model).tensor_parallel
    per_machine = world_size // max(1, nodes)
    degrees, degree = [1], 2
    while support is not None and degree <= per_machine:
        if per_machine % degree == 0 and support.problem(config, degree) is None:
            degrees.append(degree)
        degree *= 2
    return degrees


def decide_tensor_parallel(config: Config, world_size: int, nodes: int, *, float8: str | None) -> tuple[int, str]:
    """Processes per tensor-parallel group (CONFIG_TP) and why; a degree this run cannot use is a PlanError
    naming the setting and what would do."""
    from ..models.registry import spec_for

    degree = config.tensor_parallel
    unsplit = _unsplit("TP", degree, world_size, "each process holds whole blocks", "split", " per machine")
    if unsplit:
        return unsplit
    symbol = f"CONFIG_TP={degree}"
    per_machine = world_size // nodes
    if per_machine % degree:
        raise PlanError(f"{symbol} needs groups of {degree} processes within one machine, but this run has "
                        f"{per_machine} per machine: set GPUS= (or CONFIG_NPROC) to a multiple of {degree}, or a "
                        "smaller CONFIG_TP")
    check = spec_for(config.model).tensor_parallel
    if check is None:
        raise PlanError(f"{symbol}: {spec_for(config.model).named} states no tensor-parallel "
                        "plan (Llama does): set CONFIG_TP=1")
    problem = check.problem(config, degree)
    if problem:
        raise PlanError(f"{symbol} cannot split this model: {problem}; set a CONFIG_TP that divides them")
    if world_size > degree and config.parallel_strategy == "ddp":
        raise PlanError(f"{symbol} with CONFIG_PARALLEL_DDP: DDP cannot replicate tensor-parallel blocks; set "
                        "CONFIG_PARALLEL_FSDP (or AUTO) to share the batch across the groups")
    if float8:
        raise PlanError(f"{symbol} with CONFIG_FLOAT8_{float8.upper()}: float8 linear layers are not yet split "
                        "with tensor parallelism; set CONFIG_FLOAT8_OFF or CONFIG_TP=1")
    groups = world_size // degree
    return degree, (f"{symbol}: {world_size} processes as {groups} tensor-parallel group(s) of {degree}, each "
                    "splitting every block's matrix multiplies and seeing the same samples")


def pipeline_candidates(config: Config, world_size: int, nodes: int) -> list[int]:
    """The degrees CONFIG_PP=0 (AUTO) plans: 1, and every power of two up to the machines that divides them and
    cuts the model (decide_pipeline's refusals aside): each stage whole machines, its traffic the network's."""
    from ..models.registry import spec_for
    from ..pipeline import pipeline_problem

    spec = spec_for(config.model).pipeline
    degrees, degree = [1], 2
    while spec is not None and degree <= nodes:
        blocks, tied, _ = spec(config)
        if nodes % degree == 0 and pipeline_problem(blocks, degree, config.pipeline_schedule, tied) is None:
            degrees.append(degree)
        degree *= 2
    return degrees


def decide_pipeline(config: Config, world_size: int, tensor: int, *, precision: str) -> tuple[int, str, str]:
    """Pipeline stages (CONFIG_PP), their schedule and why; a degree this run cannot use is a PlanError naming
    the setting and what would do."""
    from ..models.registry import spec_for
    from ..pipeline import pipeline_problem, stages_per_process

    degree, schedule = config.pipeline_parallel, config.pipeline_schedule
    unsplit = _unsplit("PP", degree, world_size, "every process holds every block", "cut")
    if unsplit:
        return unsplit[0], schedule, unsplit[1]
    symbol = f"CONFIG_PP={degree}"
    if world_size % (degree * tensor):
        unit = f"{degree} x CONFIG_TP={tensor}" if tensor > 1 else f"{degree}"
        raise PlanError(f"{symbol} needs a multiple of {unit} processes, but this run has {world_size}: set GPUS= "
                        f"(or CONFIG_NPROC, NNODES=) to a multiple of {degree * tensor}, or another CONFIG_PP")
    spec = spec_for(config.model)
    if spec.pipeline is None:
        raise PlanError(f"{symbol}: {spec.named} cannot be cut into pipeline stages (Llama can): "
                        "set CONFIG_PP=1")
    blocks, tied, _ = spec.pipeline(config)
    problem = pipeline_problem(blocks, degree, schedule, tied)
    if problem:
        fix = ("set CONFIG_LLAMA_TIE_EMBEDDINGS=n" if tied else "set a smaller CONFIG_PP or another schedule")
        raise PlanError(f"{symbol} cannot cut this model: {problem}; {fix}, or CONFIG_PP=1")
    if precision == "fp16":
        raise PlanError(f"{symbol} with fp16: the gradient scaler's overflow check would see one stage's gradients "
                        "only; set CONFIG_PRECISION_BF16 (or FP32), or CONFIG_PP=1")
    groups = world_size // (degree * tensor)
    if groups > 1 and config.parallel_strategy == "ddp":
        raise PlanError(f"{symbol} with CONFIG_PARALLEL_DDP: DDP cannot replicate a pipeline stage; set "
                        "CONFIG_PARALLEL_FSDP (or AUTO) to share the batch across the pipelines")
    stages = degree * stages_per_process(schedule)
    return degree, schedule, (f"{symbol}: {world_size} processes as {groups} pipeline(s) of {degree} x "
                              f"{world_size // degree} process(es); {blocks} blocks cut into {stages} stages"
                              + (" (two per process)" if stages > degree else ""))


def context_parallel_candidates(config: Config, world_size: int, nodes: int) -> list[int]:
    """The degrees CONFIG_CP=0 (AUTO) plans: 1, and each power of two up to a machine's processes that splits
    the context and leaves a process lib/context_parallel.py's MIN_TOKENS at least (decide_context_parallel's
    other refusals aside)."""
    from ..context_parallel import context_candidates
    from ..models.registry import spec_for

    support = spec_for(config.model).context_parallel
    if support is None:
        return [1]
    per_machine = world_size // max(1, nodes)
    return [d for d in context_candidates(support.shape(config)[0], per_machine) if per_machine % d == 0]


def decide_context_parallel(config: Config, world_size: int, nodes: int, tensor: int, pipeline: int, *,
                            device_type: str) -> tuple[int, str]:
    """Processes per context-parallel group (CONFIG_CP) and why; a degree this run cannot use is a PlanError
    naming the setting and what would do."""
    from ..context_parallel import context_problem, handles
    from ..models.registry import spec_for

    degree = config.context_parallel
    unsplit = _unsplit("CP", degree, world_size, "each process computes whole sequences", "split", " per machine")
    if unsplit:
        return unsplit
    symbol = f"CONFIG_CP={degree}"
    support = spec_for(config.model).context_parallel
    if support is None:
        raise PlanError(f"{symbol}: {spec_for(config.model).named} cannot split its sequences "
                        "(Llama can: its attention is torch's, its positions computed); set CONFIG_CP=1")
    tokens = support.shape(config)[0]
    problem = context_problem(tokens, degree)
    if problem:
        raise PlanError(f"{symbol} cannot split this model's samples: {problem}; set a CONFIG_CP whose double "
                        "divides the context, or CONFIG_CP=1")
    per_machine, unit = world_size // nodes, degree * tensor
    if per_machine % unit or world_size % (unit * pipeline):
        group = f"{degree} x CONFIG_TP={tensor}" if tensor > 1 else f"{degree}"
        raise PlanError(f"{symbol} needs groups of {group} processes within one machine, but this run has "
                        f"{per_machine} per machine: set GPUS= (or CONFIG_NPROC) to a multiple of {unit}, or a "
                        "smaller CONFIG_CP")
    if config.parallel_strategy == "ddp":
        raise PlanError(f"{symbol} with CONFIG_PARALLEL_DDP: a context-parallel group's gradients are reduced by "
                        "FSDP, which shards over it; set CONFIG_PARALLEL_FSDP (or AUTO), or CONFIG_CP=1")
    if not handles(device_type):
        raise PlanError(f"{symbol} on {'a CPU' if device_type == 'cpu' else device_type.upper()}: torch splits "
                        "attention over a context-parallel group in its CUDA kernels only; plan it for a GPU "
                        "(make plan GPU=h100 GPUS=8) or set CONFIG_CP=1")
    groups = world_size // (pipeline * tensor * degree)
    return degree, (f"{symbol}: each sample's {tokens} tokens split over {degree} processes ({tokens // degree} "
                    f"each, in chunks balanced for causal attention), {groups} data-parallel group(s) of them "
                    "sharing the batch")


def decide_tf32(config: Config, gpu: GPUInfo | None, on_gpu: bool) -> tuple[bool, str]:
    if config.tf32 == "auto":
        tf32 = bool(on_gpu and gpu.supports_tf32)
        return tf32, "AUTO: " + (f"{gpu.name} has TF32 tensor cores" if tf32 else "no TF32 hardware")
    return config.tf32 == "on", f"CONFIG_TF32_{config.tf32.upper()}"


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
                          f"closest is {batch_split(effective, micro, world_size).text()} "
                          f"({(effective - target) / target:+.1%})")


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


def decide_cudnn_benchmark(config: Config, on_gpu: bool) -> tuple[bool, str]:
    if config.cudnn_benchmark == "auto":
        return on_gpu, "AUTO: " + ("fixed input shapes on a GPU" if on_gpu else "not a CUDA device")
    return config.cudnn_benchmark == "on", f"CONFIG_CUDNN_BENCHMARK_{config.cudnn_benchmark.upper()}"
