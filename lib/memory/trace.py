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
    # the peak of each stretch of the step (training_steps' phases: each forward, backward and optimizer
    # step), as {"peak_bytes", "breakdown"}: depth.py scales each by the depth; () where not recorded
    segments: tuple[dict, ...] = ()
    # which of `segments` ends with the first forward (what one micro-batch's forward leaves saved for its
    # backward: a pipeline stage holds that for each micro-batch in flight); None where not recorded
    forward_segment: int | None = None
    # the autograd graph's nodes after one forward (each holds C++ objects outside the tensor allocator: the
    # CPU's host_heap term, predict.py); 0 where not counted
    autograd_nodes: int = 0

    def to_json(self) -> dict:
        return {**self.__dict__, "features": list(self.features), "segments": list(self.segments)}

    @classmethod
    def from_json(cls, d: dict) -> "Trace":
        return cls(**{**d, "features": tuple(d["features"]), "segments": tuple(d.get("segments", ()))})


def autograd_nodes(loss: torch.Tensor | None) -> int:
    """The nodes of the autograd graph behind `loss` (0 without one)."""
    seen, stack = set(), [getattr(loss, "grad_fn", None)]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return len(seen)


class SegmentPeaks:
    """The peak of each stretch of a traced step: `end()` closes a stretch, keeping the tracker's peak since
    the last one, and starts the next from the bytes live now. The step's peak is the largest of them.

    Why: a step's peak is the larger of a few moments (the loss and the backward's start, the optimizer
    step), each affine in a transformer's depth, with different slopes; their maximum is not affine, but
    each stretch's peak is, so depth.py scales them one by one."""

    def __init__(self, tracker, model: torch.nn.Module | None = None) -> None:
        self.tracker = tracker
        self.peaks: list[tuple[int, dict]] = []  # (total, snapshot) per stretch
        # Within a forward or backward the peak moment moves too (Llama 60M: the embedding's backward at 2-4
        # blocks, the start of backward from 5), so each of the model's own children (a transformer's
        # embedding, its norm, its head) starts a stretch as it runs forward and as its output's gradient
        # arrives in backward: the same stretches at every depth, each with one slope.
        self.handles = []
        for child in (model.children() if model is not None else ()):
            self.handles.append(child.register_forward_pre_hook(lambda *_: self.end()))
            self.handles.append(child.register_forward_hook(self._on_output))

    def _on_output(self, module, args, out) -> None:
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: self.end())

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()

    forward_index: int | None = None  # the stretch that ended with the first forward (Trace.forward_segment)

    autograd_nodes = 0  # the first forward's graph (Trace.autograd_nodes)

    def forward_end(self, loss: torch.Tensor | None = None) -> None:
        """end(), marking the stretch it closes as the first forward's end (once), and counting the autograd
        graph that forward built from `loss`."""
        self.end()
        if self.forward_index is None and self.peaks:
            self.forward_index = len(self.peaks) - 1
            self.autograd_nodes = autograd_nodes(loss)

    def end(self) -> None:
        t = self.tracker
        snap = next(iter(t._peak_mem_snap.values()), None)
        if snap is not None:
            self.peaks.append((next(iter(t._peak_mem.values())), dict(snap)))
        t._peak_mem, t._peak_mem_snap = {}, {}
        t._update_peak_stats(None)  # the next stretch starts from what is live now

    def highest(self) -> dict:
        """The step's peak snapshot (the largest stretch's), {} when nothing was tracked."""
        return max(self.peaks, key=lambda p: p[0])[1] if self.peaks else {}


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
                   before_each: Callable[[], None] | None = None, forward_loss: Callable | None = None,
                   segment_end: Callable[[], None] | None = None,
                   forward_end: Callable[[torch.Tensor], None] | None = None) -> None:
    """The traced (and, in bench_memory, measured) sequence: two steps, the second accumulating. `forward_loss`
    (x, y -> loss: lib/step.py's, compiled) runs in place of `loss_fn(model(x), y)` where given; `segment_end`
    is called after each forward, backward and optimizer step (SegmentPeaks.end). The loss and its backward
    run where lib.parallel.loss_context says, as in the trainer."""
    from ..parallel import loss_context
    from .autocast import step_casts

    end = segment_end or (lambda: None)
    # SegmentPeaks.forward_end(loss): marks where the saved activations stand, and counts the graph
    after_forward = forward_end or (lambda loss: end())
    with step_casts(autocast):  # a traced step's casts reach the recompute in backward (TracedAutocast)
        for _ in range(2):
            if before_each:
                before_each()
            with loss_context(model):
                with autocast:
                    loss = forward_loss(x, y) if forward_loss else loss_fn(model(x), y)
                after_forward(loss)
                loss.backward()
                del loss
            end()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip, foreach=foreach)
            optimizer.step()
            end()
        optimizer.zero_grad(set_to_none=True)
        end()


