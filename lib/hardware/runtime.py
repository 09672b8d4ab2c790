"""Queries of the device in use while training: its memory (current and peak),
releasing cached memory, and whether a GPU can train at all."""

from __future__ import annotations

import os
from typing import Any


def safe_call(fn: Any, default: Any = None) -> Any:
    if fn is None:
        return default
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a probe that fails means "not available"
        return default


_rss_peak: dict[int, int] = {}  # pid -> highest RSS seen by device_memory since reset_peak_memory
_process: list = []  # [psutil.Process] of this pid (a forked DataLoader worker gets its own)


def _rss() -> int:
    import psutil

    if not _process or _process[0].pid != os.getpid():
        _process[:] = [psutil.Process()]
    return int(_process[0].memory_info().rss)


def device_memory(device: Any) -> tuple[int, int]:
    """(current, peak) bytes in use by training on ``device``.

    CUDA/ROCm: the caching allocator's allocated bytes and its max since
    reset_peak_memory.  MPS: Metal's allocated bytes, peak tracked like the CPU's.
    CPU: the process RSS and the highest RSS seen by calls to this function (the
    monitor's sampler calls it every interval); unlike ru_maxrss it can be reset.
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device)), int(torch.cuda.max_memory_allocated(device))
    current = int(torch.mps.current_allocated_memory()) if device.type == "mps" else _rss()
    key = -1 if device.type == "mps" else os.getpid()
    peak = max(current, _rss_peak.get(key, 0))
    _rss_peak[key] = peak
    return current, peak


def reset_peak_memory(device: Any) -> None:
    """Start a new peak for device_memory (e.g. per probe trial, after recovering from OOM)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        _rss_peak.pop(-1 if device.type == "mps" else os.getpid(), None)


def empty_device_cache(device: Any) -> None:
    """Give memory held by dead tensors back: collect reference cycles first (a
    failed step's traceback holds its activations), then release the allocator's
    cached blocks so the next attempt, and other processes, can use them."""
    import gc

    import torch

    gc.collect()
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def _unusable_fix(text: str) -> str:
    low = text.lower()
    if "out of memory" in low:
        return "other processes hold its memory: stop them (see nvidia-smi or rocm-smi) or pick another GPU with CUDA_VISIBLE_DEVICES"
    if "busy or unavailable" in low:
        return "it is in exclusive-process compute mode and another process uses it: free it, or pick another GPU with CUDA_VISIBLE_DEVICES"
    if "no kernel image" in low or "not compatible" in low or "invalid device function" in low:
        return "this torch build has no kernels for this GPU's architecture: install a torch build that supports it (see README)"
    if "driver" in low:
        return "update the NVIDIA (or ROCm) driver to one this torch's CUDA/HIP version supports, or install a matching torch build"
    if "invalid device ordinal" in low:
        return "that GPU index does not exist: check CUDA_VISIBLE_DEVICES and the GPU count"
    return "check that nvidia-smi (or rocm-smi) works and CUDA_VISIBLE_DEVICES is right, and reinstall the driver if it does not"


def gpu_unusable_reason(index: int = 0, *, torch_mod: Any = None) -> str | None:
    """Why GPU ``index`` cannot train, found by initialising CUDA and allocating a
    few bytes on it; None when it can, or when torch sees no CUDA/ROCm GPU."""
    if torch_mod is None:
        import torch as torch_mod
    cuda = torch_mod.cuda
    if not safe_call(cuda.is_available, default=False) or not safe_call(cuda.device_count, default=0):
        return None
    try:
        torch_mod.ones(1, device=f"cuda:{index}").add_(1)
        cuda.synchronize(index)  # errors of asynchronous kernels surface here
    except Exception as e:  # noqa: BLE001 - any failure means "unusable", said with its cause
        text = " ".join(str(e).split())[:300]
        return f"GPU {index} is unusable ({type(e).__name__}: {text}): {_unusable_fix(text)}"
    return None


# CUDA/HIP errors after which the device (or this process's context on it) cannot be used again: the run
# must continue elsewhere, from its last good state. A device-side assert is left out: that is the
# program's bug (an index out of range, say), and the same step would fail on any device.
_LOST_TEXTS = ("an illegal memory access was encountered", "unspecified launch failure", "uncorrectable ecc error",
               "ecc error encountered", "fallen off the bus", "device lost", "gpu is lost",
               "no cuda-capable device is detected", "an illegal instruction was encountered",
               "hardware stack error", "hiperrorlaunchfailure", "hiperrorillegaladdress")


def is_device_lost(error: BaseException) -> bool:
    """Whether `error` says the training device failed for good (a RuntimeError of CUDA or HIP)."""
    return isinstance(error, RuntimeError) and any(t in str(error).lower() for t in _LOST_TEXTS)
