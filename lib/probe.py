"""The probe: confirm the plan's micro-batch on the device with a few real training steps.

A plan is a prediction. Before training, the probe runs TRIAL_STEPS real steps
(forward, backward, optimizer step: the optimizer state is allocated on the
first) of a throwaway copy of the model at the planned micro-batch. Out of
memory, or a measured peak over the plan's budget, bisects down; a peak that
leaves clear room (HEADROOM, 10%) under the budget may try larger,
up to the per-process share of the effective batch. Candidates are the
resolver's (lib.steptime.balanced_micro_batches): for each accumulation count
k, the smallest micro-batch that needs only k micro-batches, ceil(share / k),
the last one short where it does not divide (the trainer weighs it by its
samples), so every answer keeps the effective batch exact. A probe that
confirms the planned micro-batch leaves the plan's split as it is; one that
finds less fits takes the fewest micro-batches that fit, balanced.
The evaluation batch is searched the same way with forward-only passes.

With torch.compile the batch dimension is marked dynamic, so the sizes tried
share one compiled graph instead of one compile each (20+ s apiece).

Results are cached in $KFIT_CACHE_DIR (else $XDG_CACHE_HOME/kfit, else
~/.cache/kfit)/probe.json under a fingerprint of the hardware, the
memory-relevant config, precision, compile and library versions.
PROBE_AUTO probes GPUs only and uses the cache; PROBE_ALWAYS probes any device
(the CPU included) and refreshes it; PROBE_NEVER trusts the plan. The cache carries
"schema": CACHE_SCHEMA and every entry is checked on read (`cached_result`): a damaged file or
entry is one note naming the file and a fresh probe, never a traceback; a cache that cannot be
written (read-only, full, a link planted in its place) only costs the next probe.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable

import torch

from . import distributed
from .parallel import is_sharded
from .config import Config
from .fileio import cache_note, read_json_cache, write_json_atomic
from .hardware import HardwareProfile, device_memory, reset_peak_memory
from .plan import Plan
from .planning import edits
from .memory import default_cache_dir
from .oom import ADVICE, Injector, OutOfMemory, is_oom, release
from .task import Task
from .step import autocast_for, forward_loss, make_optimizer
from .steptime import balanced_micro_batches
from .steptime.calibrate import samples_per_process

TRIAL_STEPS = 2
HEADROOM = 0.10
CACHE_FILE = "probe.json"
CACHE_SCHEMA = 1


def cache_path() -> Path:
    return default_cache_dir() / CACHE_FILE  # the memory planner's cache directory


def read_cache(path: Path) -> dict:
    """probe.json's entries by fingerprint ({} when missing or damaged: noted), the schema key left out."""
    cache = read_json_cache(path, CACHE_SCHEMA) or {}
    cache.pop("schema", None)
    return cache


def cached_result(cache: dict, key: str, path: Path) -> dict | None:
    """The cached probe of `key` when whole (max_micro, eval_batch: positive counts; trials a list); a
    damaged entry is noted and dropped."""
    entry = cache.get(key)
    if entry is None:
        return None
    counts = [entry.get(k) for k in ("max_micro", "eval_batch")] if isinstance(entry, dict) else [None]
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in counts) and isinstance(
            entry.get("trials", []), list) and isinstance(entry.get("eval_trials", []), list):
        return entry
    cache_note(path, f"entry {key} is not a probe's result", then="dropped; probing again")
    cache.pop(key, None)
    return None


def write_cache(path: Path, cache: dict, log=print) -> None:
    """probe.json with the schema; a cache that cannot be written is one note (the next run probes again)."""
    try:
        write_json_atomic(path, {**cache, "schema": CACHE_SCHEMA})
    except OSError as err:
        log(f"note: probe result not cached in {path} ({err.strerror or err}): the next run probes again")


