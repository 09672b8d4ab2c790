"""The device calls validation makes, and the measured peak of one training step.

CudaDevice puts the few torch.cuda calls behind one small interface (peaks,
free memory, a squeezing allocation, the cuBLAS workspace, the device's name),
so the tests hand it a fake torch.cuda and the same code runs as on a GPU.

measure_step runs lib.memory.training_steps, the step the predictor traces
(two steps, the second accumulating, then zero_grad), for real:
  cpu   torch.profiler with profile_memory=True, then export_memory_timeline:
        the largest sum over categories of live bytes;
  cuda  torch.cuda.max_memory_reserved (what other processes cannot use) and
        max_memory_allocated, after reset_peak_memory_stats.
fp16 steps through a GradScaler; compile=True measures a warm compiled step.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

from ..memory import step_optimizer, training_steps
from ..memory.measured import quiet_stderr
from ..step import autocast_for, forward_loss

MiB = 2**20


class CudaDevice:
    """One CUDA device as validation uses it; `cuda` is torch.cuda or a fake with the same calls."""

    def __init__(self, cuda: Any = None, index: int = 0, alloc: Callable[[int], Any] | None = None,
                 device: str | None = None, clear_blas: Callable[[], None] | None = None) -> None:
        self.cuda = cuda if cuda is not None else torch.cuda
        self.index = index
        self.device = device or f"cuda:{index}"  # tests with a fake torch.cuda run the step on "cpu"
        self._alloc = alloc or (lambda n: torch.empty(n, dtype=torch.uint8, device=self.device))
        # torch has no public call for it; None where this build lacks it
        self._clear_blas = clear_blas or getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        self._held: list = []
        self.held_bytes = 0

    def synchronize(self) -> None:
        self.cuda.synchronize(self.index)

    def reset_peaks(self) -> None:
        """Start a measurement: give cached blocks back, then reset the peak counters."""
        self.synchronize()
        gc.collect()
        self.cuda.empty_cache()
        self.cuda.reset_peak_memory_stats(self.index)

    def peaks(self) -> tuple[int, int]:
        """(max reserved, max allocated) since reset_peaks, the held allocation included."""
        self.synchronize()
        return int(self.cuda.max_memory_reserved(self.index)), int(self.cuda.max_memory_allocated(self.index))

    def allocated(self) -> int:
        return int(self.cuda.memory_allocated(self.index))

    def free_and_total(self) -> tuple[int, int]:
        free, total = self.cuda.mem_get_info(self.index)
        return int(free), int(total)

    def hold(self, leave: int, attempts: int = 8) -> int:
        """Allocate all free memory but `leave` bytes, as another process would hold it; returns the
        bytes held (0 when less than `leave` is free). A refused allocation is retried 256 MiB smaller."""
        free, _ = self.free_and_total()
        size = free - leave
        for _ in range(attempts):
            if size <= 0:
                return self.held_bytes
            try:
                self._held.append(self._alloc(size))
            except torch.OutOfMemoryError:
                size -= 256 * MiB
                continue
            self.held_bytes += size
            return self.held_bytes
        return self.held_bytes

    def release(self) -> None:
        """Drop the held allocation and the cached blocks."""
        self._held.clear()
        self.held_bytes = 0
        gc.collect()
        self.cuda.empty_cache()

    def name(self) -> str:
        """The device's name for validation's report, from the torch.cuda this device was handed (a test's fake
        answers it): the one torch.cuda device property read outside lib/hardware/ (docs/architecture.md)."""
        return str(self.cuda.get_device_name(self.index))

    def blas_workspace(self) -> int | None:
        """Bytes cuBLAS/cuBLASLt take from the caching allocator for their workspace at the first
        fp32 and bf16 matmul, measured from cleared workspaces; None where torch cannot clear them."""
        if self._clear_blas is None:
            return None
        self.synchronize()
        self._clear_blas()
        before = self.allocated()
        a = torch.ones((64, 64), device=self.device)
        outputs = [a @ a, a.bfloat16() @ a.bfloat16()]
        self.synchronize()
        kept = sum(t.numel() * t.element_size() for t in (a, *outputs))
        return max(0, self.allocated() - before - kept)


class ScaledOptimizer:
    """An optimizer as training_steps drives it, stepping through a GradScaler (fp16)."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        self.optimizer, self.scaler = optimizer, scaler

    def step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


def build_step(task, config, *, batch: int, precision: str, device: str, device_type: str, compile: bool = False):
    """The pieces of the measured step on `device`, planned as for `device_type`: (run, kept alive)."""
    model = task.build(config.gradient_checkpointing).train().to(device)
    optimizer = step_optimizer(config, model, device_type)
    x, y = (t.to(device) for t in task.example_batch(batch))
    loss = task.loss
    if precision == "fp16":
        scaler = torch.amp.GradScaler(device_type)
        optimizer, loss = ScaledOptimizer(optimizer, scaler), (lambda out, target: scaler.scale(task.loss(out, target)))
    compiled = forward_loss(model, loss, SimpleNamespace(compile=True, compile_mode=None)) if compile else None

    def run() -> None:
        training_steps(model, optimizer, loss, x, y, grad_clip=config.grad_clip, foreach=device_type == "cuda",
                       autocast=autocast_for(SimpleNamespace(precision=precision, device_type=device_type)),
                       forward_loss=compiled)

    return run, (model, optimizer, x, y)


def measure_cpu(task, config, *, batch: int, precision: str) -> int:
    """Peak bytes of the step on the CPU, from the profiler's memory timeline."""
    run, _ = build_step(task, config, batch=batch, precision=precision, device="cpu", device_type="cpu")
    return profiled_peak(run)


def profiled_peak(run: Callable[[], None]) -> int:
    """Peak bytes `run()` holds on the CPU, from the profiler's memory timeline."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with quiet_stderr(), torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True,
                                                with_stack=True) as prof:
        run()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of a CUDA-only API
        path = os.path.join(tmp, "timeline.json")
        prof.export_memory_timeline(path, device="cpu")
        _, sizes = json.loads(Path(path).read_text())
    return max(sum(s) for s in sizes)


def measure_cuda(task, config, cuda: CudaDevice, *, batch: int, precision: str,
                 compile: bool = False) -> tuple[int, int]:
    """(max reserved, max allocated) of the step on `cuda`, less what it holds for a squeeze.
    Compiled: the first run compiles, the second is measured."""
    cuda.reset_peaks()
    run, kept = build_step(task, config, batch=batch, precision=precision, device=cuda.device, device_type="cuda",
                           compile=compile)
    if compile:
        run()
        cuda.reset_peaks()
    run()
    reserved, allocated = cuda.peaks()
    del run, kept
    return reserved - cuda.held_bytes, allocated - cuda.held_bytes
