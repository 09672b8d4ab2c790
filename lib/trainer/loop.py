"""The one training loop, for every model. It reads only the Config and the Plan.

`Trainer` runs epochs of optimizer steps (stepper.py takes each one), with the
log lines, evaluations (evaluation.py), periodic checkpoints (resume.py) and the
stops: epochs done, CONFIG_MAX_STEPS, the time limit, early stopping (best.py, which
also keeps the best-k checkpoints), or SIGTERM/SIGINT after a checkpoint. Which samples each step sees is windows.py's. After each step the
heat and battery policies run (conditions.py). A device that fails for good
(is_device_lost: ECC, lost, launch failure) saves the last completed step's
state where it can still be read and stops with the command that resumes
(exit 3); resumed on another device, the run plans its micro-batch again.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import checkpoint, distributed, tracking
from ..config import Config
from ..hardware import HardwareProfile
from ..hardware.runtime import is_device_lost
from ..monitor import Monitor
from ..plan import Plan
from ..task import Task
from . import best
from .evaluation import Evaluator
from .conditions import Conditions, Sensors
from .resume import (DEVICE_LOST_EXIT, MIN_AUTO_INTERVAL_S, StoppedToResume, TrainingInterrupted, resume_command,
                     write_run_files)
from .stepper import Log, Stepper
from .timing import StepTimer, finish_line, format_seconds
from .windows import epoch_micro_batches

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


class Trainer(Stepper):
    """A Stepper (the model, its optimizer, one step) and the run around its steps."""

    def __init__(self, config: Config, plan: Plan, hardware: HardwareProfile, *,
                 run_dir: Path | None = None, log: Log = print, task: Task | None = None,
                 on_eval: OnEval | None = None, resume: Path | None = None, sensors: Sensors | None = None,
                 init_from: Path | None = None) -> None:
        tracking.check(config.tracking)  # a missing tracker package stops the run before its directory exists
        super().__init__(config, plan, hardware, run_dir=run_dir, log=log, task=task, resume=resume,
                         init_from=init_from)
        self.on_eval = on_eval
        self.sensors = sensors or Sensors()
        self.evaluator = Evaluator(self.task, config, self.device, self.inject)
        self.saved_step: int | None = None  # the step of the last periodic checkpoint

    def fit(self) -> TrainResult:
        config, plan, log, p = self.config, self.plan, self.log, self.progress
        main = self.rank.is_main
        if main:
            write_run_files(self.run_dir, config, plan, self.hardware)
        log(f"Data: {self.info.description}")
        log(f"Model: {config.model}{'-' + config.gpt2_preset if config.gpt2_preset else ''}, "
            f"{self.parameters:,} parameters, on {plan.device_type} ({plan.precision}); "
            f"{self.total_steps} optimizer steps of {p.window_size} samples"
            + (f" over {self.rank.world_size} processes" if self.rank.active else ""))
        log(f"Run directory: {self.run_dir}")
        sinks = (tracking.Tracking.open(config.tracking, run_dir=self.run_dir, run_name=self.run_dir.name,
                                        params=tracking.params_of(config.text, plan.to_dict()),
                                        project=config.tracking_project or "kfit", output_dir=Path(config.output_dir))
                 if main and config.tracking else None)
        self.monitor = Monitor(
            self.run_dir, self.total_steps, self.device, self.hardware,
            interval_s=(config.monitor_interval_ms or 1000) / 1000, telemetry=config.monitor,
            tokens_per_sample=self.info.block_size or 0, log=log, enabled=config.monitor,
            append=self.resumed_from is not None, write_metrics=main, gpu=self.sensors.gpu, tracking=sinks)
        self.start_conditions()
        self.timer = StepTimer(config, self.hardware, self.event, calibrate=main)
        line = finish_line(plan, self.total_steps, p.step)
        if line:
            log(line)
        history: list[dict] = []
        stop_reason, final = "epochs", {}
        self.signals.install()
        self.model.train()
        self.started = self.last_checkpoint = self.interval_start = time.perf_counter()
        try:
            self.monitor.start()
            for kind, message, data in self.deferred:
                self.monitor.event(kind, message, **data)
            if self.resumed_from is not None:
                # a checkpoint of fewer processes holds a larger micro-batch than this run's share of a window
                micro = min(p.micro_batch, math.ceil(p.window_size / self.rank.world_size))
                self.monitor.event("resume", f"Resuming {self.run_dir} from step {p.step} ({self.resumed_from.name}, "
                                   f"epoch {p.epoch + 1}, micro-batch {micro}"
                                   + (" per process)" if self.rank.world_size > 1 else ")"),
                                   path=str(self.resumed_from))
            try:
                while p.epoch < config.epochs and stop_reason == "epochs" and p.step < self.total_steps:
                    stop_reason = self.run_epoch(history)
            except RuntimeError as err:
                if is_device_lost(err):
                    self.device_lost(err)
                raise
            if stop_reason == "epochs" and config.max_steps and p.step >= config.max_steps:
                stop_reason = "max_steps"  # resumed from a checkpoint taken at the last step
            self.timer.finish()
            seconds, self.feed = self.elapsed(), None
            if self.saves:
                # early stopping has just evaluated this very step: its metrics are the final ones
                last = history[-1] if stop_reason == "early_stop" else {}
                measured = {k: v for k, v in last.items() if k not in ("step", "epoch")} or None
                final = self.log_eval(p.step, self.epochs_begun(), final=True, result=measured)
                history.append(final)
                self.judge(final, final=True)
                final = {k: v for k, v in final.items() if k not in ("step", "epoch", "final")}
                path = self.save(checkpoint.final_path(self.run_dir, self.sharded), final)
                if main:
                    for _, old in checkpoint.periodic_checkpoints(self.run_dir):
                        checkpoint.remove(old)  # the finished run's checkpoint supersedes them
                why = {"epochs": f"{config.epochs} epoch(s) done", "max_steps": "CONFIG_MAX_STEPS reached",
                       "time_limit": "CONFIG_TIME_LIMIT reached",
                       "early_stop": "CONFIG_EARLY_STOP_PATIENCE reached"}.get(stop_reason, stop_reason)
                # through the monitor: on a terminal it clears the progress bar first instead of joining it
                self.monitor.event("finished", f"Saved {path} ({why}: {p.step} steps, {p.samples:,} samples in "
                                   f"{seconds:.1f}s)", path=str(path), stop_reason=stop_reason)
        finally:
            self.feed = None
            self.signals.restore()
            self.monitor.close()
            self.release_run_directory()
        return TrainResult(run_dir=self.run_dir, steps=p.step, epochs=p.samples / len(self.train_split),
                           samples=p.samples, seconds=seconds, stop_reason=stop_reason, final_eval=final,
                           history=history)

    def start_conditions(self) -> None:
        """The heat and battery policies (conditions.py), and the checkpoint interval where the predicted run
        sets it."""
        config = self.config
        # a pause is one process's own decision: it saves only where saving needs no other rank (not sharded)
        self.conditions = Conditions(config, self.sensors, read=self.monitor.read_telemetry,
                                     save=lambda: self.save_periodic() if self.saves and not self.sharded else None,
                                     event=self.monitor.event, stopping=lambda: self.signals.received is not None,
                                     main=self.rank.is_main)
        interval = self.checkpoint_interval_s()
        if interval and MIN_AUTO_INTERVAL_S < interval < 60 * (config.checkpoint_minutes or 10):
            self.log(f"Checkpoints: every {format_seconds(interval)}, {config.checkpoint_lost_work_percent}% of the "
                     f"predicted {format_seconds(self.plan.predicted_run_seconds)} "
                     "(CONFIG_CHECKPOINT_LOST_WORK_PERCENT)")

    def run_epoch(self, history: list[dict]) -> str:
        """The rest of the current epoch, window by window. Returns "epochs" when the epoch ended, else why
        training stops ("max_steps", "time_limit", "early_stop"); raises TrainingInterrupted on SIGTERM or SIGINT."""
        config, p = self.config, self.progress
        windows = epoch_micro_batches(len(self.train_split), p.window_size, config.seed, p.epoch)
        self.feed = None
        while p.window < len(windows):
            started = time.perf_counter()
            loss, timed_out, signalled = self.optimizer_step(windows, p.window, p.step)
            self.timer.record(self.plan, time.perf_counter() - started)
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
                history.append(self.log_interval(lr))
            if config.eval_interval and p.step % config.eval_interval == 0 and p.step < self.total_steps:
                history.append(self.log_eval(p.step, p.epoch + 1))
                if self.judge(history[-1]):
                    return "early_stop"
            if config.max_steps and p.step >= config.max_steps:
                return "max_steps"
            if timed_out:
                return "time_limit"
            if signalled:
                self.interrupt()
            if self.battery_stop:
                self.conditions.stop_for_battery(p.step, self.save_periodic() if self.saves else None)  # exit 4
            paused = self.conditions.after_step(p.step)  # heat and battery: may pause, or ask to stop
            self.started, self.interval_start = self.started + paused, self.interval_start + paused
            if self.checkpoint_now and self.saves and p.step < self.total_steps and self.saved_step != p.step:
                path = self.save_periodic()
                self.monitor.event("checkpoint", f"Checkpoint at step {p.step}: {path.name}", path=str(path))
        stop = False
        if not config.eval_interval and p.epoch + 1 < config.epochs:
            history.append(self.log_eval(p.step, p.epoch + 1))
            stop = self.judge(history[-1])
        self.monitor.epoch_end(p.epoch + 1)
        p.epoch, p.window = p.epoch + 1, 0
        return "early_stop" if stop else "epochs"

    def log_interval(self, lr: float) -> dict:
        """Log the mean loss and throughput of the steps since the last log line."""
        p, now = self.progress, time.perf_counter()
        rate = p.interval_samples / max(now - self.interval_start, 1e-9)
        entry = {"step": p.step, "epoch": p.epoch + 1, "loss": p.interval_loss / p.interval_samples,
                 "lr": lr, "samples_per_s": rate, "elapsed_s": self.elapsed()}
        if self.info.block_size:
            entry["tokens_per_s"] = rate * self.info.block_size
        self.monitor.log_entry(entry)
        self.interval_start, p.interval_loss, p.interval_samples = now, 0.0, 0
        return entry

    def evaluate(self) -> dict:
        return self.evaluator(self.model, self.plan, self.eval_batch_halved)

    def eval_batch_halved(self, before: int, after: int) -> None:
        self.plan = dataclasses.replace(self.plan, eval_batch=after)
        self.event("oom_recovery", f"Out of memory in evaluation: eval batch {before} -> {after}", eval_batch=after)

    def log_eval(self, step: int, epoch: int, final: bool = False, result: dict | None = None) -> dict:
        """Evaluate and report: rank 0 only (the others wait at the next step's collective), or under
        FSDP every rank (a sharded forward gathers parameters from all), rank 0 reporting. `result`: this
        step's metrics, measured already."""
        if not self.saves:
            return {"step": step, "epoch": epoch}
        result = self.evaluate() if result is None else result
        if not self.rank.is_main:
            return {"step": step, "epoch": epoch, **result}
        entry = {"step": step, "epoch": epoch, **result, **({"final": True} if final else {})}
        self.monitor.log_entry(entry)
        if self.on_eval is not None:
            self.on_eval(step, epoch, result)
        return entry

    def judge(self, entry: dict, final: bool = False) -> bool:
        """After an evaluation: save it as a best-<step> checkpoint when it is among the best k, and say whether
        early stopping ends the run (best.py). Rank 0 judges and every rank follows: a sharded save needs all
        of them. The final evaluation only ranks (under DDP only rank 0 reaches it)."""
        config, p = self.config, self.progress
        if not (config.checkpoint_best_keep or config.early_stop_patience):
            return False
        verdict = best.judge(config, p, entry["step"], entry) if self.rank.is_main else None
        if not final or self.sharded:
            verdict = distributed.broadcast(verdict)
        entered, stop = verdict
        if entered and self.saves:
            metrics = {k: v for k, v in entry.items() if k not in ("step", "epoch", "final")}
            path = self.save(checkpoint.best_path(self.run_dir, p.step, self.sharded), metrics)
            if self.rank.is_main:
                checkpoint.prune_best(self.run_dir, [step for step, _ in p.best])
                metric = config.checkpoint_best_metric
                self.monitor.event("best_checkpoint", f"Best checkpoint: {path.name} ({metric} {entry[metric]:.4g}; "
                                   f"keeping the best {config.checkpoint_best_keep})", path=str(path),
                                   metric=metric, value=entry[metric])
        if stop is None or final:
            return False
        if self.rank.is_main:
            self.monitor.event("early_stop", stop, metric=config.checkpoint_best_metric,
                               best_step=p.early_best[0], best_value=p.early_best[1])
        return True

    def save_periodic(self) -> Path:
        path = self.save(checkpoint.periodic_path(self.run_dir, self.progress.step, self.sharded),
                         keep=self.config.checkpoint_keep)
        if self.rank.is_main:
            checkpoint.prune(self.run_dir, self.config.checkpoint_keep)
        self.last_checkpoint, self.saved_step = time.perf_counter(), self.progress.step
        return path

    def device_lost(self, err: BaseException) -> None:
        """The device failed for good: save the last completed step's state where the tensors are still
        consistent and readable (else the newest checkpoint stands), say how to resume, stop (exit 3)."""
        p, reason = self.progress, " ".join(str(err).split())[:200]
        saved = None
        if self.saves and not self.updating:  # mid-update the tensors are neither the last step's nor this one's
            try:
                saved = (p.step, self.save_periodic())
            except Exception:  # noqa: BLE001 - a lost GPU's tensors cannot be read back
                saved = None
        if saved is None and self.rank.is_main:
            saved = next(iter(checkpoint.periodic_checkpoints(self.run_dir)), None)
        kept = (f"checkpoint {saved[1].name} holds step {saved[0]}" if saved else
                "no checkpoint could be saved, so the run starts again")
        where = (" (CONFIG_DEVICE_AUTO plans again for what the machine has then, e.g. the CPU, with the same "
                 "effective batch)" if self.config.device == "auto" else
                 " after fixing or replacing the GPU (or select CONFIG_DEVICE_AUTO to continue on what is left)")
        message = (f"the training device failed at step {p.step + 1} ({reason}): {kept}; resume with "
                   f"'{resume_command(self.config, self.run_dir)}'{where}")
        self.monitor.event("device_lost", message, show=False, error=reason,
                           path=str(saved[1]) if saved else None, resume_step=saved[0] if saved else 0)
        if self.rank.is_main:
            print(f"error: {message}", file=sys.stderr, flush=True)
        raise StoppedToResume(message, saved[0] if saved else 0, saved[1] if saved else None, DEVICE_LOST_EXIT)

    def resume_hint(self) -> str:
        """'make train', or with RESUME_FROM for a run started from INIT_FROM's weights (the search passes it by)."""
        init = (self.run_dir / checkpoint.INIT_RECORD).is_file()
        return resume_command(self.config, self.run_dir) if init else "make train"

    def interrupt(self) -> None:
        """Stop at this step boundary after saving a checkpoint (all ranks agreed on it)."""
        signum = self.signals.received or signal.SIGTERM
        path = self.save_periodic() if self.saves else None
        self.monitor.event("interrupted", f"{signal.Signals(signum).name} received: checkpoint saved at step "
                           f"{self.progress.step} ({path.name if path else ''}); '{self.resume_hint()}' resumes from it",
                           signal=signal.Signals(signum).name, path=str(path))
        raise TrainingInterrupted(signum, self.progress.step, path)


def train(config: Config, plan: Plan, hardware: HardwareProfile, *, run_dir: Path | None = None,
          log: Log = print, task: Task | None = None, on_eval: OnEval | None = None,
          resume: Path | None = None, sensors: Sensors | None = None, init_from: Path | None = None) -> TrainResult:
    """Train as configured and planned; returns where the run went and how it ended.
    `resume`: a run directory to continue from its newest readable checkpoint, or a checkpoint to continue
    from exactly; `init_from`: weights a new run starts from (INIT_FROM); `sensors`: fake telemetry and
    battery readings (tests)."""
    trainer = Trainer(config, plan, hardware, run_dir=run_dir, log=log, task=task, on_eval=on_eval, resume=resume,
                      sensors=sensors, init_from=init_from)
    try:
        return trainer.fit()
    finally:
        if trainer.rank.active:
            trainer.release()
