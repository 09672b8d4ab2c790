"""The model and everything one optimizer step needs, and that step itself.

A step accumulates gradients over this rank's micro-batches of a window (see
windows.py), agrees with the other ranks in one collective whether any ran out
of memory, and if one did, redoes the step at half the micro-batch with the same
samples; once halving can go no further, with the out-of-memory ladder's next
rung (ladder.py) instead. Under DDP with out-of-memory recovery on, gradients are summed only
after that agreement; without it DDP syncs during the last backward.
Under FSDP (plan.strategy, lib/parallel.py) the model is sharded before the
optimizer is made; gradients are reduce-scattered in the last micro-batch's
backward only where memory allows (plan.gradient_sync), every rank runs the same
number of micro-batches (FSDP's collectives run in every forward and backward),
and out-of-memory cannot be redone in place (one rank cannot leave those
collectives alone): the rank marks half the micro-batch in the run directory and
the launcher relaunches the run from its last checkpoint (mark_oom).
`Stepper` is the Trainer's base (loop.py adds the epochs around the steps);
its state (model, optimizer, scaler, Progress) is what a checkpoint saves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from .. import checkpoint, distributed, parallel
from ..config import Config
from ..errors import KfitError
from ..hardware import HardwareProfile
from ..models import count_parameters
from ..monitor import Monitor
from ..fileio import format_bytes
from ..oom import Injector, OutOfMemory, halve, is_oom, release
from ..plan import Plan
from ..step import autocast_for, configure_backends, make_optimizer, seed_everything
from ..task import Task, load_task
from .resume import (StopSignals, auto_interval_s, checkpoint_due, checkpoint_problem, checkpoint_state,
                     claim_run_directory, load_state, output_directory, sharded_tensors)
from . import best
from ..planning import ladder
from .initial import load_initial, not_both
from .schedule import lr_at
from .windows import Progress, epoch_micro_batches, loader, rank_batches

Log = Callable[[str], None]


class Stepper:
    """Builds the model, optimizer and scaler (restoring them from a run to resume) and takes optimizer steps."""

    def __init__(self, config: Config, plan: Plan, hardware: HardwareProfile, *,
                 run_dir: Path | None = None, log: Log = print, task: Task | None = None,
                 resume: Path | None = None, init_from: Path | None = None) -> None:
        """resume: a run directory to continue from its newest readable checkpoint (the resume search's pick),
        or a checkpoint file or sharded directory to continue from exactly (RESUME_FROM, checked by
        resume.resume_point); init_from: weights a new run starts from (INIT_FROM, initial.py)."""
        not_both(resume, init_from)
        self.rank = distributed.current() if torch.distributed.is_initialized() else distributed.SINGLE
        self.config, self.plan, self.hardware = config, plan, hardware
        self.log = log if self.rank.is_main else (lambda line: None)
        if self.rank.is_main:
            output_directory(config)  # an unusable CONFIG_OUTPUT_DIR is refused before any work
        seed_everything(config.seed)
        configure_backends(plan)
        self.device = distributed.device_for(self.rank, plan.device_type)
        self.task = task or load_task(config)  # a data error first: before anything is written
        # then what else the user can get wrong, still before the run directory exists
        best.check_metric(config, self.task.info.kind, config.model)
        self.initial = load_initial(init_from, self.task) if init_from is not None else None
        resume_dir = checkpoint.run_of(resume) if resume is not None else None
        chosen = Path(resume) if resume is not None and Path(resume) != resume_dir else None
        # rank 0 claims the run directory (a new one, named by the time, or the one to resume), locked against
        # a second `make train` there; every rank writes into that one and resumes what rank 0 decided
        self.lock, claim = None, None
        if self.rank.is_main:
            try:
                # a chosen checkpoint's run in use by another process is refused, never swapped for a new run
                named = run_dir if chosen is None else (run_dir or resume_dir)
                claimed, resume, self.lock = claim_run_directory(config, named, resume_dir, self.log)
                claim = (claimed, resume, None)
            except KfitError as err:  # refused on every rank, not only here
                claim = (None, None, str(err))
        self.run_dir, resume, refused = distributed.broadcast(claim)
        if refused is not None:
            raise KfitError(refused)
        self.train_split, self.eval_split, self.info = self.task.train, self.task.eval, self.task.info
        self.loss_fn = self.task.loss
        self.deferred: list[tuple[str, str, dict]] = []  # events from before the monitor started (kind, message, data)
        if resume is not None:  # a relaunch after out-of-memory under FSDP: its rungs shape the model and its shards
            plan = self.plan = ladder.reapply(config, plan, marker_rungs(resume), hardware)
        self.model = self.task.build(plan.gradient_checkpointing).to(self.device)
        if self.initial is not None:  # before sharding: names and shapes of the whole model (checked already)
            self.model.load_state_dict(self.initial.weights)
            self.deferred.append(("init_from", self.initial.message(), self.initial.record()))
            if self.rank.is_main:
                checkpoint.write_json_atomic(self.run_dir / checkpoint.INIT_RECORD, self.initial.record())
            self.initial.weights = None
        self.parameters = count_parameters(self.model)
        self.sharded = parallel.is_sharded(plan.strategy) and self.rank.active
        if self.sharded:  # before the optimizer: fully_shard replaces the parameters
            mesh = parallel.make_mesh(self.device.type, plan.strategy, self.rank.world_size,
                                      self.rank.local_world_size)
            parallel.shard_model(self.model, plan.strategy, mesh, precision=plan.precision,
                                 cpu_offload=plan.cpu_offload)
        self.optimizer = make_optimizer(config, self.model)
        self.scaler = torch.amp.GradScaler(plan.device_type, enabled=plan.grad_scaler)
        self.progress = Progress(window_size=plan.effective_batch, micro_batch=plan.micro_batch)
        self.resumed_from: Path | None = None
        self.inject = Injector()
        self.monitor: Monitor | None = None
        if resume is not None:
            self.restore(resume, chosen)
        self.ddp = None
        module = self.model
        if self.rank.active and not self.sharded:
            from torch.nn.parallel import DistributedDataParallel

            # No buffer broadcast: it is a collective in every forward, and ranks may run different
            # numbers of micro-batches (uneven slices, or one rank redoing a step after out-of-memory).
            no_forward_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                               inspect.signature(DistributedDataParallel).parameters else {"broadcast_buffers": False})
            self.ddp = module = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None, **no_forward_sync)
        self.forward = torch.compile(module, mode=plan.compile_mode) if plan.compile else module
        # With recovery on, every micro-batch runs under no_sync and gradients are summed after all ranks
        # agreed that none ran out of memory; otherwise DDP syncs during the last backward (overlapped).
        self.ddp_sync_last = self.ddp is not None and not config.oom_recovery
        self.recover_oom = config.oom_recovery and not self.sharded
        self.windows_per_epoch = len(epoch_micro_batches(len(self.train_split), self.progress.window_size, 0, 0))
        total = config.epochs * self.windows_per_epoch
        self.total_steps = min(total, config.max_steps) if config.max_steps else total
        self.feed = None
        self.signals = StopSignals()
        self.last_checkpoint = time.perf_counter()
        self.checkpoint_now = False
        self.battery_stop = False  # all ranks agreed to stop for a low battery (conditions.py) after this step
        self.updating = False
        self.conditions = None  # heat and battery (conditions.py): the Trainer's, while it runs

    # -- one optimizer step --------------------------------------------------

    def window_batches(self, window: list[int]) -> list[tuple[list[int], float]]:
        return rank_batches(window, self.rank.rank, self.rank.world_size, self.progress.micro_batch,
                            equal_counts=self.sharded)

    def start_feed(self, windows: list[list[int]], first: int) -> None:
        """Load this rank's micro-batches from window `first` on, at the current micro-batch size."""
        batches = [b for window in windows[first:] for b, _ in self.window_batches(window)]
        self.feed = iter(loader(self.train_split, batches, self.plan))

    def accumulate(self, window: list[int], step: int) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches; returns its sample-weighted loss sum."""
        batches = self.window_batches(window)
        # DDP syncing on the last micro-batch and FSDP average over ranks: undo that mean.
        grad_factor = self.rank.world_size if self.ddp_sync_last or self.sharded else 1
        total = torch.zeros((), device=self.device)
        for i, (indices, weight) in enumerate(batches):
            x, y = (t.to(self.device, non_blocking=True) for t in next(self.feed))
            self.inject.check(len(indices), step + 1 if i == 0 else None)
            last = i == len(batches) - 1
            if self.sharded:  # reduce-scatter in the last backward only, where memory allows (plan.gradient_sync)
                self.model.set_requires_gradient_sync(last or self.plan.gradient_sync == "micro_batch")
            sync = self.ddp is None or (self.ddp_sync_last and last)
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                with autocast_for(self.plan):
                    loss = self.loss_fn(self.forward(x), y)
                self.scaler.scale(loss * (weight * grad_factor)).backward()
            if weight:
                total += loss.detach() * len(indices)
        return total

    def optimizer_step(self, windows: list[list[int]], position: int, step: int) -> tuple[float, bool, bool]:
        """One optimizer step over windows[position], redone at half the micro-batch after out-of-memory.
        Returns (mean loss, time limit reached, stop signal) as all ranks agree on them; `checkpoint_now`
        says whether rank 0 found a periodic checkpoint due (every rank writes its shard under FSDP)."""
        window = windows[position]
        while True:
            self.optimizer.zero_grad(set_to_none=True)
            if self.feed is None:
                self.start_feed(windows, position)
            failed, loss_sum = False, 0.0
            try:
                loss_sum = self.accumulate(window, step).item()
            except Exception as err:  # noqa: BLE001 - only out-of-memory is recovered; the rest re-raises
                if self.sharded and self.config.oom_recovery and is_oom(err):
                    self.mark_oom(step, err)  # the launcher relaunches the run at half the micro-batch
                if not (self.recover_oom and is_oom(err)):
                    raise
                failed, reason = True, " ".join(str(err).split())[:200]
            timed_out = bool(self.config.time_limit_s and self.elapsed() >= self.config.time_limit_s)
            due = self.rank.is_main and checkpoint_due(self.config, step + 1, self.last_checkpoint,
                                                       self.checkpoint_interval_s())
            # One collective per step: every rank learns whether any ran out of memory or must stop.
            low_battery = self.conditions is not None and self.conditions.stop_requested
            oom, loss_sum, time_flag, signal_flag, due_flag, battery_flag = distributed.all_sum(
                [float(failed), loss_sum, float(timed_out), float(self.signals.received is not None), float(due),
                 float(low_battery)], self.device)
            self.checkpoint_now, self.battery_stop = due_flag > 0, battery_flag > 0
            if not oom:
                break
            self.recover(step, reason if failed else "another rank ran out of memory")
        self.updating = True  # until the update is done, the tensors are neither the last step's nor this one's
        if self.ddp is not None and not self.ddp_sync_last:
            distributed.all_reduce_gradients(list(self.model.parameters()))
        if self.config.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.config, step, self.total_steps)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.updating = False
        return loss_sum / len(window), time_flag > 0, signal_flag > 0

    def recover(self, step: int, reason: str) -> None:
        """After out-of-memory: free the failed step, halve the micro-batch, double the accumulation; once
        halving can go no further, take the out-of-memory ladder's next rung (ladder.py)."""
        self.feed = None  # the loader's prefetched batches belong to the old cut
        release(self.device, self.optimizer)
        p, before = self.progress, self.progress.micro_batch
        try:
            p.micro_batch = halve(before, p.halvings, self.config.oom_max_halvings or 0, f"at step {step + 1}")
        except OutOfMemory as stuck:
            self.climb(step, reason, stuck)
            return
        p.halvings += 1
        self.plan_halved(f"after out of memory at step {step + 1}")
        if self.rank.is_main:
            checkpoint.write_json_atomic(self.run_dir / "plan.json", self.plan.to_dict())
        self.event("oom_recovery", f"Out of memory at step {step + 1} ({reason}): micro-batch {before} -> "
                           f"{p.micro_batch}, accumulation {self.plan.grad_accum}; redoing the step with the "
                           f"same {p.window_size} samples", micro_batch=p.micro_batch, halvings=p.halvings)

    def climb(self, step: int, reason: str, stuck: OutOfMemory) -> None:
        """Take the ladder's next rung and redo the step; `stuck` (with what the ladder tried) when none is left."""
        p = self.progress
        rung = ladder.next_rung(self.config, self.plan, self.hardware, p.rungs, can_checkpoint=self.can_checkpoint)
        if rung is None:
            raise OutOfMemory(f"{stuck}; {ladder.exhausted(self.config, p.rungs)}") from None
        peaks = ladder.predicted_peaks(self.config, self.plan, rung.plan)
        self.take_rungs(rung.plan, [rung.name])
        saving = " (saving not predicted)" if peaks is None else (
            f" (predicted peak {format_bytes(peaks[0])} -> {format_bytes(peaks[1])}, "
            + (f"saves {format_bytes(peaks[0] - peaks[1])})" if peaks[1] < peaks[0] else "no saving predicted)"))
        self.event("oom_rung", f"Out of memory at step {step + 1} at micro-batch {p.micro_batch} ({reason}): "
                   f"out-of-memory ladder rung {len(p.rungs)}: {rung.what}{saving}; redoing the step with the same "
                   f"{p.window_size} samples (micro-batch {p.micro_batch}, accumulation {self.plan.grad_accum})",
                   rung=rung.name, micro_batch=p.micro_batch, grad_accum=self.plan.grad_accum,
                   effective_batch=p.window_size, predicted_peak_before_bytes=peaks[0] if peaks else None,
                   predicted_peak_after_bytes=peaks[1] if peaks else None,
                   predicted_saving_bytes=peaks[0] - peaks[1] if peaks else None)

    def checkpoint_interval_s(self) -> float | None:
        """Seconds between periodic checkpoints: the low-battery interval while it applies, else AUTO's (None
        with CHECKPOINT_INTERVAL_STEPS)."""
        minutes = self.conditions.checkpoint_minutes if self.conditions is not None else None
        if minutes:
            return 60.0 * minutes
        return auto_interval_s(self.config, self.plan.predicted_run_seconds) \
            if self.config.checkpoint_interval == "auto" else None

    @property
    def can_checkpoint(self) -> bool:
        return hasattr(self.model, "grad_checkpointing")  # GPT-2 and ResNet recompute per block or stage

    def take_rungs(self, plan: Plan, names: list[str]) -> None:
        """Run from now on as `plan`, the ladder's rungs `names` taken: the model and scaler follow it."""
        self.plan = plan
        self.progress.rungs.extend(n for n in names if n not in self.progress.rungs)
        if self.can_checkpoint:
            self.model.grad_checkpointing = plan.gradient_checkpointing
        if plan.grad_scaler and not self.scaler.is_enabled():
            self.scaler = torch.amp.GradScaler(plan.device_type, enabled=True)
        self.inject.adapted = self.inject.adapted or bool(names)
        if self.rank.is_main and self.monitor is not None:  # in a run (not while restoring, before its files)
            checkpoint.write_json_atomic(self.run_dir / "plan.json", self.plan.to_dict())

    def plan_halved(self, why: str) -> None:
        """The plan at the progress's smaller micro-batch: the accumulation that keeps the step's samples."""
        p = self.progress
        share = math.ceil(p.window_size / self.rank.world_size)
        self.plan = dataclasses.replace(
            self.plan, micro_batch=p.micro_batch, grad_accum=math.ceil(share / p.micro_batch),
            reasons={**self.plan.reasons,
                     "micro_batch": self.plan.reasons.get("micro_batch", "") + f"; halved to {p.micro_batch} {why}"})

    def mark_oom(self, step: int, err: BaseException) -> None:
        """Under FSDP: record in the run directory the halved micro-batch the relaunched run takes (from its
        last checkpoint, with the same effective batch), or once halving can go no further the ladder's next
        rung (ladder.py), for `make train` to relaunch torchrun with it."""
        p = self.progress
        marker = {"micro_batch": p.micro_batch, "halvings": p.halvings, "rungs": list(p.rungs), "step": step + 1,
                  "reason": " ".join(str(err).split())[:200]}
        try:
            marker["micro_batch"] = halve(p.micro_batch, p.halvings, self.config.oom_max_halvings or 0,
                                          f"at step {step + 1}")
            marker["halvings"] += 1
        except OutOfMemory as stuck:
            rung = ladder.next_rung(self.config, self.plan, self.hardware, p.rungs, can_checkpoint=self.can_checkpoint)
            if rung is None:
                raise OutOfMemory(f"{stuck}; {ladder.exhausted(self.config, p.rungs)}") from None
            marker["rungs"].append(rung.name)
        checkpoint.write_json_atomic(self.run_dir / checkpoint.OOM_MARKER, marker)

    def apply_oom_marker(self) -> None:
        """A relaunch after out-of-memory under FSDP takes the marker's micro-batch and rungs (mark_oom; the
        rungs are in the plan already, from before the model was built: `marker_rungs`)."""
        try:
            marker = json.loads((self.run_dir / checkpoint.OOM_MARKER).read_text())
        except (OSError, ValueError):
            return
        p = self.progress
        new = [r for r in marker.get("rungs", []) if r not in p.rungs]
        if new:
            p.rungs.extend(new)
            self.deferred.append(("oom_rung", f"Out of memory at step {marker['step']} at micro-batch {p.micro_batch} "
                                  f"({marker['reason']}): out-of-memory ladder: {', '.join(new)} (FSDP relaunch); the "
                                  f"same {p.window_size} samples per step", {"rung": new[-1], "rungs": list(p.rungs)}))
        if marker.get("micro_batch", p.micro_batch) >= p.micro_batch:
            return  # a later checkpoint already runs at it
        before, p.micro_batch, p.halvings = p.micro_batch, marker["micro_batch"], marker["halvings"]
        self.plan_halved(f"after out of memory at step {marker['step']} (FSDP relaunch)")
        self.log(f"Out of memory at step {marker['step']} ({marker['reason']}): micro-batch {before} -> "
                 f"{p.micro_batch}, accumulation {self.plan.grad_accum}; the same {p.window_size} samples per step")

    def event(self, kind: str, message: str, **data) -> None:
        if self.monitor is not None:
            self.monitor.event(kind, message, **data)
        else:  # evaluate() called outside fit()
            self.log(message)

    def elapsed(self) -> float:
        return self.progress.elapsed_s + time.perf_counter() - self.started

    # -- the state a checkpoint holds ----------------------------------------

    def save(self, path: Path, final_eval: dict | None = None, keep: int = 0) -> Path:
        """Rank 0 writes the checkpoint file; under FSDP every rank calls this and writes its shards.
        `keep`: a periodic checkpoint, after which the newest `keep` are kept (loop.py prunes): out of room,
        the ones that pruning would delete go first, while at least one earlier checkpoint stays."""
        state = checkpoint_state(
            model=None if self.sharded else self.model, optimizer=None if self.sharded else self.optimizer,
            scaler=self.scaler, device=self.device, progress={**asdict(self.progress), "elapsed_s": self.elapsed()},
            epoch=self.epochs_begun(), final_eval=final_eval, config=self.config, plan=self.plan,
            hardware=self.hardware)
        if self.sharded:
            checkpoint.save_sharded(path, sharded_tensors(self.model, self.optimizer), state,
                                    is_main=self.rank.is_main, barrier=torch.distributed.barrier)
        else:
            make_room = (lambda: bool(checkpoint.prune(self.run_dir, keep - 1, path))) if keep > 1 else None
            checkpoint.save_run_checkpoint(path, state, make_room)
        return path

    def release_run_directory(self) -> None:
        """Let another `make train` take the run directory (the process ending does it too)."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    @property
    def saves(self) -> bool:
        """Whether this rank takes part in saving: rank 0, or every rank of a sharded run."""
        return self.rank.is_main or self.sharded

    def restore(self, run_dir: Path, chosen: Path | None = None) -> None:
        """Continue the run in run_dir from `chosen` (RESUME_FROM's, checked), else its newest readable checkpoint."""
        found = ((chosen, checkpoint.load_checkpoint(chosen)) if chosen is not None else
                 checkpoint.latest_valid(run_dir, self.log, checkpoint_problem))
        if found is None and not (Path(run_dir) / checkpoint.OOM_MARKER).is_file():
            self.log(f"warning: no readable checkpoint in {run_dir}: starting a fresh run")
            return
        if found is not None:
            path, state = found
            self.progress = load_state(state, self.model, self.optimizer, self.scaler, self.device, path=path,
                                       sharded=self.sharded)
            if state.get("plan") and moved(state["plan"], self.plan):
                self.replan(state["plan"])
            else:
                self.plan = dataclasses.replace(self.plan, micro_batch=self.progress.micro_batch)
                rungs = self.progress.rungs
                plan = ladder.reapply(self.config, self.plan, rungs, self.hardware, self.can_checkpoint)
                self.take_rungs(plan, rungs)
                if state["scaler"] and self.scaler.is_enabled():  # a scaler the fp16 rung enabled: its scale back
                    self.scaler.load_state_dict(state["scaler"])
            self.resumed_from = path
            if self.rank.is_main:
                self.drop_later(run_dir, path)
        self.run_dir = Path(run_dir)  # without a checkpoint: out of memory before the first, restarted here
        self.apply_oom_marker()

    def drop_later(self, run_dir: Path, resumed: Path) -> None:
        """Checkpoints later than the one resumed (an older one RESUME_FROM chose, or unreadable newer ones)
        belong to steps this run takes again: the rotation would keep them over its new ones and the resume
        search would take them. Best-<step> files outside the resumed ranking go too (best.py)."""
        p = self.progress
        later = [path for step, path in checkpoint.periodic_checkpoints(run_dir) if step > p.step]
        for path in later:
            checkpoint.remove(path)
        later += checkpoint.prune_best(run_dir, [step for step, _ in p.best])
        if later:
            self.log(f"note: resuming from {resumed.name}: removed {', '.join(sorted(q.name for q in later))}, "
                     "saved after it")

    def replan(self, old: dict) -> None:
        """Resuming on another device than the checkpoint's (its GPU lost, say): this run's own plan's
        micro-batch for the same effective batch, halvings and ladder rungs started afresh."""
        p = self.progress
        p.micro_batch, p.halvings, p.rungs = self.plan.micro_batch, 0, []
        self.log(f"Resuming on {self.plan.device_type} ({self.plan.device_name}); the checkpoint was taken on "
                 f"{old.get('device_type')} ({old.get('device_name')}): micro-batch {old.get('micro_batch')} -> "
                 f"{p.micro_batch}, accumulation {self.plan.grad_accum}, the same effective batch {p.window_size}")

    def epochs_begun(self) -> int:
        return min(self.progress.epoch + (self.progress.window > 0), self.config.epochs)

    def release(self) -> None:
        """Drop the model, optimizer and DDP wrapper (before leaving a process group)."""
        self.forward = self.ddp = self.model = self.optimizer = self.feed = None


def moved(old: dict, plan: Plan) -> bool:
    """Whether a checkpoint's plan ran on another kind of device, or another GPU model, than `plan`."""
    return (old.get("device_type"), old.get("device_name")) != (plan.device_type, plan.device_name)


def marker_rungs(run_dir: Path) -> list[str]:
    """The ladder rungs an out-of-memory marker (mark_oom) asks the relaunched run to take."""
    try:
        return list(json.loads((Path(run_dir) / checkpoint.OOM_MARKER).read_text()).get("rungs", []))
    except (OSError, ValueError, AttributeError):
        return []
