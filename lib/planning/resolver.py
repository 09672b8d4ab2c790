"""The resolver: a PlanRequest (config, hardware, model, world size, settings) -> Plan.

Order matters: device, then precision, compile and TF32 (the batch depends on whether compile is on), then the
largest micro-batch that fits from a swappable batch policy, then (the memory planner) the micro-batch up to it,
and gradient checkpointing on or off, with the highest samples/s that lib.steptime predicts, and gradient
accumulation so that

    effective batch = micro-batch x accumulation x world size

equals the target (a micro-batch that does not divide a process's share makes the last one of each step
short). World size is the number of training processes (WORLD_SIZE under torchrun), not the number of GPUs in
the machine. Every plan ends with its predicted step time, samples/s, run time and energy (`with_predictions`).
Where not even micro-batch 1 is predicted to fit, the out-of-memory ladder's rungs are taken before training
(ladder.pre_training).

Nothing here detects hardware or reads the environment: what the surroundings say comes in the request's
Settings. Callers come through lib/planning/door.py (make_plan), which builds the request.
"""

from __future__ import annotations

import dataclasses
import itertools

from ..config import Config
from ..errors import NoFitError, PlanError
from ..hardware import HardwareProfile
from ..parallel import LABELS, is_sharded
from ..plan import BatchChoice, BatchPolicy, ModelDescription, Plan, local_groups
from ..threads import decide_cpu_threads, decide_loader_workers, decide_prefetch, using_threads
from ..units import batch_split
from . import ladder
from .decisions import (auto_detect_compile, calculate_gradient_accumulation, decide_cudnn_benchmark, decide_device,
                        decide_float8, decide_gradient_sync, decide_pipeline, decide_precision, decide_tensor_parallel,
                        decide_tf32, pipeline_candidates, tensor_parallel_candidates, context_parallel_candidates,
                        decide_context_parallel, refuse_slow_precision)
from .request import PlanRequest, Settings, settings_or_environment
from .strategy import ChooseArgs, candidates as strategy_candidates, pick as pick_strategy
from .throughput import choose_fastest, with_predictions
from .tiers import policy_for


def resolve_request(request: PlanRequest) -> Plan:
    """The plan for the request, sharing the model as lib.planning.strategy decides. Where the memory planner
    predicts that not even micro-batch 1 fits, the out-of-memory ladder's rungs that the config allows are
    taken before training (`_on_the_ladder`), as training would take them after running out of memory.
    CONFIG_TP=0, CONFIG_PP=0 or CONFIG_CP=0 (AUTO) is every candidate layout's plan, the fastest kept
    (`_auto_layout`)."""
    config = request.config
    if 0 in (config.tensor_parallel, config.pipeline_parallel, config.context_parallel):
        return _auto_layout(request)
    try:
        return _resolve(request)
    except NoFitError as err:
        return _on_the_ladder(request, err)


# the degrees AUTO plans, as (Config field, CONFIG_ symbol's name, candidates), in the order they nest (the least
# split first: where step time is unknown the first that fits wins); named in _NAMED's order
_NAMED = ("TP", "PP", "CP")
_LAYOUT = (("pipeline_parallel", "PP", pipeline_candidates), ("context_parallel", "CP", context_parallel_candidates),
           ("tensor_parallel", "TP", tensor_parallel_candidates))


def _auto_layout(request: PlanRequest) -> Plan:
    """CONFIG_TP=0, CONFIG_PP=0 and/or CONFIG_CP=0: the plan of each degree decisions' *_candidates give (every
    combination where several are AUTO), each as CONFIG_TP=N CONFIG_PP=M CONFIG_CP=K would plan it (its
    strategy, micro-batch and checkpointing its own best, the ladder included); the one with the most
    predicted samples/s wins, the least split that fits where step time is unknown (it communicates least).
    The reason lists the others, and why a layout had no plan."""
    config = request.config
    auto = [(field, short, candidates) for field, short, candidates in _LAYOUT if getattr(config, field) == 0]
    named = sorted(auto, key=lambda a: _NAMED.index(a[1]))
    degrees = [candidates(config, request.world_size, request.nodes) if (field, short, candidates) in auto
               else [getattr(config, field)] for field, short, candidates in _LAYOUT]

    def name(layout: dict) -> str:
        return " x ".join(f"{short} {layout[field]}" for field, short, _ in named)

    plans, refused = [], []
    for combination in itertools.product(*degrees):
        layout = {field: degree for (field, _, _), degree in zip(_LAYOUT, combination)}
        try:
            plans.append(resolve_request(dataclasses.replace(request, config=dataclasses.replace(config, **layout))))
        except PlanError as err:
            refused.append((name(layout), err))
    symbols = " and ".join(f"CONFIG_{short}=0" for _, short, _ in named)
    if not plans:
        if len({str(err) for _, err in refused}) == 1:  # nothing to do with the layout (a device, the data): as is
            raise refused[0][1]
        layout, err = refused[-1]  # the most split layout's refusal: what is left when splitting has done its part
        what = ({"TP": "tensor-parallel degree", "PP": "pipeline degree", "CP": "context-parallel degree"}[auto[0][1]]
                if len(auto) == 1 else "layout")
        raise type(err)(f"{symbols} (AUTO) found no {what} that plans "
                        f"(tried {', '.join(n.split()[-1] if len(auto) == 1 else n for n, _ in refused)}); "
                        f"at {layout}: {err}", *((err.helps, err.hint) if isinstance(err, NoFitError) else ()))
    timed = [p for p in plans if p.predicted_samples_per_second]
    best = max(timed, key=lambda p: p.predicted_samples_per_second) if timed else plans[0]

    def summary(plan: Plan) -> str:
        speed = (f"{plan.predicted_samples_per_second:,.1f} samples/s" if plan.predicted_samples_per_second
                 else "step time unknown")
        layout = dict(tensor_parallel=plan.tensor_parallel, pipeline_parallel=plan.pipeline_parallel,
                      context_parallel=plan.context_parallel)
        return (f"{name(layout)}: {speed} ({plan.strategy}, "
                f"micro-batch {plan.micro_batch})")

    how = "the fastest predicted that fits" if timed else "the least split that fits (step time unknown)"
    others = [summary(p) for p in plans if p is not best] + [f"{n}: {err}" for n, err in refused]
    why = f"AUTO ({symbols}): {summary(best)}, {how}" + (f"; {'; '.join(others)}" if others else "")
    # the whole reason once, on the first row make plan shows; the other degrees' rows point there
    first = next(field for field, _, _ in named)
    row = {"tensor_parallel": "tensor parallel", "pipeline_parallel": "pipeline parallel",
           "context_parallel": "context parallel"}[first]
    chosen = {field: why if field == first else f"AUTO ({symbols}): see the {row} row" for field, _, _ in auto}
    return dataclasses.replace(best, reasons={**best.reasons, **chosen})


def _on_the_ladder(request: PlanRequest, no_fit: NoFitError) -> Plan:
    """The plan with the fewest of the ladder's rungs under which micro-batch 1 is predicted to fit; the
    refusal with every rung taken (the planner's, with what would help) when none does."""
    config, hardware = request.config, request.hardware
    device_type, _ = decide_device(config, hardware)
    gpu = hardware.primary_gpu if device_type == "cuda" else None
    precision, _ = decide_precision(config, device_type, gpu)
    taken: list[str] = []
    keys: dict[str, str] = {}
    for name, what, rung_config in ladder.pre_training(config, device_type=device_type, precision=precision,
                                                       supports_bf16=gpu is None or gpu.supports_bf16):
        taken.append(what)
        keys[name] = what
        try:
            plan = _resolve(dataclasses.replace(request, config=rung_config))
        except NoFitError as err:  # the refusal with every rung taken so far: its peaks are the ones that count
            no_fit = NoFitError(f"{err.what}, even with the out-of-memory ladder's {', '.join(taken)} "
                                "(CONFIG_OOM_LADDER_*)", err.helps, err.hint)
            continue
        why = f"out-of-memory ladder: micro-batch 1 is predicted not to fit without {', '.join(taken)}"
        reasons = {**plan.reasons, "oom_ladder": f"before training: {', '.join(taken)}"}
        for name in keys:
            reasons["gradient_checkpointing" if name == "checkpointing" else "precision"] = f"AUTO, {why}"
        note = f"the memory planner predicts that not even micro-batch 1 fits as configured: {why} " \
               "(CONFIG_OOM_LADDER_*)"
        return dataclasses.replace(plan, notes=(*plan.notes, note), reasons=reasons)
    raise no_fit


