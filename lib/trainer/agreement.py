"""One optimizer step's agreement across ranks, and the steps' losses, without a host sync per step.

After each step every rank must learn whether any ran out of memory (the step is redone by all), reached the
time limit, got a stop signal, found a checkpoint due (rank 0 decides) or must stop for a low battery: five
flags the host holds, summed in one all-reduce of one tensor. Where the default group's collectives run on the
device (NCCL), that all-reduce would queue behind the step's kernels and reading it back would wait for all of
them, so the CPU could not queue the next step ahead: the flags then go over a gloo group of the same ranks
(`distributed.host_group`), which waits for the other hosts only. A CUDA out-of-memory is raised on the host
when the allocation fails, so the flag is known there without waiting for the device.

The step's loss stays on the device: summed over the ranks there (an all-reduce the host does not wait for)
and kept in `Losses` until the host needs it. The trainer reads them all in one transfer (`Trainer.settle`)
before anything acts on the state they describe: a log line, an evaluation, a checkpoint, a stop, the end of
an epoch, and at every step the step timer still times (its times must be the device's). Divergence is
found there, named at the step where the loss first became non-finite, as it was when every step was read.

With gloo on a CPU nothing runs ahead of the host: the loss joins the flags' tensor, as it always did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import distributed


@dataclass(frozen=True)
class Agreed:
    """What every rank agreed on after one step."""

    oom: bool  # some rank ran out of memory: every rank redoes the step
    time_limit: bool
    signal: bool
    checkpoint_due: bool
    battery_stop: bool


NONE_AGREED = Agreed(oom=False, time_limit=False, signal=False, checkpoint_due=False, battery_stop=False)


class Agreement:
    """The step's flags over all ranks, and its loss summed over them (a device tensor, or a float on a CPU).

    host_flags: the flags go over a separate host group and the loss stays on the device; None decides it
    from the default group (NCCL: yes; gloo: no). Tests pass True to run that path on a CPU with gloo."""

    def __init__(self, device: torch.device, active: bool, *, host_flags: bool | None = None) -> None:
        self.device, self.active = device, active
        self.host_flags = active and (distributed.collectives_on_device() if host_flags is None else host_flags)
        self.group = distributed.host_group() if self.host_flags else None  # collective: every rank, same order

    def step(self, oom: bool, time_limit: bool, signal: bool, checkpoint_due: bool, battery_stop: bool,
             loss: torch.Tensor | None) -> tuple[Agreed, torch.Tensor | float | None]:
        """This rank's flags and loss sum (None after its own out-of-memory) -> what all agreed, and the loss
        summed over the ranks (None when any ran out of memory)."""
        if not self.active:  # one process: its own flags; most steps build nothing (NONE_AGREED)
            if not (oom or time_limit or signal or checkpoint_due or battery_stop):
                return NONE_AGREED, loss
            return Agreed(oom, time_limit, signal, checkpoint_due, battery_stop), None if oom else loss
        flags = [oom, time_limit, signal, checkpoint_due, battery_stop]
        if not self.host_flags:  # gloo: the loss is read on the host at no cost and joins the flags
            *summed, total = distributed.all_sum(
                [float(f) for f in flags] + [0.0 if loss is None else loss.item()], self.device)
            agreed = Agreed(*(v > 0 for v in summed))
            return agreed, None if agreed.oom else total
        summed = distributed.all_sum([float(f) for f in flags], torch.device("cpu"), group=self.group)
        agreed = Agreed(*(v > 0 for v in summed))
        if agreed.oom:
            return agreed, None
        return agreed, distributed.sum_on_device(loss.detach().to(torch.float64))


class Losses:
    """The loss sums of the steps not yet read: (step, samples, sum) with the sum a device tensor or a float."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, int, torch.Tensor | float]] = []

    def add(self, step: int, samples: int, total: torch.Tensor | float) -> None:
        self.pending.append((step, samples, total))

    def read(self) -> list[tuple[int, int, float]]:
        """Every pending (step, samples, loss sum) as floats, in order, read in one transfer; then none pend."""
        pending, self.pending = self.pending, []
        tensors = [t for _, _, t in pending if isinstance(t, torch.Tensor)]
        values = iter(torch.stack(tensors).tolist() if tensors else ())
        return [(step, n, next(values) if isinstance(t, torch.Tensor) else t) for step, n, t in pending]

    def settle(self, progress, learning_rate: float, last: float) -> float:
        """Read every pending loss in one transfer into the progress's interval mean and return the newest
        (`last` when none pends); FloatingPointError at the first that is not finite, named by its step."""
        for step, n, total in self.read():
            loss = total / n
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss became {loss} at step {step}: lower CONFIG_LEARNING_RATE "
                                         f"(now {learning_rate:g}) or enable CONFIG_GRAD_CLIP")
            progress.interval_loss += loss * n
            last = loss
        return last
