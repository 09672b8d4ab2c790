"""The allocators under torch's tensors: glibc's C heap on a CPU, the CUDA caching allocator on a GPU.

CUDA: `use_expandable_segments()` (called when lib.hardware is imported, before
anything starts CUDA) asks torch's caching allocator for expandable segments
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) unless the user configured the
allocator. Fixed segments leave gaps that a later, differently sized block cannot
use: on an H100 (validate-gpu, 2026-11-23, torch 2.11) max_memory_reserved ran
8-64% of a step's activations above max_memory_allocated (ResNet-18 fp32 batch
256: 1870 MiB reserved for 1394 allocated); with expandable segments the gap was
10-115 MiB over 34 steps, and the squeezed GPT-2 run that went 18% over its
budget stayed at 82% of it. lib.memory predicts for the setting in force
(`expandable_segments()`), so a plan made in another process agrees.

The C heap of a CPU process: make memory that torch frees go back to the system.

On a CPU torch's tensors come from malloc. glibc serves allocations below its
mmap threshold from the heap and keeps freed heap memory for reuse, and the
threshold grows on its own (up to 32 MiB on 64-bit) each time a larger mmapped
block is freed, so after the first step nearly every tensor lives on the heap.
A step frees and re-allocates tensors of many sizes, and the process's resident
memory (RSS, what runs out on a CPU) stays well above what torch holds.

`return_freed_memory()` fixes the threshold at 64 KiB (tensors from 64 KiB up
are mmapped and unmapped when freed) and lowers the trim threshold to 1 MiB so
a freed top of the heap goes back as well. Measured by make bench-memory (42
steps of 7 models, torch 2.13, glibc 2.36): with it, a step's RSS growth is
within -0.4%/+3.1% of lib.memory's prediction; with glibc's defaults it ran
12-102% above it (BERT fp32 batch 128: 258 MiB for 163.5 predicted).

It costs speed: every tensor of 64 KiB or more becomes a fresh mapping that the
kernel zeroes and faults in. Steady-state steps on this 2-core CPU: LeNet-5
batch 512 fp32 7.4-7.9k samples/s against 15.6-24k with glibc's defaults
(-50 to -65%), ResNet-18 batch 32 fp32 42-47 against 74-91 (-40 to -50%);
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (huge pages for mmapped blocks) narrows
LeNet-5's loss to about -35%, not ResNet-18's. No threshold between 64 KiB and
32 MiB kept RSS down at a lower price (1 MiB: nearly the same saving and price;
4 MiB: half the saving for most of the price; 32 MiB: no saving). Use it where
fitting in RAM matters more than speed.

Where RAM is not short, `keep_freed_memory()` does the opposite, as torch's
CUDA caching allocator (and jemalloc or tcmalloc, which Intel's guide for
PyTorch on CPUs preloads) does: the mmap threshold fixed at glibc's own maximum
(32 MiB) and no trimming, so a step's tensors come from heap memory the process
already holds instead of pages the kernel must zero and fault in again. glibc's
adaptive threshold reaches the same place only some of the time: LeNet-5 batch
512 here ran at a median 39-49 ms per step with the defaults (minimum 21-32:
the same process moves between the two states), 22-25 ms with it; ResNet-18
batch 32 462-512 against 500-549 ms (three fresh processes each way; GPT-2-tiny
batch 32 within noise, 233-273 against 227-245). The peak RSS moves little (a
step's peak is reached every step either way: LeNet-5 402-406 MiB both ways,
ResNet-18 721-739 against 703-709); over a step pair it reached at most 2.19x
the prediction against 2.02x with the defaults (make bench-memory with
KFIT_BENCH_HEAP=keep), and memory is not handed back between phases of a run.

Both respect MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ / MALLOC_MMAP_MAX_
set by the user, and do nothing off glibc (macOS, Windows, musl) or when
KFIT_KEEP_MALLOC=1 (glibc's defaults). return_freed_memory() wins over keep_freed_memory().
"""

from __future__ import annotations

import ctypes
import sys

from ..env import environ as process_environ

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 64 * 1024
TRIM_THRESHOLD_BYTES = 1024 * 1024

