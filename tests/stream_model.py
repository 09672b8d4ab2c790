"""Streams for tests/test_streaming.py: a linear model learning the sum of four numbers from an IterableDataset
of (x, sum of x) rows, item i drawn from a generator seeded by i, so every pass yields the same items. The
pass (170 training rows) ends inside a window of 32, and runs of 60 steps make several passes.
KFIT_TEST_STREAM_DELAY: seconds each item takes (a run slow enough to be killed mid-way)."""

from __future__ import annotations

import os
import time

import torch

ROWS = 210  # the single stream's first 40 (CONFIG_CUSTOM_EVAL_SAMPLES) go to evaluation


def row(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(4, generator=torch.Generator().manual_seed(i))
    time.sleep(float(os.environ.get("KFIT_TEST_STREAM_DELAY", "0")))
    return x, x.sum(dim=0, keepdim=True)


class Rows(torch.utils.data.IterableDataset):
    """Rows start..stop-1, no state: a resume reads it again and skips."""

    def __init__(self, start: int = 0, stop: int = ROWS) -> None:
        self.start, self.stop = start, stop

    def __iter__(self):
        for i in range(self.start, self.stop):
            yield row(i)


class StatefulRows(Rows):
    """The same rows, with torchdata's Stateful protocol: the position of its iteration, restored by
    load_state_dict before the next iter(). Yields dicts, as a Hugging Face stream does."""

    def __init__(self, start: int = 0, stop: int = ROWS) -> None:
        super().__init__(start, stop)
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]

    def __iter__(self):
        while self.start + self.position < self.stop:
            x, y = row(self.start + self.position)
            self.position += 1
            yield {"inputs": x, "labels": y}
        self.position = 0


def mse(out, y):
    return torch.nn.functional.mse_loss(out, y)


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def stateless():
    """One stream: its first 40 rows are held out for evaluation."""
    return model(), Rows(), mse


def stateful():
    """A (train, eval) pair of streams."""
    return model(), (StatefulRows(0, 170), StatefulRows(1000, 1040)), mse
