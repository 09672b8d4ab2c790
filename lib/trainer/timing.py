"""Predicted against measured step time: the first steps of a run time the plan, and calibrate it.

The optimizer steps after SKIP warm-up ones (one more with torch.compile: the first compiles) are timed,
at least STEPS of them and at least MIN_SECONDS of steps (at most MAX_STEPS). Their median and the
plan's predicted_step_seconds go to metrics.jsonl as one "step_time" event, and lib.steptime.calibrate
stores them for this machine and model, so the next plan here predicts from them. A run shorter than that reports what it timed when it ends.

On a GPU each step's end is marked with a CUDA event on the stream, and a step's time is the device's time
between two marks, read once when the timer reports: the timed steps wait for nothing. A wait after each
step (reading its loss) would cost a host-bound step its overlap with the device (the host would queue
the next step's kernels only after the last one ran), so the steps timed would be slower than the run's.
"""

from __future__ import annotations

import statistics
from typing import Callable

from ..config import Config
from ..hardware import HardwareProfile
from ..monitor import format_seconds  # noqa: F401  (re-exported: the trainer formats with it)
from ..plan import Plan

SKIP = 2  # the first steps also grow the allocator, pick cuDNN/cuBLAS kernels and warm the data loader
STEPS = 10  # on an H100 a host-bound step (GPT-2-tiny) moved 20-30% between steps: a median of 10 holds
# A shared CPU's speed drifts over seconds (make bench-throughput, 2 cores: the same step's median moved
# 10-25% between rounds a few seconds apart), so short steps are timed for MIN_SECONDS in all: LeNet-5's
# 10 steps are a quarter of a second.
MIN_SECONDS = 3.0
MAX_STEPS = 500


class StepTimer:
    def __init__(self, config: Config, hardware: HardwareProfile, event: Callable[..., None], *,
                 calibrate: bool) -> None:
        self.config, self.hardware, self.event, self.calibrate = config, hardware, event, calibrate
        self.plan: Plan | None = None
        self.times: list[float] = []
        self.marks: list = []  # a GPU's: an event recorded at each step's end (torch.cuda.Event, timing on)
        self.timed_s = 0.0  # the sum of the times after the skipped ones
        self.done = False

    def record(self, plan: Plan, seconds: float, mark=None) -> None:
        """One optimizer step of `plan` took `seconds` on the host (a new micro-batch or ladder rung, after
        out-of-memory, starts over). `mark`: on a GPU, the event recorded on the stream at the step's end;
        the step's time is then the device's since the previous step's mark (read when the timer reports)."""
        if self.done:
            return
        if plan is not self.plan and (self.plan is None or _step_shape(plan) != _step_shape(self.plan)):
            self.plan, self.times, self.marks, self.timed_s = plan, [], [], 0.0
        self.times.append(seconds)
        if mark is not None:
            self.marks.append(mark)
        timed = len(self.times) - self.skip  # a running count and sum: no copy of the times per step
        if timed > 0:
            self.timed_s += seconds
        if timed >= MAX_STEPS or (timed >= STEPS and self.timed_s >= MIN_SECONDS):
            self.report()

    @property
    def skip(self) -> int:
        return SKIP + bool(self.plan is not None and self.plan.compile)

    def finish(self) -> None:
        if not self.done and self.plan is not None and len(self.times) > self.skip:
            self.report()

    def step_times(self) -> list[float]:
        """Every step's seconds: the marks' device times where each step has one (the first, with no mark
        before it, is always skipped), else the host's."""
        if not self.marks or len(self.marks) != len(self.times):
            return self.times
        self.marks[-1].synchronize()  # the one wait: every mark before it is done too
        return self.times[:1] + [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]

    def report(self) -> None:
        self.done = True
        timed = self.step_times()[self.skip:]
        measured, plan = statistics.median(timed), self.plan
        predicted = plan.predicted_step_seconds
        after = calibrate_step_time(self.config, self.hardware, plan, timed) if self.calibrate else None
        text = f"Step time: {measured * 1e3:.1f} ms measured over {len(timed)} steps"
        if predicted:
            text += f", {predicted * 1e3:.1f} ms predicted ({(predicted - measured) / measured:+.0%})"
        if after is not None:
            text += "; calibrated for the next plan on this machine"
        self.event("step_time", text, measured_step_seconds=measured, predicted_step_seconds=predicted,
                   steps_timed=len(timed), micro_batch=plan.micro_batch, grad_accum=plan.grad_accum,
                   predicted_source=plan.reasons.get("step_time"),
                   calibrated_step_seconds=after.seconds if after is not None else None)


def calibrate_step_time(config: Config, hardware: HardwareProfile, plan: Plan, timed: list[float]):
    """The trainer's one call into lib.steptime: store the timed steps' median for this machine and model, so
    the next plan here predicts from it. Returns lib.steptime's calibration (its `seconds`), or None."""
    from ..steptime import calibrate

    return calibrate(config, hardware, plan, timed)


def _step_shape(plan: Plan) -> tuple:
    """What decides a step's time that out-of-memory recovery may change mid-run."""
    return plan.micro_batch, plan.precision, plan.gradient_checkpointing, plan.cpu_offload


def finish_line(plan: Plan, total_steps: int, done_steps: int) -> str | None:
    """'Predicted: ...' before the first step: the time to finish from here, or None when unknown."""
    if not plan.predicted_step_seconds or not plan.predicted_run_seconds or total_steps <= 0:
        return None
    left = max(0, total_steps - done_steps)
    seconds = plan.predicted_run_seconds * left / total_steps
    energy = (f", {plan.predicted_energy_kwh * left / total_steps:.2g} kWh"
              if plan.predicted_energy_kwh is not None else "")
    why = plan.reasons.get("step_time", "")
    source = ("calibrated on this machine" if "calibrated by" in why else
              "from steps measured here" if "measured on" in why else "roofline")
    return (f"Predicted: {left} steps of {plan.predicted_step_seconds * 1e3:.1f} ms "
            f"({plan.predicted_samples_per_second:,.0f} samples/s, {source}) = {format_seconds(seconds)} "
            f"to finish{energy}")
