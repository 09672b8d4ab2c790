"""Torch's context-parallel ring attention on a CPU, for the tests.

torch.distributed.tensor.experimental.context_parallel turns scaled_dot_product_attention into a ring by
handling the CUDA attention kernels' ops on DTensors (flash, memory-efficient, cuDNN); a CPU's attention runs
another op, which it does not handle, so kfit refuses CONFIG_CP on a CPU. `install()` adds handlers for the
CPU's flash attention that run the same ring (torch's _templated_ring_attention and its backward, with their
head-tail balance and all-gathers), the CPU kernel inside it in place of a CUDA one: what the trainer's
context-parallel path does on a GPU, everything but the kernel, can then run here under gloo.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
SEQUENCE = 2  # (batch, heads, tokens, width): the dimension the ring splits


def _forward(group, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

    assert attn_mask is None, "the ring takes causal attention, not a mask"
    return _templated_ring_attention(group, SEQUENCE, aten._scaled_dot_product_flash_attention_for_cpu,
                                     query=query, key=key, value=value, is_causal=is_causal, dropout_p=dropout_p,
                                     scale=scale)


def _backward(group, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
              scale=None):
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention_backward)

    return _templated_ring_attention_backward(group, SEQUENCE, BACKWARD, grad_out=grad_out, grad_out_name="grad_out",
                                              query=query, key=key, value=value, out=out, logsumexp=logsumexp,
                                              is_causal=is_causal, dropout_p=dropout_p, scale=scale)


def _handler(op_call, args, kwargs):
    """A DTensor handler for the CPU op: the ring over the inputs' mesh (the "cp" dimension), on their local
    chunks, its outputs sharded along the sequence as the inputs are."""
    from torch.distributed.tensor import DTensor, Shard

    mesh = next(a for a in args if isinstance(a, DTensor)).device_mesh
    local = [a.to_local() if isinstance(a, DTensor) else a for a in args]
    kw = {k: v.to_local() if isinstance(v, DTensor) else v for k, v in kwargs.items()}
    ring = _forward if op_call is FORWARD else _backward
    results = ring(mesh.get_group(), *local, **kw)
    return tuple(DTensor.from_local(t, mesh, [Shard(SEQUENCE)], run_check=False) if isinstance(t, torch.Tensor)
                 else t for t in results)


def install() -> None:
    """Handle the CPU's flash attention within context_parallel, as the CUDA kernels' ops are."""
    from torch.distributed.tensor.experimental._context_parallel import _attention

    _attention.custom_ops[FORWARD] = _handler
    _attention.custom_ops[BACKWARD] = _handler