def _resolve(request: PlanRequest) -> Plan:
    """resolve_request() as configured, without the ladder.

    The planner reads and writes its trace cache, and lib.steptime its counts, CPU figures and (on this
    machine's CPU, once, where request.settings.measure) real micro-batch timings, which only changes how
    long this takes.
    """
    config, hardware, model = request.config, request.hardware, request.model
    world_size, nodes, policy = request.world_size, request.nodes, request.policy
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
    refuse_slow_precision(config, device_type, precision)
    float8, reasons["float8"] = decide_float8(config, device_type, gpu)
    compile_on, compile_mode, reasons["compile"] = auto_detect_compile(config, device_type, gpu)
    tf32, reasons["tf32"] = decide_tf32(config, gpu, on_gpu)
    offload = bool(config.fsdp_cpu_offload and device_type == "cuda")
    tensor, reasons["tensor_parallel"] = decide_tensor_parallel(config, world_size, nodes, float8=float8)
    pipeline, schedule, reasons["pipeline_parallel"] = decide_pipeline(config, world_size, tensor,
                                                                       precision=precision)
    context, reasons["context_parallel"] = decide_context_parallel(config, world_size, nodes, tensor, pipeline,
                                                                   device_type=device_type)
    processes = world_size
    # From here on the world is the data-parallel groups: they share the batch, and the strategy spans them
    # (a tensor-parallel group's, a context-parallel group's and a pipeline's processes see the same samples;
    # FSDP shards over a context-parallel group too, which the memory and step-time models add). The plan
    # counts every process again.
    world_size //= tensor * pipeline * context
    staged = (pipeline, schedule) if pipeline > 1 else None  # what the memory planner traces per process
    idle = hardware.cpu.idle_cores  # step timings taken while planning run at the threads training will
    # the processes that share one machine's cores: a 16-machine run's 8 per machine, not its 128
    local = processes // nodes
    cpu_threads, reasons["cpu_threads"] = decide_cpu_threads(config, device_type, hardware, local,
                                                             idle_cores=idle,
                                                             omp_threads=request.settings.omp_threads)
    workers, reasons["workers"] = decide_loader_workers(config, device_type, hardware, local, idle_cores=idle)
    prefetch, prefetch_note = decide_prefetch(config, workers)
    if prefetch_note:
        notes.append(prefetch_note)
    timing_threads = cpu_threads if device_type == "cpu" else None

    per_machine = processes // nodes
    if device_type == "cuda" and per_machine > hardware.identical_gpu_count and hardware.identical_gpu_count:
        notes.append(f"{per_machine} processes per machine but only {hardware.identical_gpu_count} identical GPU(s): "
                     "processes will share GPUs or use different models")

    memory: dict = {}
    sync = "step"
    checkpointing = config.gradient_checkpointing
    speed_model = None
    alternatives: tuple = ()  # the runner-up splits (AUTO with step-time prediction)
    if config.hyperparam_mode == "manual":
        options, reasons["strategy"] = strategy_candidates(config, world_size, nodes, tensor, pipeline, context)
        strategy = options[0]
        if len(options) > 1:
            reasons["strategy"] = f"AUTO without the memory planner (MANUAL batch): {LABELS[strategy]}"
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
        with using_threads(timing_threads):
            memory = _manual_memory(config, hardware, notes, policy or policy_for(config), device_type=device_type,
                                    compile_mode=compile_mode,
                                    precision=precision, micro=micro, eval_batch=eval_batch, strategy=strategy,
                                    world_size=world_size, local_world_size=local_groups(world_size, nodes, pipeline),
                                    cpu_offload=offload,
                                    tensor=tensor, pipeline=staged, grad_accum=accum, context=context)
    else:
        target = config.target_effective_batch
        policy = policy or policy_for(config)
        policy_name = policy.name
        choose = ChooseArgs(hardware=hardware, model=model, device_type=device_type, compile=compile_on,
                            compile_mode=compile_mode, precision=precision, world_size=world_size, target=target,
                            local_world_size=local_groups(world_size, nodes, pipeline), cpu_offload=offload,
                            tensor=tensor, pipeline=staged, nodes=nodes, context=context)

        def speed(strategy: str, choice: BatchChoice):
            """The memory planner: the fastest micro-batch that fits under `strategy`, with its samples/s."""
            if choice.predict is None or target % world_size:
                return None
            try:
                with using_threads(timing_threads):
                    fast = choose_fastest(config, policy, choice, choose.with_strategy(strategy), tf32=tf32,
                                          measure=request.settings.measure)
            except Exception as err:  # noqa: BLE001 - a step-time failure must not stop planning
                note = (f"step time not predicted ({type(err).__name__}: {err}); the micro-batch is the "
                        "largest that divides the target")
                if note not in notes:
                    notes.append(note)
                return None
            return (fast[0].samples_per_second, fast) if fast is not None else None

        with using_threads(timing_threads):  # a CPU step is traced at the threads it will train with
            strategy, choice, fast, reasons["strategy"] = pick_strategy(
                config, policy, choose, world_size=world_size, nodes=nodes, target=target, speed=speed, tensor=tensor,
                pipeline=pipeline, context=context)
        cap, reasons["micro_batch"] = choice.max_micro, choice.reason
        if fast is not None:
            best, option, speed_model, why, alternatives = fast
            micro, accum, checkpointing, choice = best.micro_batch, best.grad_accum, option.checkpointing, option.choice
            share = target // world_size
            reasons["micro_batch"] = f"{choice.reason}; {why}"
            split = batch_split(share, micro)
            holder = ("pipeline" if pipeline > 1 else "context-parallel group" if context > 1
                      else "tensor-parallel group" if tensor > 1 else "process")
            reasons["grad_accum"] = f"{share} per {holder} / micro-batch {micro}" + (
                f": {split.text()} (the short one weighs its samples)" if split.last_micro_batch != micro else "")
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

    cudnn_benchmark, reasons["cudnn_benchmark"] = decide_cudnn_benchmark(config, on_gpu)
    if compile_on and device_type == "cpu":
        notes.append("torch.compile on a CPU was measured slower than eager for small models here")
    if hardware.on_battery:
        notes.append("running on battery: training will be slower and drain it; plug in for long runs")

    plan = Plan(
        mode=config.hyperparam_mode, policy=policy_name, device_type=device_type, accelerator=(
            hardware.accelerator if device_type != "cpu" else "cpu"),
        device_name=gpu.name if gpu else hardware.cpu.name, world_size=processes, tensor_parallel=tensor,
        pipeline_parallel=pipeline, pipeline_schedule=schedule, context_parallel=context,
        micro_batch=micro, grad_accum=accum, effective_batch=effective, target_effective_batch=target,
        eval_batch=eval_batch, compile=compile_on, compile_mode=compile_mode, precision=precision,
        grad_scaler=precision == "fp16", tf32=tf32, cudnn_benchmark=cudnn_benchmark,
        gradient_checkpointing=checkpointing, num_workers=workers, cpu_threads=cpu_threads,
        pin_memory=on_gpu, model=model.name, reasons=reasons, notes=tuple(notes), strategy=strategy, nodes=nodes,
        cpu_offload=offload and is_sharded(strategy), gradient_sync=sync, prefetch_factor=prefetch, float8=float8,
        alternatives=alternatives, **memory)
    with using_threads(timing_threads):
        return with_predictions(config, hardware, plan, speed_model)


def _manual_memory(config: Config, hardware: HardwareProfile, notes: list[str], policy, **at) -> dict:
    """A MANUAL plan's predicted memory at its fixed batch (the memory planner's figures, and a note where it is
    predicted not to fit). What stops the planner (no data, a model that cannot be built) stops this plan too,
    as it stops an AUTO one. A policy that predicts no memory (the tier policy) predicts none here either: it
    neither loads the data nor traces, as its AUTO plans do not."""
    if not hasattr(policy, "at_batch"):
        return {}
    memory, warning = policy.at_batch(config=config, hardware=hardware, **at)
    if warning:
        notes.append(warning)
    return memory
