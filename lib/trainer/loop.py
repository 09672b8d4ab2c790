"""The one training loop, for every model. It reads only the Config and the Plan (and the HardwareProfile it
is handed, for the ladder's bf16 question).

`Trainer` holds the parts of a run and runs its epochs of optimizer steps:
  directory    rundir.py       the run directory: claim, lock, run files, plan.json, pruning
  engine       engine.py       the model, optimizer and scaler, DDP/FSDP/compile, forward/backward, the update
  recovery     recovery.py     the plan and Progress: out-of-memory halving, the ladder's rungs, the FSDP marker
  checkpoints  checkpoints.py  save, restore, sharded checkpoints, best-k, the stops that save first
with the log lines, evaluations (evaluation.py), periodic checkpoints and the stops: epochs done,
CONFIG_MAX_STEPS, the time limit, early stopping (best.py), or SIGTERM/SIGINT after a checkpoint; after the last
step, the final evaluation and checkpoint come before any bookkeeping that may fail (ending.py). Which samples
each step sees is windows.py's. After each step the heat and battery policies run (conditions.py). A device
that fails for good (the monitor's device_lost: ECC, lost, launch failure) saves the last completed step's
state where it can still be read and stops with the command that resumes (exit 3); resumed on another device,
the run plans its micro-batch again.

One optimizer step: the engine accumulates this rank's micro-batches of the window; one collective tells
every rank whether any ran out of memory (or must stop), on the host where the device would make it wait
(agreement.py); after out-of-memory the step is redone with the same samples as recovery.py changed the plan.
The step's loss stays on the device until the host needs it (settle): the steady-state step reads nothing
back, so the CPU queues the next step while the device runs this one. Under FSDP out-of-memory cannot be redone in place (one rank
cannot leave the collectives alone): the rank marks the run directory and the launcher relaunches the run
from its last checkpoint (mark_oom).
"""

from __future__ import annotations

import dataclasses
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..redact import shown
from .. import checkpoint, distributed, tracking
from ..config import Config
from ..hardware import HardwareProfile
from ..monitor import Monitor, device_lost
from ..oom import is_oom
from ..plan import Plan
from ..step import configure_backends, seed_everything
from ..task import Task, load_task
from . import best
from .agreement import Agreement, Losses
from .checkpoints import Checkpoints
from .conditions import Conditions, Sensors
from .ending import finish, quietly
from .engine import Engine
from .evaluation import Evaluator
from .initial import load_initial, not_both
from .opening import open_run
from .recovery import Recovery
from .resume import MIN_AUTO_INTERVAL_S, StopSignals, auto_interval_s, checkpoint_due
from .rundir import RunDirectory, output_directory
from .schedule import check_schedule
from .timing import StepTimer, finish_line, format_seconds
from .trial import Trial
from .windows import InputWait, Progress, epoch_windows, epochs_trained, total_steps

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


