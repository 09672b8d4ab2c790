"""What a trace depends on, and where traces are kept.

Traces are cached as JSON under $KFIT_CACHE_DIR, else $XDG_CACHE_HOME/kfit,
else ~/.cache/kfit, keyed by a fingerprint of everything that changes the
result (`fingerprint`): the model's config fields, precision, optimizer,
checkpointing, device type, the torch version and a hash of kfit's own model,
task, step (lib/step.py: optimizer, autocast) and tracer code. A custom
model's key includes a hash of its module's source, so editing the factory
file invalidates its traces.

A cache file is read by `read_traces` only: never through a symlink, every field of every trace
checked; a damaged or foreign file (or a directory, a link in its place) is one note naming it
(lib.fileio.cache_note) and a cache miss, never a traceback. `write_traces` writes one (with
"schema": SCHEMA, never through a link; a read-only cache only costs time).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import torch

from ..config import Config
from ..env import cache_dir
from ..fileio import UnsafeFileError, cache_note, is_number, read_json_cache, sweep_temporaries, write_cache_file

FORMAT = 1  # bump when the traced step changes: old cache entries then stop matching
SCHEMA = 1  # the file's own structure ({"key", "traces", "affine"}); a file without one is taken as 1


def default_cache_dir() -> Path:
    return cache_dir()


def read_traces(path: Path) -> dict[str, dict]:
    """A cache file's traces by batch size, each as Trace.to_json wrote it; {} when the file is missing,
    damaged or of another structure (an older kfit's, edited by hand; noted, naming the file): a cache
    miss, so the step is traced again and the file replaced, where a wrong entry would fail later."""
    data = read_json_cache(path, SCHEMA)
    if data is None:
        return {}
    try:
        traces = data["traces"]
        if not isinstance(traces, dict):
            raise ValueError("traces is not an object")
        for batch, entry in traces.items():
            check_trace(batch, entry)
        return traces
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        cache_note(path, f"invalid ({type(err).__name__}: {err})", then="dropped; traced again")
        return {}


def check_trace(batch: str, entry) -> None:
    """ValueError unless `entry` is a whole Trace.to_json of batch size `batch` with every field's type."""
    from .trace import Trace

    if not isinstance(entry, dict) or not str(batch).isdigit():
        raise ValueError(f"entry {batch!r} is not a trace")
    trace = Trace.from_json(entry)
    counts = (trace.batch, trace.peak_bytes, trace.parameters, trace.eval_samples)
    if (int(batch) != trace.batch or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                             for v in (*counts, *trace.breakdown.values()))
            or not isinstance(trace.breakdown, dict) or not all(isinstance(k, str) for k in trace.breakdown)
            or not all(isinstance(f, str) for f in trace.features) or not is_number(trace.seconds)
            or not (trace.allocator_holes is None or isinstance(trace.allocator_holes, int))):
        raise ValueError(f"entry {batch!r} has a field of the wrong type")


def write_traces(path: Path, contents: dict) -> None:
    """A cache file's {"key", "traces", "affine"} with the schema, atomically and never through a link; a
    read-only cache (or a link planted in its place: noted) only costs time."""
    try:
        write_cache_file(path, json.dumps({**contents, "schema": SCHEMA}, sort_keys=True).encode())
    except UnsafeFileError as err:
        cache_note(path, str(err).split(": kfit")[0], then="not updated")
    except OSError:
        return
    sweep_temporaries(path.parent)


@functools.lru_cache(maxsize=4)
def _code_hash(sharded: bool = False, pipeline: bool = False) -> str:
    """kfit's own code that shapes a trace: this package, the optimizer and loss, the built-in models;
    for a sharded trace also the strategies' shard_model (lib/parallel.py), else not sharded*.py; for a
    pipeline process's, the cut (lib/pipeline.py)."""
    package = Path(__file__).resolve().parent
    lib = package.parent
    own = sorted(p for p in package.glob("*.py") if sharded or not p.name.startswith("sharded"))
    files = [*own, lib / "step.py",
             lib / "task.py", *sorted((lib / "models").glob("*.py")), *([lib / "parallel.py"] if sharded else []),
             *([lib / "pipeline.py"] if pipeline else [])]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def model_fingerprint(config: Config) -> dict:
    """The config fields that decide the model's shapes (and so its traces), never the data's contents: with
    the parameters CONFIG_FREEZE freezes and the blocks CONFIG_CHECKPOINT_MODULES checkpoints (left out where
    empty, so the keys of configs without them stay as they were)."""
    from ..models.registry import shape_key

    fp = shape_key(config)  # each family's own fields (lib/models/registry.py)
    if config.freeze:  # frozen parameters have no gradients and no optimizer state
        fp.update(freeze=list(config.freeze))
    return fp