# What a CPU run's process may hold over the predicted peak unless freed memory is returned: glibc's
# defaults held RSS at most 2.02x what torch held (BERT fp32 batch 128: 258 MiB for a 163.5 MiB peak,
# make bench-memory with KFIT_KEEP_MALLOC=1), keep_freed_memory() at most 2.19x (LeNet-5 fp32 batch
# 1024: 159.0 MiB for 72.6; KFIT_BENCH_HEAP=keep, 42 cases, 2026-11-23).
RETENTION_FACTOR = 2.25
KEEP_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
KEEP_TRIM_THRESHOLD_BYTES = 2**31 - 1  # mallopt takes an int: never trim in practice
USER_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_")

_applied: bool | None = None  # return_freed_memory's result
_mode: str | None = None  # "return" or "keep": the last setting glibc took

CUDA_ALLOC_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # torch reads either (the second since 2.9)
EXPANDABLE = "expandable_segments:True"


def _user_allocator_conf(environ) -> str | None:
    return next((environ[k] for k in CUDA_ALLOC_ENV if environ.get(k)), None)


def expandable_segments(environ=None) -> bool:
    """Whether kfit's CUDA processes run the caching allocator with expandable segments: on Linux
    unless the user configured the allocator, else as the user's setting says. environ: this process's
    (lib.env.environ()) unless given."""
    environ = process_environ() if environ is None else environ
    conf = _user_allocator_conf(environ)
    if conf is None:
        return sys.platform.startswith("linux")  # torch supports them there only
    settings = {k.strip(): v.strip() for k, _, v in (item.partition(":") for item in conf.split(","))}
    return settings.get("expandable_segments", "").lower() == "true"


def use_expandable_segments(environ=None) -> bool:
    """Turn expandable segments on for this process and its children, unless the user configured the
    allocator; True when they are on. Takes effect only before the process first uses CUDA. environ: this
    process's (lib.env.environ(), written through: torch and the children read it there) unless given."""
    environ = process_environ() if environ is None else environ
    if _user_allocator_conf(environ) is None and sys.platform.startswith("linux"):
        environ[CUDA_ALLOC_ENV[0]] = EXPANDABLE
    return expandable_segments(environ)


def needs_returning(predicted_peak: int | None, budget: int | None) -> bool:
    """Whether a CPU run must hand freed memory back to fit its budget: the heap's retention can take the
    process to RETENTION_FACTOR x the predicted peak, and return_freed_memory() costs 40-65% of a
    step's speed, so it is set only where that retention would not fit."""
    return bool(predicted_peak and budget and predicted_peak * RETENTION_FACTOR > budget)


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # this process's own symbols: the C library it really uses
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has a mallopt that does nothing)
        return libc
    except (OSError, AttributeError):
        return None


def _set(settings: tuple[tuple[int, int, str], ...]) -> bool:
    """mallopt each (param, value, env) the user has not set; False off glibc, under KFIT_KEEP_MALLOC=1,
    when the user set any of glibc's malloc variables, or when glibc refused a value."""
    libc = _glibc()
    environ = process_environ()
    if libc is None or environ.get("KFIT_KEEP_MALLOC") == "1" or any(v in environ for v in USER_ENV):
        return False
    ok = True
    for param, value, _env in settings:
        ok = libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1 and ok
    return ok


def return_freed_memory() -> bool:
    """Set glibc so that freed tensors leave the process, and hand back what it kept; True when glibc
    took the settings.

    Idempotent (the first call's result is kept); False and harmless off glibc.
    """
    global _applied, _mode
    if _applied is not None:
        return _applied
    _applied = _set(((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES, "MALLOC_MMAP_THRESHOLD_"),
                     (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES, "MALLOC_TRIM_THRESHOLD_")))
    if _applied:
        _mode = "return"
        trim()  # what keep_freed_memory() held
    return _applied


def keep_freed_memory() -> bool:
    """Set glibc to keep freed memory for the next step (see the module's docstring); True when glibc took
    it. Does nothing once return_freed_memory() has been applied: fitting in RAM comes first."""
    global _mode
    if _mode == "return":
        return False
    if _mode == "keep":
        return True
    if _set(((M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD_BYTES, "MALLOC_MMAP_THRESHOLD_"),
             (M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD_BYTES, "MALLOC_TRIM_THRESHOLD_"))):
        _mode = "keep"
        return True
    return False


def trim() -> bool:
    """Hand the heap's free memory back now (glibc's malloc_trim); False off glibc."""
    libc = _glibc()
    return bool(libc and libc.malloc_trim(ctypes.c_size_t(0)))
