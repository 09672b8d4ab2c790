"""Which samples each optimizer step sees: the epoch's order, cut into windows and micro-batches.

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
processes each rank takes a disjoint slice of every window (`rank_batches`);
each rank cuts its slice into micro-batches of the current size. So neither the
number of processes nor an out-of-memory halving of the micro-batch changes
which samples an optimizer step sees: N ranks x accumulation k equal 1 rank x
N*k, and a step redone after out-of-memory equals the step that failed.

`Progress` is where a run stands in that order; with the tensors it is all a
checkpoint needs to continue exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader

from ..data import BatchSplit
from ..plan import Plan
from ..units import micro_batch_sizes


def epoch_micro_batches(num_samples: int, micro_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's sample order, cut into micro-batches. Order depends on (seed, epoch) only."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return split_batches(torch.randperm(num_samples, generator=generator).tolist(), micro_batch)


def split_batches(indices: list[int], size: int) -> list[list[int]]:
    """Consecutive batches of at most `size`, cut as lib.units.micro_batch_sizes says (a lone trailing
    sample shares the last two batches' samples instead, for BatchNorm's statistics)."""
    batches, start = [], 0
    for n in micro_batch_sizes(len(indices), size):
        batches.append(indices[start:start + n])
        start += n
    return batches


def rank_batches(window: list[int], rank: int, world_size: int, micro_batch: int,
                 equal_counts: bool = False) -> list[tuple[list[int], float]]:
    """This rank's micro-batches of a window, each with its share of the window's samples.

    equal_counts: every rank runs as many micro-batches as the rank with the most (zero-weight passes
    fill the rest). FSDP needs it: its collectives run inside every forward and backward, so a rank
    that ran one micro-batch fewer (an uneven last window) would leave the others waiting."""
    n = len(window)
    mine = window[rank * n // world_size:(rank + 1) * n // world_size]
    batches = [(b, len(b) / n) for b in split_batches(mine, micro_batch)]
    if not batches:  # fewer samples than ranks: a zero-weight pass keeps DDP's bookkeeping in step
        batches = [(window[:2], 0.0)]
    if equal_counts:
        most = max(len(split_batches(window[r * n // world_size:(r + 1) * n // world_size], micro_batch)) or 1
                   for r in range(world_size))
        batches += [(window[:2], 0.0)] * (most - len(batches))
    return batches


def loader(split: BatchSplit, batches: list[list[int]], plan: Plan) -> DataLoader:
    """Loads `batches` of `split` in the given order, with the plan's workers and pinning."""
    return DataLoader(split, sampler=batches, batch_size=None, num_workers=plan.num_workers,
                      pin_memory=plan.pin_memory)


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
    rungs: list[str] = field(default_factory=list)  # out-of-memory ladder rungs taken, in order (ladder.py)
    # judged by CONFIG_CHECKPOINT_BEST_METRIC after each evaluation (best.py)
    best: list[list] = field(default_factory=list)  # [step, value] of the best-<step> checkpoints, best first
    early_best: list | None = None  # early stopping: [step, value] of the best evaluation so far
    stale_evals: int = 0  # evaluations since early_best without improvement
