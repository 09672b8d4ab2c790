"""Fake models: what every fake-tensor trace of a kfit step starts from.

The one-process trace (trace.py), the sharded trace (sharded.py) and the step-time
operation counter (lib/steptime/count.py) all run a step of the configured model under
FakeTensorMode, which allocates no memory and does no arithmetic: `fake_copy` swaps the
model's parameters and buffers for fake tensors of the same shapes, and `model_features`
names the per-model device terms a trace records (predict.py's `device_overheads`).
"""

from __future__ import annotations

import torch


def fake_copy(model: torch.nn.Module) -> torch.nn.Module:
    """Swap every parameter and buffer for a fake CPU tensor of the same shape (ties kept).

    Must run inside FakeTensorMode. nn.Module._apply cannot do this: it tries
    torch.utils.swap_tensors, which refuses fake tensors (they hold weakrefs).
    """
    made: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(t) not in made:
            new = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu")
            made[id(t)] = torch.nn.Parameter(new, t.requires_grad) if parameter else new
        return made[id(t)]

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = fake(p, True)
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fake(b, False)
    return model


def model_features(model: torch.nn.Module) -> tuple[str, ...]:
    """Which per-model device terms apply: "attention" (by module type or name, e.g. GPT-2's attn), "conv"
    (a convolution module: cuDNN's benchmark workspaces)."""
    names = {type(m).__name__.lower() for m in model.modules()}
    attention = any("attention" in n or "attn" in n for n in names)
    convs = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
             torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)
    conv = any(isinstance(m, convs) for m in model.modules())
    return ("attention",) * attention + ("conv",) * conv


# --------------------------------------------------------------------------
# Fake kernels kfit supplies where torch's own is missing or too strict for what real models run


def _grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None,
                bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten._grouped_mm's output, for every input dtype: torch's meta kernel repeats the CUDA kernel's
    bf16-only check, while the CPU kernel (and CUDA's fallback) multiply float32 too, so a mixture of experts
    in fp32 (transformers' grouped_mm experts) trains but could not be traced. Shapes as the kernel's:
    2D x 3D (tokens grouped by offs, one matrix per expert) -> (tokens, n); 3D x 2D -> (m, n);
    2D x 2D (the weight gradient, summed per group) -> (groups, m, n); 3D x 3D -> a batched matmul."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        shape = (offs.shape[0], mat_a.shape[0], mat_b.shape[1])
    elif mat_a.dim() == 2:
        shape = (mat_a.shape[0], mat_b.shape[-1])
    elif mat_b.dim() == 2:
        shape = (mat_a.shape[1], mat_b.shape[1])
    else:
        shape = (mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1])
    return torch.empty(shape, dtype=out_dtype or mat_a.dtype, device=mat_a.device)


# op -> (does torch's fake kernel refuse these arguments, kfit's kernel). Checked by tests/test_fake_kernels.py
# against the real kernel's output on the CPU.
FAKE_KERNELS = {torch.ops.aten._grouped_mm.default: (
    lambda a, b, *rest, **kw: a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16, _grouped_mm)}


def fake_kernels():
    """A dispatch mode, entered inside FakeTensorMode (under any tracker), that runs FAKE_KERNELS' kernel
    for the ops and arguments torch's fake kernel refuses; every other op passes through untouched."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class FakeKernels(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            entry = FAKE_KERNELS.get(func)
            if entry is not None and entry[0](*args, **kwargs):
                return entry[1](*args, **kwargs)
            return func(*args, **kwargs)

    return FakeKernels()
