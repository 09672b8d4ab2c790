"""A model kfit's fake-tensor tracer cannot run: its op `kfit_test::gate` has a CPU kernel and a backward
but no fake kernel, as a third-party C++/CUDA extension often has none (tests/test_measured_memory.py)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


@torch.library.custom_op("kfit_test::gate", mutates_args=())
def gate(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    s = torch.sigmoid(x)
    return grad * (s + x * s * (1 - s))


gate.register_autograd(_backward, setup_context=_setup)


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(256, 256) for _ in range(3))
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        for block in self.blocks:
            x = gate(block(x))
        return self.head(x)


def make_batch(n, generator):
    x = torch.randn((n, 256), generator=generator)
    return x, torch.randint(0, 10, (n,), generator=generator)


def build():
    return Gated(), make_batch, lambda out, y: F.cross_entropy(out, y)
