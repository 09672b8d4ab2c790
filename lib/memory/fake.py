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
