"""Pipeline parallelism (CONFIG_PP): a model's blocks cut into stages that run on different processes, one
after another, through torch.distributed.pipelining's schedules (1F1B, Interleaved1F1B, GPipe).

A model that can be cut states its parts (`Llama.pipeline_parts`: the embedding, the blocks, the head) and
runs one stage when its forward is given `stage=`. `keep_stages` cuts a process's copy of the whole model down
to its own stages in place, so every tensor keeps the whole model's name: a checkpoint saved under PP resumes
under another degree, or in one process (DCP matches tensors by name), and the data-parallel strategy and TP
apply to what is left as they do to a whole model. With the interleaved schedule a process holds two stages,
`degree` apart (stage r and r + degree on process r): one module with both stages' blocks, each stage run
through a view that calls the module's forward with its stage, so FSDP's hooks on the module run as usual.

A step's micro-batches (its gradient accumulation) are the pipeline's: `Pipeline.step` hands the schedule the
process's whole share of the window and the number of micro-batches, and the loss of each is weighted by its
share of the window, so the effective batch and its mean stay exact. The schedule cuts the share into equal
parts (its stages exchange tensors of one fixed shape): where the share does not divide, the last parts are
padded with repeated samples whose targets say IGNORE, and the loss leaves them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

SCHEDULES = {"1F1B": "Schedule1F1B", "Interleaved1F1B": "ScheduleInterleaved1F1B", "GPipe": "ScheduleGPipe"}
IGNORE = -100  # a padded sample's target: cross-entropy's ignore_index, and the loss here skips its rows


def stages_per_process(schedule: str) -> int:
    """Stages each process holds under `schedule`: two for the interleaved one (half the bubble), else one."""
    return 2 if schedule == "Interleaved1F1B" else 1


def stage_blocks(blocks: int, stages: int) -> list[range]:
    """The blocks of each stage, in order: consecutive runs whose lengths differ by one at most (the longer
    ones last: the first stage also runs the embedding's backward, the cheapest part, so it takes no extra)."""
    base, extra = divmod(blocks, stages)
    sizes = [base + (s >= stages - extra) for s in range(stages)]
    starts = [sum(sizes[:s]) for s in range(stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def process_stages(stage_rank: int, degree: int, per_process: int) -> list[int]:
    """The stages process `stage_rank` of a pipeline of `degree` processes holds: its rank, then every
    `degree`-th after it (the loop order the interleaved schedule runs its stages in)."""
    return [stage_rank + k * degree for k in range(per_process)]


def pipeline_problem(blocks: int, degree: int, schedule: str, tied: bool) -> str | None:
    """Why a model of `blocks` blocks cannot be cut into `degree` processes' stages under `schedule`, or None."""
    stages = degree * stages_per_process(schedule)
    if tied:
        return ("its output layer shares its weights with the token embedding (tied), and the two would sit on "
                "different stages")
    if blocks < stages:
        return (f"its {blocks} blocks cannot make {stages} stages of one block at least"
                + (f" ({degree} processes x 2 for the interleaved schedule)" if stages != degree else ""))
    return None


def micro_batches(share: int, micro_batch: int, degree: int, schedule: str) -> tuple[int, int]:
    """(number, size) of the equal micro-batches a pipeline cuts a share of `share` samples into, at most
    `micro_batch` each: as few as fit, but one per stage at least (torch's 1F1B schedules want no fewer: a stage
    would wait with nothing to do), then as many more as the interleaved schedule needs (it runs them in
    rounds of `degree`, and the number must be a multiple of the rounds). size x number >= share: the rest
    is padding."""
    n = max(1, math.ceil(share / micro_batch), degree)
    if schedule == "Interleaved1F1B":
        while n % max(1, n // degree):
            n += 1
    return n, max(1, math.ceil(share / n))


def keep_stages(model: nn.Module, stages: list[int], degree_stages: int) -> nn.Module:
    """Cut `model` (in place) down to `stages` of the `degree_stages` its blocks are cut into: the embedding
    only on the first, the final norm and the output layer only on the last, the blocks of its stages kept
    under their own indices (an nn.ModuleDict "layers.5", as the whole model's nn.ModuleList names it)."""
    embedding, blocks_name, head = model.pipeline_parts
    whole = set(model.state_dict())
    blocks = getattr(model, blocks_name)
    cuts = stage_blocks(len(blocks), degree_stages)
    kept = sorted(i for s in stages for i in cuts[s])
    setattr(model, blocks_name, nn.ModuleDict({str(i): blocks[i] for i in kept}))
    if 0 not in stages:
        setattr(model, embedding, None)
    if degree_stages - 1 not in stages:
        for name in head:
            setattr(model, name, None)
    model.pipeline_stages = {s: (s == 0, tuple(cuts[s]), s == degree_stages - 1) for s in stages}
    # the other stages' tensors: a checkpoint of the whole model holds them, and this process leaves them be
    model.pipeline_elsewhere = frozenset(whole - set(model.state_dict()))
    return model


def process_parts(blocks: int, degree: int, schedule: str) -> list[tuple[int, bool, bool, int]]:
    """(stage rank, holds the first stage, holds the last, blocks held) of the processes whose memory bounds
    a pipeline's: the first (the most micro-batches in flight, the embedding) and the last (the output layer
    and its logits)."""
    per = stages_per_process(schedule)
    cuts = stage_blocks(blocks, degree * per)
    parts = []
    for rank in sorted({0, degree - 1}):
        stages = process_stages(rank, degree, per)
        parts.append((rank, 0 in stages, degree * per - 1 in stages, sum(len(cuts[s]) for s in stages)))
    return parts


def bubble_share(schedule: str, degree: int, n: int) -> float:
    """The share of a step a stage waits in the schedule's fill and drain, with `n` micro-batches."""
    idle = (degree - 1) / stages_per_process(schedule)
    return idle / (n + idle)


def traced_part(model: nn.Module, first: bool, last: bool, example: torch.Tensor,
                loss_fn: Callable) -> tuple[nn.Module, torch.Tensor, Callable]:
    """`model` (in place) as one process of a pipeline holds it, for the memory tracer: its blocks all kept
    (the tracer builds it at the process's depth), the embedding only if it holds the first stage, the head
    only if the last; with the input it receives (`example`'s token ids, or the previous stage's
    activations) and the loss its backward starts from (the task's on the last stage; elsewhere the
    gradient of its output, which the next stage sends back)."""
    embedding, _, head = model.pipeline_parts
    if not first:
        setattr(model, embedding, None)
        example = model.pipeline_activation(example)
    if not last:
        for name in head:
            setattr(model, name, None)
        loss_fn = _output_gradient
    model.pipeline_stages = {0: (first, None, last)}
    return model, example, loss_fn


def _output_gradient(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return outputs.sum()


def in_flight(schedule: str, degree: int, n: int, stage_rank: int = 0) -> float:
    """The micro-batches whose activations process `stage_rank` holds at once under `schedule` (in units of
    all its blocks' activations for one micro-batch): GPipe runs every forward before any backward (n);
    1F1B starts backwards once the pipeline is full (degree - stage_rank); the interleaved schedule runs
    chunks of half a process's blocks, degree - 1 - stage_rank more of them on each side of its first round
    (torch's warm-up: a round of micro-batches plus 2 x (degree - 1 - stage_rank) chunks, then one)."""
    if schedule == "GPipe":
        return float(n)
    if schedule == "1F1B":
        return float(min(n, degree - stage_rank))
    per_round = n // max(1, n // degree)
    return min(2 * n, per_round + 2 * (degree - 1 - stage_rank) + 1) / 2


def process_terms(schedule: str, degree: int, share: int, rank: int, sample_bytes: int, batch: int,
                  activations: int) -> dict[str, int]:
    """What process `rank` of a pipeline holds beyond one traced micro-batch of `batch` (whose activations are
    `activations` bytes), when its share of `share` samples runs as the schedule's micro-batches:
    pipeline_in_flight, the activations of the other micro-batches it holds at once (`in_flight`);
    pipeline_buffers, for each of its stages a receive buffer per micro-batch for its input (all but the
    first stage) and for its output's gradient (all but the last), torch's PipelineStage keeps them from
    step to step, and as many of what it sends, alive until the sends complete at the end of the step;
    `sample_bytes`: one sample's activations between stages."""
    n, size = micro_batches(share, batch, degree, schedule)
    per = stages_per_process(schedule)
    last = degree * per - 1
    ends = sum((s > 0) + (s < last) for s in process_stages(rank, degree, per))
    more = in_flight(schedule, degree, n, rank) - 1
    return {"pipeline_in_flight": int(max(0.0, more) * activations),
            "pipeline_buffers": 2 * ends * n * size * sample_bytes}


class StageView(nn.Module):
    """One stage of a process's cut model, as torch's PipelineStage wants a module per stage: its forward is
    the model's with `stage=`, so the model's own hooks (FSDP's) run around every stage."""

    def __init__(self, model: nn.Module, stage: int) -> None:
        super().__init__()
        self.model, self.stage = model, stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x, stage=self.stage)


@dataclass
class Pipeline:
    """A process's stages and the schedules that run them (one per number of micro-batches, made when first
    needed: a schedule's stages learn the shapes they exchange from its first step)."""

    model: nn.Module
    group: object  # the pipeline's process group (the mesh's "pp" dimension)
    stage_rank: int
    degree: int
    schedule: str
    device: torch.device
    stages: list[int] = field(init=False)
    _schedules: dict = field(default_factory=dict, init=False, repr=False)
    _loss: Callable | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.stages = process_stages(self.stage_rank, self.degree, stages_per_process(self.schedule))
        self.views = [StageView(self.model, s) for s in self.stages]

    @property
    def n_stages(self) -> int:
        return self.degree * stages_per_process(self.schedule)

    @property
    def is_first(self) -> bool:
        return 0 in self.stages

    @property
    def is_last(self) -> bool:
        return self.n_stages - 1 in self.stages

    def _made(self, key, n: int, loss_fn, schedule: str | None = None) -> object:
        from torch.distributed.pipelining import PipelineStage, schedules

        if key not in self._schedules:
            if len(self._schedules) > 4:  # a shape seen once (an epoch's short last window): not kept
                self._schedules.clear()
            stages = [PipelineStage(view, s, self.n_stages, self.device, group=self.group)
                      for view, s in zip(self.views, self.stages)]
            kind = getattr(schedules, schedule or SCHEDULES[self.schedule])
            self._schedules[key] = kind(stages if len(stages) > 1 else stages[0], n_microbatches=n,
                                        loss_fn=loss_fn, scale_grads=False)
        return self._schedules[key]

    def step(self, x: torch.Tensor, y: torch.Tensor, *, share_max: int, micro_batch: int, window: int,
             grad_factor: float, loss_fn: Callable) -> torch.Tensor | None:
        """Forward and backward of this process's share (x, y) of a window of `window` samples, cut into the
        schedule's equal micro-batches (sized by the largest share of any data-parallel group, `share_max`, so
        every group runs as many); each micro-batch's loss_fn(outputs, targets) is weighted by its share of the
        window (times `grad_factor`, the data-parallel mean undone). Returns the sample-weighted loss sum on
        the last stage, None on the others."""
        n, size = micro_batches(share_max, micro_batch, self.degree, self.schedule)
        padded = n * size - x.size(0)
        if padded:
            x, y = pad(x, padded), pad(y, padded, IGNORE)
        self._loss = _weighted(loss_fn, window, grad_factor, padded > 0)
        schedule = self._made(("train", n, size), n, self._call_loss)
        losses: list[torch.Tensor] = []
        args = (x,) if self.is_first else ()
        schedule.step(*args, target=y if self.is_last else None, losses=losses if self.is_last else None,
                      return_outputs=False)
        if not self.is_last:
            return None
        return (torch.stack([loss.detach().float() for loss in losses]).sum() * (window / grad_factor)
                if losses else torch.zeros((), device=self.device))

    def _call_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._loss(outputs, targets)

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """The outputs of the whole model for x (forward only, one micro-batch) on the last stage; None on
        the others, which only pass their stages' activations on."""
        # forward only, the batch whole: every stage in turn (GPipe's order; looped for two stages a process)
        schedule = self._made(("eval", tuple(x.shape)), 1, None,
                              "ScheduleGPipe" if len(self.stages) == 1 else "ScheduleLoopedBFS")
        out = schedule.eval(*((x,) if self.is_first else ()))
        return out if self.is_last else None


def pad(t: torch.Tensor, rows: int, value: int | None = None) -> torch.Tensor:
    """`t` with `rows` more rows at the end: copies of its first (targets: `value`)."""
    extra = t[:1].expand(rows, *t.shape[1:]).clone()
    if value is not None:
        extra.fill_(value)
    return torch.cat([t, extra])


def _weighted(loss_fn: Callable, window: int, grad_factor: float, padded: bool) -> Callable:
    """loss_fn's mean over a micro-batch's samples, weighted by their share of the window: padded rows (targets
    IGNORE, at the end of the last micro-batches) left out."""
    def weighted(outputs, targets):
        rows = targets.size(0)
        if padded:
            rows = int((targets.reshape(rows, -1)[:, 0] != IGNORE).sum())
            if rows == 0:  # all padding: a zero that keeps the graph (the stage still sends a gradient back)
                return (outputs * 0).sum()
            outputs, targets = outputs[:rows], targets[:rows]
        return loss_fn(outputs, targets) * (rows / window * grad_factor)
    return weighted


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float, group=None) -> torch.Tensor:
    """torch's clip_grad_norm_, the norm taken over every stage's gradients (the pipeline's `group`): each stage
    holds some of the model's parameters, and the clip must scale them all by the whole model's norm."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    if hasattr(norm, "full_tensor"):  # FSDP or TP: a DTensor norm of this stage's parameters
        norm = norm.full_tensor()
    if group is not None:
        import torch.distributed as dist

        norm = norm.float() ** 2
        dist.all_reduce(norm, group=group)
        norm = norm.sqrt()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm
