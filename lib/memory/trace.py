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
conservative by at most one copy of the gradients. This is one process's step,
and a DDP replica's (predict.py adds DDP's buffers); the sharded strategies'
per-process step is traced by sharded.py, with the same sequence. The breakdown is the one
at that peak moment: parameters, buffers, gradients, optimizer_state,
activations (saved for backward), temporaries (backward and optimizer scratch),
the batch itself, and workspace: what a kernel allocates and frees inside one
op, which the trace cannot see (it sees only inputs and outputs), added to the
live total while that op runs (`kernel_workspace`): on a CPU the convolution
path torch really takes on this machine (oneDNN's blocked reorders, or im2col's
column buffers, e.g. bf16 on AVX2-only CPUs), and the copies a pointwise op on
mixed dtypes makes (autocast's fp32 + bf16 residuals), both measured against the
allocator; on CUDA cuDNN's algorithm workspace, estimated. Which CPU path a
convolution takes depends on this CPU (workspace.py's `cpu_conv_path`). The step's output can
be anything the loss function reads (a tensor, a Hugging Face ModelOutput).
fp16's GradScaler is not traced: it keeps a few scalars.

Fake tensors live on the CPU: a CPU-only torch cannot run autograd on fake
CUDA tensors (it aborts looking for a CUDA device guard). What differs on a
CUDA target is modelled explicitly:
  * the optimizer runs the implementation the trainer runs on CUDA: Adam and
    AdamW fused (updated in place, no temporaries), SGD foreach (multi-tensor,
    as torch picks on CUDA), whose temporaries are whole lists of
    parameter-sized tensors;
  * autocast follows the CPU cast lists, which for matmul/conv/linear/SDPA
    agree with CUDA's, plus the float32 casts only CUDA's makes (autocast.py);
  * `device_overheads` (lib/memory/predict.py) adds the named terms a trace
    cannot see.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..config import Config
from .caching_allocator import replay
from .fake import fake_copy, fake_kernels, model_features
from .workspace import kernel_workspace

MiB = 2**20

# MemTracker's categories -> ours.
_CATEGORIES = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients",
               "Optstate": "optimizer_state", "Activation": "activations", "Temp": "temporaries",
               "Workspace": "workspace", "Other": "other"}
_ONE_PROCESS = (*_CATEGORIES.values(), "batch")  # a one-process trace's breakdown (kept as cached traces have it)
# Every category a breakdown may hold, in the order StepCurve lists them: a sharded trace (sharded.py)
# adds a unit's gathered parameters and full gradients, and the all-gather/reduce-scatter buffers.
CATEGORIES = ("parameters", "unsharded_parameters", "buffers", "gradients", "unsharded_gradients", "optimizer_state",
              "activations", "temporaries", "communication", "workspace", "other", "batch")


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
    # what the CUDA caching allocator (expandable segments) reserves beyond the step's allocated peak, its
    # allocations and frees replayed in order (caching_allocator.py); None where not replayed (not CUDA)
    allocator_holes: int | None = None

    def to_json(self) -> dict:
        return {**self.__dict__, "features": list(self.features)}

    @classmethod
    def from_json(cls, d: dict) -> "Trace":
        return cls(**{**d, "features": tuple(d["features"])})


def step_optimizer(config: Config, model: torch.nn.Module, device_type: str) -> torch.optim.Optimizer:
    """The trainer's optimizer, with the implementation it runs on `device_type` made explicit.

    torch defaults to foreach (multi-tensor) kernels on CUDA only, and it cannot
    tell for fake tensors, so the trace would otherwise always take the CPU path.
    Adam and AdamW run fused on CUDA (lib.step.fused_on): the fused kernel updates
    every list in place, with none of foreach's list-sized temporaries.
    """
    from ..step import fused_on, make_optimizer

    optimizer = make_optimizer(config, model)
    fused = fused_on(config, device_type)
    for group in optimizer.param_groups:
        group["foreach"] = device_type == "cuda" and not fused
        group["fused"] = fused
    return optimizer


def training_steps(model, optimizer, loss_fn, x, y, *, autocast, grad_clip: float, foreach: bool,
                   before_each: Callable[[], None] | None = None, forward_loss: Callable | None = None) -> None:
    """The traced (and, in bench_memory, measured) sequence: two steps, the second accumulating. `forward_loss`
    (x, y -> loss: lib/step.py's, compiled) runs in place of `loss_fn(model(x), y)` where given."""
    from .autocast import step_casts

    with step_casts(autocast):  # a traced step's casts reach the recompute in backward (TracedAutocast)
        for _ in range(2):
            if before_each:
                before_each()
            with autocast:
                loss = forward_loss(x, y) if forward_loss else loss_fn(model(x), y)
            loss.backward()
            del loss
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip, foreach=foreach)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def evaluation_pass(model, task, x, y) -> None:
    """The traced evaluation: the forward, the loss and, for images, the evaluator's accuracy
    (lib/trainer/evaluation.py). The output is whatever the loss reads: a tensor, a ModelOutput, a tuple."""
    out = model(x)
    task.loss(out, y)
    if task.info.kind == "image":
        out.argmax(dim=-1)


class _NoHook:
    """The handle of a gradient hook never installed (a frozen parameter's): removing it does nothing."""

    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


def _peak_tracker(device_type: str):
    """A MemTracker that keeps only the whole-step peak, counting kernel workspaces as they happen.

    MemTracker's per-module peak statistics (walked after every op) cost half
    of the trace time and are not used here; a torch that renames the hook
    just runs the slower original.
    """
    from torch.distributed._tools.mem_tracker import MemTracker, _UpdateType

    class PeakTracker(MemTracker):
        def __init__(self) -> None:
            super().__init__()
            # every storage's allocation and free, in order, as (key, bytes; 0 frees): the allocator's replay
            self.events: list[tuple[int, int]] = []

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            if u_type in (_UpdateType.ADD, _UpdateType.SIZE):  # a resize reallocates
                self.events.append((id(winfo), winfo.mem_consumed))
            elif u_type == _UpdateType.DEL:
                self.events.append((id(winfo), 0))

        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            # torch hooks every parameter's gradient and raises on a frozen one (CONFIG_FREEZE), which has none
            for p in module.parameters():
                if not p.requires_grad:
                    self._param_to_grad_hook_handles.setdefault(p, (_NO_HOOK, _NO_HOOK))
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            extra = kernel_workspace(func, args, out, device_type)
            if extra:  # allocated after the op's outputs, freed when it returns
                self.events += [(-1, extra), (-1, 0)]
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

    from .autocast import TracedAutocast

    start = time.perf_counter()
    x1, y1 = task.example_batch(1)  # shapes and dtypes; fake tensors need no values
    with torch.device("meta"):  # the built-in models initialise nothing here
        model = task.build(gradient_checkpointing and train)
    features = model_features(model)
    parameters = sum(p.numel() for p in model.parameters())
    # The trace runs on the CPU (see the module docstring): CPU autocast, with CUDA's float32 casts for a GPU
    autocast = TracedAutocast(precision, device_type)
    with FakeTensorMode(), fake_kernels():
        model = fake_copy(model)
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
                evaluation_pass(model, task, *batch_tensors())
        peak = tracker.get_tracker_snapshot("peak")
    snap = next(iter(peak.values()), {})
    breakdown = {name: 0 for name in _ONE_PROCESS}
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
    holes = replay(tracker.events).holes if device_type == "cuda" else None
    return Trace(batch=batch, peak_bytes=total, breakdown=breakdown, parameters=parameters,
                 features=features, eval_samples=len(task.eval), seconds=time.perf_counter() - start,
                 allocator_holes=holes)
