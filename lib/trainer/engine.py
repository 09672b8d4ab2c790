"""The engine: the model, its optimizer and scaler, their wrapping, and the computation of one optimizer step.

It builds the model (with INIT_FROM's weights, before sharding), shards it under FSDP (plan.strategy,
lib/parallel.py) before the optimizer is made, and once the run's state is restored wraps it in DDP and
torch.compile (the model and its loss in one graph: lib/step.py forward_loss). A step is `accumulate`
(forward and backward over this rank's micro-batches of a window, windows.py) and then `update` (the
gradients summed where DDP did not, clipped, the scaler's optimizer step).
Under DDP with out-of-memory recovery on, every micro-batch runs under no_sync and gradients are summed only
after all ranks agreed that none ran out of memory; without it DDP syncs during the last backward. Under
FSDP gradients are reduce-scattered in the last micro-batch's backward only where memory allows
(plan.gradient_sync), and every rank runs the same number of micro-batches.

The engine reads the plan it is handed on each call: recovery.py owns the plan and changes it.
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from .. import distributed, parallel
from ..context_parallel import split_for
from ..config import Config
from ..distributed import Rank
from ..models import count_parameters
from ..models.checkpointing import is_on, switch
from ..models.freeze import trainable_parameters
from ..models.registry import checkpointing_for
from ..oom import Injector, release
from ..plan import Plan
from ..step import autocast_for, decay_groups, forward_loss, make_optimizer
from ..task import Task
from .schedule import lr_at
from ..data.stream import StreamWindows
from .windows import loader, rank_batches


class Engine:
    """The model, optimizer and scaler of one process, and the forward, backward and update of a step."""

    def __init__(self, config: Config, plan: Plan, task: Task, rank: Rank, device: torch.device, *,
                 initial_weights: dict | None = None) -> None:
        self.config, self.task, self.rank, self.device = config, task, rank, device
        self.loss_fn = task.loss
        model = task.build(plan.gradient_checkpointing)
        if initial_weights is not None:  # before sharding: names and shapes of the whole model (checked already)
            model.load_state_dict(initial_weights)
        self.parameters = count_parameters(model)  # the whole model's, whatever part of it this process holds
        self.trainable_parameters = trainable_parameters(model)  # CONFIG_FREEZE's are not
        if rank.pipeline > 1:  # this process's stages only (CONFIG_PP), cut before moving: never the whole on a GPU
            from ..pipeline import keep_stages, process_stages, stages_per_process

            per = stages_per_process(plan.pipeline_schedule)
            names = {id(p): n for n, p in model.named_parameters()}
            order = [names[id(p)] for group in decay_groups(config, model) for p in group["params"]]
            keep_stages(model, process_stages(rank.stage_rank, rank.pipeline, per), rank.pipeline * per)
            model.pipeline_optimizer_order = order  # how a one-process checkpoint numbers the whole model's
        self.model = model.to(device)
        self.checkpointing = checkpointing_for(config, self.model)  # how it recomputes, None where it cannot
        # fully_shard applied: over the data-parallel groups and their context-parallel processes
        self.fsdp = parallel.is_sharded(plan.strategy) and rank.data_world * rank.context > 1
        # parameters are DTensors spread over the ranks (FSDP, or CONFIG_TP's groups), or split between pipeline
        # stages: every rank saves its part (DCP), and every rank runs as many forwards and backwards, whose
        # collectives the others wait for
        self.sharded = self.fsdp or rank.tensor > 1 or rank.pipeline > 1
        self.pipeline = None  # lib/pipeline.py's schedules over this process's stages (CONFIG_PP)
        if plan.float8:  # before sharding (its all-gather may be in float8) and before compile
            from ..float8 import convert

            convert(self.model, plan.float8, sharded=self.fsdp)
        # before the optimizer: parallelize_module and fully_shard replace the parameters with DTensors
        if self.sharded:
            mesh = parallel.make_mesh(device.type, plan.strategy, rank.world_size, rank.local_world_size,
                                      rank.tensor, rank.pipeline, rank.context)
            if rank.context > 1:  # each batch's sequences split over the group (CONFIG_CP; CUDA only)
                from ..context_parallel import ContextSplit

                self.model.context_split = ContextSplit(mesh["cp"])  # how the evaluation enters it too
            if rank.pipeline > 1:
                from ..pipeline import Pipeline

                self.pipeline = Pipeline(self.model, mesh["pp"].get_group(), rank.stage_rank, rank.pipeline,
                                         plan.pipeline_schedule, device)
                self.model.pipeline = self.pipeline  # how the evaluation runs it (evaluation.py)
            if rank.tensor > 1:
                parallel.tensor_parallelize(self.model, mesh)
            if self.fsdp:
                parallel.shard_model(self.model, plan.strategy, mesh, precision=plan.precision,
                                     cpu_offload=plan.cpu_offload)
        self.optimizer = make_optimizer(config, self.model)
        self.scaler = torch.amp.GradScaler(plan.device_type, enabled=plan.grad_scaler)
        self.inject = Injector()
        self.ddp = None
        self.forward_loss = None  # x, y -> loss: wrap() makes it, around the restored model
        self.ddp_sync_last = False
        self.feed = None  # the loader's iterator over this rank's micro-batches
        self.updating = False  # inside `update`: the tensors are neither the last step's nor this one's

    def wrap(self, plan: Plan) -> None:
        """DDP (several processes, not sharded) and torch.compile around the model: after restoring it."""
        module = self.model
        if self.pipeline is not None:  # the schedule calls the stages: each block compiled in place, as torchtitan does
            if plan.compile:
                for block in parallel.shard_units(self.model):
                    block.compile(mode=plan.compile_mode)
            return
        if self.rank.data_world > 1 and not self.fsdp:
            from torch.nn.parallel import DistributedDataParallel

            # No buffer broadcast: it is a collective in every forward, and ranks may run different
            # numbers of micro-batches (uneven slices, or one rank redoing a step after out-of-memory).
            no_forward_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                               inspect.signature(DistributedDataParallel).parameters else {"broadcast_buffers": False})
            self.ddp = module = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None, **no_forward_sync)
        self.forward_loss = forward_loss(module, self.loss_fn, plan)  # compiled with the loss where it compiles
        # With recovery on, every micro-batch runs under no_sync and gradients are summed after all ranks
        # agreed that none ran out of memory; otherwise DDP syncs during the last backward (overlapped).
        self.ddp_sync_last = self.ddp is not None and not self.config.oom_recovery

    @property
    def can_checkpoint(self) -> bool:
        return self.checkpointing is not None

    def follow(self, plan: Plan, rungs: list[str]) -> None:
        """Compute steps as `plan` says from now on, the ladder's rungs `rungs` taken: checkpointing, a scaler."""
        if self.checkpointing is not None and is_on(self.model, self.checkpointing) != plan.gradient_checkpointing:
            switch(self.model, self.checkpointing, plan.gradient_checkpointing)
        if plan.grad_scaler and not self.scaler.is_enabled():
            self.scaler = torch.amp.GradScaler(plan.device_type, enabled=True)
        self.inject.adapted = self.inject.adapted or bool(rungs)

    # -- one optimizer step ----------------------------------------------------

    def window_batches(self, window: list[int], micro_batch: int) -> list[tuple[list[int], float]]:
        return rank_batches(window, self.rank.data_rank, self.rank.data_world, micro_batch,
                            equal_counts=self.sharded)

    def start_feed(self, windows: list[list[int]], first: int, plan: Plan, micro_batch: int) -> None:
        """Load this rank's micro-batches from window `first` on, at `micro_batch`: a stream's as its windows are
        read, in this process (windows.epoch_windows; its reading counts as step time, not as a loader's wait)."""
        if isinstance(windows, StreamWindows):
            self.feed = windows.batches(first, lambda window: self.window_batches(window, micro_batch))
            return
        batches = [b for window in windows[first:] for b, _ in self.window_batches(window, micro_batch)]
        self.feed = iter(loader(self.task.train, batches, plan))

    def accumulate(self, window: list[int], step: int, plan: Plan, micro_batch: int) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches; returns its sample-weighted loss sum."""
        batches = self.window_batches(window, micro_batch)
        # DDP syncing on the last micro-batch and FSDP average over the data-parallel groups: undo that mean.
        grad_factor = self.rank.data_world if self.ddp_sync_last or self.fsdp else 1
        if self.pipeline is not None:
            return self._pipeline_step(window, batches, step, plan, micro_batch, grad_factor)
        total = None  # no zeros to add to: one micro-batch's loss sum is one tensor op
        split = split_for(self.model)  # CONFIG_CP: the micro-batch's chunks of the sequence, the attention a ring
        for i, (indices, weight) in enumerate(batches):
            x, y = (t.to(self.device, non_blocking=True) for t in next(self.feed))
            self.inject.check(len(indices), step + 1 if i == 0 else None)
            last = i == len(batches) - 1
            if self.fsdp:  # reduce-scatter in the last backward only, where memory allows (plan.gradient_sync)
                self.model.set_requires_gradient_sync(last or plan.gradient_sync == "micro_batch")
            sync = self.ddp is None or (self.ddp_sync_last and last)
            with contextlib.nullcontext() if sync else self.ddp.no_sync(), parallel.loss_context(self.model), \
                    split(self.model, x, y) as (x, y):
                with autocast_for(plan):
                    loss = self.forward_loss(x, y)
                scale = weight * grad_factor  # 1 for one micro-batch on one process: no multiply, nor its backward
                self.scaler.scale(loss if scale == 1 else loss * scale).backward()
            if weight:
                part = parallel.local_value(loss.detach()) * len(indices)
                total = part.float() if total is None else total + part
        if total is None or not self.rank.counts:  # a tensor-parallel group's loss counts once in the sum
            return torch.zeros((), device=self.device)
        return total * self.rank.loss_weight if self.rank.context > 1 else total

    def _pipeline_step(self, window: list[int], batches: list, step: int, plan: Plan, micro_batch: int,
                       grad_factor: int) -> torch.Tensor:
        """The micro-batches of this rank's share as the pipeline's (lib/pipeline.py): one schedule step over
        all of them, every stage of the pipeline with the same samples."""
        from ..pipeline import IGNORE

        xs, ys = [], []
        for indices, weight in batches:
            x, y = next(self.feed)
            xs.append(x)
            ys.append(y if weight else torch.full_like(y, IGNORE))  # a zero-weight pass: no sample of its own
        x, y = (torch.cat(t).to(self.device, non_blocking=True) for t in (xs, ys))
        self.inject.check(min(micro_batch, x.size(0)), step + 1)
        if self.fsdp:  # the stages' backwards run inside the schedule: each reduce-scatters its gradients
            self.model.set_requires_gradient_sync(True)
        with autocast_for(plan), parallel.loss_context(self.model), split_for(self.model)(self.model, x, y) as (x, y):
            total = self.pipeline.step(x, y, share_max=-(-len(window) // self.rank.data_world),
                                       micro_batch=micro_batch, window=len(window), grad_factor=grad_factor,
                                       loss_fn=self.loss_fn)
        if total is None or not self.rank.counts:
            return torch.zeros((), device=self.device)
        return parallel.local_value(total) * self.rank.loss_weight

    def update(self, step: int, total_steps: int) -> None:
        """The optimizer step after all ranks agreed the gradients are whole: summed where DDP did not, clipped
        (CONFIG_GRAD_CLIP), at the schedule's learning rate."""
        self.updating = True  # until the update is done, the tensors are neither the last step's nor this one's
        if self.ddp is not None and not self.ddp_sync_last:
            distributed.all_reduce_gradients([p for p in self.model.parameters() if p.requires_grad])
        if self.config.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            if self.pipeline is not None:  # the norm of every stage's gradients
                from ..pipeline import clip_grad_norm

                clip_grad_norm(list(self.model.parameters()), self.config.grad_clip, self.pipeline.group)
            else:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        lr = lr_at(self.config, step, total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.updating = False

    def free(self) -> None:
        """After out-of-memory: drop the failed step's gradients and cached blocks, and the prefetched batches
        (they belong to the old cut)."""
        self.feed = None
        release(self.device, self.optimizer)

    def release(self) -> None:
        """Drop the model, optimizer and DDP wrapper (before leaving a process group)."""
        self.forward_loss = self.ddp = self.model = self.optimizer = self.feed = None
