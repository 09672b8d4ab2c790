"""The changes a resolved plan takes besides the ladder's (ladder.py: halving and the rungs): what the probe
found on the device, a smaller evaluation batch after out-of-memory in evaluation, and a resumed run's
micro-batch. With ladder.py, the only code that changes a plan after the resolver (docs/architecture.md;
tests/test_imports.py checks that no module outside lib/planning/ does).
"""

from __future__ import annotations

import dataclasses

from ..plan import Plan
from ..steptime import window_sizes
from ..steptime.calibrate import samples_per_process


def probed(plan: Plan, fits: int, eval_batch: int, how: str) -> Plan:
    """The plan with the probed evaluation batch and, where the planned micro-batch does not fit (`fits` is the
    largest that did), the fewest micro-batches that do: accumulation ceil(share / fits), each ceil(share /
    accumulation) (the resolver's balanced split), the effective batch unchanged. A planned micro-batch that
    fits stands, with its accumulation, even where a larger one would fit too: the resolver chose it.
    how: "measured" or "cached", for the reasons."""
    reasons = {**plan.reasons, "eval_batch": f"probe {how}: largest safe forward-only batch"}
    planned = plan.reasons.get("micro_batch", f"planned {plan.micro_batch}")
    if fits >= plan.micro_batch:
        reasons["micro_batch"] = f"{planned}; probe {how}: confirmed ({fits} fits)"
        return dataclasses.replace(plan, eval_batch=eval_batch, reasons=reasons)
    share = samples_per_process(plan)
    accum = -(-share // fits)
    micro = -(-share // accum)
    sizes = window_sizes(share, micro)
    cut = f"{len(sizes)} x {micro}" if len(set(sizes)) == 1 else f"{len(sizes) - 1} x {micro} + {sizes[-1]}"
    reasons["micro_batch"] = (f"{planned}; probe {how}: {fits} is the largest that fits, under the planned "
                              f"{plan.micro_batch}: {micro}, the smallest that needs only {accum} micro-batches")
    reasons["grad_accum"] = (f"probe {how}: {share} per process as {cut} (a short one weighs its samples); "
                             f"effective batch {plan.effective_batch} unchanged")
    return dataclasses.replace(plan, micro_batch=micro, grad_accum=accum, eval_batch=eval_batch, reasons=reasons)


def eval_batch_halved(plan: Plan, eval_batch: int) -> Plan:
    """The plan after out-of-memory in evaluation: the smaller evaluation batch `eval_batch`."""
    return dataclasses.replace(plan, eval_batch=eval_batch)


def resumed_at(plan: Plan, micro_batch: int) -> Plan:
    """The plan of a run resumed on the same kind of device as its checkpoint: the checkpoint's micro-batch
    (where its halvings left it); the accumulation stays the plan's."""
    return dataclasses.replace(plan, micro_batch=micro_batch)


def switched(plan: Plan, micro_batch: int, why: str) -> Plan:
    """The plan of a run that switched its micro-batch after timing its runner-up splits (lib/trainer/trial.py):
    `micro_batch`, with the accumulation that keeps each process's share (the effective batch unchanged), and
    the runner-up's predicted step time where it is one."""
    share = samples_per_process(plan)
    predicted = next((s for m, _, s in plan.alternatives if m == micro_batch), None)
    reasons = {**plan.reasons, "micro_batch": f"{plan.reasons.get('micro_batch', '')}; switched to {micro_batch} {why}"}
    return dataclasses.replace(plan, micro_batch=micro_batch, grad_accum=-(-share // micro_batch), reasons=reasons,
                               predicted_step_seconds=predicted or plan.predicted_step_seconds)


def with_note(plan: Plan, note: str) -> Plan:
    """The plan with one more note, shown with it (`kfit plan`'s, where it plans without a config file)."""
    return dataclasses.replace(plan, notes=(*plan.notes, note))
