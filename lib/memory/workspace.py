"""Kernel workspaces: scratch a kernel allocates and frees inside one op, which a trace cannot see.

The trace sees only an op's inputs and outputs; these functions add what the kernel torch really runs
holds meanwhile (trace.py and sharded.py count it at the moment the op runs). The CPU rules were
measured with torch.profiler on torch 2.13 (oneDNN 3.12), AVX-512 and AVX2 (ONEDNN_MAX_CPU_ISA=AVX2).
"""

from __future__ import annotations

import functools
import math
import platform

import torch

@functools.lru_cache(maxsize=1)
def _onednn() -> tuple[bool, bool, int]:
    """(bf16 conv through oneDNN, fp16 conv through oneDNN, channel block of its layouts) on this CPU.

    torch sends bf16/fp16 convolutions to oneDNN only where oneDNN supports the
    type (x86: AVX-512 core or AVX2-VNNI-2, as it reads the CPU and
    ONEDNN_MAX_CPU_ISA), else to its own im2col kernels. oneDNN's blocked
    layouts pad channels to 16 with AVX-512, to 8 below it.
    """
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        fp16 = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        bf16 = fp16 = False
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512") and bf16
    return bf16, fp16, 16 if avx512 or not x86 else 8


def cpu_kernels_key() -> dict:
    """What of this CPU decides the convolution paths a CPU trace modelled: for a trace cache key."""
    bf16, fp16, block = _onednn()
    # the threads too: the im2col backward keeps one column buffer per thread (cpu_conv_workspace), and
    # 1x1 filters take oneDNN only when multi-threaded, so a trace at 1 thread is not one at 2
    return {"onednn": bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
            "onednn_bf16": bf16, "onednn_fp16": fp16, "block": block,
            "nnpack": bool(torch.backends.nnpack.is_available() and _nnpack_enabled()),
            "threads": torch.get_num_threads()}


def _nnpack_enabled() -> bool:
    getter = getattr(torch._C, "_get_nnpack_enabled", None)  # torch.backends.nnpack.flags() sets it
    return bool(getter()) if getter else True


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _padded(t: torch.Tensor, block: int) -> int:
    """Bytes of `t` in a layout whose channels (dimension 1) are padded to a multiple of `block`."""
    channels = t.shape[1]
    return t.numel() // max(channels, 1) * (-(-channels // block) * block) * t.element_size()


def cpu_conv_path(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, transposed: bool,
                  output_padding, groups: int) -> str:
    """The kernel torch's convolution picks on a CPU (ConvParams::use_mkldnn, use_nnpack, _select_conv_backend).

    "onednn", "nnpack" (fp32 at batch >= 16 when oneDNN does not take it), "dilated"
    (torch's per-sample im2col kernels), "im2col" (batched im2col: `_slow_conv2d`,
    `slow_conv3d`) or "transposed".
    """
    dilated = any(d != 1 for d in dilation)
    if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled and not (
            transposed and any(p >= s for p, s in zip(output_padding, stride))):
        bf16, fp16, _ = _onednn()
        if x.dtype in (torch.bfloat16, torch.float16) and (bf16 if x.dtype == torch.bfloat16 else fp16):
            return "onednn"
        n, kw, kh = x.shape[0], weight.shape[-1], weight.shape[-2]
        strided = any(s != 1 for s in stride)
        # torch: 1x1 filters go to oneDNN only when multi-threaded; tiny single samples stay native
        if x.dtype == torch.float32 and (
                strided or dilated or n >= 16 or kw != 1 or kh != 1 or torch.get_num_threads() > 1) and (
                groups > 1 or (kw > 3 and kh > 3) or n > 1 or x.numel() > 20480):
            return "onednn"
    if transposed:
        return "transposed"
    if x.dim() == 4 and dilated:
        return "dilated"
    if (x.dim() == 4 and x.dtype == torch.float32 and torch.backends.nnpack.is_available() and _nnpack_enabled()
            and max(weight.shape[2:]) < 17 and all(p < k for p, k in zip(padding, weight.shape[2:]))
            and x.shape[0] >= 16):
        return "nnpack"
    return "dilated" if x.dim() == 5 and dilated else "im2col"