def evaluation_pass(model, task, x, y, loss_fn: Callable | None = None) -> None:
    """The traced evaluation: the forward, the loss (`loss_fn`, the task's by default) and, for images, the
    evaluator's accuracy (lib/trainer/evaluation.py). The output is whatever the loss reads: a tensor, a
    ModelOutput, a tuple."""
    from ..parallel import loss_context

    out = model(x)
    with loss_context(model):
        (loss_fn or task.loss)(out, y)
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
               gradient_checkpointing: bool, train: bool = True, part: tuple[bool, bool] | None = None) -> Trace:
    """Trace one training step (or, with train=False, one evaluation forward) at `batch`; `part`: (first,
    last) of one pipeline process's blocks (lib/pipeline.py traced_part), all of the model's blocks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .autocast import TracedAutocast

    start = time.perf_counter()
    x1, y1 = task.example_batch(1)  # shapes and dtypes; fake tensors need no values
    with torch.device("meta"):  # the built-in models initialise nothing here
        model = task.build(gradient_checkpointing and train)
    features = model_features(model)
    loss_fn = task.loss
    if part is not None:
        from ..pipeline import traced_part

        model, x1, loss_fn = traced_part(model, *part, x1, loss_fn)
    parameters = sum(p.numel() for p in model.parameters())
    # The trace runs on the CPU (see the module docstring): CPU autocast, with CUDA's float32 casts for a GPU
    autocast = TracedAutocast(precision, device_type)
    with FakeTensorMode(), fake_kernels():
        model = fake_copy(model)
        tracker = _peak_tracker(device_type)

        def batch_tensors():  # made inside the tracker: the batch is on the device during the step
            return (torch.empty((batch, *x1.shape[1:]), dtype=x1.dtype),
                    torch.zeros((batch, *y1.shape[1:]), dtype=y1.dtype))

        segments = SegmentPeaks(tracker, model)
        if train:
            optimizer = step_optimizer(config, model, device_type)
            tracker.track_external(model, optimizer)
            with tracker:
                x, y = batch_tensors()
                training_steps(model, optimizer, loss_fn, x, y, autocast=autocast, grad_clip=config.grad_clip,
                               foreach=device_type == "cuda", before_each=tracker.reset_mod_stats,
                               segment_end=segments.end, forward_end=segments.forward_end)
        else:
            model.eval()
            tracker.track_external(model)
            with tracker, torch.no_grad(), autocast:
                evaluation_pass(model, task, *batch_tensors(), loss_fn=loss_fn)
                segments.end()
        segments.close()
    batch_bytes = batch * (x1[0].numel() * x1.element_size() + y1[0].numel() * y1.element_size())

    def breakdown_of(snap: dict) -> tuple[int, dict[str, int]]:
        breakdown = {name: 0 for name in _ONE_PROCESS}
        total = 0
        for k, v in snap.items():
            name = getattr(k, "value", k)
            if name in _CATEGORIES:
                breakdown[_CATEGORIES[name]] = int(v)
            elif name == "Total":
                total = int(v)
        # The batch was counted as an activation (made outside any module): name it.
        moved = min(batch_bytes, breakdown["activations"])
        breakdown["activations"] -= moved
        breakdown["batch"] = moved
        return total, breakdown

    total, breakdown = breakdown_of(segments.highest())
    holes = replay(tracker.events).holes if device_type == "cuda" else None
    return Trace(batch=batch, peak_bytes=total, breakdown=breakdown, parameters=parameters,
                 features=features, eval_samples=len(task.eval), seconds=time.perf_counter() - start,
                 allocator_holes=holes, segments=tuple(
                     dict(zip(("peak_bytes", "breakdown"), breakdown_of(snap))) for _, snap in segments.peaks),
                 forward_segment=segments.forward_index, autograd_nodes=segments.autograd_nodes)