def parallel_key(strategy: str, world_size: int, local_world_size: int | None, cpu_offload: bool,
                 device_type: str, tensor: int = 1) -> dict | None:
    """What of the data-parallel setup changes a trace: None for one process and DDP (a replica, traced as
    one process), else the strategy, world size, mesh and CPU offload (CUDA only: off elsewhere); world sizes
    count data-parallel groups, each of `tensor` processes (CONFIG_TP; "tensor" in the key only above 1, so
    the keys of other traces stay as they were)."""
    from ..parallel import STRATEGIES, is_sharded, mesh_shape

    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    if world_size < 1 or (local_world_size is not None and local_world_size < 1):
        raise ValueError(f"world size {world_size} / local world size {local_world_size} must be >= 1")
    if tensor < 1:
        raise ValueError(f"tensor-parallel degree {tensor} must be >= 1")
    if strategy == "ddp" and tensor > 1:
        raise ValueError("DDP cannot replicate tensor-parallel groups")
    if not is_sharded(strategy) and tensor == 1:
        return None
    local = world_size if local_world_size is None else min(local_world_size, world_size)
    key = {"strategy": strategy, "world_size": world_size, "mesh": list(mesh_shape(strategy, world_size, local)),
           "cpu_offload": bool(cpu_offload and device_type == "cuda")}
    return {**key, "tensor": tensor} if tensor > 1 else key


def traced_precision(precision: str, device_type: str) -> str:
    """The precision as the trace sees it: on CUDA fp16 and bf16 steps hold the same bytes (autocast casts the
    same ops to a 2-byte type either way; fp16's GradScaler keeps a few scalars, not traced), so one trace
    serves both ("half"): a plan matrix traces each half-precision step once for every GPU. Not on a CPU,
    where oneDNN takes bf16 and fp16 convolutions apart (workspace.py)."""
    return "half" if device_type == "cuda" and precision in ("bf16", "fp16") else precision


def fingerprint(config: Config, *, device_type: str, precision: str, gradient_checkpointing: bool,
                train: bool, parallel: dict | None = None, scaled_from: tuple[int, ...] = (),
                part: tuple[bool, bool] | None = None) -> tuple[str, dict]:
    """(hash, contents) of everything but the batch size that changes a trace; `parallel`: parallel_key's;
    `scaled_from`: the depths a deep model's traces are scaled from (depth.py), () for traces of every block;
    `part`: (first, last) of a pipeline process's (lib/pipeline.py traced_part), None for the whole model."""
    key = {"format": FORMAT, "torch": torch.__version__, "code": _code_hash(parallel is not None, part is not None),
           "model": model_fingerprint(config), "device_type": device_type,
           "precision": traced_precision(precision, device_type), "train": train}
    if parallel is not None:
        key["parallel"] = parallel
    if part is not None:
        key["pipeline_part"] = list(part)
    if scaled_from:
        key["scaled_from"] = list(scaled_from)
    if device_type == "cpu":  # the convolution kernels torch picks (and their scratch) depend on this CPU
        from .workspace import cpu_kernels_key

        key["cpu_kernels"] = cpu_kernels_key()
    if train:  # evaluation runs no backward and no optimizer
        key.update(gradient_checkpointing=gradient_checkpointing,
                   optimizer=config.optimizer if config.optimizer != "custom" else f"custom:{config.optimizer_name}",
                   momentum=bool(config.sgd_momentum), weight_decay=config.weight_decay > 0,
                   grad_clip=config.grad_clip > 0)
    text = json.dumps(key, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24], key

