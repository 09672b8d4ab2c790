"""The predictor: a traced step (trace.py, cached: cache.py) plus what the device adds.

Device overheads (CUDA and ROCm; all zero on CPU and MPS, where glibc/Metal
hand memory straight back and the bench measures no gap):
  cuda_context           0: free memory is measured after our context exists
                          (lib.hardware uses mem_get_info; the catalog subtracts
                          catalog.CONTEXT_RESERVE_BYTES), so it is already
                          outside the budget.
  blas_workspace         32 MiB: the cuBLAS/cuBLASLt workspace torch allocates per
                          handle at the first matmul (CUBLAS_WORKSPACE_CONFIG default
                          on Hopper is 32 MiB; older GPUs use less).
  attention_workspace    models with attention: 2% of activations, the fp32
                          accumulators of the fused attention backward.
  allocator_fragmentation 10% of activations + temporaries: the caching allocator
                          rounds blocks (512 B, 2 MiB and 20 MiB segments) and split
                          blocks leave gaps, so reserved > allocated for the
                          short-lived tensors of a step.
  cudagraph_pool         torch.compile mode reduce-overhead only: CUDA graphs keep
                          a private pool holding the step's transient memory.
Compile in the default and max-autotune modes adds no term: inductor fuses
pointwise ops and its partitioner saves no more than eager does, so the eager
trace is an upper bound.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import Config
from .cache import default_cache_dir, fingerprint
from .trace import MiB, Trace, trace_step

BLAS_WORKSPACE_BYTES = 32 * MiB
ATTENTION_WORKSPACE_SHARE = 0.02
FRAGMENTATION_SHARE = 0.10


# --------------------------------------------------------------------------
# What the device adds


def device_overheads(trace: Trace, device_type: str, compile_mode: str | None = None) -> dict[str, int]:
    """The named terms a trace cannot see (module docstring); empty off CUDA/ROCm."""
    if device_type != "cuda":
        return {}
    act, tmp = trace.breakdown["activations"], trace.breakdown["temporaries"]
    terms = {"blas_workspace": BLAS_WORKSPACE_BYTES}
    if "attention" in trace.features:
        terms["attention_workspace"] = int(ATTENTION_WORKSPACE_SHARE * act)
    terms["allocator_fragmentation"] = int(FRAGMENTATION_SHARE * (act + tmp))
    if compile_mode == "reduce-overhead":
        terms["cudagraph_pool"] = act + tmp
    return terms


@dataclass(frozen=True)
class Prediction:
    batch: int
    device_type: str
    trace: Trace
    overheads: dict[str, int] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        return self.trace.peak_bytes + sum(self.overheads.values())

    @property
    def breakdown(self) -> dict[str, int]:
        """Every category at the traced peak, then every device term; sums to peak_bytes."""
        return {**{k: v for k, v in self.trace.breakdown.items() if v}, **self.overheads}


# --------------------------------------------------------------------------
# The predictor and its cache


_TASK: dict[str, object] = {}  # the last task loaded, by model fingerprint: data is loaded once


def _task_for(config: Config, key: str):
    from ..task import load_task

    if key not in _TASK:
        _TASK.clear()
        _TASK[key] = load_task(config)
    return _TASK[key]


class MemoryPredictor:
    """Predicts peaks through a trace cache; `traces` counts the traces actually run."""

    def __init__(self, cache_dir: Path | str | None = None) -> None:
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self._memo: dict[str, dict[str, dict]] = {}
        self.traces = 0

    @property
    def cache_dir(self) -> Path:
        return (self._cache_dir or default_cache_dir()) / "memory"

    def _entries(self, key: str) -> dict[str, dict]:
        if key not in self._memo:
            try:
                self._memo[key] = json.loads((self.cache_dir / f"{key}.json").read_text())["traces"]
            except (OSError, ValueError, KeyError, TypeError):
                self._memo[key] = {}  # no cache yet, or a damaged file: trace again
        return self._memo[key]

    def _store(self, key: str, contents: dict) -> None:
        directory = self.cache_dir
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f"{key}.", suffix=".tmp", dir=directory)
            with os.fdopen(fd, "w") as f:
                json.dump({"key": contents, "traces": self._memo[key]}, f, sort_keys=True)
            os.replace(tmp, directory / f"{key}.json")
        except OSError:
            pass  # a read-only cache only costs time

    def trace(self, config: Config, *, batch: int, device_type: str, precision: str,
              gradient_checkpointing: bool | None = None, train: bool = True) -> Trace:
        """The cached trace for this step, tracing (and caching) it on a miss."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        ckpt = config.gradient_checkpointing if gradient_checkpointing is None else gradient_checkpointing
        key, contents = fingerprint(config, device_type=device_type, precision=precision,
                                    gradient_checkpointing=ckpt, train=train)
        entries = self._entries(key)
        if str(batch) not in entries:
            task = _task_for(config, json.dumps(contents["model"], sort_keys=True))
            result = trace_step(task, config, batch=batch, precision=precision, device_type=device_type,
                                gradient_checkpointing=ckpt, train=train)
            self.traces += 1
            # re-read: another process may have added entries meanwhile
            self._memo.pop(key, None)
            self._entries(key)[str(batch)] = result.to_json()
            self._store(key, contents)
        return Trace.from_json(self._entries(key)[str(batch)])

    def cached_batches(self, config: Config, *, device_type: str, precision: str, train: bool = True) -> list[int]:
        """The batch sizes already traced for this step (what the planner's search tried)."""
        key, _ = fingerprint(config, device_type=device_type, precision=precision,
                             gradient_checkpointing=config.gradient_checkpointing, train=train)
        return sorted(int(b) for b in self._entries(key))

    def predict(self, config: Config, *, batch: int, device_type: str, precision: str,
                gradient_checkpointing: bool | None = None, train: bool = True,
                compile_mode: str | None = None) -> Prediction:
        trace = self.trace(config, batch=batch, device_type=device_type, precision=precision,
                           gradient_checkpointing=gradient_checkpointing, train=train)
        return Prediction(batch, device_type, trace,
                          device_overheads(trace, device_type, compile_mode if train else None))


def largest_fitting(peak: Callable[[int], int], budget: int, limit: int) -> int:
    """The largest b in 1..limit with peak(b) <= budget (0 when none), for a peak that grows with b.

    Peak memory is close to linear in the batch, so each step aims where the line
    through the two bracketing points crosses the budget, then checks the
    neighbour on the other side: usually 3 to 5 calls in all.
    """
    if peak(limit) <= budget:
        return limit
    if peak(1) > budget:
        return 0
    lo, hi = 1, limit  # peak(lo) fits, peak(hi) does not
    while hi - lo > 1:
        p_lo, p_hi = peak(lo), peak(hi)
        aim = lo + math.floor((budget - p_lo) * (hi - lo) / max(1, p_hi - p_lo))
        guess = min(max(aim, lo + 1), hi - 1)
        width = hi - lo
        if peak(guess) <= budget:
            lo = guess
            if guess + 1 < hi:
                lo, hi = (guess + 1, hi) if peak(guess + 1) <= budget else (lo, guess + 1)
        else:
            hi = guess
            if guess - 1 > lo:
                lo, hi = (guess - 1, hi) if peak(guess - 1) <= budget else (lo, guess - 1)
        if hi - lo > width // 2 and hi - lo > 1:  # the line was off: halve the bracket as well
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if peak(mid) <= budget else (lo, mid)
    return lo
