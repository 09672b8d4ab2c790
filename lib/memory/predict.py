"""The predictor: a traced step (trace.py, cached: cache.py) plus what the device adds.

The trace already holds what kernels allocate inside an op (workspace.kernel_workspace):
oneDNN's reorders and im2col's column buffers of CPU convolutions, CPU type
promotion copies, cuDNN's workspace. Device overheads beyond it:
  CPU (RSS, what runs out on a CPU, measured by make bench-memory):
  host_heap              1.5 KiB a node of the forward's autograd graph, at
                          least 256 KiB: the graph, tensor metadata and Python
                          objects live in the C heap and pymalloc, outside the
                          tensor allocator. RSS grew 0-1.0 MiB more than the
                          allocator's peak in the bench, roughly in step with the
                          graph: 1.8-2.6 KiB a node for T5 (427-512 nodes: 0.7-0.9
                          MiB whatever the batch) and Llama with checkpointing
                          (399: 0.5-1.0), 1.3-2.0 for Llama without, 1.1-1.6 for
                          GPT-2 (187), near 0 for a TransformerEncoder (234) and
                          ConvNeXt (167). 2 KiB put the encoder's smallest case
                          5.5% over; 1.5 leaves T5 and Llama under by at most 0.8%.
  RSS follows this only in a process whose C heap hands freed tensors back
  (lib.hardware.allocator.return_freed_memory): with glibc's defaults the heap
  keeps them, and RSS grew 12-102% above the prediction (no fixed share: glibc's
  fragmentation depends on the order of a step's allocations). What a process
  pays once, at its first step (20-100 MiB here: kernel code, thread pools, lazy
  imports), is left to the memory profile's headroom.
  CUDA and ROCm (MPS: none, not measured). Measured by make validate-gpu on an
  H100 (docs/validation/, 2026-11-23, torch 2.11, 34 eager steps of 5 models
  and 5 checkpointed ones), reserved peak against the trace:
  cuda_context           0: free memory is measured after our context exists
                          (lib.hardware uses mem_get_info; the catalog subtracts
                          catalog.CONTEXT_RESERVE_BYTES), so it is already
                          outside the budget.
  blas_workspace         65 MiB in training: the cuBLAS workspace torch allocates
                          per handle and stream at the first matmul (32 MiB on
                          Hopper), one for the forward's thread and one for the
                          autograd engine's device thread, plus cuBLASLt's 1 MiB:
                          every step measured allocated 65.0 MiB or more beyond
                          its traced peak. Evaluation runs in a process that has
                          trained, with both workspaces alive.
  attention_workspace,   allocator_model.py, refitted to the committed H100 runs
  allocator_fragmentation, (replayed by tests/test_memory_replay.py: every case within
  cudnn_benchmark        -2% and +5% (or one 20 MiB page) of the reserved peak): the
                          holes the caching allocator leaves, from replaying the traced
                          step's allocations through it (caching_allocator.py), or at least
                          its pages, autocast's cast cache and a share of activations;
                          cuDNN's benchmark workspaces (models with convolutions) and the
                          fused attention backward's accumulators.
  cudagraph_pool         torch.compile mode reduce-overhead only: CUDA graphs keep
                          a private pool holding the step's transient memory.
Compile in the default and max-autotune modes adds no term: inductor fuses
pointwise ops and its partitioner saves no more than eager does, so the eager
trace is an upper bound.

Several processes (the `strategy`, `world_size`, `local_world_size` and
`cpu_offload` arguments; lib/parallel.py): every figure is one process's peak.
  none, ddp              the one-process trace: a DDP rank runs a replica's step.
                          DDP adds (`parallel_overheads`, world size > 1; read off
                          DDP's and the trainer's code, not measured by make
                          bench-memory, whose step is training_steps):
  ddp_buckets            the Reducer's flat bucket buffers, one gradient's worth
                          (gradient_as_bucket_view off, torch's default and the
                          trainer's), allocated when the model is wrapped and alive
                          for the whole run, evaluation included. On a CPU they are
                          counted in full although under no_sync (below) their pages
                          may never be touched: conservative there.
  ddp_flat_gradients     with out-of-memory recovery on (the default), every
                          micro-batch runs under no_sync and the gradients are summed
                          after the last backward in one flat copy
                          (lib.distributed.all_reduce_gradients): parameters, buffers,
                          gradients, the previous step's optimizer state and the copy
                          are alive at once. The term is what that moment needs beyond
                          the traced peak, 0 when the traced peak is higher (large
                          activations); for a small batch it is up to one gradient.
  fsdp, fsdp_grad_op,    sharded.py's trace of the step at that world size, in a
  hsdp                   child process (cached like any trace): this rank's shards,
                          a unit's gathered parameters and full gradients, the
                          all-gather and reduce-scatter buffers (and, on a CPU, gloo's
                          copy inside each).
  sharded_host_heap      CPU, sharded strategies and tensor-parallel groups (whose
                          process at 8 samples of Llama-tiny ran 0.7 MiB, -2.06%, over
                          its prediction without it): 512 KiB beyond host_heap, the C heap
                          and Python objects of a sharded step (a DTensor for every
                          shard, gradient and state tensor, FSDP's per-unit hooks,
                          gloo's work objects): RSS grew 0-1.3 MiB (half of them
                          0.4-0.8) beyond the traced peak + host_heap over 8 FSDP
                          steps (GPT-2 tiny fp32/bf16 at 2 processes, fp32 at 4;
                          GPT-2 124M at 2), under torchrun with gloo.
  cpu_offload            CUDA, sharded strategies: minus the sharded parameters,
                          gradients and optimizer state at the traced moment with the
                          most bytes left on the device (sharded.py picks it): they
                          live in host memory. An estimate: one unit's shards copied
                          to the device and back are not counted.
device_overheads applies to every strategy as to one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..config import Config
from ..errors import KfitError
from ..hardware.allocator import expandable_segments
from ..parallel import is_sharded
from . import allocator_model
from .allocator_model import ATTENTION_WORKSPACE_SHARE  # noqa: F401  re-exported
from .cache import default_cache_dir, fingerprint, parallel_key, read_traces, write_traces
from .depth import at_depth, depth_of, scaled, shallow_depths
from .curve import PeakCurve, Vector, affine_runs, largest_fitting  # noqa: F401  largest_fitting: re-exported
from .trace import CATEGORIES, MiB, Trace, trace_step
from ..models.registry import label as model_label

if TYPE_CHECKING:
    from .measured import MeasuredFit

HOST_HEAP_BYTES = 256 * 1024  # the least (module docstring)
HOST_HEAP_NODE_BYTES = 1536


def host_heap(trace: Trace) -> int:
    """What a CPU step holds in the C heap beside its tensors: in step with its autograd graph (docstring)."""
    return max(HOST_HEAP_BYTES, HOST_HEAP_NODE_BYTES * trace.autograd_nodes)
SHARDED_HOST_HEAP_BYTES = 512 * 1024  # beyond HOST_HEAP_BYTES, a sharded step on a CPU (module docstring)
BLAS_WORKSPACE_BYTES = 32 * MiB  # per cuBLAS handle
BLAS_HANDLES = 2  # the forward's thread and the autograd engine's device thread
BLAS_LT_WORKSPACE_BYTES = 1 * MiB
# the allocator's terms (allocator_model.py), under the names lib.validation's memory check reports against
FRAGMENTATION_BASE_BYTES = allocator_model.PAGE_SLACK_BYTES
FRAGMENTATION_SHARE = allocator_model.HOLE_SHARE_ACTIVATIONS  # expandable segments
FRAGMENTATION_SHARE_CHECKPOINTED = allocator_model.HOLE_SHARE_CHECKPOINTED
FRAGMENTATION_SHARE_FIXED_SEGMENTS = allocator_model.HOLE_SHARE_FIXED_SEGMENTS


# --------------------------------------------------------------------------
# What the device adds


def fragmentation_share(*, checkpointed: bool, expandable: bool | None = None) -> float:
    """The share of activations the caching allocator leaves as holes (allocator_model.py)."""
    return allocator_model.hole_share(checkpointed=checkpointed,
                                      expandable=expandable_segments() if expandable is None else expandable)


def device_overheads(trace: Trace, device_type: str, compile_mode: str | None = None, *,
                     checkpointed: bool = False, expandable: bool | None = None,
                     precision: str | None = None) -> dict[str, int]:
    """The named terms a trace cannot see (module docstring); none on MPS. `expandable`: whether the
    CUDA allocator uses expandable segments (default: lib.hardware.allocator's answer for this process);
    `precision`: the step's (bf16 and fp16 autocast keep a cast cache and halve cuDNN's workspaces)."""
    if device_type == "cpu":
        return {"host_heap": host_heap(trace)}
    if device_type != "cuda" or "measured" in trace.features:  # a measured reserved peak holds them all
        return {}
    act, tmp = trace.breakdown["activations"], trace.breakdown["temporaries"]
    autocast = precision in allocator_model.AUTOCAST_PRECISIONS
    terms = {"blas_workspace": BLAS_HANDLES * BLAS_WORKSPACE_BYTES + BLAS_LT_WORKSPACE_BYTES}
    if "attention" in trace.features:
        terms["attention_workspace"] = allocator_model.attention_workspace(act)
    if "conv" in trace.features:
        terms["cudnn_benchmark"] = allocator_model.cudnn_benchmark(trace.breakdown.get("batch", 0),
                                                                   autocast=autocast)
    terms["allocator_fragmentation"] = allocator_model.fragmentation(
        act, tmp, checkpointed=checkpointed, autocast=autocast, replayed_holes=trace.allocator_holes,
        expandable=expandable_segments() if expandable is None else expandable)
    if compile_mode == "reduce-overhead":
        terms["cudagraph_pool"] = act + tmp
    return terms


# Optimizer state per parameter byte once the first step made it (lib/step.py's; another's is traced, 2 here).
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd_momentum": 1, "sgd": 0}


def optimizer_state_bytes(config: Config, parameter_bytes: int) -> int:
    kind = config.optimizer if config.optimizer != "sgd" or not config.sgd_momentum else "sgd_momentum"
    return OPTIMIZER_STATES.get(kind, 2) * parameter_bytes


def parallel_overheads(trace: Trace, config: Config, *, strategy: str = "none", world_size: int = 1,
                       cpu_offload: bool = False, train: bool = True, device_type: str = "cuda",
                       tensor: int = 1) -> dict[str, int]:
    """The named terms of the data-parallel strategy (module docstring): DDP's buffers, the sharded step's
    host objects on a CPU, CPU offload's host-resident state (negative). `cpu_offload`: as the trace was
    made (cache.parallel_key's)."""
    b = trace.breakdown
    terms: dict[str, int] = {}
    if device_type == "cpu" and (is_sharded(strategy) or tensor > 1):  # a tensor-parallel group's DTensors too
        terms["sharded_host_heap"] = SHARDED_HOST_HEAP_BYTES
    if strategy == "ddp" and world_size > 1:
        gradients = b["parameters"]  # one per parameter, in its dtype
        terms["ddp_buckets"] = gradients
        if train and config.oom_recovery:
            flatten = (b["parameters"] + b.get("buffers", 0) + 2 * gradients
                       + optimizer_state_bytes(config, b["parameters"]))
            terms["ddp_flat_gradients"] = max(0, flatten - trace.peak_bytes)
    if cpu_offload:
        from .sharded import OFFLOADED_CATEGORIES

        terms["cpu_offload"] = -sum(b.get(k, 0) for k in OFFLOADED_CATEGORIES)
    return terms


def pipeline_overheads(trace: Trace, terms: Callable[[int, int], dict[str, int]] | None) -> dict[str, int]:
    """A pipeline process's memory beyond the one micro-batch traced (lib/pipeline.py process_terms: the other
    micro-batches in flight, the stages' send and receive buffers), from (batch, its activations)."""
    if terms is None:
        return {}
    # one micro-batch's saved activations: what the stretch ending with its first forward holds
    # (Trace.forward_segment), not what is left of them at the step's peak, nor a checkpointed block's recomputed
    # ones in backward; the peak's where the trace did not record it
    index = trace.forward_segment
    saved = (trace.segments[index]["breakdown"].get("activations", 0)
             if index is not None and index < len(trace.segments) else trace.breakdown.get("activations", 0))
    return {k: v for k, v in terms(trace.batch, saved).items() if v > 0}


def _part(config: Config, part: tuple | None) -> tuple[Config, tuple[bool, bool] | None]:
    """(the config at a pipeline process's depth, its (first, last)) for part = (first, last, blocks)."""
    if part is None:
        return config, None
    first, last, blocks = part
    from ..models.registry import llama_shape

    if llama_shape(config).n_layer != blocks:  # at_depth derives from the text: what the planner set on the
        # config itself (checkpointing on or off for a candidate, its policy) kept
        config = replace(at_depth(config, blocks), gradient_checkpointing=config.gradient_checkpointing,
                         recompute_policy=config.recompute_policy)
    return config, (bool(first), bool(last))


@dataclass(frozen=True)
class Prediction:
    batch: int
    device_type: str
    trace: Trace
    overheads: dict[str, int] = field(default_factory=dict)  # the device's terms, then the strategy's
    strategy: str = "none"
    world_size: int = 1

    @property
    def peak_bytes(self) -> int:
        return self.trace.peak_bytes + sum(self.overheads.values())

    @property
    def breakdown(self) -> dict[str, int]:
        """Every category at the traced peak, then every device term; sums to peak_bytes."""
        return {**{k: v for k, v in self.trace.breakdown.items() if v}, **self.overheads}


# --------------------------------------------------------------------------
# The predictor and its cache


# Sharded traces taken at once, each in a child process of its own (the two shallow depths a deep model is
# scaled from): at most 2, and no more than the cores this process may use
TRACE_PROCESSES = min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _sharded_request(parallel: dict, **step) -> dict:
    """trace_sharded_step's keywords for a step under `parallel` (cache.parallel_key's)."""
    local = parallel["mesh"][-1] if parallel["strategy"] == "hsdp" else parallel["world_size"]
    return dict(step, strategy=parallel["strategy"], world_size=parallel["world_size"], local_world_size=local,
                cpu_offload=parallel["cpu_offload"], tensor=parallel.get("tensor", 1))


@contextlib.contextmanager
def _tracing(config: Config, batch: int, parallel: dict | None, train: bool):
    """On a terminal, say on stderr which step is being traced (a cold trace of a large model takes seconds
    to minutes) and clear it when done; elsewhere stay quiet: the callers that loop over plans report per
    item (lib.report.Progress)."""
    if not sys.stderr.isatty():
        yield
        return
    label = model_label(config)
    how = f", {parallel['strategy']} x{parallel['world_size']}" if parallel else ""
    if parallel and parallel.get("tensor", 1) > 1:
        how += f", TP {parallel['tensor']}"
    sys.stderr.write(f"\rtracing {label} ({'training step' if train else 'evaluation'}{how}) at "
                     f"micro-batch {batch} ...\x1b[K")
    sys.stderr.flush()
    try:
        yield
    finally:
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()


class MemoryPredictor:
    """Predicts peaks through a trace cache; `traces` counts the traces actually run.

    A cache file (one per fingerprint) holds the traces by batch size and, for
    people reading it, the stretches of batch sizes where the traced peak is
    exactly affine (`affine`: see `affine_runs`).
    """

    def __init__(self, cache_dir: Path | str | None = None, *, full_depth: bool = False) -> None:
        self._cache_dir = Path(cache_dir) if cache_dir else None
        self.full_depth = full_depth  # trace every block of a deep transformer (depth.py scales two shallow ones)
        self._memo: dict[str, dict[str, dict]] = {}
        self._sharded = None  # sharded_process.ShardedTracers: their children start at the first sharded trace
        self.trace_processes = TRACE_PROCESSES  # children tracing at once (1: a pool's worker traces in itself)
        self._floors: dict[str, tuple[int, int]] = {}  # state_floor's (held, trainable) parameter bytes by model
        self._prefetched: dict[tuple[str, int], Trace] = {}  # sharded traces taken at once, for _step to store
        self._fits: dict[str, "MeasuredFit | None"] = {}  # key -> the measured fit, where the trace failed
        self.traces = 0
        self.measured = 0  # steps fitted from real steps (measured.py)

    def close(self) -> None:
        """Stop the sharded tracer's child process, if one runs (it also stops with this object)."""
        if self._sharded is not None:
            self._sharded.close()
            self._sharded = None

    @property
    def cache_dir(self) -> Path:
        return (self._cache_dir or default_cache_dir()) / "memory"

    def _entries(self, key: str) -> dict[str, dict]:
        if key not in self._memo:
            self._memo[key] = read_traces(self.cache_dir / f"{key}.json")  # {}: missing or damaged, trace again
        return self._memo[key]

    def _store(self, key: str, contents: dict) -> None:
        directory = self.cache_dir
        traces = self._memo[key]
        points = {int(b): (t["peak_bytes"], *(t["breakdown"][k] for k in sorted(t["breakdown"])))
                  for b, t in traces.items()}
        affine = [{"from": first, "to": last, "peak_at_from": points[first][0],
                   "bytes_per_sample": (points[last][0] - points[first][0]) / (last - first)}
                  for first, last in affine_runs(points)]
        write_traces(directory / f"{key}.json", {"key": contents, "traces": traces, "affine": affine})

    def _step(self, config: Config, *, device_type: str, precision: str, gradient_checkpointing: bool | None,
              train: bool, parallel: dict | None = None,
              part: tuple[bool, bool] | None = None) -> tuple[str, Callable[[int], Trace]]:
        """(cache key, batch -> the cached trace of this step, tracing and caching it on a miss).
        `parallel`: cache.parallel_key's (None: one process's step, which a DDP rank runs too); `part`: a
        pipeline process's (first, last), `config` at its depth (None: the whole model)."""
        ckpt = config.gradient_checkpointing if gradient_checkpointing is None else gradient_checkpointing
        layers = None if self.full_depth else depth_of(config, parallel is not None)
        depths = shallow_depths(config, parallel is not None)
        key, contents = fingerprint(config, device_type=device_type, precision=precision,
                                    gradient_checkpointing=ckpt, train=train, parallel=parallel,
                                    scaled_from=depths if layers else (), part=part)

        def trace(batch: int) -> Trace:
            if batch < 1:
                raise ValueError(f"batch must be >= 1, got {batch}")
            if str(batch) not in self._entries(key):
                if layers is not None:  # two shallow steps (traced and cached as any), scaled to the depth
                    # both traced at once, each in a child process of its own
                    self._prefetch([at_depth(config, d) for d in depths], batch, device_type=device_type,
                                   precision=precision, gradient_checkpointing=ckpt, train=train, parallel=parallel,
                                   part=part)
                    result = scaled(tuple(
                        self._step(at_depth(config, d), device_type=device_type, precision=precision,
                                   gradient_checkpointing=ckpt, train=train, parallel=parallel, part=part)[1](batch)
                        for d in depths), layers, depths)
                    self._memo.pop(key, None)
                    self._entries(key)[str(batch)] = result.to_json()
                    self._store(key, contents)
                    return Trace.from_json(self._entries(key)[str(batch)])
                with _tracing(config, batch, parallel, train):
                    if parallel is None:
                        from ..task import task_once

                        fit = self._fit(key)
                        if fit is not None:
                            return fit.trace(batch)
                        result = self._prefetched.pop((key, batch), None)  # traced beside another
                        try:
                            if result is None:
                                task = task_once(config, json.dumps(contents["model"], sort_keys=True))
                                result = trace_step(task, config, batch=batch, precision=precision,
                                                    device_type=device_type, gradient_checkpointing=ckpt,
                                                    train=train, part=part)
                        except KfitError:
                            raise
                        except Exception as err:  # noqa: BLE001 - no fake kernel for an op: measure real steps
                            return self._measure(key, config, err, batch=batch, precision=precision,
                                                 device_type=device_type, gradient_checkpointing=ckpt,
                                                 train=train).trace(batch)
                    else:  # in a child process: the fake process group must not replace this process's own
                        result = self._prefetched.pop((key, batch), None) or self._tracers().trace(
                            config, **_sharded_request(parallel, batch=batch, precision=precision,
                                                       device_type=device_type, gradient_checkpointing=ckpt,
                                                       train=train, part=part))
                self.traces += 1
                # re-read: another process may have added entries meanwhile
                self._memo.pop(key, None)
                self._entries(key)[str(batch)] = result.to_json()
                self._store(key, contents)
            return Trace.from_json(self._entries(key)[str(batch)])

        return key, trace

    def _tracers(self):
        if self._sharded is None:
            from .sharded_process import ShardedTracers

            self._sharded = ShardedTracers(self.trace_processes)
        return self._sharded

    def _prefetch(self, configs: list[Config], batch: int, *, parallel: dict | None,
                  part: tuple[bool, bool] | None = None, **step) -> None:
        """The traces of `configs` at `batch` not cached yet, traced at once in child processes
        (ShardedTracers.trace_all) and kept for _step's trace to take. One process's steps that the tracer
        cannot run are left to _step, which measures real ones instead."""
        missing = []
        for config in configs:
            key, _ = self._step(config, parallel=parallel, part=part, **step)
            if str(batch) not in self._entries(key) and (key, batch) not in self._prefetched and (
                    parallel is not None or self._fit(key) is None):
                missing.append((key, config))
        if len(missing) < 2 or self.trace_processes < 2:
            return  # one trace gains nothing from another process
        request = (lambda: _sharded_request(parallel, batch=batch, part=part, **step)) if parallel else (
            lambda: dict(batch=batch, part=part, **step))
        with _tracing(missing[0][1], batch, parallel, step["train"]):
            try:
                traces = self._tracers().trace_all([(config, request()) for _, config in missing])
            except KfitError:
                if parallel is not None:
                    raise
                return  # in this process, _step traces each (or measures real steps) and says why
        self._prefetched.update({(key, batch): trace for (key, _), trace in zip(missing, traces)})

    def _fit(self, key: str) -> "MeasuredFit | None":
        """The measured fit cached under this step's key (measured.py), where the trace could not run."""
        if key not in self._fits:
            from .measured import read_fit

            self._fits[key] = read_fit(self.cache_dir / f"{key}.measured.json")
        return self._fits[key]

    def _measure(self, key: str, config: Config, err: BaseException, **step) -> "MeasuredFit":
        """Fit the step from real steps on this machine's device (measured.py) and cache the fit."""
        from .measured import fit_step, why_untraceable, write_fit

        fit = self._fits[key] = fit_step(config, reason=why_untraceable(err), **step)
        self.measured += 1
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        write_fit(self.cache_dir / f"{key}.measured.json", fit)
        return fit

    def measured_note(self, trace: Trace, config: Config, **step) -> str | None:
        """How a measured trace's figures were found (measured.py), None for a traced one."""
        if "measured" not in trace.features:
            return None
        parallel = parallel_key(step.pop("strategy", "none"), step.pop("world_size", 1),
                                step.pop("local_world_size", None), step.pop("cpu_offload", False),
                                step["device_type"], step.pop("tensor", 1))
        config, part = _part(config, step.pop("part", None))
        step.pop("pipeline_terms", None)
        key, _ = self._step(config, gradient_checkpointing=None, parallel=parallel, part=part, **step)
        fit = self._fit(key)
        return fit.describe() if fit else None

    # strategy, world_size, local_world_size (None: = world_size, one machine), cpu_offload: the data-parallel
    # setup whose per-process peak is wanted (module docstring); tensor: processes per tensor-parallel group
    # (world sizes then count the groups); part: a pipeline process's (first, last, blocks) (lib/pipeline.py),
    # pipeline_terms: (batch, activations) -> what it holds beyond one micro-batch; the defaults are one process.

    def trace(self, config: Config, *, batch: int, device_type: str, precision: str,
              gradient_checkpointing: bool | None = None, train: bool = True, strategy: str = "none",
              world_size: int = 1, local_world_size: int | None = None, cpu_offload: bool = False,
              tensor: int = 1, part: tuple | None = None) -> Trace:
        """The cached trace for this step, tracing (and caching) it on a miss."""
        parallel = parallel_key(strategy, world_size, local_world_size, cpu_offload, device_type, tensor)
        config, part = _part(config, part)
        return self._step(config, device_type=device_type, precision=precision,
                          gradient_checkpointing=gradient_checkpointing, train=train, parallel=parallel,
                          part=part)[1](batch)

    def cached_batches(self, config: Config, *, device_type: str, precision: str, train: bool = True,
                       strategy: str = "none", world_size: int = 1, local_world_size: int | None = None,
                       cpu_offload: bool = False, tensor: int = 1, part: tuple | None = None) -> list[int]:
        """The batch sizes already traced for this step (what the planner's search tried)."""
        parallel = parallel_key(strategy, world_size, local_world_size, cpu_offload, device_type, tensor)
        config, part = _part(config, part)
        key, _ = self._step(config, device_type=device_type, precision=precision, gradient_checkpointing=None,
                            train=train, parallel=parallel, part=part)
        return sorted(int(b) for b in self._entries(key))

    def predict(self, config: Config, *, batch: int, device_type: str, precision: str,
                gradient_checkpointing: bool | None = None, train: bool = True,
                compile_mode: str | None = None, strategy: str = "none", world_size: int = 1,
                local_world_size: int | None = None, cpu_offload: bool = False,
                tensor: int = 1, part: tuple | None = None,
                pipeline_terms: Callable[[int, int], dict[str, int]] | None = None) -> Prediction:
        parallel = parallel_key(strategy, world_size, local_world_size, cpu_offload, device_type, tensor)
        config, part = _part(config, part)
        trace = self._step(config, device_type=device_type, precision=precision,
                           gradient_checkpointing=gradient_checkpointing, train=train, parallel=parallel,
                           part=part)[1](batch)
        ckpt = config.gradient_checkpointing if gradient_checkpointing is None else gradient_checkpointing
        overheads = {**device_overheads(trace, device_type, compile_mode if train else None,
                                        checkpointed=ckpt and train, precision=precision),
                     **parallel_overheads(trace, config, strategy=strategy, world_size=world_size,
                                          cpu_offload=bool(parallel and parallel["cpu_offload"]), train=train,
                                          device_type=device_type, tensor=tensor),
                     **pipeline_overheads(trace, pipeline_terms if train else None)}
        return Prediction(batch, device_type, trace, overheads, strategy=strategy, world_size=world_size)

    def state_floor(self, config: Config) -> int:
        """Bytes one process holding the whole model keeps whatever the batch, precision or checkpointing: its
        parameters as built, the trainable ones' gradients and the optimizer's state for them (Adam's two
        tensors, SGD's momentum; a custom optimizer's counted as none). A lower bound of every trained step's
        peak (the traces hold exactly these, beside the activations), from the model built on the meta device:
        no trace. The parameter bytes are kept per model for the process."""
        import torch

        from ..task import task_once
        from .cache import model_fingerprint

        model_key = json.dumps(model_fingerprint(config), sort_keys=True)
        if model_key not in self._floors:
            try:
                task = task_once(config, model_key)  # loaded outside: its data must not be made on meta
                with torch.device("meta"):
                    model = task.build(False)
            except KfitError:
                raise
            except Exception:  # noqa: BLE001 - a custom factory that cannot build on meta: no floor, the traces say
                self._floors[model_key] = (0, 0)
                return 0
            unique = {id(p): p for p in model.parameters()}.values()  # a tied weight once
            self._floors[model_key] = (sum(p.numel() * p.element_size() for p in unique),
                                       sum(p.numel() * p.element_size() for p in unique if p.requires_grad))
        held, trainable = self._floors[model_key]
        if not held:
            return 0
        # a custom optimizer's state is unknown until traced: none, for a floor
        state = 0 if config.optimizer == "custom" else optimizer_state_bytes(config, trainable)
        return held + trainable + state

    def curve(self, config: Config, *, device_type: str, precision: str, train: bool = True,
              compile_mode: str | None = None, plus: int = 0, strategy: str = "none", world_size: int = 1,
              local_world_size: int | None = None, cpu_offload: bool = False,
              tensor: int = 1, part: tuple | None = None,
              pipeline_terms: Callable[[int, int], dict[str, int]] | None = None) -> "StepCurve":
        """The predicted peak (device and strategy terms and `plus` bytes included) against the batch size,
        starting from every batch size already in the cache: the planner searches on it."""
        parallel = parallel_key(strategy, world_size, local_world_size, cpu_offload, device_type, tensor)
        config, part = _part(config, part)
        key, step = self._step(config, device_type=device_type, precision=precision, gradient_checkpointing=None,
                               train=train, parallel=parallel, part=part)
        offload = bool(parallel and parallel["cpu_offload"])
        deep = not self.full_depth and depth_of(config, parallel is not None) is not None
        return StepCurve(step, [int(b) for b in list(self._entries(key))], device_type=device_type, deep=deep,
                         compile_mode=compile_mode if train else None, plus=plus,
                         checkpointed=config.gradient_checkpointing and train, precision=precision,
                         strategy_terms=lambda trace: {**parallel_overheads(
                             trace, config, strategy=strategy, world_size=world_size, cpu_offload=offload,
                             train=train, device_type=device_type, tensor=tensor),
                             **pipeline_overheads(trace, pipeline_terms if train else None)},
                         strategy=strategy, world_size=world_size)


# --------------------------------------------------------------------------
# A traced step's peak against the batch size (curve.py's PeakCurve, with the device terms)


class StepCurve(PeakCurve):
    """The PeakCurve of a traced step: a point is a trace (peak, then its breakdown), and a point read off
    a proven line is that trace interpolated, so the plan's figures at any batch there cost no trace."""

    def __init__(self, step: Callable[[int], Trace], batches: list[int], *, device_type: str,
                 compile_mode: str | None, plus: int = 0, checkpointed: bool = False, precision: str | None = None,
                 strategy_terms: Callable[[Trace], dict[str, int]] | None = None, strategy: str = "none",
                 world_size: int = 1, deep: bool = False) -> None:
        self._traces: dict[int, Trace] = {}
        # a deep transformer's step (depth.py scales it): at a long context even micro-batch 1 may not fit, so
        # the planner's search tries 1 before the per-process share (largest_fitting's low_first)
        self.deep = deep
        self._device_type, self._compile_mode, self._plus = device_type, compile_mode, plus
        self._overheads = {"checkpointed": checkpointed, "precision": precision}
        self._strategy_terms = strategy_terms or (lambda trace: {})
        self._strategy, self._world_size = strategy, world_size
        self._keys: list[str] = []  # the breakdown's categories, in CATEGORIES order

        def measure(batch: int) -> Vector:
            trace = self._traces[batch] = step(batch)
            self._keys = self._keys or sorted(trace.breakdown, key=lambda k: (
                CATEGORIES.index(k) if k in CATEGORIES else len(CATEGORIES), k))
            return (trace.peak_bytes, *(trace.breakdown[k] for k in self._keys))

        super().__init__(measure, {b: measure(b) for b in batches})

    def trace(self, batch: int) -> Trace:
        vector = self.vector(batch)
        # a point read off a line: the parameters, features and evaluation split are those of any trace
        template = self._traces.get(batch) or replace(next(iter(self._traces.values())), batch=batch, seconds=0.0,
                                                      allocator_holes=self._holes(batch),
                                                      segments=self._segments(batch))
        return replace(template, peak_bytes=vector[0], breakdown=dict(zip(self._keys, vector[1:])))

    def _holes(self, batch: int) -> int | None:
        """The allocator's holes read off a line: interpolated between its traced ends (None off a line)."""
        a, b = self._run(batch, batch) or (0, 0)
        ha, hb = (getattr(self._traces.get(end), "allocator_holes", None) for end in (a, b))
        return None if ha is None or hb is None else ha + (hb - ha) * (batch - a) // (b - a)

    def _segments(self, batch: int) -> tuple[dict, ...]:
        """The step's segments read off a line: each figure interpolated between its traced ends (() off a
        line, or where the ends were traced in other segments)."""
        a, b = self._run(batch, batch) or (0, 0)
        ends = [getattr(self._traces.get(end), "segments", None) for end in (a, b)]
        if not ends[0] or not ends[1] or len(ends[0]) != len(ends[1]) or a == b:
            return ()

        def at(x: int, y: int) -> int:
            return x + (y - x) * (batch - a) // (b - a)
        return tuple({"peak_bytes": at(sa["peak_bytes"], sb["peak_bytes"]),
                      "breakdown": {k: at(v, sb["breakdown"].get(k, 0)) for k, v in sa["breakdown"].items()}}
                     for sa, sb in zip(*ends))

    def prediction(self, batch: int) -> Prediction:
        trace = self.trace(batch)
        overheads = {**device_overheads(trace, self._device_type, self._compile_mode, **self._overheads),
                     **self._strategy_terms(trace)}
        return Prediction(batch, self._device_type, trace, overheads, strategy=self._strategy,
                          world_size=self._world_size)

    def at(self, batch: int) -> int:
        return self.prediction(batch).peak_bytes + self._plus
