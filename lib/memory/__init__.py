"""The memory predictor: the peak bytes of one training step, per process, before running one.

    trace.py     the fake-tensor trace of one process's step (what is traced, how, and its breakdown);
                 a DDP rank runs the same step
    fake.py      the fake copy of a model every fake-tensor trace starts from (also lib/steptime/count.py's)
    sharded.py   the per-process trace of a sharded step (FSDP2: fsdp, fsdp_grad_op, hsdp) at a world
                 size, with FSDPMemTracker and the fake process group
    sharded_process.py  the child process that runs sharded.py's trace (ShardedTracer, its parent's side)
    cache.py     where traces are cached and the fingerprint that keys them (the strategy, world size,
                 mesh and CPU offload only for a sharded step)
    predict.py   the device's own overhead terms, the strategy's (DDP's buffers, CPU offload),
                 Prediction, MemoryPredictor, StepCurve
    curve.py     a peak against the batch size (PeakCurve: exact on proven lines), largest_fitting

MemoryPredictor.trace / predict / curve / cached_batches take the data-parallel setup as keywords,
`strategy="none"`, `world_size=1`, `local_world_size=None` (= world_size: one machine) and
`cpu_offload=False`; the defaults give one process's step, as before.
"""

from .cache import FORMAT, default_cache_dir, fingerprint, model_fingerprint, parallel_key
from .curve import largest_fitting
from .predict import (
    ATTENTION_WORKSPACE_SHARE, BLAS_HANDLES, BLAS_LT_WORKSPACE_BYTES, BLAS_WORKSPACE_BYTES, FRAGMENTATION_BASE_BYTES,
    FRAGMENTATION_SHARE, MemoryPredictor, Prediction, device_overheads, fragmentation_share, optimizer_state_bytes,
    parallel_overheads,
)
from .sharded import trace_sharded_step
from .sharded_process import ShardedTracer
from .trace import CATEGORIES, MiB, Trace, step_optimizer, trace_step, training_steps
from .workspace import conv_workspace

__all__ = [
    "ATTENTION_WORKSPACE_SHARE", "BLAS_HANDLES", "BLAS_LT_WORKSPACE_BYTES", "BLAS_WORKSPACE_BYTES", "CATEGORIES",
    "FORMAT", "FRAGMENTATION_BASE_BYTES", "FRAGMENTATION_SHARE", "MiB", "MemoryPredictor", "Prediction",
    "ShardedTracer", "Trace", "conv_workspace", "default_cache_dir", "device_overheads", "fingerprint",
    "fragmentation_share", "largest_fitting", "model_fingerprint", "optimizer_state_bytes", "parallel_key",
    "parallel_overheads", "step_optimizer", "trace_sharded_step", "trace_step", "training_steps",
]
