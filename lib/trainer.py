"""The one training loop, for every model. It reads only the Config and the Plan.

Gradient accumulation is exactly one large batch: each micro-batch's mean loss
is weighted by its share of the samples in its optimizer step, so a short last
window of an epoch (or a short last micro-batch) weighs what it should, and
micro-batch b with accumulation k ends with the same weights as b*k with 1
(to float rounding; BatchNorm is the exception, as its batch statistics are
computed per micro-batch in any framework).
The sample order is a function of (seed, epoch) only, never of the batch
size, which is what makes that equivalence (and exact resume) hold.

An optimizer step is a *window* of the epoch's order: effective-batch samples,
cut by `epoch_micro_batches(n, effective batch, seed, epoch)`. Under several
processes each rank takes a disjoint slice of every window; each rank cuts its
slice into micro-batches of the current size. So neither the number of
processes nor an out-of-memory halving of the micro-batch changes which
samples an optimizer step sees: N ranks x accumulation k equal 1 rank x N*k,
and a step redone after out-of-memory equals the step that failed.

Resume: checkpoints hold the model, optimizer, scaler, RNG states and the
position (epoch, window, current micro-batch), so a run interrupted by SIGTERM
or SIGINT and resumed computes exactly the losses of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import platform
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import DataLoader

from . import checkpoint, distributed
from .config import Config
from .data import BatchSplit
from .hardware import HardwareProfile
from .plan import Plan
from .models import count_parameters
from .monitor import Monitor
from .oom import Injector, halve, is_oom, release
from .step import autocast_for, configure_backends, make_optimizer, seed_everything
from .task import Task, load_task

Log = Callable[[str], None]
# Called after every evaluation with (optimizer step, epoch, metrics); an exception it raises
# (optuna.TrialPruned, say) ends training and propagates to the caller of train().
OnEval = Callable[[int, int, dict], None]


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    epochs: float
    samples: int
    seconds: float
    stop_reason: str
    final_eval: dict
    history: list[dict] = field(default_factory=list)


# --------------------------------------------------------------------------
# Building the pieces


def lr_at(config: Config, step: int, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then cosine to 10% or constant."""
    peak = config.learning_rate
    if step < config.warmup_steps:
        return peak * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return peak
    span = max(1, total_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def epoch_micro_batches(num_samples: int, micro_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's sample order, cut into micro-batches. Order depends on (seed, epoch) only."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return split_batches(torch.randperm(num_samples, generator=generator).tolist(), micro_batch)


def split_batches(indices: list[int], size: int) -> list[list[int]]:
    """Consecutive batches of `size`; a lone trailing sample would break BatchNorm's training
    statistics, so it joins the previous batch."""
    batches = [indices[i:i + size] for i in range(0, len(indices), size)]
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2].extend(batches.pop())
    return batches


def run_directory(config: Config) -> Path:
    base = Path(config.output_dir)
    if config.run_name:
        return base / config.run_name
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    label = f"{config.model}-{config.gpt2_preset}" if config.gpt2_preset else config.model
    path = base / f"{label}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = base / f"{label}-{stamp}-{n}"
    return path


def versions() -> dict:
    return {"torch": str(torch.__version__), "python": platform.python_version(),
            "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}


# --------------------------------------------------------------------------
# The loop


class TrainingInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT stopped training after a checkpoint was saved; exit_code is 128 + the signal."""

    def __init__(self, signum: int, step: int, path: Path | None) -> None:
        self.signum, self.step, self.path, self.exit_code = signum, step, path, 128 + signum
        super().__init__(f"{signal.Signals(signum).name} at step {step}")


@dataclass
class Progress:
    """Where a run stands: with the tensors, all a checkpoint needs to continue exactly."""

    window_size: int  # samples per optimizer step over all ranks (the effective batch)
    micro_batch: int  # current micro-batch per rank (smaller after out-of-memory halvings)
    halvings: int = 0
    step: int = 0
    epoch: int = 0  # 0-based epoch in progress
    window: int = 0  # windows of that epoch already done
    samples: int = 0
    elapsed_s: float = 0.0
    interval_loss: float = 0.0  # sample-weighted loss since the last log line
    interval_samples: int = 0


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class Trainer:
    def __init__(self, config: Config, plan: Plan, hardware: HardwareProfile, *,
                 run_dir: Path | None = None, log: Log = print, task: Task | None = None,
                 on_eval: OnEval | None = None, resume: Path | None = None) -> None:
        self.rank = distributed.current() if torch.distributed.is_initialized() else distributed.SINGLE
        self.config, self.plan, self.hardware = config, plan, hardware
        self.log = log if self.rank.is_main else (lambda line: None)
        self.on_eval = on_eval
        seed_everything(config.seed)
        configure_backends(plan)
        self.device = distributed.device_for(self.rank, plan.device_type)
        self.task = task or load_task(config)
        self.train_split, self.eval_split, self.info = self.task.train, self.task.eval, self.task.info
        self.loss_fn = self.task.loss
        self.model = self.task.build(plan.gradient_checkpointing).to(self.device)
        self.parameters = count_parameters(self.model)
        self.optimizer = make_optimizer(config, self.model)
        self.scaler = torch.amp.GradScaler(plan.device_type, enabled=plan.grad_scaler)
        self.progress = Progress(window_size=plan.effective_batch, micro_batch=plan.micro_batch)
        self.resumed_from: Path | None = None
        self.run_dir = run_dir or run_directory(config)
        if resume is not None:
            self.restore(resume)
        self.ddp = None
        module = self.model
        if self.rank.active:
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
        self.inject = Injector()
        self.windows_per_epoch = len(epoch_micro_batches(len(self.train_split), self.progress.window_size, 0, 0))
        total = config.epochs * self.windows_per_epoch
        self.total_steps = min(total, config.max_steps) if config.max_steps else total
        self.feed = None
        self.stop_signal: int | None = None
        self.monitor: Monitor | None = None

    # -- pieces of a step ----------------------------------------------------

    def autocast(self):
        return autocast_for(self.plan)

    def loader(self, split: BatchSplit, batches: list[list[int]]) -> DataLoader:
        return DataLoader(split, sampler=batches, batch_size=None, num_workers=self.plan.num_workers,
                          pin_memory=self.plan.pin_memory)

    def to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def window_batches(self, window: list[int]) -> list[tuple[list[int], float]]:
        """This rank's micro-batches of a window, each with its share of the window's samples."""
        n, size, rank = len(window), self.rank.world_size, self.rank.rank
        mine = window[rank * n // size:(rank + 1) * n // size]
        if not mine:  # fewer samples than ranks: a zero-weight pass keeps DDP's bookkeeping in step
            return [(window[:2], 0.0)]
        return [(b, len(b) / n) for b in split_batches(mine, self.progress.micro_batch)]

    def start_feed(self, windows: list[list[int]], first: int) -> None:
        """Load this rank's micro-batches from window `first` on, at the current micro-batch size."""
        batches = [b for window in windows[first:] for b, _ in self.window_batches(window)]
        self.feed = iter(self.loader(self.train_split, batches))

    def accumulate(self, window: list[int], step: int) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches; returns its sample-weighted loss sum."""
        batches = self.window_batches(window)
        # Under DDP with sync on the last micro-batch, DDP averages over ranks: undo that mean.
        grad_factor = self.rank.world_size if self.ddp_sync_last else 1
        total = torch.zeros((), device=self.device)
        for i, (indices, weight) in enumerate(batches):
            x, y = self.to_device(*next(self.feed))
            self.inject.check(len(indices), step + 1 if i == 0 else None)
            sync = self.ddp is None or (self.ddp_sync_last and i == len(batches) - 1)
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                with self.autocast():
                    loss = self.loss_fn(self.forward(x), y)
                self.scaler.scale(loss * (weight * grad_factor)).backward()
            if weight:
                total += loss.detach() * len(indices)
        return total

    def optimizer_step(self, windows: list[list[int]], position: int, step: int) -> tuple[float, bool, bool]:
        """One optimizer step over windows[position], redone at half the micro-batch after out-of-memory.
        Returns (mean loss, time limit reached, stop signal) as all ranks agree on them."""
        window = windows[position]
        while True:
            self.optimizer.zero_grad(set_to_none=True)
            if self.feed is None:
                self.start_feed(windows, position)
            failed, loss_sum = False, 0.0
            try:
                loss_sum = self.accumulate(window, step).item()
            except Exception as err:  # noqa: BLE001 - only out-of-memory is recovered; the rest re-raises
                if not (self.config.oom_recovery and is_oom(err)):
                    raise
                failed, reason = True, " ".join(str(err).split())[:200]
            timed_out = bool(self.config.time_limit_s and self.elapsed() >= self.config.time_limit_s)
            # One collective per step: every rank learns whether any ran out of memory or must stop.
            oom, loss_sum, time_flag, signal_flag = distributed.all_sum(
                [float(failed), loss_sum, float(timed_out), float(self.stop_signal is not None)], self.device)
            if not oom:
                break
            self.recover(step, reason if failed else "another rank ran out of memory")
        if self.ddp is not None and not self.ddp_sync_last:
            distributed.all_reduce_gradients(list(self.model.parameters()))
        if self.config.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.config, step, self.total_steps)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss_sum / len(window), time_flag > 0, signal_flag > 0

    def recover(self, step: int, reason: str) -> None:
        """After out-of-memory: free the failed step, halve the micro-batch, double the accumulation."""
        self.feed = None  # the loader's prefetched batches belong to the old cut
        release(self.device, self.optimizer)
        p, before = self.progress, self.progress.micro_batch
        p.micro_batch = halve(before, p.halvings, self.config.oom_max_halvings or 0, f"at step {step + 1}")
        p.halvings += 1
        share = math.ceil(p.window_size / self.rank.world_size)
        self.plan = dataclasses.replace(
            self.plan, micro_batch=p.micro_batch, grad_accum=math.ceil(share / p.micro_batch),
            reasons={**self.plan.reasons, "micro_batch": self.plan.reasons.get("micro_batch", "") +
                     f"; halved to {p.micro_batch} after out of memory at step {step + 1}"})
        if self.rank.is_main:
            checkpoint.write_json_atomic(self.run_dir / "plan.json", self.plan.to_dict())
        self.event("oom_recovery", f"Out of memory at step {step + 1} ({reason}): micro-batch {before} -> "
                           f"{p.micro_batch}, accumulation {self.plan.grad_accum}; redoing the step with the "
                           f"same {p.window_size} samples", micro_batch=p.micro_batch, halvings=p.halvings)

    def event(self, kind: str, message: str, **data) -> None:
        if self.monitor is not None:
            self.monitor.event(kind, message, **data)
        else:  # evaluate() called outside fit()
            self.log(message)

    @torch.no_grad()
    def evaluate(self) -> dict:
        halvings = 0
        while True:
            try:
                return self._evaluate(self.plan.eval_batch)
            except Exception as err:  # noqa: BLE001
                if not (self.config.oom_recovery and is_oom(err)):
                    raise
            finally:
                self.model.train()
            release(self.device)
            before = self.plan.eval_batch
            self.plan = dataclasses.replace(self.plan, eval_batch=halve(
                before, halvings, self.config.oom_max_halvings or 0, "in evaluation"))
            halvings += 1
            self.event("oom_recovery", f"Out of memory in evaluation: eval batch {before} -> "
                               f"{self.plan.eval_batch}", eval_batch=self.plan.eval_batch)

    def _evaluate(self, eval_batch: int) -> dict:
        self.model.eval()
        n = len(self.eval_split)
        batches = [list(range(i, min(i + eval_batch, n))) for i in range(0, n, eval_batch)]
        loss_sum, correct = 0.0, 0
        for x, y in self.loader(self.eval_split, batches):
            x, y = self.to_device(x, y)
            self.inject.check(len(y))
            with self.autocast():
                logits = self.model(x)  # the bare module: no DDP collectives, only rank 0 evaluates
            loss_sum += self.loss_fn(logits, y).item() * len(y)
            if self.info.kind == "image":
                correct += (logits.argmax(dim=-1) == y).sum().item()
        loss = loss_sum / n
        if self.info.kind == "image":
            return {"eval_loss": loss, "accuracy": correct / n}
        if self.info.kind == "text":
            return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0))}
        return {"eval_loss": loss}

    # -- checkpoints ---------------------------------------------------------

    def write_run_files(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.write_text_atomic(self.run_dir / "config", self.config.text)
        checkpoint.write_json_atomic(self.run_dir / "plan.json", self.plan.to_dict())
        checkpoint.write_json_atomic(self.run_dir / "hardware.json", self.hardware.to_dict())

    def save(self, path: Path, final_eval: dict | None = None) -> Path:
        p = self.progress
        checkpoint.save_checkpoint(path, {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(), "progress": {**asdict(p), "elapsed_s": self.elapsed()},
            "rng": _rng_state(self.device), "step": p.step, "epoch": self.epochs_begun(), "eval": final_eval,
            "config": self.config.text, "plan": self.plan.to_dict(), "hardware": self.hardware.to_dict(),
            "versions": versions()})
        return path

    def save_periodic(self) -> Path:
        path = self.save(checkpoint.periodic_path(self.run_dir, self.progress.step))
        checkpoint.prune(self.run_dir, self.config.checkpoint_keep)
        self.last_checkpoint = time.perf_counter()
        return path

    def checkpoint_due(self) -> bool:
        if self.config.checkpoint_interval == "steps":
            return self.progress.step % self.config.checkpoint_every_steps == 0
        # AUTO: from the measured step time, about every CHECKPOINT_MINUTES of training.
        return time.perf_counter() - self.last_checkpoint >= 60 * (self.config.checkpoint_minutes or 10)

    def restore(self, run_dir: Path) -> None:
        """Continue the run in run_dir from its newest readable checkpoint."""
        found = checkpoint.latest_valid(run_dir, self.log)
        if found is None:
            self.log(f"warning: no readable checkpoint in {run_dir}: starting a fresh run")
            return
        path, state = found
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"], self.device)
        self.progress = Progress(**state["progress"])
        self.plan = dataclasses.replace(self.plan, micro_batch=self.progress.micro_batch)
        self.run_dir, self.resumed_from = Path(run_dir), path

    def epochs_begun(self) -> int:
        return min(self.progress.epoch + (self.progress.window > 0), self.config.epochs)

    def elapsed(self) -> float:
        return self.progress.elapsed_s + time.perf_counter() - self.started

    def _on_signal(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.stop_signal == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        self.stop_signal = signum

    def _catch_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}  # signal handlers can only be installed from the main thread (HPO may use others)
        return {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    # -- the run -------------------------------------------------------------

    def fit(self) -> TrainResult:
        config, plan, log, p = self.config, self.plan, self.log, self.progress
        main = self.rank.is_main
        if main:
            self.write_run_files()
        log(f"Data: {self.info.description}")
        log(f"Model: {config.model}{'-' + config.gpt2_preset if config.gpt2_preset else ''}, "
            f"{self.parameters:,} parameters, on {plan.device_type} ({plan.precision}); "
            f"{self.total_steps} optimizer steps of {p.window_size} samples"
            + (f" over {self.rank.world_size} processes" if self.rank.active else ""))
        log(f"Run directory: {self.run_dir}")
        self.monitor = Monitor(
            self.run_dir, self.total_steps, self.device, self.hardware,
            interval_s=(config.monitor_interval_ms or 1000) / 1000, telemetry=config.monitor,
            tokens_per_sample=self.info.block_size or 0, log=log, enabled=config.monitor,
            append=self.resumed_from is not None, write_metrics=main)
        history: list[dict] = []
        stop_reason, final = "epochs", {}
        previous_handlers = self._catch_signals()
        self.model.train()
        self.started = self.last_checkpoint = time.perf_counter()
        interval_start = self.started
        try:
            self.monitor.start()
            if self.resumed_from is not None:
                self.monitor.event("resume", f"Resuming {self.run_dir} from step {p.step} ({self.resumed_from.name}, "
                                   f"epoch {p.epoch + 1}, micro-batch {p.micro_batch})", path=str(self.resumed_from))
            while p.epoch < config.epochs and stop_reason == "epochs" and p.step < self.total_steps:
                windows = epoch_micro_batches(len(self.train_split), p.window_size, config.seed, p.epoch)
                self.feed = None
                while p.window < len(windows):
                    loss, timed_out, signalled = self.optimizer_step(windows, p.window, p.step)
                    if not math.isfinite(loss):
                        raise FloatingPointError(
                            f"loss became {loss} at step {p.step + 1}: lower CONFIG_LEARNING_RATE "
                            f"(now {config.learning_rate:g}) or enable CONFIG_GRAD_CLIP")
                    n = len(windows[p.window])
                    p.step, p.window, p.samples = p.step + 1, p.window + 1, p.samples + n
                    p.interval_loss, p.interval_samples = p.interval_loss + loss * n, p.interval_samples + n
                    lr = self.optimizer.param_groups[0]["lr"]
                    self.monitor.update(p.step, p.epoch + 1, loss, lr, p.samples)
                    if p.step % config.log_interval == 0 or p.step == self.total_steps:
                        now = time.perf_counter()
                        rate = p.interval_samples / max(now - interval_start, 1e-9)
                        entry = {"step": p.step, "epoch": p.epoch + 1, "loss": p.interval_loss / p.interval_samples,
                                 "lr": lr, "samples_per_s": rate, "elapsed_s": self.elapsed()}
                        if self.info.block_size:
                            entry["tokens_per_s"] = rate * self.info.block_size
                        history.append(entry)
                        self.monitor.log_entry(entry)
                        interval_start, p.interval_loss, p.interval_samples = now, 0.0, 0
                    if config.eval_interval and p.step % config.eval_interval == 0 and p.step < self.total_steps:
                        history.append(self.log_eval(p.step, p.epoch + 1))
                    if config.max_steps and p.step >= config.max_steps:
                        stop_reason = "max_steps"
                        break
                    if timed_out:
                        stop_reason = "time_limit"
                        break
                    if signalled:
                        self.interrupt()
                    if main and self.checkpoint_due() and p.step < self.total_steps:
                        path = self.save_periodic()
                        self.monitor.event("checkpoint", f"Checkpoint at step {p.step}: {path.name}", path=str(path))
                else:
                    if not config.eval_interval and p.epoch + 1 < config.epochs:
                        history.append(self.log_eval(p.step, p.epoch + 1))
                    self.monitor.epoch_end(p.epoch + 1)
                    p.epoch, p.window = p.epoch + 1, 0
            if stop_reason == "epochs" and config.max_steps and p.step >= config.max_steps:
                stop_reason = "max_steps"  # resumed from a checkpoint taken at the last step
            seconds, self.feed = self.elapsed(), None
            if main:
                final = self.log_eval(p.step, self.epochs_begun(), final=True)
                history.append(final)
                final = {k: v for k, v in final.items() if k not in ("step", "epoch", "final")}
                path = self.save(self.run_dir / checkpoint.FINAL, final)
                for _, old in checkpoint.periodic_checkpoints(self.run_dir):
                    old.unlink(missing_ok=True)  # the finished run's checkpoint supersedes them
                log(f"Saved {path} ({stop_reason}: {p.step} steps, {p.samples:,} samples in {seconds:.1f}s)")
        finally:
            self.feed = None
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
            self.monitor.close()
        return TrainResult(run_dir=self.run_dir, steps=p.step, epochs=p.samples / len(self.train_split),
                           samples=p.samples, seconds=seconds, stop_reason=stop_reason, final_eval=final,
                           history=history)

    def interrupt(self) -> None:
        """Stop at this step boundary after saving a checkpoint (all ranks agreed on it)."""
        signum = self.stop_signal or signal.SIGTERM
        path = self.save_periodic() if self.rank.is_main else None
        self.monitor.event("interrupted", f"{signal.Signals(signum).name} received: checkpoint saved at step "
                           f"{self.progress.step} ({path.name if path else ''}); 'make train' resumes from it",
                           signal=signal.Signals(signum).name, path=str(path))
        raise TrainingInterrupted(signum, self.progress.step, path)

    def log_eval(self, step: int, epoch: int, final: bool = False) -> dict:
        """Evaluate (rank 0 only: the others wait at the next step's collective) and report."""
        if not self.rank.is_main:
            return {"step": step, "epoch": epoch}
        result = self.evaluate()
        entry = {"step": step, "epoch": epoch, **result, **({"final": True} if final else {})}
        self.monitor.log_entry(entry)
        if self.on_eval is not None:
            self.on_eval(step, epoch, result)
        return entry

    def release(self) -> None:
        """Drop the model, optimizer and DDP wrapper (before leaving a process group)."""
        self.forward = self.ddp = self.model = self.optimizer = self.feed = None


def train(config: Config, plan: Plan, hardware: HardwareProfile, *, run_dir: Path | None = None,
          log: Log = print, task: Task | None = None, on_eval: OnEval | None = None,
          resume: Path | None = None) -> TrainResult:
    """Train as configured and planned; returns where the run went and how it ended.
    `resume`: a run directory to continue from its newest readable checkpoint."""
    trainer = Trainer(config, plan, hardware, run_dir=run_dir, log=log, task=task, on_eval=on_eval, resume=resume)
    try:
        return trainer.fit()
    finally:
        if trainer.rank.active:
            trainer.release()
