"""Evaluation: the mean loss and the task's metric over the eval split.

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
        for x, y in loader(self.split, batches, plan):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            self.inject.check(len(y))
            with autocast_for(plan):
                logits = model(x)
            loss_sum += self.loss_fn(logits, y).item() * len(y)
            if self.kind == "image":
                correct += (logits.argmax(dim=-1) == y).sum().item()
        loss = loss_sum / n
        if self.kind == "image":
            return {"eval_loss": loss, "accuracy": correct / n}
        if self.kind == "text":
            return {"eval_loss": loss, "perplexity": math.exp(min(loss, 50.0))}
        return {"eval_loss": loss}


def metric_names(kind: str) -> tuple[str, ...]:
    """The metrics Evaluator.metrics reports for a task of this kind (image, text, custom)."""
    return {"image": ("eval_loss", "accuracy"), "text": ("eval_loss", "perplexity")}.get(kind, ("eval_loss",))
