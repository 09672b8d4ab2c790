"""Context parallelism (CONFIG_CP): each sample's sequence split over a group of processes, for contexts
whose activations no other split shrinks.

torch.distributed.tensor.experimental.context_parallel shards a step's sequence-long tensors in place (the
token ids, the targets, the rotary positions) into 2 x CP chunks handed out head and tail: process r of the
group holds chunks r and 2CP - 1 - r, so that each does the same share of causal attention. Inside it,
scaled_dot_product_attention becomes a ring: the forward all-gathers the group's keys and values, the backward
gathers them again and passes their gradients round the group, in float32. In torch 2.13 it intercepts only
the CUDA attention kernels (flash, memory-efficient, cuDNN): on a CPU each chunk would attend to itself only,
so kfit plans it for GPU profiles and refuses to train it elsewhere (`handles`).

What the planner takes from here: a process computes the whole model at 1/CP of the context (the family's
ContextParallel.local config, which the memory tracer traces); its attention spans the whole context, but
balanced, so its FLOPs are 1/CP of the whole's as well; and beyond that trace it holds, while one block's
attention runs, the gathered keys and values and the float32 gradient chunks (`gather_terms`), and it moves
`traffic_bytes` per sample over the group's links, none of it overlapped (the all-gather is waited on where
the attention starts).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Callable, ContextManager, Iterator

import torch

MIN_TOKENS = 2048  # AUTO's floor: a process's share of the context below which it plans no larger degree
GRADIENT_BYTES = 4  # the ring's key and value gradients travel and accumulate in float32 (convert_to_f32)


def handles(device_type: str) -> bool:
    """Whether torch's context_parallel splits attention on this kind of device: CUDA's kernels always;
    another's where a handler for its attention op is registered beside theirs (torch 2.13 has none for a
    CPU's; kfit's tests add one, tests/cpu_ring.py, to run the rest of this path under gloo)."""
    if device_type == "cuda":
        return True
    if device_type != "cpu":
        return False
    try:
        from torch.distributed.tensor.experimental._context_parallel._attention import custom_ops
    except ImportError:  # a torch without it: nothing to split with
        return False
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in custom_ops


def context_problem(tokens: int, degree: int) -> str | None:
    """Why `degree` processes cannot split a context of `tokens`, or None: the head-tail balance cuts it into
    2 x degree equal chunks."""
    if degree > 1 and tokens % (2 * degree):
        return f"its {tokens} tokens of context do not split into 2 x {degree} equal chunks"
    return None


def context_candidates(tokens: int, most: int) -> list[int]:
    """The degrees AUTO plans: 1, and each power of two up to `most` that splits the context and leaves a
    process MIN_TOKENS at least (fewer, and the per-block gathers cost more than the attention they share)."""
    degrees, degree = [1], 2
    while degree <= most and tokens // degree >= MIN_TOKENS:
        if context_problem(tokens, degree) is None:
            degrees.append(degree)
        degree *= 2
    return degrees


def gather_terms(degree: int, tokens: int, kv_elements: int, element_bytes: int) -> Callable[[int, int], dict]:
    """(batch, activations) -> what a process holds beyond its traced share while one block's attention runs
    (lib/memory/predict.py adds it to the peak): the keys and values of the whole context, gathered
    (`kv_elements` per token: key and value heads x head width, in the activations' `element_bytes`), and the
    float32 gradients of its own chunk's keys and values, as accumulated, sent and received."""
    local = tokens // degree

    def terms(batch: int, activations: int) -> dict[str, int]:
        gathered = batch * tokens * kv_elements * element_bytes
        return {"context_gather": gathered + 3 * batch * local * kv_elements * GRADIENT_BYTES}

    return terms


def traffic_bytes(tokens: int, blocks: int, kv_elements: int, element_bytes: int, checkpointed: bool) -> int:
    """The bytes per sample of one micro-batch that a process's ring collectives carry (each collective's full
    size; a ring moves (CP - 1) / CP of it through a link): each block's keys and values gathered in forward,
    again in backward (and in a recomputed forward), and their float32 gradients passed round in backward."""
    gathers = 2 + (1 if checkpointed else 0)
    return blocks * tokens * kv_elements * (gathers * element_bytes + GRADIENT_BYTES)


@contextmanager
def sharded(mesh, tensors: list[torch.Tensor], dims: list[int]) -> Iterator[None]:
    """Within it, `tensors` (each along its dimension in `dims`; made for this micro-batch, so none is restored
    after) hold this process's chunks of the sequence, and scaled_dot_product_attention runs as the group's
    ring (`mesh`: the context-parallel dimension). The CUDA path only: see the module's docstring."""
    from torch.distributed.tensor.experimental import context_parallel

    with context_parallel(mesh, buffers=tensors, buffer_seq_dims=dims, no_restore_buffers=set(tensors)):
        yield


class ContextSplit:
    """A process's context-parallel group (the mesh's "cp" dimension), and how a batch enters it: the model's
    whole-context positions (its `context_parallel_positions`) and the batch's tokens and targets sharded
    with them, the attention the group's ring until the block ends."""

    def __init__(self, mesh) -> None:
        self.mesh = mesh

    @contextmanager
    def __call__(self, model, x: torch.Tensor, y: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yields this process's chunks of (x, y) (B, T / CP): copies, the loader's own tensors left whole."""
        x, y = x.clone(), y.clone()  # sharded in place: a loader's tensor may share memory it cannot resize
        positions = model.context_parallel_positions(x.size(1), x.device)
        try:
            with sharded(self.mesh, [x, y, *positions], [1, 1, 0, 0]):
                yield x, y
        finally:
            model.positions = None


def split_for(model) -> Callable[..., ContextManager]:
    """The model's ContextSplit (set by the trainer under CONFIG_CP), or one that yields the batch as it is."""
    split = getattr(model, "context_split", None)
    return split if split is not None else (lambda model, x, y: nullcontext((x, y)))
