"""Recovery: the plan and the run's Progress as out-of-memory, a relaunch or another device change them.

Every plan change goes through lib/planning/: ladder.py, and edits.py for the evaluation batch and a resumed
run's micro-batch. After out-of-memory the step is redone with the same samples at half the micro-batch
(`ladder.halved`: the accumulation that keeps the step's samples); once
halving can go no further (micro-batch 1, or CONFIG_OOM_MAX_HALVINGS), with the ladder's next rung
(`ladder.next_rung`) instead, its predicted saving in the event (`ladder.predicted_peaks`). Under FSDP no
rank can redo a step alone: `mark` writes what the relaunched run takes (the halved micro-batch, or the next
rung) to the run directory's marker, and the relaunch applies it (`apply_marker`). A run resumed on another
device than its checkpoint's plans its micro-batch again (`replan`); on the same kind, the checkpoint's
micro-batch and rungs are taken again (`resumed`).

`Recovery` holds the plan and the Progress; `apply(plan, rungs)` (the Trainer's) makes the engine and the
run directory follow a changed plan.
"""

from __future__ import annotations

from typing import Callable

from ..redact import shown
from ..config import Config
from ..hardware import HardwareProfile
from ..oom import OutOfMemory, halve
from ..plan import Plan
from ..planning import edits, ladder
from ..units import format_bytes
from .windows import Progress


class Recovery:
    """The plan and Progress of one run, and how out-of-memory and resuming change them.

    `apply(plan, rungs, write)`: the engine follows the plan (its rungs `rungs` taken), and plan.json is
    written again where `write`; `event(kind, message, **data)` reports; `log(line)` prints."""

    def __init__(self, config: Config, plan: Plan, hardware: HardwareProfile, world_size: int, *,
                 can_checkpoint: Callable[[], bool], apply: Callable[[Plan, list[str], bool], None],
                 event: Callable[..., None], log: Callable[[str], None]) -> None:
        self.config, self.plan, self.hardware, self.world_size = config, plan, hardware, world_size
        self.can_checkpoint, self.apply, self.event, self.log = can_checkpoint, apply, event, log
        self.progress = Progress(window_size=plan.effective_batch, micro_batch=plan.micro_batch)
        self.deferred: list[tuple[str, str, dict]] = []  # events from before the monitor started

    # -- out of memory in a step -------------------------------------------------

    def after_oom(self, step: int, reason: str) -> None:
        """After out-of-memory in step `step` (0-based; the failed step freed): halve the micro-batch and double
        the accumulation; once halving can go no further, take the ladder's next rung."""
        p, before = self.progress, self.progress.micro_batch
        try:
            p.micro_batch = halve(before, p.halvings, self.config.oom_max_halvings or 0, f"at step {step + 1}")
        except OutOfMemory as stuck:
            self.climb(step, reason, stuck)
            return
        p.halvings += 1
        self.halved(f"after out of memory at step {step + 1}")
        self.apply(self.plan, [], True)
        self.event("oom_recovery", f"Out of memory at step {step + 1} ({reason}): micro-batch {before} -> "
                   f"{p.micro_batch} ({self.plan.split.text()}); redoing the step with the "
                   f"same {p.window_size} samples", micro_batch=p.micro_batch, halvings=p.halvings)

    def climb(self, step: int, reason: str, stuck: OutOfMemory) -> None:
        """Take the ladder's next rung and redo the step; `stuck` (with what the ladder tried) when none is left."""
        p = self.progress
        rung = self.next_rung(stuck)
        peaks = ladder.predicted_peaks(self.config, self.plan, rung.plan)
        self.take_rungs(rung.plan, [rung.name])
        saving = " (saving not predicted)" if peaks is None else (
            f" (predicted peak {format_bytes(peaks[0])} -> {format_bytes(peaks[1])}, "
            + (f"saves {format_bytes(peaks[0] - peaks[1])})" if peaks[1] < peaks[0] else "no saving predicted)"))
        self.event("oom_rung", f"Out of memory at step {step + 1} at micro-batch {p.micro_batch} ({reason}): "
                   f"out-of-memory ladder rung {len(p.rungs)}: {rung.what}{saving}; redoing the step with the same "
                   f"{p.window_size} samples (micro-batches {self.plan.split.text()})",
                   rung=rung.name, micro_batch=p.micro_batch, grad_accum=self.plan.grad_accum,
                   effective_batch=p.window_size, predicted_peak_before_bytes=peaks[0] if peaks else None,
                   predicted_peak_after_bytes=peaks[1] if peaks else None,
                   predicted_saving_bytes=peaks[0] - peaks[1] if peaks else None)

    def next_rung(self, stuck: OutOfMemory) -> ladder.Rung:
        rung = ladder.next_rung(self.config, self.plan, self.hardware, self.progress.rungs,
                                can_checkpoint=self.can_checkpoint())
        if rung is None:
            raise OutOfMemory(f"{stuck}; {ladder.exhausted(self.config, self.progress.rungs)}") from None
        return rung

    def take_rungs(self, plan: Plan, names: list[str], write: bool = True) -> None:
        """Run from now on as `plan`, the ladder's rungs `names` taken."""
        self.plan = plan
        self.progress.rungs.extend(n for n in names if n not in self.progress.rungs)
        self.apply(plan, names, write)

    def switched(self, micro_batch: int, why: str, write: bool) -> None:
        """The in-run trial's micro-batch (trial.py) from the next step on, the same samples per step; plan.json
        says it where `write` (the trial's choice, not a size it is timing)."""
        self.progress.micro_batch = micro_batch
        self.plan = edits.switched(self.plan, micro_batch, why)
        self.apply(self.plan, [], write)

    def halved(self, why: str) -> None:
        """The plan at the progress's smaller micro-batch, with the accumulation that keeps the step's samples."""
        p = self.progress
        self.plan = ladder.halved(self.plan, p.micro_batch, p.window_size, self.world_size, why)

    def eval_batch_halved(self, before: int, after: int) -> None:
        self.plan = edits.eval_batch_halved(self.plan, after)
        self.event("oom_recovery", f"Out of memory in evaluation: eval batch {before} -> {after}", eval_batch=after)

    # -- a sharded run: relaunched by `make train` ------------------------------------

    def mark(self, step: int, err: BaseException) -> dict:
        """Under FSDP: the marker the relaunched run takes (from its last checkpoint, with the same effective
        batch): the halved micro-batch, or once halving can go no further the ladder's next rung."""
        p = self.progress
        marker = {"micro_batch": p.micro_batch, "halvings": p.halvings, "rungs": list(p.rungs), "step": step + 1,
                  "reason": shown(" ".join(str(err).split()), 200)}
        try:
            marker["micro_batch"] = halve(p.micro_batch, p.halvings, self.config.oom_max_halvings or 0,
                                          f"at step {step + 1}")
            marker["halvings"] += 1
        except OutOfMemory as stuck:
            marker["rungs"].append(self.next_rung(stuck).name)
        return marker

    def apply_marker(self, marker: dict | None) -> None:
        """A relaunch after out-of-memory under FSDP takes the marker's micro-batch and rungs (the rungs are in
        the plan already, from before the model was built: checkpoint.read_oom_marker)."""
        if marker is None:
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
        self.halved(f"after out of memory at step {marker['step']} (FSDP relaunch)")
        self.log(f"Out of memory at step {marker['step']} ({marker['reason']}): micro-batch {before} -> "
                 f"{p.micro_batch} ({self.plan.split.text()}); the same {p.window_size} samples per step")

    # -- resuming ---------------------------------------------------------------------

    def relaunch_rungs(self, rungs: list[str]) -> None:
        """Before the model is built: the rungs a relaunch after out-of-memory takes shape the model and its
        shards."""
        self.plan = ladder.reapply(self.config, self.plan, rungs, self.hardware)

    def resumed(self, progress: Progress, old_plan: dict | None) -> bool:
        """Continue from a checkpoint's `progress`: on another device than its plan's, plan the micro-batch
        again (`replan`); else take its micro-batch and rungs again. True in the second case (its scaler
        state applies)."""
        self.progress = progress
        if old_plan and moved(old_plan, self.plan):
            self.replan(old_plan)
            return False
        self.plan = edits.resumed_at(self.plan, progress.micro_batch)
        rungs = progress.rungs
        plan = ladder.reapply(self.config, self.plan, rungs, self.hardware, self.can_checkpoint())
        self.take_rungs(plan, rungs, write=False)
        return True

    def replan(self, old: dict) -> None:
        """Resuming on another device than the checkpoint's (its GPU lost, say): this run's own plan's
        micro-batch for the same effective batch, halvings and ladder rungs started afresh."""
        p = self.progress
        p.micro_batch, p.halvings, p.rungs = self.plan.micro_batch, 0, []
        self.log(f"Resuming on {self.plan.device_type} ({self.plan.device_name}); the checkpoint was taken on "
                 f"{old.get('device_type')} ({old.get('device_name')}): micro-batch {old.get('micro_batch')} -> "
                 f"{p.micro_batch} ({self.plan.split.text()}), the same effective batch {p.window_size}")


def moved(old: dict, plan: Plan) -> bool:
    """Whether a checkpoint's plan ran on another kind of device, or another GPU model, than `plan`."""
    return (old.get("device_type"), old.get("device_name")) != (plan.device_type, plan.device_name)
