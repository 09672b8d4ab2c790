"""A plan's predicted step time, and its calibration by the steps of a real run.

`step_time_model` assembles a StepTimeModel from the counted step (count.py,
cached), the device's figures (device.py), any real micro-batch timings taken
on this machine (measure.py, cached) and any calibration. `predict_step_time`
applies it to a plan. `calibrate` is what the trainer calls after its first
steps: it stores the run's median step time and the load other processes put
on the CPU under a key of the machine, the model's step and the plan's
precision, compile, TF32 and world size, in
<cache dir>/steptime/calibration.json (the last CALIBRATION_RUNS runs at each
micro-batch and load: idle, or loaded past LOADED_SHARE of the cores). From
then on each micro-batch a run trained at is predicted by the median over its
runs of (the run's time / the model's own prediction for that step), idle runs
only where there are any; other micro-batches by those ratios interpolated in
log2(micro-batch) (`calibrated_by_runs`), so the runs correct the ranking of
the candidates, not only its level, and one run on a busy machine does not set
the next plans. Timings taken under load (measured or calibrated) widen the
prediction's interval (model.py, `uncertainty`), and measured-*.json timings
taken under heavier load than now are taken again, never the other way round.

Measuring while planning can be switched off with KFIT_STEPTIME_MEASURE=0.

The caches are read and written through cache.py (versioned, every field checked, a damaged entry
dropped with a note naming the file). `calibrate` runs after a run's last step: it never raises (a
bad input, a damaged cache, a read-only or full disk), returning None after one warning line instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import Config
from ..hardware import HardwareProfile
from ..memory import default_cache_dir
from ..plan import Plan
from ..threads import using_threads
from .comm import communication_for
from .cache import SCHEMA, calibration_entries, is_count, measured_timings, write_json
from .count import StepCounter, step_key, task_for
from ..fileio import is_number, write_cache_file
from .device import Device, device_for
from .measure import START_RATIO, TIMINGS_FORMAT, budget_for, power_sizes, relative_spread, time_micro_batches
from .model import StepTimeModel, calibrated, window_sizes

CALIBRATION_FILE = "calibration.json"
CALIBRATION_RUNS = 5  # the last runs kept per machine, model, micro-batch and load; their median ratio calibrates
LOADED_SHARE = 0.25  # other processes' share of the usable cores past which timings count as taken under load
MEASURE_ENV = "KFIT_STEPTIME_MEASURE"

_COUNTERS: dict[Path, StepCounter] = {}


@dataclass(frozen=True)
class StepTime:
    """One optimizer step of a plan, predicted."""

    seconds: float
    samples_per_second: float  # over all processes
    calibrated: bool  # scaled by a real run on this machine
    source: str  # roofline / measured / calibrated, and from what
    parts: dict[str, float]  # micro_batches, optimizer, step_overhead: seconds, summing to `seconds`
    uncertainty: float = 0.0  # the relative half-width of the interval around `seconds` (model.uncertainty)


def steptime_dir(cache_dir: Path | str | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / "steptime"


def _counter(cache_dir: Path | str | None) -> StepCounter:
    root = Path(cache_dir or default_cache_dir())
    if root not in _COUNTERS:
        _COUNTERS[root] = StepCounter(root)
    return _COUNTERS[root]


def _hash(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _run_estimate(model: StepTimeModel, config: Config, micro_batch: int) -> float:
    """The configured run's forward+backward seconds by the roofline (x measure.START_RATIO) at `micro_batch`:
    what sets how long timing it may take (measure.budget_for). The roofline is optimistic on a CPU."""
    samples = model.counts.train_samples * max(1, config.epochs)
    if config.max_steps:
        samples = min(samples, config.max_steps * (config.target_effective_batch or micro_batch))
    seconds = samples * model.roofline_micro_seconds(micro_batch) / micro_batch * START_RATIO
    return min(seconds, config.time_limit_s) if config.time_limit_s else seconds


def current_load() -> float:
    """Other processes' share of this CPU's usable cores (lib.hardware.host; 0 where unknown)."""
    from ..hardware.host import cpu_load_since_start

    load = cpu_load_since_start()
    return 0.0 if load is None or not load.usable_cores else min(1.0, load.busy_cores / load.usable_cores)


def _measured(model: StepTimeModel, config: Config, counts: str, *, precision: str, checkpointing: bool,
              measure_up_to: int | None, directory: Path) -> StepTimeModel:
    """The model with this machine's real micro-batch timings, taking the missing ones when asked and cheap,
    and taking them all again where the cached ones ran under heavier load than now."""
    path = directory / f"measured-{_hash(model.device.key, counts, TIMINGS_FORMAT)}.json"
    stored = measured_timings(path)  # empty when missing or damaged (noted)
    micro, optimizer, spread, load = stored.micro, stored.optimizer, stored.spread, stored.load
    now = current_load()
    wanted = [s for s in power_sizes(measure_up_to or 0) if s not in micro and s not in stored.skipped]
    busier = bool(micro) and load - now > LOADED_SHARE
    if measure_up_to and (wanted or busier):
        # all sizes again, in one set of rounds: timings taken at different times do not compare
        sizes = sorted(set(wanted) | set(micro))
        timed = time_micro_batches(config, task_for(config), precision=precision,
                                   gradient_checkpointing=checkpointing, sizes=sizes,
                                   estimate=model.roofline_micro_seconds,
                                   budget_s=budget_for(_run_estimate(model, config, max(sizes))))
        timed_load = _share(timed.busy_cores)
        if timed.micro and (wanted or timed_load < load):  # a busier timing never replaces a quieter one
            micro, optimizer, spread, load = timed.micro, timed.optimizer, timed.spread, timed_load
            write_json(path, {"micro": {str(k): v for k, v in micro.items()}, "skipped": sorted(set(sizes) - set(micro)),
                              "optimizer": {str(k): v for k, v in optimizer.items()},
                              "spread": {str(k): v for k, v in spread.items()}, "load": round(load, 3),
                              "time": time.time()})
    if not micro:  # the roofline's interval is its own: the load widens what was timed
        return model
    return dataclasses.replace(model, measured=micro, measured_optimizer=optimizer, measured_spread=spread,
                               load=max(load, now))


def _share(busy_cores: float | None) -> float:
    from ..hardware.host import usable_cores

    return 0.0 if busy_cores is None else min(1.0, busy_cores / max(1.0, usable_cores()))


def _calibration_key(device: Device, counts: str, *, tf32: bool, compile: bool, world_size: int,
                     strategy: str = "none", float8: bool = False, tensor: int = 1,
                     pipeline: tuple[int, str] | None = None, context: int = 1) -> str:
    # each left out when off: the keys calibrations had before float8, tensor, pipeline and context parallelism
    extra = (("float8",) if float8 else ()) + ((f"tp{tensor}",) if tensor > 1 else ()) + (
        (f"pp{pipeline[0]}-{pipeline[1]}",) if pipeline else ()) + ((f"cp{context}",) if context > 1 else ())
    if strategy in ("none", "ddp"):  # the key calibrations had before sharded strategies existed
        return _hash(device.kind, device.key, counts, tf32, compile, world_size, *extra)
    return _hash(device.kind, device.key, counts, tf32, compile, world_size, strategy, *extra)


def _profile_link(hardware: HardwareProfile) -> float | None:
    """The GPU link a HW= profile states for its GPUs (GPUSpeed.link_gbs); None: the catalog's."""
    gpu = hardware.primary_gpu
    return gpu.speed.link_gbs if gpu is not None and gpu.speed is not None else None


