"""The fake-tensor trace: the peak bytes of one training step, before running one.

A step of the configured model (forward, loss, backward, gradient clipping,
optimizer step) is traced under FakeTensorMode, which allocates no memory and
does no arithmetic, with torch's MemTracker counting every storage that comes
and goes. What is traced, in order:

    forward, backward, optimizer step      (creates the optimizer state)
    forward, backward, optimizer step      (state exists; gradients are still there, as
                                            for the 2nd micro-batch of an accumulation window)
    zero_grad(set_to_none=True)

so the peak covers the worst moment of any plan: with accumulation 1 it is
conservative by at most one copy of the gradients. The breakdown is the one
at that peak moment: parameters, buffers, gradients, optimizer_state,
activations (saved for backward), temporaries (backward and optimizer scratch),
the batch itself, and workspace: the scratch a convolution kernel allocates
inside the op (`conv_workspace`: oneDNN reorders on a CPU, measured; cuDNN's
algorithm workspace on CUDA, estimated), added to the live total while that op
runs. fp16's GradScaler is not traced: it keeps a few scalars.

Fake tensors live on the CPU: a CPU-only torch cannot run autograd on fake
CUDA tensors (it aborts looking for a CUDA device guard). What differs on a
CUDA target is modelled explicitly:
  * the optimizer runs its foreach (multi-tensor) implementation, as torch
    picks on CUDA; its temporaries are whole lists of parameter-sized tensors;
  * autocast follows the CPU cast lists, which for matmul/conv/linear/SDPA and
    the float32 ops these models use agree with CUDA's;
  * `device_overheads` (lib/memory/predict.py) adds the named terms a trace
    cannot see.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch

from ..config import Config

MiB = 2**20

# MemTracker's categories -> ours.
_CATEGORIES = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients",
               "Optstate": "optimizer_state", "Activation": "activations", "Temp": "temporaries",
               "Workspace": "workspace", "Other": "other"}
CATEGORIES = (*_CATEGORIES.values(), "batch")


# --------------------------------------------------------------------------
# The trace


@dataclass(frozen=True)
class Trace:
    """What one traced step at one batch size saw."""

    batch: int
    peak_bytes: int
    breakdown: dict[str, int]  # category -> bytes at the peak
    parameters: int  # parameter count
    features: tuple[str, ...]  # "conv", "attention": which workspaces the device adds
    eval_samples: int  # size of the evaluation split (bounds the evaluation batch)
    seconds: float  # how long tracing took

    def to_json(self) -> dict:
        return {**self.__dict__, "features": list(self.features)}

    @classmethod
    def from_json(cls, d: dict) -> "Trace":
        return cls(**{**d, "features": tuple(d["features"])})


def _fake_copy(model: torch.nn.Module) -> torch.nn.Module:
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


def _features(model: torch.nn.Module) -> tuple[str, ...]:
    """Which per-model device terms apply: "attention" (by module type or name, e.g. GPT-2's attn)."""
    names = {type(m).__name__.lower() for m in model.modules()}
    return ("attention",) if any("attention" in n or "attn" in n for n in names) else ()


def step_optimizer(config: Config, model: torch.nn.Module, device_type: str) -> torch.optim.Optimizer:
    """The trainer's optimizer, with the implementation torch picks on `device_type` made explicit.

    torch defaults to foreach (multi-tensor) kernels on CUDA only, and it cannot
    tell for fake tensors, so the trace would otherwise always take the CPU path.
    """
    from ..step import make_optimizer

    optimizer = make_optimizer(config, model)
    for group in optimizer.param_groups:
        group["foreach"] = device_type == "cuda"
    return optimizer


def training_steps(model, optimizer, loss_fn, x, y, *, autocast, grad_clip: float, foreach: bool,
                   before_each: Callable[[], None] | None = None) -> None:
    """The traced (and, in bench_memory, measured) sequence: two steps, the second accumulating."""
    for _ in range(2):
        if before_each:
            before_each()
        with autocast:
            loss = loss_fn(model(x), y)
        loss.backward()
        del loss
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip, foreach=foreach)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def conv_workspace(func, args, device_type: str) -> int:
    """Scratch memory a convolution kernel allocates and frees inside one op; the trace sees only outputs.

    CPU (oneDNN, measured by bench_memory): the backward reorders the weight
    into a blocked layout (one weight-sized copy), and a grad_output whose
    channels are not a multiple of 16 into a layout padded to 16 channels.
    CUDA (cuDNN, an estimate): the algorithm cudnn.benchmark picks is allowed a
    workspace about the size of its largest operand.
    """
    name = str(func)
    if "convolution" not in name:
        return 0
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if device_type == "cuda":
        return max((t.numel() * t.element_size() for t in tensors), default=0)
    if "backward" not in name or len(tensors) < 3:
        return 0
    grad_out, weight = tensors[0], tensors[2]
    extra = weight.numel() * weight.element_size()
    channels = grad_out.shape[1]
    if channels % 16:
        extra += grad_out.numel() // channels * (-(-channels // 16) * 16) * grad_out.element_size()
    return extra


