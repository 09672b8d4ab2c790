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
        if func is torch.Tensor.backward or func is torch.autograd.backward:
            return self._backward(func, args, kwargs)
        if torch.is_autocast_enabled("cpu"):
            if func in FP32_INPUTS:
                args, kwargs = tree_map_only(torch.Tensor, _to_fp32, (args, kwargs))
            elif func in FP32_OUTPUT and kwargs.get("dtype") is None and args and \
                    isinstance(args[0], torch.Tensor) and args[0].dtype in LOW:
                kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)

    def _backward(self, func, args, kwargs):
        """Backward with this mode still on. A mode is off while its handler runs, and so for whatever the
        handler calls: backward called through it would run without the casts, and a checkpointed block's
        recompute (autocast re-entered, these casts not) would save other dtypes than its forward did. The
        engine is called directly, the mode pushed back, so the recompute inside it sees the casts."""
        from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
        from torch.autograd.graph import _engine_run_backward

        if func is torch.Tensor.backward:
            tensors, rest = args[:1], args[1:]
        else:
            tensors, rest = args[0], args[1:]
        names = ("gradient" if func is torch.Tensor.backward else "grad_tensors", "retain_graph", "create_graph")
        options = dict(zip(names, rest), **kwargs)
        grads = options.pop("gradient", options.pop("grad_tensors", None))
        create_graph = bool(options.get("create_graph", False))
        retain_graph = options.get("retain_graph")
        inputs = options.get("inputs")
        tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        inputs = () if inputs is None else (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        grads = _make_grads(tensors, _tensor_or_tensors_to_tuple(grads, len(tensors)), is_grads_batched=False)
        with self:
            _engine_run_backward(tensors, grads, create_graph if retain_graph is None else retain_graph,
                                 create_graph, inputs, allow_unreachable=True, accumulate_grad=True)


class TracedAutocast:
    """The autocast of `precision` on `device_type`, for a step traced on CPU tensors; reusable (a training
    step enters it once per micro-batch).

    `step()` must enclose the whole traced step, backward included. On CUDA the float32 casts are part of
    autocast itself, so a checkpointed block recomputed in backward (torch.utils.checkpoint re-enters the
    autocast state its forward saw) makes them again; here they are a mode beside CPU autocast, and a mode
    entered only around the forward is gone by the time backward recomputes, which then saves bf16 where the
    forward saved fp32 and torch.utils.checkpoint refuses the mismatch. The mode acts only while CPU autocast
    is on, so outside the forward and the recompute it changes nothing."""

    def __init__(self, precision: str, device_type: str) -> None:
        self.precision, self.device_type = precision, device_type
        self._stack: contextlib.ExitStack | None = None

    @property
    def low_precision(self) -> bool:
        return self.precision != "fp32"

    def step(self):
        """CUDA's float32 casts for everything inside, forward and backward (class docstring)."""
        if self.low_precision and self.device_type == "cuda":
            return CudaCastLists()
        return contextlib.nullcontext()

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        if self.low_precision:
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            self._stack.enter_context(torch.autocast("cpu", dtype=dtype))
            self._stack.enter_context(self.step())  # on its own (an evaluation forward): the casts as well
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)


def step_casts(autocast):
    """`autocast.step()` where the step is traced (TracedAutocast), nothing for a real device's autocast."""
    step = getattr(autocast, "step", None)
    return step() if step else contextlib.nullcontext()
