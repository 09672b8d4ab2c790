"""Evaluation: the mean loss and the task's metrics over the eval split (lib/metrics.py: torchmetrics objects,
the built-in models' accuracy, top-5 accuracy and macro-F1, or a custom model's own).

Every rank evaluates its share of the split's batches (rank r takes batches r, r + world, ...) with the bare
model; the loss sums and torchmetrics' states are then summed over the ranks, so every rank gets the figures
of the whole split. Under DDP the forward has no collective; under FSDP a sharded forward gathers parameters
from every rank, so each rank runs as many forwards as the one with the most batches (the extra ones'
outputs are dropped). With out-of-memory recovery on, a failed evaluation is retried at half the eval batch.
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import distributed
from ..context_parallel import split_for
from ..config import Config
from ..distributed import Rank
from ..oom import Injector, halve, is_oom, release
from ..parallel import local_value, loss_context
from ..plan import Plan
from ..step import autocast_for
from ..task import Task
from .windows import loader


class Evaluator:
    """Evaluates a model on the task's eval split; holds no model, so it can be built once per run."""

    def __init__(self, task: Task, config: Config, device: torch.device, inject: Injector,
                 rank: Rank = distributed.SINGLE, lockstep: bool = False) -> None:
        self.split, self.loss_fn, self.metrics = task.eval, task.loss, task.metrics
        self.config, self.device, self.inject = config, device, inject
        self.rank, self.lockstep = rank, lockstep  # lockstep: every rank runs as many forwards (FSDP)

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, plan: Plan, halved: Callable[[int, int], None]) -> dict:
        """Metrics of `model` at the plan's eval batch. After each out-of-memory halving,
        halved(before, after) is told (the trainer keeps the new batch in its plan)."""
        batch, halvings = plan.eval_batch, 0
        while True:
            try:
                return self.measure(model, plan, batch)
            except Exception as err:  # noqa: BLE001
                if not (self.config.oom_recovery and is_oom(err)):
                    raise
            finally:
                model.train()
            release(self.device)
            before, batch = batch, halve(batch, halvings, self.config.oom_max_halvings or 0, "in evaluation")
            halvings += 1
            halved(before, batch)

    def measure(self, model: torch.nn.Module, plan: Plan, eval_batch: int) -> dict:
        model.eval()
        n = len(self.split)
        batches = [list(range(i, min(i + eval_batch, n))) for i in range(0, n, eval_batch)]
        mine = batches[self.rank.data_rank::self.rank.data_world]
        spare = 0  # forwards whose outputs are dropped: as many on every rank as the busiest one's
        if self.lockstep and self.rank.active:
            spare = -(-len(batches) // self.rank.data_world) - len(mine)
        running = self.metrics.fresh(self.device)
        loss_sum = 0.0
        pipeline = getattr(model, "pipeline", None)  # CONFIG_PP: the stages run the batch in turn
        split = split_for(model)  # CONFIG_CP: each process its chunks of the sequences
        for i, (x, y) in enumerate(loader(self.split, mine + batches[:1] * spare, plan)):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            self.inject.check(len(y))
            with autocast_for(plan), split(model, x, y) as (x, y):
                outputs = model(x) if pipeline is None else pipeline.forward(x)
            if i >= len(mine) or outputs is None:  # a spare forward, or a pipeline stage before the last
                continue
            with loss_context(model):
                loss_sum += local_value(self.loss_fn(outputs, y)).item() * len(y)
            if running:  # the metrics see float32 outputs, not autocast's half-precision ones
                seen = outputs.float() if isinstance(outputs, torch.Tensor) and outputs.is_floating_point() \
                    else outputs
                for metric in running.values():
                    metric.update(seen, y)
        # a tensor-parallel group's processes computed the same loss on the same samples: counted once
        # (a context-parallel group's each for its chunks: Rank.loss_weight)
        loss_sum, = distributed.all_sum([loss_sum * self.rank.loss_weight], self.device)
        return self.metrics.finish(running, loss_sum / n)


def metric_names(task: Task) -> tuple[str, ...]:
    """The metrics Evaluator.measure reports for this task."""
    return task.metrics.names
