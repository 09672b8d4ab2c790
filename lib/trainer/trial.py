"""The run checks its plan's batch layout: where the first timed steps miss the predicted interval, the
runner-up splits are timed and the run continues with the fastest.

A plan keeps its runner-up splits of the same effective batch (plan.alternatives, fastest predicted
first) and the interval around its predicted step time (plan.predicted_step_uncertainty). After SKIP
warm-up steps the trainer times TRIAL_STEPS steps at the planned micro-batch; where their median lies
outside the interval, each runner-up runs for WARMUP + TRIAL_STEPS steps, and the run continues at the
micro-batch whose timed steps had the lowest median. Every one of these steps trains: the windows are the
run's own, each cut into micro-batches of the size being timed and weighed by their samples, so the
effective batch and the samples each step sees are the planned ones. The switch is an event in
metrics.jsonl, and plan.json and the checkpoints hold the micro-batch it chose, so a resume continues
there (without a trial of its own).

It applies to one process (several would have to agree on each switch) running eagerly (a compiled step
would recompile at each size: its cost, not the size's, would be timed); where either holds, or the plan
has no runner-ups or no prediction, or out-of-memory recovery changes the micro-batch, nothing is tried.
"""

from __future__ import annotations

import statistics

from ..plan import Plan

SKIP = 2  # the run's first steps grow the allocator and warm the loader (as timing.SKIP)
WARMUP = 1  # after a switch: one step at the new size before its steps are timed
TRIAL_STEPS = 3  # timed steps per split: the median of three holds one outlier


class Trial:
    """The in-run comparison of the plan's micro-batch with its runner-ups (module docstring)."""

    def __init__(self, plan: Plan, *, world_size: int, resumed: bool) -> None:
        self.planned = plan
        self.active = bool(world_size == 1 and not plan.compile and plan.alternatives and not resumed
                           and plan.predicted_step_seconds and plan.predicted_step_uncertainty is not None)
        self.current = plan.micro_batch
        self.queue: list[int] = []
        self.times: dict[int, list[float]] = {}
        self.skip, self.seen = SKIP, 0
        self.outside: str | None = None  # why the trial started

    def record(self, micro_batch: int, seconds: float) -> int | None:
        """One training step at `micro_batch` took `seconds`: the micro-batch to switch to now, or None."""
        if not self.active:
            return None
        if micro_batch != self.current:  # out-of-memory recovery changed it: its choice stands
            self.active = False
            return None
        self.seen += 1
        if self.seen <= self.skip:
            return None
        timed = self.times.setdefault(micro_batch, [])
        timed.append(seconds)
        if len(timed) < TRIAL_STEPS:
            return None
        if not self.queue and self.outside is None:  # the planned split's steps are in
            plan = self.planned
            measured, u = statistics.median(timed), plan.predicted_step_uncertainty
            low, high = plan.predicted_step_seconds / (1 + u), plan.predicted_step_seconds * (1 + u)
            if low <= measured <= high:
                self.active = False
                return None
            self.outside = (f"{measured * 1e3:.1f} ms measured against {plan.predicted_step_seconds * 1e3:.1f} ms "
                            f"predicted (±{u:.0%})")
            self.queue = [m for m, _, _ in plan.alternatives if m not in self.times]
        if self.queue:
            return self._switch(self.queue.pop(0))
        self.active = False
        return self._switch(self.fastest())  # the trial's choice, the size it ended at or not

    def _switch(self, micro_batch: int) -> int:
        self.current, self.skip, self.seen = micro_batch, WARMUP, 0
        return micro_batch

    def fastest(self) -> int:
        """The micro-batch whose timed steps had the lowest median (the planned one on a tie)."""
        return min(self.times, key=lambda m: (statistics.median(self.times[m]), m != self.planned.micro_batch))

    def medians(self) -> dict[int, float]:
        return {m: statistics.median(t) for m, t in self.times.items()}

    def describe(self) -> str:
        """'512: 80.1 ms, 16: 140.2 ms': each timed split's median step."""
        return ", ".join(f"{m}: {s * 1e3:.1f} ms" for m, s in self.medians().items())