def step_time_model(config: Config, hardware: HardwareProfile, *, device_type: str, precision: str,
                    tf32: bool = False, compile: bool = False, gradient_checkpointing: bool | None = None,
                    world_size: int = 1, measure_up_to: int | None = None,
                    cache_dir: Path | str | None = None, strategy: str = "none",
                    local_world_size: int | None = None, per_micro_batch: bool = True,
                    tensor: int = 1, pipeline: tuple[int, str] | None = None,
                    nodes: int = 1, context: int = 1) -> StepTimeModel | None:
    """The step-time model of this config on this device; None where the device's speed is unknown.
    With several processes it includes the strategy's collectives (comm.py) where the links are known;
    world sizes count tensor-parallel groups of `tensor` processes (CONFIG_TP), whose share of the work and
    collectives the model adds, and groups of `context` processes that split each sample's tokens (CONFIG_CP).

    `measure_up_to`: on this machine's CPU, time real micro-batches (powers of two up to it) that are
    not cached yet, within measure.BUDGET_S. Cached timings and calibrations are always used; `per_micro_batch`
    False: the runs calibrate by one factor (their median run's), which leaves the candidates' ranking as it was.
    """
    checkpointing = config.gradient_checkpointing if gradient_checkpointing is None else gradient_checkpointing
    directory = steptime_dir(cache_dir)
    device = device_for(hardware, device_type, directory)
    if device is None:
        return None
    counts = _counter(cache_dir).counts(config, device_type=device_type, precision=precision,
                                        gradient_checkpointing=checkpointing)
    from ..models.registry import spec_for

    traffic = spec_for(config.model).tensor_parallel.traffic(config, checkpointing) if tensor > 1 else 0
    stages, schedule = pipeline or (1, "1F1B")
    sends = spec_for(config.model).pipeline(config)[2] // context if stages > 1 else 0
    ring = 0
    if context > 1:
        from ..context_parallel import traffic_bytes

        tokens, blocks, kv_elements = spec_for(config.model).context_parallel.shape(config)
        ring = traffic_bytes(tokens, blocks // stages, kv_elements, 2 if precision in ("bf16", "fp16") else 4,
                             checkpointing)
    local_world_size = local_world_size or world_size
    # FSDP shards over the data-parallel groups and their context-parallel processes together
    communication = communication_for(strategy, world_size=world_size * context,
                                      local_world_size=local_world_size * context,
                                      parameters=counts.parameters // stages, precision=precision,
                                      device_name=device.name, device_kind=device.kind,
                                      network_gbps=config.net_gbps or None,
                                      link_gbps=_profile_link(hardware) if device_type == "cuda" else None,
                                      tensor=tensor, tensor_elements_per_sample=traffic // stages,
                                      pipeline=stages, pipeline_elements_per_sample=sends,
                                      pipeline_across_machines=nodes > 1, context=context,
                                      context_bytes_per_sample=ring)
    if communication is not None and stages > 1:  # a stage's FSDP reduce-scatters after each of its backwards
        communication = dataclasses.replace(communication, reduce_every_micro_batch=True)
    float8 = config.float8 != "off" and device_type == "cuda" and device.fp8_flops is not None
    model = StepTimeModel(counts=counts, device=device, precision=precision, tf32=tf32, compile=compile,
                          communication=communication, float8=float8, tensor=tensor, pipeline=stages,
                          pipeline_schedule=schedule, context=context)
    key = step_key(config, device_type=device_type, precision=precision, gradient_checkpointing=checkpointing)
    if device.here and not compile:  # eager timings say nothing about a compiled step
        model = _measured(model, config, key, precision=precision, checkpointing=checkpointing,
                          measure_up_to=measure_up_to, directory=directory)
    runs = calibration_entries(directory / CALIBRATION_FILE).get(
        _calibration_key(device, key, tf32=tf32, compile=compile, world_size=world_size, strategy=strategy,
                         float8=float8, tensor=tensor, pipeline=pipeline, context=context), [])
    return calibrated_by_runs(model, runs, per_micro_batch=per_micro_batch) if runs else model


