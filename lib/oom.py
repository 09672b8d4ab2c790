"""Out-of-memory: recognising it, recovering from it, and injecting it for tests.

Recognised: torch.OutOfMemoryError (CUDA; torch.cuda.OutOfMemoryError is the
same class) and the RuntimeError texts of ROCm/HIP and of the CPU allocator.

Fault injection (environment, read when a run starts):
  KFIT_INJECT_OOM="3,7"       the first micro-batch forward of optimizer steps 3
                              and 7 (1-based) raises OutOfMemoryError, once each
  KFIT_INJECT_OOM_RANK=1      only rank 1 injects KFIT_INJECT_OOM (the others must
                              still agree to redo the step)
  KFIT_INJECT_OOM_ABOVE=16    any micro-batch (training, evaluation or probe) of
                              more than 16 samples raises OutOfMemoryError: a
                              device that holds 16 samples, simulated on the CPU,
                              until a rung of the out-of-memory ladder other than
                              halving has been taken (lib/planning/ladder.py): the
                              rung made the step fit. KFIT_INJECT_OOM_ABOVE=0 fails
                              every micro-batch until then.
  KFIT_INJECT_DEVICE_LOST=5   the first micro-batch forward of optimizer step 5
                              raises CUDA's "unspecified launch failure" (once), on
                              any device: the GPU lost mid-run, simulated
"""

from __future__ import annotations

import os

import torch

from .errors import KfitError
from .env import environ
from .hardware import empty_device_cache, reset_peak_memory

_OOM_TEXTS = ("out of memory", "defaultcpuallocator: can't allocate memory", "hiperroroutofmemory")

ADVICE = ("lower CONFIG_MEMORY_PROFILE (a smaller share of free memory), use bf16 (CONFIG_PRECISION_BF16), "
          "enable CONFIG_GRADIENT_CHECKPOINTING, pick a smaller model or GPT-2 preset, or free the device "
          "from other processes")


class OutOfMemory(KfitError):
    """Out of memory with nothing left to shrink: the message says what to change."""


def is_oom(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(t in str(error).lower() for t in _OOM_TEXTS)


def release(device: torch.device, *optimizers: torch.optim.Optimizer) -> None:
    """Free what a failed step held. Call it after leaving the `except` block: until then the
    exception's traceback keeps the step's frames, and so its activations, alive."""
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    empty_device_cache(device)  # collects reference cycles, then returns cached blocks
    reset_peak_memory(device)


def halve(micro_batch: int, halvings: int, max_halvings: int, where: str) -> int:
    """The next micro-batch after an out-of-memory error, or OutOfMemory when none is left."""
    if micro_batch <= 1:
        raise OutOfMemory(f"out of memory {where} at micro-batch 1: nothing is left to shrink; {ADVICE}")
    if halvings >= max_halvings:
        raise OutOfMemory(f"out of memory {where} at micro-batch {micro_batch} after {halvings} halvings "
                          f"(CONFIG_OOM_MAX_HALVINGS={max_halvings}); {ADVICE}")
    return micro_batch // 2


class Injector:
    """Test-only faults, configured from the environment (see the module docstring)."""

    def __init__(self, env=None) -> None:
        env = environ() if env is None else env
        steps = env.get("KFIT_INJECT_OOM", "").replace(" ", "")
        above = env.get("KFIT_INJECT_OOM_ABOVE", "").strip()
        lost = env.get("KFIT_INJECT_DEVICE_LOST", "").replace(" ", "")
        try:
            self.steps = {int(s) for s in steps.split(",") if s}
            self.above = int(above) if above else None
            self.lost = {int(s) for s in lost.split(",") if s}
            only = env.get("KFIT_INJECT_OOM_RANK", "").strip()
            if only and int(only) != int(env.get("RANK") or 0):
                self.steps = set()
        except ValueError:
            raise KfitError(f"KFIT_INJECT_OOM={steps!r} / KFIT_INJECT_OOM_ABOVE={above!r} / KFIT_INJECT_DEVICE_LOST="
                            f"{lost!r}: give whole numbers (e.g. KFIT_INJECT_OOM=3,7 or KFIT_INJECT_OOM_ABOVE=16)"
                            ) from None
        self.adapted = False  # a ladder rung was taken: KFIT_INJECT_OOM_ABOVE's device now holds the step

    def check(self, batch_size: int, step: int | None = None) -> None:
        """Raise OutOfMemoryError (or a lost device's error) if a fault is due: `step` (1-based) is given on a
        step's first forward."""
        if step is not None and step in self.lost:
            self.lost.discard(step)
            raise RuntimeError(f"CUDA error: unspecified launch failure (injected at optimizer step {step}: "
                               "KFIT_INJECT_DEVICE_LOST)")
        if step is not None and step in self.steps:
            self.steps.discard(step)  # once: the redone step must succeed
            raise torch.OutOfMemoryError(f"injected out of memory at optimizer step {step} (KFIT_INJECT_OOM)")
        if self.above is not None and not self.adapted and batch_size > self.above:
            raise torch.OutOfMemoryError(f"injected out of memory: batch {batch_size} > KFIT_INJECT_OOM_ABOVE="
                                         f"{self.above}")
