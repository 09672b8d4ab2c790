"""Evaluation: the mean loss and the task's metrics over the eval split (for image classifiers the accuracy and
the macro-F1: the mean over classes of each class's F1, from the predictions' confusion counts).

Only rank 0 evaluates, with the bare model (no DDP collectives; the other ranks
wait at the next step's collective), in the split's own order. With out-of-memory
recovery on, a failed evaluation is retried at half the eval batch.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..config import Config
from ..oom import Injector, halve, is_oom, release
from ..plan import Plan
from ..step import autocast_for
from ..task import Task
from .windows import loader


class Evaluator:
    """Evaluates a model on the task's eval split; holds no model, so it can be built once per run."""

    def __init__(self, task: Task, config: Config, device: torch.device, inject: Injector) -> None:
        self.split, self.loss_fn, self.kind = task.eval, task.loss, task.info.kind
        self.config, self.device, self.inject = config, device, inject

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, plan: Plan, halved: Callable[[int, int], None]) -> dict:
        """Metrics of `model` at the plan's eval batch. After each out-of-memory halving,
        halved(before, after) is told (the trainer keeps the new batch in its plan)."""
        batch, halvings = plan.eval_batch, 0
        while True:
            try:
                return self.metrics(model, plan, batch)
            except Exception as err:  # noqa: BLE001
                if not (self.config.oom_recovery and is_oom(err)):
                    raise
            finally:
                model.train()
            release(self.device)
            before, batch = batch, halve(batch, halvings, self.config.oom_max_halvings or 0, "in evaluation")
            halvings += 1
            halved(before, batch)

    def metrics(self, model: torch.nn.Module, plan: Plan, eval_batch: int) -> dict:
        model.eval()
        n = len(self.split)
        batches = [list(range(i, min(i + eval_batch, n))) for i in range(0, n, eval_batch)]
        loss_sum, correct = 0.0, 0
        hits = predicted = actual = None  # per class: true positives, predictions, labels
        for x, y in loader(self.split, batches, plan):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            self.inject.check(len(y))
            with autocast_for(plan):
                logits = model(x)
            loss_sum += self.loss_fn(logits, y).item() * len(y)
            if self.kind == "image":
                guess = logits.argmax(dim=-1)
                right = guess == y
                correct += right.sum().item()
                k = logits.shape[-1]
                counts = (torch.bincount(guess[right], minlength=k), torch.bincount(guess, minlength=k),
                          torch.bincount(y, minlength=k))
                hits, predicted, actual = counts if hits is None else \
                    (hits + counts[0], predicted + counts[1], actual + counts[2])
        loss = loss_sum / n
        if self.kind == "image":
            return {"eval_loss": loss, "accuracy": correct / n, "macro_f1": macro_f1(hits, predicted, actual)}
        if self.kind == "text":
            return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0))}
        return {"eval_loss": loss}


def metric_names(kind: str) -> tuple[str, ...]:
    """The metrics Evaluator.metrics reports for a task of this kind (image, text, custom)."""
    return {"image": ("eval_loss", "accuracy", "macro_f1"),
            "text": ("eval_loss", "perplexity")}.get(kind, ("eval_loss",))


def macro_f1(hits: torch.Tensor | None, predicted: torch.Tensor | None, actual: torch.Tensor | None) -> float:
    """The mean F1 (2 TP / (2 TP + FP + FN) = 2 hits / (predicted + actual)) over the classes that occur among
    the labels or the predictions; 0 for an empty evaluation."""
    if hits is None:
        return 0.0
    seen = (predicted + actual) > 0
    if not seen.any():
        return 0.0
    return (2 * hits[seen].double() / (predicted[seen] + actual[seen]).double()).mean().item()
