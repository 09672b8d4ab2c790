"""Autocast for a step traced on CPU fake tensors for a target device.

Fake tensors live on the CPU (trace.py's docstring), so a trace runs under CPU
autocast. For matmul, linear, convolution and SDPA the CPU and CUDA cast lists
agree, but CUDA's autocast also runs a list of ops in float32 that CPU's leaves
in the input's dtype: layer_norm, group_norm, softmax, log_softmax, exp, log,
pow, rsqrt, sum and others. With fp32 parameters these ops see fp32 inputs
anyway (the residual stream stays fp32), so nothing differs; with bf16
parameters -- FSDP2's MixedPrecisionPolicy, or a model kept in bf16 -- the
residual stream is bf16, and CUDA saves fp32 copies where CPU saves bf16 ones.
Measured on an H100 (torch 2.11, GPT-2 124M, bf16, FSDP at one process,
micro-batch 8; docs/validation/diagnostics-2026-11-23/fsdp_diag.py): the
layer norms' saved tensors were 577.6 MiB against 288.8 MiB in the CPU-autocast
trace, and the whole step's activations 2598 MiB (FSDPMemTracker on the real
step) against 2309 MiB traced.

`CudaCastLists` is a TorchFunctionMode that, while CPU autocast is on, makes
those casts: the fp32 ops get float32 inputs, the ops CUDA runs with an fp32
output dtype get dtype=float32. The lists are CUDA's (aten/src/ATen/autocast_mode.cpp,
"fp32" and "fp32_set_opt_dtype") restricted to ops a training step meets.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map_only

LOW = (torch.bfloat16, torch.float16)

# CUDA autocast's "fp32" list: inputs cast to float32
FP32_INPUTS = frozenset(filter(None, (
    F.layer_norm, F.group_norm, torch.layer_norm, torch.group_norm, F.softplus, F.mse_loss, F.l1_loss,
    F.smooth_l1_loss, F.huber_loss, F.kl_div, F.nll_loss, F.binary_cross_entropy_with_logits,
    F.cosine_similarity, F.poisson_nll_loss, F.cosine_embedding_loss, F.margin_ranking_loss, F.hinge_embedding_loss,
    F.soft_margin_loss, F.triplet_margin_loss, F.multi_margin_loss, F.multilabel_margin_loss, F.interpolate,
    torch.exp, torch.Tensor.exp, torch.log, torch.Tensor.log, torch.log2, torch.log10, torch.log1p, torch.Tensor.log1p,
    torch.expm1, torch.Tensor.expm1, torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.rsqrt,
    torch.Tensor.rsqrt, torch.reciprocal, torch.Tensor.reciprocal, torch.logsumexp, torch.Tensor.logsumexp,
    torch.cdist, torch.dist, torch.renorm, torch.acos, torch.asin, torch.cosh, torch.sinh, torch.tan, torch.erfinv,
    getattr(F, "rms_norm", None),
)))
# "fp32_set_opt_dtype": run with dtype=float32 (no float32 copy of the input)
FP32_OUTPUT = frozenset((
    F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, torch.Tensor.softmax, torch.Tensor.log_softmax,
    torch.cumsum, torch.Tensor.cumsum, torch.cumprod, torch.Tensor.cumprod, torch.sum, torch.Tensor.sum,
    torch.prod, torch.Tensor.prod,
))


def _to_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in LOW else t


class CudaCastLists(TorchFunctionMode):
    """CUDA autocast's float32 casts, made on CPU tensors while CPU autocast is on (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_autocast_enabled("cpu"):
            if func in FP32_INPUTS:
                args, kwargs = tree_map_only(torch.Tensor, _to_fp32, (args, kwargs))
            elif func in FP32_OUTPUT and kwargs.get("dtype") is None and args and \
                    isinstance(args[0], torch.Tensor) and args[0].dtype in LOW:
                kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)


class TracedAutocast:
    """The autocast of `precision` on `device_type`, for a step traced on CPU tensors; reusable (a training
    step enters it once per micro-batch)."""

    def __init__(self, precision: str, device_type: str) -> None:
        self.precision, self.device_type = precision, device_type
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        if self.precision != "fp32":
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            self._stack.enter_context(torch.autocast("cpu", dtype=dtype))
            if self.device_type == "cuda":
                self._stack.enter_context(CudaCastLists())
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)
