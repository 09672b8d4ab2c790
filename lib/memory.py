"""The memory predictor: the peak bytes of one training step, before running one.

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
  * `device_overheads` adds the named terms a trace cannot see (below).

Device overheads (CUDA and ROCm; all zero on CPU and MPS, where glibc/Metal
hand memory straight back and the bench measures no gap):
  cuda_context           0: free memory is measured after our context exists
                          (lib.hardware uses mem_get_info; the catalog subtracts
                          gpu_catalog.CONTEXT_RESERVE_BYTES), so it is already
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

Traces are cached as JSON under $KFIT_CACHE_DIR, else $XDG_CACHE_HOME/kfit,
else ~/.cache/kfit, keyed by a fingerprint of everything that changes the
result (`fingerprint`): the model's config fields, precision, optimizer,
checkpointing, device type, the torch version and a hash of kfit's own model,
task, trainer and tracer code. A custom model's key includes a hash of its
module's source, so editing the factory file invalidates its traces.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch

from .config import Config

FORMAT = 1  # bump when the traced step changes: old cache entries then stop matching
MiB = 2**20

# MemTracker's categories -> ours.
_CATEGORIES = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients",
               "Optstate": "optimizer_state", "Activation": "activations", "Temp": "temporaries",
               "Workspace": "workspace", "Other": "other"}
CATEGORIES = (*_CATEGORIES.values(), "batch")

BLAS_WORKSPACE_BYTES = 32 * MiB
ATTENTION_WORKSPACE_SHARE = 0.02
FRAGMENTATION_SHARE = 0.10


def default_cache_dir() -> Path:
    if os.environ.get("KFIT_CACHE_DIR"):
        return Path(os.environ["KFIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kfit"


# --------------------------------------------------------------------------
# What a trace depends on


def _file_hash(path: str | os.PathLike | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _code_hash() -> str:
    """kfit's own code that shapes a trace: this tracer, the optimizer and loss, the built-in models."""
    lib = Path(__file__).resolve().parent
    files = [lib / "memory.py", lib / "step.py", lib / "task.py", *sorted((lib / "models").glob("*.py"))]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def model_fingerprint(config: Config) -> dict:
    """The config fields that decide the model's shapes (and so its traces), never the data's contents."""
    fp: dict = {"model": config.model}
    if config.model == "gpt2":
        fp.update(preset=config.gpt2_preset, block_size=config.gpt2_block_size,
                  dropout=bool(config.gpt2_dropout),  # masks are saved for backward only when > 0
                  # the vocabulary: 256 bytes for the embedded text, meta.json (or GPT-2's) for a corpus
                  corpus=(None if config.dataset != "dir" else
                          _file_hash(Path(config.data_dir or "") / "meta.json") or "gpt2-vocab"))
    elif config.model == "custom":
        from .models.custom import load_factory

        factory = load_factory(config.custom_model_factory)
        fp.update(factory=config.custom_model_factory,
                  source=_file_hash(inspect.getsourcefile(inspect.getmodule(factory)) or ""))
    else:  # image models: channels and classes come from the data set's format
        fp.update(image_size=config.image_size,
                  data=config.dataset_format if config.dataset == "dir" else "digits")
    return fp


def fingerprint(config: Config, *, device_type: str, precision: str, gradient_checkpointing: bool,
                train: bool) -> tuple[str, dict]:
    """(hash, contents) of everything but the batch size that changes a trace."""
    key = {"format": FORMAT, "torch": torch.__version__, "code": _code_hash(), "model": model_fingerprint(config),
           "device_type": device_type, "precision": precision, "train": train}
    if train:  # evaluation runs no backward and no optimizer
        key.update(gradient_checkpointing=gradient_checkpointing, optimizer=config.optimizer,
                   momentum=bool(config.sgd_momentum), weight_decay=config.weight_decay > 0,
                   grad_clip=config.grad_clip > 0)
    text = json.dumps(key, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24], key


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
    from .step import make_optimizer

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

    from .step import autocast_for

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
    from .task import load_task

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