def _columns(x: torch.Tensor, weight: torch.Tensor, out_shape, stride, padding, per_sample: bool = False) -> int:
    """The im2col buffer: C_in*kH*kW x H_out*W_out per sample, in the input's dtype (none for a plain 1x1)."""
    kernel = weight.shape[2:]
    if all(k == 1 for k in kernel) and all(s == 1 for s in stride) and all(p == 0 for p in padding):
        return 0  # the input itself is the column matrix
    size = x.shape[1] * math.prod(kernel) * math.prod(out_shape[2:]) * x.element_size()
    return size if per_sample else size * x.shape[0]


def cpu_conv_workspace(name: str, args, out) -> int:
    """Scratch of one CPU convolution (forward or backward), on the path torch takes (`cpu_conv_path`).

    oneDNN (`aten::mkldnn_convolution` and its backward): operands are reordered
    into blocked layouts with channels padded to the block (16 with AVX-512, 8
    below) and the results reordered back to torch's plain layout. Forward: the
    blocked output, plus the blocked input and weight while it runs (an input of
    fewer than 8 channels is read as it is). Backward, the largest of its phases:
    input gradient (blocked grad_output + weight + blocked grad_input, then the
    blocked grad_input beside the plain one, and a second copy for a strided
    convolution), and weight gradient (blocked grad_output + the input in blocks of
    8 below 16 channels, none for one channel with AVX-512 + the blocked weight,
    and for bf16/fp16 an fp32 accumulator of the weight's size; then the blocked
    weight gradient beside the plain one).
    im2col (`aten::_slow_conv2d_*`: bf16 where oneDNN has no bf16 kernels, e.g.
    AVX2-only CPUs): forward and the weight gradient unfold the input into
    columns, C_in*kH*kW x H_out*W_out per sample, for the whole batch; the input
    gradient uses one per-sample column buffer per thread; the bias gradient of a
    bf16/fp16 grad_output sums an fp32 copy of it.
    nnpack (fp32 without oneDNN): the forward's workspace is NNPACK's own, kept per
    thread (not counted); the backward runs the dilated kernel.
    dilated: one per-sample column buffer, forward and backward.
    transposed: not modelled beyond a weight-sized buffer.
    channels-last input (oneDNN without reorders: ConvNeXt's activations): `_channels_last_workspace`.
    """
    backward = "backward" in name
    if backward:
        grad_out, x, weight = args[0], args[1], args[2]
        stride, padding, dilation, transposed, output_padding, groups, mask = args[4:11]
        out_shape = grad_out.shape
    else:
        x, weight = args[0], args[1]
        stride, padding, dilation, transposed, output_padding, groups = args[3:9]
        out_shape = out.shape
    if x.dim() < 3:
        return 0
    path = cpu_conv_path(x, weight, stride, padding, dilation, transposed, output_padding, groups)
    if path == "transposed":
        return _bytes(weight)
    # torch's own kernels have no groups: it runs one group at a time (a group's channels, so its columns are
    # 1/groups of the whole) and keeps each group's result until it concatenates them: forward, the outputs;
    # backward, the input and weight gradients
    pieces = 0 if groups == 1 else (
        (_bytes(x) if mask[0] else 0) + (_bytes(weight) if mask[1] else 0) if backward else _bytes(out))
    if path in ("nnpack", "dilated"):
        if path == "nnpack" and not backward:
            return 0
        return _columns(x, weight, out_shape, stride, padding, per_sample=True) // groups + pieces
    if path == "im2col":
        columns = _columns(x, weight, out_shape, stride, padding) // groups
        if not backward:
            return columns + pieces
        phases = [columns if mask[1] else 0]
        if mask[0]:
            phases.append(torch.get_num_threads() * _columns(x, weight, out_shape, stride, padding,
                                                             per_sample=True) // groups)
        if mask[2] and grad_out.dtype != torch.float32:
            phases.append(grad_out.numel() * 4)
        return max(phases) + pieces
    _, _, block = _onednn()
    w = _bytes(weight)
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return _channels_last_workspace(grad_out if backward else None, weight, groups, mask if backward else None,
                                        block)
    if not backward:
        src = _padded(x, block) if x.shape[1] >= 8 else 0
        dst = _padded(out, block)
        return max(src + w + dst - _bytes(out), dst)
    gi = _bytes(x) if mask[0] else 0
    gw = w if mask[1] else 0
    go = _padded(grad_out, block)
    phases = [0]
    if mask[0]:
        blocked_gi = _padded(x, block)
        phases.append(go + w + blocked_gi - gi - gw)
        phases.append(blocked_gi + (gi if any(s != 1 for s in stride) else 0) - gw)
    if mask[1]:
        channels = x.shape[1]
        src = 0 if channels == 1 and block == 16 else _padded(x, 8 if channels < 16 else block)
        accumulator = weight.numel() * 4 if weight.dtype != torch.float32 else 0
        phases.append(go + src + w + accumulator - gw)
        phases.append(w)  # the blocked weight gradient, beside the plain one it is reordered into
    return max(phases)


# oneDNN's weight gradient of a grouped channels-last convolution with a kernel wider than 3 (ConvNeXt's
# depthwise 7x7): scratch per group and kernel tap, whatever the batch, image size or threads, plus in half
# precision some per group and an fp32 copy of grad_output. Measured with torch.profiler, torch 2.13,
# AVX-512, groups 32-512, kernels 1x7 to 11x11, batch 1-64, 2-32 px: fp32 exactly 1,028 bytes a tap; bf16
# 1,536 a tap + 1-6 KiB a group (more at small batches and odd sizes: 6 KiB is taken, so the rule is never
# under and at most 28% over on the op's own allocations, 0.2 MiB there) (ConvNeXt's 128-channel 7x7 at batch
# 16: 9.4 MiB in bf16, 6.3 in fp32).
GROUPED_TAP_BYTES = {"fp32": 1028, "half": 1536}
HALF_GROUP_BYTES = 6 * 1024


def _channels_last_workspace(grad_out: torch.Tensor | None, weight: torch.Tensor, groups: int, mask,
                             block: int) -> int:
    """Scratch of a convolution whose input is channels-last (oneDNN takes the activations as they are):
    forward, a weight-sized buffer. Backward, the larger phase: the input gradient holds 2 weights' worth;
    the weight gradient 2 plus one in oneDNN's blocked layout (both channel counts padded to the block; an
    fp32 accumulator of that size in half precision), or for a grouped convolution with a kernel wider than 3
    the per-tap buffers above (narrower ones keep a few bytes a tap). Measured: fp32 3.00 weights at 64-128
    channels, 3.78 at 24; bf16 3.07-3.5 at 64-128 (4 modelled), 5.67 at 24 (5.56)."""
    w = _bytes(weight)
    if grad_out is None:
        return w
    half = weight.dtype != torch.float32
    phases = [2 * w if mask[0] else 0]
    if mask[1]:
        if groups > 1 and weight.shape[-1] > 3:
            taps = math.prod(weight.shape[2:])
            phases.append(groups * taps * GROUPED_TAP_BYTES["half" if half else "fp32"]
                          + (groups * HALF_GROUP_BYTES + grad_out.numel() * 4 if half else 0))
        else:
            padded = math.prod(-(-n // block) * block for n in weight.shape[:2]) * math.prod(weight.shape[2:])
            phases.append(2 * w + padded * 4 if half else 2 * w + padded * weight.element_size())
    return max(phases)


def promotion_workspace(func, args) -> int:
    """CPU pointwise ops on floating tensors of mixed dtypes (fp32 + bf16 under autocast) copy each input
    into the common dtype first (TensorIterator; CUDA kernels cast on the fly): one temporary per such input.
    Measured for add, sub, mul, div, where and in-place add_; masks and indices (bool, int) are left out."""
    if torch.Tag.pointwise not in getattr(func, "tags", ()):
        return 0
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() > 0  # 0-dim: a scalar, no copy
               and a.dtype.is_floating_point]
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) < 2:
        return 0
    common = functools.reduce(torch.promote_types, dtypes)
    return sum(t.numel() * common.itemsize for t in tensors if t.dtype != common)


def conv_workspace(func, args, device_type: str, out=None) -> int:
    """Scratch memory a convolution kernel allocates and frees inside one op; the trace sees only outputs.

    CPU: `cpu_conv_workspace`, on the path torch takes on this CPU.
    CUDA (cuDNN, an estimate): the algorithm cudnn.benchmark picks is allowed a
    workspace about the size of its largest operand.
    """
    name = str(func)
    if "convolution" not in name:
        return 0
    if device_type == "cuda":
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return max((_bytes(t) for t in tensors), default=0)
    if out is None and "backward" not in name:
        return 0
    return max(0, cpu_conv_workspace(name, args, out))


def kernel_workspace(func, args, out, device_type: str) -> int:
    """What one op's kernel holds beyond its inputs and outputs while it runs, on `device_type`."""
    extra = conv_workspace(func, args, device_type, out)
    if device_type == "cpu" and not extra:
        extra = promotion_workspace(func, args)
    return extra