def calibrated_by_runs(model: StepTimeModel, runs: list[dict], *, per_micro_batch: bool = True) -> StepTimeModel:
    """The model calibrated by the runs: at each micro-batch a run trained at, the median of its runs' ratios to
    the model (the idle runs' where there are any); between and beyond them interpolated in log2(micro-batch)
    and held. Runs at one micro-batch only: the model scaled as `calibrated` scales it, by its median run."""
    if not per_micro_batch:  # the median run over all of them as one factor; the interval the model's own
        ratios = sorted(((r["seconds"] / model.seconds(r["micro_batch"], r["grad_accum"], r["samples"]), i)
                         for i, r in enumerate(runs)))
        run = runs[ratios[(len(ratios) - 1) // 2][1]]
        return calibrated(model, run["seconds"], run["micro_batch"], run["grad_accum"], run["samples"])
    by_micro: dict[int, list[dict]] = {}
    for run in runs:
        by_micro.setdefault(run["micro_batch"], []).append(run)
    points, spreads, loads = [], [], []
    for micro, group in sorted(by_micro.items()):
        trusted = [r for r in group if r.get("load", 0.0) <= LOADED_SHARE] or group
        ratios = sorted(((r["seconds"] / model.seconds(r["micro_batch"], r["grad_accum"], r["samples"]), r)
                         for r in trusted), key=lambda pair: pair[0])
        points.append((micro, ratios[(len(ratios) - 1) // 2]))
        spreads.append((micro, relative_spread([q for q, _ in ratios])))
        loads.extend(r.get("load", 0.0) for r in trusted)
    load = max(model.load, statistics.fmean(loads)) if model.device.kind == "cpu" else 0.0
    if len(points) == 1:
        _, (_, run) = points[0]
        model = calibrated(model, run["seconds"], run["micro_batch"], run["grad_accum"], run["samples"])
    else:
        latest = runs[-1]["micro_batch"]
        model = dataclasses.replace(model, correction=1.0, correction_bound="all", calibrated_at=latest,
                                    corrections=tuple((m, q) for m, (q, _) in points))
    return dataclasses.replace(model, calibration_spread=tuple(spreads), load=load)


def model_for_plan(config: Config, hardware: HardwareProfile, plan: Plan,
                   cache_dir: Path | str | None = None) -> StepTimeModel | None:
    with using_threads(plan.cpu_threads if plan.device_type == "cpu" else None):  # a CPU's speed is per thread count
        model = step_time_model(config, hardware, device_type=plan.device_type, precision=plan.precision,
                                tf32=plan.tf32, compile=plan.compile,
                                gradient_checkpointing=plan.gradient_checkpointing, world_size=plan.data_parallel,
                                cache_dir=cache_dir, strategy=plan.strategy,
                                local_world_size=plan.local_data_parallel,
                                tensor=plan.tensor_parallel, pipeline=_pipeline_of(plan), nodes=plan.nodes,
                                context=plan.context_parallel)
    return for_gradient_sync(model, plan)


def _pipeline_of(plan: Plan) -> tuple[int, str] | None:
    return (plan.pipeline_parallel, plan.pipeline_schedule) if plan.pipeline_parallel > 1 else None


def for_gradient_sync(model: StepTimeModel | None, plan: Plan) -> StepTimeModel | None:
    """The model with FSDP's reduce-scatter after every micro-batch where the plan syncs so (Plan.gradient_sync)."""
    if model is None or model.communication is None or plan.gradient_sync != "micro_batch":
        return model
    return dataclasses.replace(model, communication=dataclasses.replace(model.communication,
                                                                        reduce_every_micro_batch=True))


def samples_per_process(plan: Plan) -> int:
    """The most samples one process takes in an optimizer step (the slowest rank sets the pace)."""
    return math.ceil(plan.effective_batch / plan.data_parallel)


def step_time(model: StepTimeModel, plan: Plan) -> StepTime:
    samples = samples_per_process(plan)
    parts = model.parts(plan.micro_batch, plan.grad_accum, samples)
    seconds = sum(parts.values())
    return StepTime(seconds=seconds, samples_per_second=plan.effective_batch / seconds,
                    calibrated=model.calibrated_at is not None, source=model.source, parts=parts,
                    uncertainty=model.uncertainty(plan.micro_batch))


def predict_step_time(config: Config, hardware: HardwareProfile, plan: Plan,
                      cache_dir: Path | str | None = None) -> StepTime | None:
    """The plan's step time on this hardware (calibrated where a run here calibrated it); None if unknown."""
    model = model_for_plan(config, hardware, plan, cache_dir)
    return step_time(model, plan) if model is not None else None


def calibrate(config: Config, hardware: HardwareProfile, plan: Plan, step_seconds: list[float],
              cache_dir: Path | str | None = None, *, warn: Callable[[str], None] | None = None) -> StepTime | None:
    """Store a real run's step times (seconds per optimizer step, warm-up excluded) for this machine and
    model; returns the plan's prediction as it now stands (calibrated). None where the device is unknown.

    It runs after the last training step, so it never fails a finished run: invalid step times, a damaged
    cache, an unwritable one or any other error is one `warning:` line (to `warn`, else stderr) and None."""
    times = [float(s) for s in step_seconds if is_number(s, positive=True)] if isinstance(
        step_seconds, (list, tuple)) else []
    if not times:
        return None
    try:
        return _calibrate(config, hardware, plan, times, cache_dir)
    except Exception as err:  # noqa: BLE001 - bookkeeping after the last step: a warning, never a lost run
        line = f"warning: step time not calibrated ({type(err).__name__}: {err}); the run itself is complete"
        if warn is not None:
            warn(line)
        else:
            print(line, file=sys.stderr, flush=True)
        return None


def _calibrate(config: Config, hardware: HardwareProfile, plan: Plan, step_seconds: list[float],
               cache_dir: Path | str | None) -> StepTime | None:
    if not all(is_count(v) for v in (plan.micro_batch, plan.grad_accum, plan.world_size)):
        raise ValueError(f"the plan's split is not counts (micro-batch {plan.micro_batch!r}, accumulation "
                         f"{plan.grad_accum!r}, world size {plan.world_size!r})")
    model = model_for_plan(config, hardware, plan, cache_dir)
    if model is None:
        return None
    # the key as model_for_plan reads it: a CPU step's key holds the thread count (its kernels are chosen per
    # thread count), so it is taken at the plan's threads, not this process's (they differ on a busy machine)
    with using_threads(plan.cpu_threads if plan.device_type == "cpu" else None):
        key = step_key(config, device_type=plan.device_type, precision=plan.precision,
                       gradient_checkpointing=plan.gradient_checkpointing)
    path = steptime_dir(cache_dir) / CALIBRATION_FILE
    entries = calibration_entries(path)  # damaged entries dropped (noted)
    name = _calibration_key(model.device, key, tf32=plan.tf32, compile=plan.compile, world_size=plan.data_parallel,
                            strategy=plan.strategy, float8=model.float8, tensor=plan.tensor_parallel,
                            pipeline=_pipeline_of(plan), context=plan.context_parallel)
    runs = entries.get(name, [])
    load = current_load() if plan.device_type == "cpu" else 0.0
    runs.append({"micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum, "samples": samples_per_process(plan),
                 "seconds": statistics.median(step_seconds), "steps": len(step_seconds), "load": round(load, 3),
                 "device": model.device.name, "model": config.model, "time": round(time.time(), 3)})
    entries[name] = _kept(runs)
    _write_calibration(path, entries)
    return predict_step_time(config, hardware, plan, cache_dir)


def _kept(runs: list[dict]) -> list[dict]:
    """The last CALIBRATION_RUNS runs of each micro-batch and load (idle or loaded), in their order: a run
    under load never pushes out an idle one."""
    def kind(run: dict) -> tuple[int, bool]:
        return run["micro_batch"], run.get("load", 0.0) > LOADED_SHARE

    seen: dict[tuple[int, bool], int] = {}
    kept = []
    for run in reversed(runs):
        seen[kind(run)] = seen.get(kind(run), 0) + 1
        if seen[kind(run)] <= CALIBRATION_RUNS:
            kept.append(run)
    return kept[::-1]


def _write_calibration(path: Path, entries: dict) -> None:
    """calibration.json, written or an OSError: a calibration not stored is worth a warning (write_json is silent)."""
    write_cache_file(path, json.dumps({**entries, "schema": SCHEMA}, sort_keys=True).encode())


# --------------------------------------------------------------------------
# A whole run


def run_steps(config: Config, plan: Plan, train_samples: int) -> int:
    """Optimizer steps of the configured run: epochs x windows per epoch, capped by CONFIG_MAX_STEPS."""
    windows = len(window_sizes(train_samples, plan.effective_batch))
    total = config.epochs * windows
    return min(total, config.max_steps) if config.max_steps else total


def evaluations(config: Config, steps: int) -> int:
    """Evaluation passes of a run of `steps` (lib/trainer/loop.py's schedule), the final one included."""
    if config.eval_interval:
        return (steps - 1) // config.eval_interval + 1
    return max(0, config.epochs - 1) + 1


def plan_predictions(config: Config, plan: Plan, model: StepTimeModel) -> tuple[dict, str]:
    """The plan's four predicted_* fields, and the reason that explains them."""
    step = step_time(model, plan)
    counts = model.counts
    steps = run_steps(config, plan, counts.train_samples)
    evals = evaluations(config, steps)
    eval_s = sum(model.forward_seconds(b) for b in window_sizes(counts.eval_samples, plan.eval_batch))
    seconds = steps * step.seconds + evals * eval_s
    limited = bool(config.time_limit_s and seconds > config.time_limit_s)
    if limited:
        seconds = float(config.time_limit_s)
    device = model.device
    devices = plan.world_size if device.kind == "gpu" else 1  # processes on a CPU share one package
    energy = device.power_watts * devices * seconds / 3.6e6 if device.power_watts else None
    why = (f"{step.source}; {steps} steps x {step.seconds * 1e3:.1f} ms (±{step.uncertainty:.0%}) + {evals} evaluation(s) x "
           f"{eval_s * 1e3:.1f} ms = {seconds:,.1f}s"
           + (f", stopped by CONFIG_TIME_LIMIT={config.time_limit_s}" if limited else ""))
    if energy is None:
        why += "; energy unknown (no power figure for this device)"
    else:
        guess = " (a guess: catalog.CPU_WATTS_PER_CORE x cores)" if device.kind == "cpu" else " (board power limit)"
        why += f"; energy at {device.power_watts * devices:.0f} W{guess}"
    return {"predicted_step_seconds": step.seconds, "predicted_samples_per_second": step.samples_per_second,
            "predicted_run_seconds": seconds, "predicted_energy_kwh": energy}, why