class Trainer:
    """The parts of one run (directory, engine, recovery, checkpoints) and the epochs of steps around them."""

    def __init__(self, config: Config, plan: Plan, hardware: HardwareProfile, *,
                 run_dir: Path | None = None, log: Log = print, task: Task | None = None,
                 on_eval: OnEval | None = None, resume: Path | None = None, sensors: Sensors | None = None,
                 init_from: Path | None = None) -> None:
        """resume: a run directory to continue from its newest readable checkpoint (the resume search's pick),
        or a checkpoint file or sharded directory to continue from exactly (RESUME_FROM, checked by
        resume.resume_point); init_from: weights a new run starts from (INIT_FROM, initial.py)."""
        tracking.check(config.tracking)  # a missing tracker package stops the run before its directory exists
        not_both(resume, init_from)
        rank = distributed.current() if torch.distributed.is_initialized() else distributed.SINGLE
        self.rank = (dataclasses.replace(rank, tensor=plan.tensor_parallel, pipeline=plan.pipeline_parallel,
                                         context=plan.context_parallel) if rank.active else rank)
        self.config, self.hardware = config, hardware
        self.log = log if self.rank.is_main else (lambda line: None)
        if self.rank.is_main:
            output_directory(config)  # an unusable CONFIG_OUTPUT_DIR is refused before any work
        seed_everything(config.seed)
        configure_backends(plan)
        self.device = distributed.device_for(self.rank, plan.device_type)
        self.task = task or load_task(config)  # a data error first: before anything is written
        # then what else the user can get wrong, still before the run directory exists
        lower_is_better = best.check_metric(config, self.task.metrics, config.model)
        check_schedule(config)  # a schedule function of the user's loads and gives a rate
        initial = load_initial(init_from, self.task) if init_from is not None else None
        self.directory, resume, chosen = RunDirectory.claim(config, self.rank, run_dir, resume, self.log)
        self.train_split, self.eval_split, self.info = self.task.train, self.task.eval, self.task.info
        self.monitor: Monitor | None = None
        self.recovery = Recovery(config, plan, hardware, self.rank.data_world,
                                 can_checkpoint=lambda: self.engine.can_checkpoint, apply=self.follow,
                                 event=self.event, log=self.log)
        # a relaunch after out-of-memory under FSDP: its rungs shape the model and its shards (a marker that is
        # not one is said and passed by)
        marker = checkpoint.read_oom_marker(resume, self.log) if resume is not None else None
        if marker is not None:
            self.recovery.relaunch_rungs(marker["rungs"])
        self.engine = Engine(config, self.plan, self.task, self.rank, self.device,
                             initial_weights=initial.weights if initial is not None else None)
        if initial is not None:
            self.recovery.deferred.append(("init_from", initial.message(), initial.record()))
            self.directory.write_init_record(initial.record())
            initial.weights = None
        self.started = time.perf_counter()
        self.checkpoints = Checkpoints(config, hardware, self.rank, self.directory, self.engine, self.recovery,
                                       elapsed=self.elapsed, event=self.event, log=self.log,
                                       lower_is_better=lower_is_better)
        self.resumed_from = self.checkpoints.restore(chosen, marker) if resume is not None else None
        if resume is not None and self.resumed_from is None and marker is None:  # (a marker: restarted here)
            self.start_afresh_elsewhere()
        self.engine.wrap(self.plan)
        self.recover_oom = config.oom_recovery and not self.sharded
        self.total_steps = total_steps(self.train_split, self.progress.window_size, config.epochs, config.max_steps)
        self.signals = StopSignals()
        self.checkpoint_now = False
        self.battery_stop = False  # all ranks agreed to stop for a low battery (conditions.py) after this step
        self.conditions: Conditions | None = None  # heat and battery, while fit() runs
        self.on_eval = on_eval
        self.sensors = sensors or Sensors()
        self.evaluator = Evaluator(self.task, config, self.device, self.engine.inject, self.rank,
                                   lockstep=self.engine.sharded)
        self.agreement = Agreement(self.device, self.rank.active)  # a host group under NCCL: every rank makes it
        self.losses = Losses()  # the steps' losses not yet read (settle)
        self.last_loss = math.nan  # the newest loss read, for the monitor's progress line

    # -- the parts' state, as the Trainer's own ------------------------------------

    @property
    def plan(self) -> Plan:
        return self.recovery.plan

    @plan.setter
    def plan(self, plan: Plan) -> None:
        self.recovery.plan = plan

    @property
    def progress(self) -> Progress:
        return self.recovery.progress

    @progress.setter
    def progress(self, progress: Progress) -> None:
        self.recovery.progress = progress

    @property
    def model(self) -> torch.nn.Module | None:
        return self.engine.model

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self.engine.optimizer

    @property
    def run_dir(self) -> Path:
        return self.directory.path

    @property
    def sharded(self) -> bool:
        return self.engine.sharded

    def fit(self) -> TrainResult:
        config, plan, log, p = self.config, self.plan, self.log, self.progress
        main = self.rank.is_main
        open_run(self)  # the run's files, its first lines, the monitor and trackers
        self.start_conditions()
        self.timer = StepTimer(config, self.hardware, self.event, calibrate=main)
        self.trial = Trial(plan, world_size=self.rank.world_size, resumed=self.resumed_from is not None)
        line = finish_line(plan, self.total_steps, p.step)
        if line:
            log(line)
        history: list[dict] = []
        stop_reason, final = "epochs", {}
        self.signals.install()
        self.model.train()
        self.started = self.checkpoints.last_checkpoint = self.interval_start = time.perf_counter()
        try:
            self.monitor.start()
            for kind, message, data in self.recovery.deferred:
                self.monitor.event(kind, message, **data)
            if self.resumed_from is not None:
                # a checkpoint of fewer processes holds a larger micro-batch than this run's share of a window
                micro = min(p.micro_batch, math.ceil(p.window_size / self.rank.data_world))
                self.monitor.event("resume", f"Resuming {self.run_dir} from step {p.step} ({self.resumed_from.name}, "
                                   f"epoch {p.epoch + 1}, micro-batch {micro}"
                                   + (" per process)" if self.rank.data_world > 1 else ")"),
                                   path=str(self.resumed_from))
            try:
                while p.epoch < config.epochs and stop_reason == "epochs" and p.step < self.total_steps:
                    stop_reason = self.run_epoch(history)
            except RuntimeError as err:
                if device_lost(err):
                    self.checkpoints.device_lost(err)
                raise
            if stop_reason == "epochs" and config.max_steps and p.step >= config.max_steps:
                stop_reason = "max_steps"  # resumed from a checkpoint taken at the last step
            seconds, self.engine.feed = self.elapsed(), None
            final = finish(self, history, stop_reason, seconds)
        finally:
            self.engine.feed = None
            self.signals.restore()
            quietly(self.log, "closing the monitor and trackers", self.monitor.close)
            self.directory.release()  # another `make train` may take it (the process ending does it too)
        return TrainResult(run_dir=self.run_dir, steps=p.step,
                           epochs=epochs_trained(self.train_split, p.samples, p.epoch), samples=p.samples,
                           seconds=seconds, stop_reason=stop_reason, final_eval=final, history=history)

    def start_conditions(self) -> None:
        """The heat and battery policies (conditions.py), and the checkpoint interval where the predicted run
        sets it."""
        config = self.config
        # a pause is one process's own decision: it saves only where saving needs no other rank (not sharded)
        self.conditions = Conditions(config, self.sensors, read=self.monitor.read_telemetry,
                                     save=lambda: self.save_periodic() if self.checkpoints.saves and not self.sharded else None,
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
        windows = epoch_windows(self.train_split, p, config.seed, self.rank.data_rank, self.rank.data_world)
        self.engine.feed = None
        while p.window < len(windows):
            started = time.perf_counter()
            loss_sum, timed_out, signalled = self.optimizer_step(windows, p.window, p.step)
            n = len(windows[p.window])
            self.losses.add(p.step + 1, n, loss_sum)
            mark = None
            if not self.timer.done:  # the timed steps are the device's: marked on a GPU's stream, else read
                if self.plan.device_type == "cuda":
                    mark = torch.cuda.Event(enable_timing=True)
                    mark.record()
                else:
                    self.settle()
            if self.trial.active and self.plan.device_type == "cuda":
                torch.cuda.synchronize(self.device)  # the trial's few steps: each one's own time
            step_s = time.perf_counter() - started
            self.timer.record(self.plan, step_s, mark)
            p.step, p.window, p.samples = p.step + 1, p.window + 1, p.samples + n
            switch = self.trial.record(p.micro_batch, step_s)
            if switch is not None:  # from the next step on
                self.switch_micro_batch(switch)
            p.interval_samples += n
            if self.boundary(timed_out, signalled, last=p.window == len(windows)):
                self.settle()  # before anything acts on this step's state: divergence stops the run here
            lr = self.optimizer.param_groups[0]["lr"]
            # the step's wait for the loader (windows.InputWait), for the monitor's input-wait share
            waited = self.engine.feed.take() if isinstance(self.engine.feed, InputWait) else 0.0
            self.monitor.update(p.step, p.epoch + 1, self.last_loss, lr, p.samples, input_wait_s=waited,
                                step_s=step_s)
            if p.step % config.log_interval == 0 or p.step == self.total_steps:
                history.append(self.log_interval(lr))
            if config.eval_interval and p.step % config.eval_interval == 0 and p.step < self.total_steps:
                history.append(self.log_eval(p.step, p.epoch + 1))
                if self.checkpoints.judge(history[-1]):
                    return "early_stop"
            if config.max_steps and p.step >= config.max_steps:
                return "max_steps"
            if timed_out:
                return "time_limit"
            if signalled:
                self.interrupt()
            if self.battery_stop:
                self.conditions.stop_for_battery(p.step, self.save_periodic() if self.checkpoints.saves else None)  # exit 4
            paused = self.conditions.after_step(p.step)  # heat and battery: may pause, or ask to stop
            self.started, self.interval_start = self.started + paused, self.interval_start + paused
            if self.checkpoint_now and self.checkpoints.saves and p.step < self.total_steps and self.checkpoints.saved_step != p.step:
                path = self.save_periodic()
                self.monitor.event("checkpoint", f"Checkpoint at step {p.step}: {path.name}", path=str(path))
        stop = False
        if not config.eval_interval and p.epoch + 1 < config.epochs:
            history.append(self.log_eval(p.step, p.epoch + 1))
            stop = self.checkpoints.judge(history[-1])
        self.monitor.epoch_end(p.epoch + 1)
        p.epoch, p.window = p.epoch + 1, 0
        return "early_stop" if stop else "epochs"

    def boundary(self, timed_out: bool, signalled: bool, last: bool) -> bool:
        """Whether the host acts on the state of the step just taken (every rank answers alike): a log line, an
        evaluation, a stop, a checkpoint due, the epoch's last step. A heat pause's checkpoint settles in
        save_periodic."""
        config, step = self.config, self.progress.step
        return (step % config.log_interval == 0 or step == self.total_steps or last or timed_out or signalled
                or self.battery_stop or self.checkpoint_now
                or bool(config.eval_interval and step % config.eval_interval == 0)
                or bool(config.max_steps and step >= config.max_steps))

    def settle(self) -> None:
        """Read the losses of the steps not read yet (agreement.Losses.settle): a stop at the first not finite."""
        self.last_loss = self.losses.settle(self.progress, self.config.learning_rate, self.last_loss)

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

    def log_eval(self, step: int, epoch: int, final: bool = False, result: dict | None = None) -> dict:
        """Evaluate and report: every rank evaluates its share of the split (evaluation.py), rank 0 reports.
        `result`: this step's metrics, measured already."""
        result = self.evaluator(self.model, self.plan, self.recovery.eval_batch_halved) if result is None else result
        if not self.rank.is_main:
            return {"step": step, "epoch": epoch, **result}
        entry = {"step": step, "epoch": epoch, **result, **({"final": True} if final else {})}
        self.monitor.log_entry(entry)
        if self.on_eval is not None:
            self.on_eval(step, epoch, result)
        return entry

    def save_periodic(self) -> Path:
        self.settle()  # the checkpoint's progress holds the interval's loss (a heat pause saves between boundaries)
        return self.checkpoints.save_periodic()

    def interrupt(self) -> None:
        """Stop at this step boundary after saving a checkpoint (all ranks agreed on it)."""
        self.checkpoints.interrupt(self.signals.received or signal.SIGTERM)

    # -- one optimizer step --------------------------------------------------

    def optimizer_step(self, windows: list[list[int]], position: int, step: int) -> tuple[torch.Tensor | float, bool,
                                                                                         bool]:
        """One optimizer step over windows[position], redone with the same samples after out-of-memory as
        recovery.py changed the plan. Returns (the loss summed over the window's samples and the ranks, time limit
        reached, stop signal) as all ranks agree on them, the loss unread (a device tensor, or a float where
        reading it cost nothing: agreement.py); `checkpoint_now` says whether rank 0 found a periodic checkpoint
        due (every rank writes its shard under FSDP)."""
        window, engine = windows[position], self.engine
        while True:
            engine.optimizer.zero_grad(set_to_none=True)
            if engine.feed is None:
                engine.start_feed(windows, position, self.plan, self.progress.micro_batch)
            failed, loss_sum = False, None
            try:
                loss_sum = engine.accumulate(window, step, self.plan, self.progress.micro_batch)
            except Exception as err:  # noqa: BLE001 - only out-of-memory is recovered; the rest re-raises
                if self.sharded and self.config.oom_recovery and is_oom(err):
                    self.mark_oom(step, err)  # the launcher relaunches the run at half the micro-batch
                if not (self.recover_oom and is_oom(err)):
                    raise
                failed, reason = True, shown(" ".join(str(err).split()), 200)
            timed_out = bool(self.config.time_limit_s and self.elapsed() >= self.config.time_limit_s)
            due = self.rank.is_main and checkpoint_due(self.config, step + 1, self.checkpoints.last_checkpoint,
                                                       self.checkpoint_interval_s())
            # One collective per step: every rank learns whether any ran out of memory or must stop.
            low_battery = self.conditions is not None and self.conditions.stop_requested
            agreed, loss_sum = self.agreement.step(failed, timed_out, self.signals.received is not None, due,
                                                   low_battery, loss_sum)
            self.checkpoint_now, self.battery_stop = agreed.checkpoint_due, agreed.battery_stop
            if not agreed.oom:
                break
            engine.free()  # out of the except block: its traceback no longer holds the step's tensors
            self.recovery.after_oom(step, reason if failed else "another rank ran out of memory")
        engine.update(step, self.total_steps)
        return loss_sum, agreed.time_limit, agreed.signal

    def switch_micro_batch(self, micro: int) -> None:
        """The trial (trial.py) runs the next steps at `micro`: a runner-up to time, or its choice."""
        trial, before = self.trial, self.progress.micro_batch
        self.engine.feed = None  # the micro-batches loaded ahead are the old size's
        if trial.active:
            self.recovery.switched(micro, f"(timing it: {trial.outside})", write=False)
            return
        self.recovery.switched(micro, f"by the run's own steps: {trial.outside}; timed {trial.describe()}", write=True)
        kept = micro == trial.planned.micro_batch
        self.event("micro_batch_switch", f"Micro-batch {micro} {'kept' if kept else f'from {trial.planned.micro_batch}'} "
                   f"({self.plan.split.text()}) after step {self.progress.step}: {trial.outside}; the run's own steps "
                   f"timed {trial.describe()}", planned_micro_batch=trial.planned.micro_batch, micro_batch=micro,
                   grad_accum=self.plan.grad_accum, step=self.progress.step, before=before,
                   timed_step_seconds={str(m): t for m, t in trial.medians().items()})

    def mark_oom(self, step: int, err: BaseException) -> None:
        """Under FSDP: record in the run directory what the relaunched run takes (recovery.py), for `make train`
        to relaunch torchrun with it."""
        self.directory.write_marker(self.recovery.mark(step, err))

    def follow(self, plan: Plan, rungs: list[str], write: bool) -> None:
        """Recovery changed the plan: the engine computes steps as it says; plan.json says it (in a run)."""
        self.engine.follow(plan, rungs)
        if write and self.monitor is not None:
            self.directory.write_plan(plan)

    def checkpoint_interval_s(self) -> float | None:
        """Seconds between periodic checkpoints: the low-battery interval while it applies, else AUTO's (None
        with CHECKPOINT_INTERVAL_STEPS)."""
        minutes = self.conditions.checkpoint_minutes if self.conditions is not None else None
        if minutes:
            return 60.0 * minutes
        return auto_interval_s(self.config, self.plan.predicted_run_seconds) \
            if self.config.checkpoint_interval == "auto" else None

    def event(self, kind: str, message: str, **data) -> None:
        if self.monitor is not None:
            self.monitor.event(kind, message, **data)
        else:  # evaluate() called outside fit()
            self.log(message)

    def elapsed(self) -> float:
        return self.progress.elapsed_s + time.perf_counter() - self.started

    def start_afresh_elsewhere(self) -> None:
        """The run picked to resume had no intact checkpoint: the fresh run gets a directory of its own, so
        the picked one keeps its history (its metrics, its config, the checkpoints set aside as .damaged)."""
        kept = self.directory.path
        self.directory.release()
        self.directory, _, _ = RunDirectory.claim(self.config, self.rank, None, None, self.log)
        self.checkpoints.directory = self.directory
        self.log(f"note: {kept} keeps its history; the fresh run is {self.directory.path}")



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
            trainer.engine.release()  # the model, optimizer and DDP wrapper, before leaving a process group