def _peak_tracker(device_type: str):
    """A MemTracker that keeps only the whole-step peak, counting kernel workspaces as they happen.

    MemTracker's per-module peak statistics (walked after every op) cost half
    of the trace time and are not used here; a torch that renames the hook
    just runs the slower original.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    class PeakTracker(MemTracker):
        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            extra = conv_workspace(func, args, device_type)
            for dev, snap in self._curr_mem_snap.items():  # inputs and outputs are live while it runs
                if extra and self._peak_mem.get(dev, 0) < snap["Total"] + extra:
                    self._peak_mem[dev] = snap["Total"] + extra
                    self._peak_mem_snap[dev] = {**snap, "Workspace": extra, "Total": snap["Total"] + extra}
            return out

    return PeakTracker()


def trace_step(task, config: Config, *, batch: int, precision: str, device_type: str,
               gradient_checkpointing: bool, train: bool = True) -> Trace:
    """Trace one training step (or, with train=False, one evaluation forward) at `batch`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..step import autocast_for

    start = time.perf_counter()
    x1, y1 = task.example_batch(1)  # shapes and dtypes; fake tensors need no values
    with torch.device("meta"):  # the built-in models initialise nothing here
        model = task.build(gradient_checkpointing and train)
    features = _features(model)
    parameters = sum(p.numel() for p in model.parameters())
    # The trace runs on the CPU (see the module docstring), so CPU autocast.
    autocast = autocast_for(SimpleNamespace(precision=precision, device_type="cpu"))
    with FakeTensorMode():
        model = _fake_copy(model)
        tracker = _peak_tracker(device_type)

        def batch_tensors():  # made inside the tracker: the batch is on the device during the step
            return (torch.empty((batch, *x1.shape[1:]), dtype=x1.dtype),
                    torch.zeros((batch, *y1.shape[1:]), dtype=y1.dtype))

        if train:
            optimizer = step_optimizer(config, model, device_type)
            tracker.track_external(model, optimizer)
            with tracker:
                x, y = batch_tensors()
                training_steps(model, optimizer, task.loss, x, y, autocast=autocast, grad_clip=config.grad_clip,
                               foreach=device_type == "cuda", before_each=tracker.reset_mod_stats)
        else:
            model.eval()
            tracker.track_external(model)
            with tracker, torch.no_grad(), autocast:
                x, y = batch_tensors()
                out = model(x)
                task.loss(out, y)
                if out.dim() == 2:
                    out.argmax(dim=-1)
        peak = tracker.get_tracker_snapshot("peak")
    snap = next(iter(peak.values()), {})
    breakdown = {name: 0 for name in CATEGORIES}
    total = 0
    for k, v in snap.items():
        name = getattr(k, "value", k)
        if name in _CATEGORIES:
            breakdown[_CATEGORIES[name]] = int(v)
        elif name == "Total":
            total = int(v)
    # The batch was counted as an activation (made outside any module): name it.
    batch_bytes = batch * (x1[0].numel() * x1.element_size() + y1[0].numel() * y1.element_size())
    moved = min(batch_bytes, breakdown["activations"])
    breakdown["activations"] -= moved
    breakdown["batch"] = moved
    return Trace(batch=batch, peak_bytes=total, breakdown=breakdown, parameters=parameters,
                 features=features, eval_samples=len(task.eval), seconds=time.perf_counter() - start)
