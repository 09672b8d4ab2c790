"""Streams: a custom model's IterableDataset, read in order, one optimizer step's window at a time, with exact
resume.

A stream has no length and no index, so kfit reads it front to back: window k of a pass is the stream's items
k*W .. k*W+W-1 (W the effective batch; the last window of a pass is short where the stream ends there), and a
pass ends where the stream does (an epoch). Every rank reads the whole stream and keeps its own slice of each
window (lib/trainer/windows.py's rank_slice), so one position serves every rank. Reading happens in the
training process itself (no loader workers: a worker's copy of the stream would not know the position).

Resume is exact two ways:
  - a stream with state_dict() and load_state_dict() (torchdata's Stateful protocol; a Hugging Face
    IterableDataset has them) is checkpointed with its state after the last window trained on, and continues
    from it (`position` below);
  - any other stream is read again from its start and the items already trained on are skipped, which is
    exact where the stream yields the same items each time it is iterated (the trainer says so in a warning).

Planning reads the stream's first items (`__getitem__` serves indices from that prefix, wrapping around a
stream shorter than asked): the memory planner's and the probe's example batches, the check of the first
two items, the LR finder.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import IterableDataset, default_collate

from .splits import BatchSplit, Indices, as_pair

STATEFUL = ("state_dict", "load_state_dict")


def is_stream(value) -> bool:
    """An iterable dataset: a torch IterableDataset, or a Hugging Face datasets.IterableDataset."""
    return isinstance(value, IterableDataset) or (type(value).__name__ == "IterableDataset"
                                                   and hasattr(value, "__iter__"))


def stateful(stream) -> bool:
    return all(callable(getattr(stream, name, None)) for name in STATEFUL)


class StreamSplit(BatchSplit):
    """A stream as the trainer reads it. `skip`: items at the start of every pass that belong to evaluation;
    `nominal`: the length planning assumes a pass has (CONFIG_CUSTOM_TRAIN_SAMPLES), as a stream has none."""

    def __init__(self, stream, skip: int = 0, nominal: int = 4096) -> None:
        self.stream, self.skip, self.nominal = stream, skip, nominal
        self.stateful = stateful(stream)
        # the state before any item: each pass starts from it (iterating may have moved the stream's own state)
        self.initial = copy.deepcopy(stream.state_dict()) if self.stateful else None
        self.prefix: list = []  # the pass's first items, for planning
        self.prefix_complete = False  # the stream ended within the prefix

    def __len__(self) -> int:
        return self.nominal

    @property
    def name(self) -> str:
        return type(self.stream).__name__

    def open(self, skip_items: int = 0, state=None) -> Iterator:
        """An iterator over a pass: at `state` (a stateful stream's, saved by `position`), else at its start,
        `self.skip` + `skip_items` items read and dropped."""
        if self.stateful:
            self.stream.load_state_dict(copy.deepcopy(self.initial if state is None else state))
        items = iter(self.stream)
        if state is None and self.skip + skip_items:
            next(itertools.islice(items, self.skip + skip_items, self.skip + skip_items), None)
        return items

    def head(self, n: int, skip: int = 0) -> list:
        """The first `n` items of a pass (fewer where it ends sooner), after `skip` items; the whole stream's
        start, `self.skip` ignored (the evaluation items a single stream holds out)."""
        if self.stateful:
            self.stream.load_state_dict(copy.deepcopy(self.initial))
        return list(itertools.islice(iter(self.stream), skip, skip + n))

    def __getitem__(self, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
        positions = [int(i) for i in indices]
        wanted = max(positions, default=0) + 1
        if len(self.prefix) < wanted and not self.prefix_complete:
            # read again from the start (a paused iterator may share the stream's state with a newer one)
            self.prefix = self.head(max(wanted, 2 * len(self.prefix)), self.skip)
            self.prefix_complete = len(self.prefix) < max(wanted, 2 * len(self.prefix))
        if not self.prefix:
            raise ValueError(f"the stream ({self.name}) yielded no training items")
        return collate([self.prefix[i % len(self.prefix)] for i in positions])


def collate(rows: list) -> tuple[torch.Tensor, torch.Tensor]:
    return as_pair(default_collate(rows))


class StreamWindows:
    """One pass's windows, read as the trainer reaches them. Sized and indexable as the list of windows of a
    map-style epoch is (window k: the list of its positions in the pass), with one window read ahead: len()
    is the number of windows the pass has once the stream ended, and otherwise one more than the trainer has
    asked for so far. Only this rank's items of a window are held (`keep(window) -> positions`), and only the
    current window and the next. `record(position)`: told, as the trainer takes window k, what a checkpoint
    taken after it needs to continue (`position`)."""

    def __init__(self, split: StreamSplit, size: int, epoch: int, first: int, saved: dict | None,
                 keep: Callable[[list[int]], set[int]], record: Callable[[dict | None], None]) -> None:
        """saved: a checkpoint's `position` for window `first` of this pass (a stateful stream), else None."""
        self.split, self.size, self.epoch, self.keep, self.record = split, size, epoch, keep, record
        ended = bool(saved and saved.get("ended"))  # the pass ended in the last window trained on
        self.items = iter(()) if ended else split.open(first * size, saved["state"] if saved else None)
        self.windows: dict[int, list[int]] = {}
        self.held: dict[int, object] = {}  # position -> item, of the windows held
        # window -> the stream's state after it (a stateful stream), and whether the stream ended in it
        self.states: dict[int, tuple] = {}
        self.read = first  # windows read so far (the first `first` skipped, or restored)
        self.asked = first - 1
        self.ended: int | None = None  # the pass's number of windows, once the stream ended

    def _read_next(self) -> None:
        start = self.read * self.size
        rows = list(itertools.islice(self.items, self.size))
        if len(rows) < self.size:
            self.ended = self.read + (1 if rows else 0)
        if not rows:
            return
        window = list(range(start, start + len(rows)))
        mine = self.keep(window)
        self.held.update((p, row) for p, row in zip(window, rows) if p in mine)
        self.windows[self.read] = window
        if self.split.stateful:
            self.states[self.read] = (copy.deepcopy(self.split.stream.state_dict()), len(rows) < self.size)
        self.read += 1

    def __len__(self) -> int:
        while self.ended is None and self.read <= self.asked + 1:
            self._read_next()
        return self.ended if self.ended is not None else self.read

    def __getitem__(self, k: int) -> list[int]:
        while self.ended is None and self.read <= k:
            self._read_next()
        if k not in self.windows:
            raise IndexError(f"window {k} of the stream's pass is not held")
        for old in [w for w in self.windows if w < k]:  # done with: the trainer never goes back
            for p in self.windows.pop(old):
                self.held.pop(p, None)
            self.states.pop(old, None)
        self.asked = max(self.asked, k)
        self.record(self.position(k + 1))
        return self.windows[k]

    def position(self, done: int) -> dict | None:
        """What a checkpoint taken once `done` windows of this pass are trained on holds to continue there:
        the stateful stream's state after window done - 1; None for a stream without one (it is read again and
        skipped: the count of windows done says how far)."""
        if not self.split.stateful or done - 1 not in self.states:
            return None
        state, ended = self.states[done - 1]
        return {"epoch": self.epoch, "window": done, "state": state, "ended": ended}

    def batches(self, first: int, cut: Callable[[list[int]], list[tuple[list[int], float]]]) -> Iterator:
        """This rank's micro-batches, collated, from window `first` on; `cut(window)` says which (the trainer's
        rank_batches at the current micro-batch)."""
        k = first
        while k < len(self):
            for positions, _ in cut(self[k]):
                yield collate([self.held[p] for p in positions])
            k += 1


def saved_state(split: StreamSplit, saved: dict | None, epoch: int, window: int) -> dict | None:
    """The stateful stream's position a checkpoint holds for (epoch, window), or None: read again and skip."""
    if split.stateful and isinstance(saved, dict) and saved.get("epoch") == epoch and saved.get("window") == window:
        return saved
    return None


def resume_note(split: StreamSplit, skipped: int) -> str:
    """The warning a run of a stream without state says once: what a resume does."""
    return (f"warning: the stream ({split.name}) has no state_dict()/load_state_dict(): a resumed run reads it "
            "again from its start and skips the items already trained on"
            + (f" ({skipped:,} now)" if skipped else "")
            + "; exact where it yields the same items each time it is iterated")
