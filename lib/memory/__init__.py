"""The memory predictor: the peak bytes of one training step, before running one.

    trace.py     the fake-tensor trace of one step (what is traced, how, and its breakdown)
    cache.py     where traces are cached and the fingerprint that keys them
    predict.py   the device's own overhead terms, Prediction, MemoryPredictor, largest_fitting
"""

from .cache import FORMAT, default_cache_dir, fingerprint, model_fingerprint
from .predict import (
    ATTENTION_WORKSPACE_SHARE, BLAS_HANDLES, BLAS_LT_WORKSPACE_BYTES, BLAS_WORKSPACE_BYTES, FRAGMENTATION_BASE_BYTES,
    FRAGMENTATION_SHARE, MemoryPredictor, Prediction, device_overheads, fragmentation_share, largest_fitting,
)
from .trace import CATEGORIES, MiB, Trace, conv_workspace, step_optimizer, trace_step, training_steps

__all__ = [
    "ATTENTION_WORKSPACE_SHARE", "BLAS_HANDLES", "BLAS_LT_WORKSPACE_BYTES", "BLAS_WORKSPACE_BYTES", "CATEGORIES",
    "FORMAT", "FRAGMENTATION_BASE_BYTES", "FRAGMENTATION_SHARE", "MiB", "MemoryPredictor", "Prediction", "Trace",
    "conv_workspace", "default_cache_dir", "device_overheads", "fingerprint", "fragmentation_share", "largest_fitting", "model_fingerprint", "step_optimizer", "trace_step", "training_steps",
]