def fingerprint(config: Config, plan: Plan, hardware: HardwareProfile, task: Task) -> str:
    """What decides how much memory a training step takes on this device."""
    from .memory.cache import model_fingerprint

    gpu = hardware.primary_gpu if plan.device_type != "cpu" else None
    info = task.info
    key = {
        "device": plan.device_type, "name": gpu.name if gpu else hardware.cpu.name,
        "total_bytes": gpu.total_bytes if gpu else hardware.cpu.ram_total_bytes,
        # the model's shapes as its family declares them (a Llama preset's too; lib/models/registry.py)
        "model": model_fingerprint(config),
        "data": [info.channels, info.image_size, info.num_classes, info.vocab_size, info.block_size],
        "optimizer": config.optimizer, "optimizer_name": config.optimizer_name, "memory_profile": config.memory_profile,
        "precision": plan.precision, "compile": plan.compile, "compile_mode": plan.compile_mode,
        "gradient_checkpointing": plan.gradient_checkpointing,
        "versions": [torch.__version__, torch.version.cuda, getattr(torch.version, "hip", None)],
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def search(fits: Callable[[int], int | None], candidates: list[int], start: int, budget: int | None,
           grow: bool) -> tuple[int | None, list[tuple[int, bool, int | None]]]:
    """The largest candidate that fits, starting at candidates[start].

    fits(size) -> the measured peak bytes, or None on out-of-memory. A peak over `budget` fails too.
    Grows (about x2 per trial) only while no size failed and the peak leaves HEADROOM under the budget;
    then bisects between the largest success and the smallest failure. Returns (size or None, trials).
    """
    trials: list[tuple[int, bool, int | None]] = []
    good, bad, i = -1, len(candidates), start
    while good + 1 < bad:
        peak = fits(candidates[i])
        ok = peak is not None and (budget is None or peak <= budget)
        trials.append((candidates[i], ok, peak))
        if ok:
            good = i
            if bad == len(candidates):  # nothing failed yet: grow while there is clear room
                if not grow or budget is None or peak > budget * (1 - HEADROOM) or i + 1 == len(candidates):
                    break
                i = max(i + 1, max(j for j, c in enumerate(candidates) if c <= 2 * candidates[i]))
                continue
        else:
            bad = i
        i = (good + bad) // 2
    return (candidates[good] if good >= 0 else None), trials


class _Trials:
    """A throwaway model, optimizer and scaler on the device, and one trial per size."""

    def __init__(self, config: Config, plan: Plan, task: Task, device: torch.device) -> None:
        self.plan, self.task, self.device = plan, task, device
        self.model = task.build(plan.gradient_checkpointing).to(device)
        self.optimizer = make_optimizer(config, self.model)
        self.scaler = torch.amp.GradScaler(plan.device_type, enabled=plan.grad_scaler)
        self.forward_loss = forward_loss(self.model, task.loss, plan)  # as the trainer compiles it
        self.inject = Injector()
        self.steps = 0

    def batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = (t.to(self.device) for t in self.task.example_batch(size))
        if self.plan.compile:  # one graph for every size tried
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(y, 0)
        return x, y

    def measure(self, size: int, train: bool) -> int | None:
        reset_peak_memory(self.device)
        failed = False
        try:
            x, y = self.batch(size)
            for _ in range(TRIAL_STEPS if train else 1):
                self.steps += 1
                self.inject.check(size)
                if train:
                    with autocast_for(self.plan):
                        loss = self.forward_loss(x, y)
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    self.optimizer.zero_grad(set_to_none=True)
                else:
                    with torch.no_grad(), autocast_for(self.plan):
                        self.forward_loss(x, y)
            peak = device_memory(self.device)[1]
        except Exception as err:  # noqa: BLE001 - out-of-memory is an answer; anything else is a bug
            if not is_oom(err):
                raise
            failed = True
        if failed:
            release(self.device, self.optimizer)  # outside the except block: the traceback is gone
            return None
        return peak


def run(config: Config, plan: Plan, task: Task, device: torch.device) -> dict:
    """Probe now; the result as cached."""
    started = time.perf_counter()
    budget = getattr(plan, "budget_bytes", None)  # from the memory planner, when it planned this
    share = samples_per_process(plan)  # as the trainer cuts a window: the largest rank's slice
    # AUTO may grow up to the share; MANUAL: the configured micro-batch is the most the user wants
    cap, grow = (share, True) if plan.mode == "auto" else (plan.micro_batch, False)
    candidates = sorted(set(balanced_micro_batches(share, cap)) | {plan.micro_batch})
    start = candidates.index(plan.micro_batch)
    trials = _Trials(config, plan, task, device)
    model = trials.model
    model.train()
    micro, train_trials = search(lambda b: trials.measure(b, True), candidates, start, budget, grow)
    if micro is None:
        raise OutOfMemory(f"the probe ran out of memory even at micro-batch {candidates[0]} on {plan.device_name}: "
                          f"{ADVICE}")
    model.eval()
    n_eval = len(task.eval)
    eval_candidates = sorted({c for c in [2 ** k for k in range(n_eval.bit_length())] + [plan.eval_batch, n_eval]
                              if 1 <= c <= n_eval})
    eval_start = max(i for i, c in enumerate(eval_candidates) if c <= plan.eval_batch)
    eval_batch, eval_trials = search(lambda b: trials.measure(b, False), eval_candidates, eval_start, budget, True)
    steps = trials.steps
    del trials, model
    release(device)
    return {"max_micro": micro, "eval_batch": eval_batch or 1, "trial_steps": steps,
            "seconds": round(time.perf_counter() - started, 3),
            "peak_bytes": max((p for b, ok, p in train_trials if ok and b == micro), default=None),
            "trials": [[b, ok] for b, ok, _ in train_trials], "eval_trials": [[b, ok] for b, ok, _ in eval_trials]}


def _describe(trials: list) -> str:
    return ", ".join(f"{b} {'ok' if ok else 'failed'}" for b, ok in trials)


def apply(plan: Plan, result: dict, how: str) -> Plan:
    """The plan as the probe's `result` confirms it (lib.planning.edits.probed: the probed evaluation batch and,
    where the planned micro-batch does not fit, the fewest micro-batches that do)."""
    return edits.probed(plan, result["max_micro"], result["eval_batch"], how)


def maybe_probe(config: Config, plan: Plan, hardware: HardwareProfile, task: Task, *, log=print,
                rank: distributed.Rank = distributed.SINGLE) -> Plan:
    """The plan as the probe confirms it (PROBE_AUTO: GPUs, cache first; ALWAYS: any device; NEVER: as is)."""
    result = confirm(config, plan, hardware, task, log=log, rank=rank)
    if result is None:
        return plan
    probed = apply(plan, result, result["how"])
    log(f"Probe: micro-batches {plan.split.text()} -> {probed.split.text()}; eval batch {probed.eval_batch}")
    return probed


def confirm(config: Config, plan: Plan, hardware: HardwareProfile, task: Task, *, log=print,
            rank: distributed.Rank = distributed.SINGLE) -> dict | None:
    """The probe's result for `plan` ("max_micro", "eval_batch": the largest that fit; "how": measured or
    cached), or None where the config does not probe on this device."""
    if config.probe == "never" or (config.probe == "auto" and plan.device_type != "cuda"):
        return None
    if is_sharded(plan.strategy) and plan.world_size > 1 or plan.tensor_parallel > 1 or plan.pipeline_parallel > 1:
        # its trials hold a whole replica, which a process of a sharded, tensor-parallel or pipeline run never
        # does: it would refuse sizes that fit (or run out of memory where the run would not); the trace decides
        log("Probe: skipped: the plan shards, splits or cuts the model over processes, and the probe's trials "
            "hold a whole replica; the memory planner's trace of one process's share stands")
        return None
    device = distributed.device_for(rank, plan.device_type)
    path, key = cache_path(), fingerprint(config, plan, hardware, task)
    cache = read_cache(path)
    cached = cached_result(cache, key, path)
    if config.probe == "auto" and cached is not None:
        result, how = cached, "cached"
        log(f"Probe: cached result for this device and model in {path}: micro-batch up to {result['max_micro']}, "
            f"eval batch {result['eval_batch']} (CONFIG_PROBE_ALWAYS probes again)")
    else:
        result, how = run(config, plan, task, device), "measured"
        log(f"Probe: {result['trial_steps']} trial steps in {result['seconds']:.1f}s on {plan.device_name}: "
            f"micro-batch {_describe(result['trials'])}; eval batch {_describe(result['eval_trials'])}")
        if rank.is_main:
            cache[key] = {**result, "device": plan.device_name, "model": config.model, "time": time.time()}
            write_cache(path, cache, log)
    # Several ranks (possibly on different GPUs): everyone uses what fits on all of them.
    return {**result, "max_micro": distributed.all_min(result["max_micro"], device),
            "eval_batch": distributed.all_min(result["eval_batch"], device), "how": how}
