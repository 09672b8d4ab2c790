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

import time
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader

from ..data import BatchSplit
from ..data.stream import StreamSplit, StreamWindows, saved_state
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
    mine = rank_slice(window, rank, world_size)
    batches = [(b, len(b) / n) for b in split_batches(mine, micro_batch)]
    if not batches:  # fewer samples than ranks: a zero-weight pass keeps DDP's bookkeeping in step
        batches = [(window[:2], 0.0)]
    if equal_counts:
        most = max(len(split_batches(window[r * n // world_size:(r + 1) * n // world_size], micro_batch)) or 1
                   for r in range(world_size))
        batches += [(window[:2], 0.0)] * (most - len(batches))
    return batches


def rank_slice(window: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's disjoint share of a window: its contiguous slice."""
    n = len(window)
    return window[rank * n // world_size:(rank + 1) * n // world_size]


def epoch_windows(split: BatchSplit, progress: Progress, seed: int, rank: int, world_size: int):
    """The windows of the epoch in progress: the (seed, epoch) order cut into windows, or for a stream
    (lib/data/stream.py) its pass read window by window from where `progress` stands, at the stream's state
    the checkpoint saved or by skipping the items already trained on."""
    p = progress
    if not isinstance(split, StreamSplit):
        return epoch_micro_batches(len(split), p.window_size, seed, p.epoch)

    def keep(window: list[int]) -> set[int]:  # rank_batches' share, and the two a zero-weight pass takes
        return set(rank_slice(window, rank, world_size)) | set(window[:2])

    def record(position: dict | None) -> None:
        p.stream = position

    state = saved_state(split, p.stream, p.epoch, p.window) if p.window else None
    return StreamWindows(split, p.window_size, p.epoch, p.window, state, keep, record)


def total_steps(split: BatchSplit, window_size: int, epochs: int, max_steps: int) -> int:
    """The run's optimizer steps: epochs x windows per epoch, capped by CONFIG_MAX_STEPS; for a stream, whose
    passes have no length known in advance, CONFIG_MAX_STEPS (required for one: lib/task.py)."""
    if isinstance(split, StreamSplit):
        return max_steps
    total = epochs * len(epoch_micro_batches(len(split), window_size, 0, 0))
    return min(total, max_steps) if max_steps else total


def epochs_trained(split: BatchSplit, samples: int, epoch: int) -> float:
    """Epochs the run trained: samples over the split's length; for a stream, whose length is only a
    planning stand-in (CONFIG_CUSTOM_TRAIN_SAMPLES), the passes it completed."""
    return float(epoch) if isinstance(split, StreamSplit) else samples / len(split)


def loader(split: BatchSplit, batches: list[list[int]], plan: Plan) -> DataLoader:
    """Loads `batches` of `split` in the given order, with the plan's workers, prefetch depth and pinning;
    iterating it times each wait for a batch (InputWait)."""
    return make_loader(split, batches, plan.num_workers, plan.prefetch_factor, plan.pin_memory)


def make_loader(split, batches: list[list[int]], workers: int, prefetch_factor: int, pin_memory: bool) -> DataLoader:
    """The DataLoader the trainer uses, from its settings (make bench-data measures the same one).
    prefetch_factor 0: torch's default (it takes none without workers)."""
    prefetch = {"prefetch_factor": prefetch_factor} if workers and prefetch_factor else {}
    return TimedLoader(split, sampler=batches, batch_size=None, num_workers=workers, pin_memory=pin_memory,
                       **prefetch)


class InputWait:
    """An iterator over a loader's batches that adds up the seconds spent inside next(): the time the
    training loop waited for input, which the step's own compute does not include.

    The first batch's wait is kept apart (`first_s`): it is the loader starting (worker processes, their
    first fill), paid once per epoch, which neither more workers nor a deeper prefetch shortens."""

    def __init__(self, batches) -> None:
        self._batches = batches
        self.waited_s = 0.0  # since the last take(), the first batch's wait left out
        self.first_s: float | None = None

    def __iter__(self) -> InputWait:
        return self

    def __next__(self):
        started = time.perf_counter()
        try:
            return next(self._batches)
        finally:
            waited = time.perf_counter() - started
            if self.first_s is None:
                self.first_s = waited
            else:
                self.waited_s += waited

    def take(self) -> float:
        """The seconds waited since the last take(), and start counting again."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited


class TimedLoader(DataLoader):
    """A DataLoader whose iterators time their waits (InputWait)."""

    def __iter__(self) -> InputWait:
        return InputWait(super().__iter__())


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
    # a stateful stream's position after the windows done (lib/data/stream.py's StreamWindows.position)
    stream: dict | None = None
