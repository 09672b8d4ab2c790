"""How fast the device is: peak FLOP/s per precision, memory bandwidth, overheads and power.

GPUs: the catalog's datasheet figures (lib/hardware/catalog.py, `Peak`, each
with its source), found by the device's name, with the share of peak a
training step reaches in practice (`GPU_COMPUTE_EFFICIENCY`,
`GPU_BANDWIDTH_EFFICIENCY`) and a host-side cost per dispatched op
(`GPU_OP_OVERHEAD_S`). A GPU the catalog does not know has no figures: plans
there carry no time prediction and keep the largest-divisor micro-batch.

CPUs: measured on this machine by `measure_cpu` (a matmul at fp32 and bf16, a
large copy, and a loop of tiny ops for the per-op dispatch cost; about a
second), cached per CPU, core count, thread count and torch version in
<cache dir>/steptime/cpu-<key>.json. A profile of another machine's CPU
(HW=file) is scaled from this one by its physical core count, and says so.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

from ..errors import HardwareError
from ..hardware import HardwareProfile, catalog
from .cache import cpu_figures, write_json

# What a training step reaches of a GPU's datasheet peak: matmuls at large sizes run at 60-80%
# of the dense tensor-core peak, elementwise kernels at 70-85% of the bandwidth; calibration
# (lib.steptime.calibrate) replaces these guesses with the machine's own ratio after a run.
# Measured by make validate-gpu's diagnostics on an H100 (2026-11-23, torch 2.11, eager, bf16; kernel
# times from torch.profiler): GPT-2 124M's kernels matched 60% / 75% once each kernel's floor is added;
# ResNet-18 and -50's convolutions (32x32 images) ran at 9-10% of the peak; the host spent 26-48 us
# per counted op (a VM's CPU; the median of 20 steps), which made GPT-2-tiny, LeNet-5, ResNet-50 and
# GPT-2 at micro-batch 8 host-bound there.
GPU_COMPUTE_EFFICIENCY = 0.6
GPU_CONV_EFFICIENCY = 0.1  # convolutions' share of the datasheet peak
GPU_BANDWIDTH_EFFICIENCY = 0.75
GPU_KERNEL_FLOOR_S = 6e-6  # device time every kernel takes however small (launch, ramp, tail)
GPU_OP_OVERHEAD_S = 30e-6  # eager PyTorch's host time per dispatched op (kernel launch included)
GPU_STEP_OVERHEAD_S = 1e-3  # the loss's .item(), the learning rate, the data loader hand-off
CPU_STEP_OVERHEAD_S = 2e-4
# torch.compile fuses elementwise chains into few kernels: what remains of eager's bytes (an estimate:
# inductor keeps the matmuls and cuts most intermediate round trips) and of its host time per counted op.
# The host share was measured on an H100 (docs/validation/diagnostics-2026-11-23/phase_times.jsonl, the
# host-bound forward+backward of GPT-2-tiny compiled vs eager): 0.62-0.68 (guards, the compiled graph's
# launches and autograd's own dispatch remain), 1.0 for LeNet-5; it was 0.25, which predicted the compiled
# GPT-2-tiny step at 3.7 ms against 12.4 ms measured. A measured run calibrates either.
COMPILE_MEMORY_FACTOR = 0.4
COMPILE_OPS_FACTOR = 0.7

MEASURE_FORMAT = 1


@dataclass(frozen=True)
class Device:
    """What the step-time model divides counted work by."""

    kind: str  # "gpu" | "cpu"
    name: str
    fp32_flops: float  # FLOP/s reachable in fp32 matmuls
    tf32_flops: float | None
    half_flops: float  # bf16/fp16 (autocast) matmuls
    bandwidth: float  # bytes/s reachable by memory-bound ops
    op_overhead_s: float  # per dispatched op, on the host
    step_overhead_s: float  # per optimizer step
    power_watts: float | None
    source: str  # where the figures come from, for the plan's reasons
    key: str = ""  # the machine (and its thread count), for the caches of measurements and calibrations
    here: bool = False  # a CPU whose figures were measured on it: real steps can be timed here
    conv_efficiency: float = 1.0  # convolutions' FLOP/s over the matmuls' (a CPU's measured ratio covers both)
    kernel_floor_s: float = 0.0  # device time per kernel (a GPU's; on a CPU the op overhead is all of it)

    def flops(self, precision: str, tf32: bool) -> float:
        if precision in ("bf16", "fp16"):
            return self.half_flops
        return self.tf32_flops if tf32 and self.tf32_flops else self.fp32_flops


def gpu_device(name: str) -> Device | None:
    """A catalog GPU's figures, by key, alias or torch name; None when the catalog does not know it."""
    try:
        entry = catalog.lookup(name)
    except HardwareError:
        return None
    peak = entry.peak
    eff, bw = GPU_COMPUTE_EFFICIENCY, GPU_BANDWIDTH_EFFICIENCY
    return Device(kind="gpu", name=entry.name, fp32_flops=peak.fp32_tflops * 1e12 * eff,
                  tf32_flops=peak.tf32_tflops * 1e12 * eff if peak.tf32_tflops else None,
                  half_flops=peak.half_tflops * 1e12 * eff, bandwidth=peak.bandwidth_gbs * 1e9 * bw,
                  op_overhead_s=GPU_OP_OVERHEAD_S, step_overhead_s=GPU_STEP_OVERHEAD_S,
                  conv_efficiency=GPU_CONV_EFFICIENCY / eff, kernel_floor_s=GPU_KERNEL_FLOOR_S,
                  power_watts=float(entry.tdp_watts), key=entry.name,
                  source=f"{entry.key} datasheet peaks x {eff:.0%} compute / {bw:.0%} bandwidth")


# --------------------------------------------------------------------------
# CPUs: measured


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _matmul_flops(dtype, n: int = 768, small: int = 256, call_budget_s: float = 0.1) -> float:
    """A square matmul's FLOP/s: timed at n, unless the small one shows a call at n would take longer than
    call_budget_s (bf16 without native support runs near 1 GFLOP/s: 768 took 4.5 s for six calls, 256 0.15 s
    for the same figure within 6%), where the small size's figure is kept, the kernel then compute-bound."""
    import torch

    flops = 0.0
    for size in (small, n):
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        flops = 2 * size**3 / _best(lambda: torch.mm(a, b), 5)
        if 2 * n**3 / flops > call_budget_s:
            break
    return flops


def measure_cpu() -> dict:
    """Matmul FLOP/s at fp32 and bf16, copy bandwidth and per-op dispatch time on this CPU (about 1 s)."""
    import torch

    started = time.perf_counter()
    result: dict = {"threads": torch.get_num_threads()}
    for key, dtype in (("fp32_flops", torch.float32), ("bf16_flops", torch.bfloat16)):
        result[key] = _matmul_flops(dtype)
    src = torch.empty(2**24)  # 64 MiB: past any cache
    dst = torch.empty_like(src)
    result["bandwidth"] = 2 * src.numel() * src.element_size() / _best(lambda: dst.copy_(src), 5)
    x, y = torch.ones(8), torch.ones(8)

    def tiny_ops():
        for _ in range(500):
            torch.add(x, y)

    result["op_overhead_s"] = _best(tiny_ops, 3) / 500
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result


def _cpu_key(name: str, cores: int) -> str:
    import torch

    text = json.dumps([MEASURE_FORMAT, name, cores, torch.get_num_threads(), torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cpu_device(hardware: HardwareProfile, cache_dir) -> Device:
    """This CPU's measured figures (cached), scaled by core count for another machine's CPU."""
    from ..hardware import detect_cpu

    here = detect_cpu()
    key = _cpu_key(here.name, here.logical_cores)
    path = cache_dir / f"cpu-{key}.json"
    figures = cpu_figures(path)  # None: missing, or damaged (noted): measured again
    if figures is None:
        figures = measure_cpu()
        write_json(path, figures)
    cpu = hardware.cpu
    scale, source = 1.0, f"measured on this CPU ({figures['threads']} threads)"
    local = (cpu.name, cpu.logical_cores) == (here.name, here.logical_cores)
    if not local:
        scale = cpu.physical_cores / max(1, here.physical_cores)
        source = (f"measured on this machine's CPU ({here.name}), scaled by {cpu.physical_cores}/"
                  f"{here.physical_cores} physical cores for {cpu.name}")
    return Device(kind="cpu", name=cpu.name, fp32_flops=figures["fp32_flops"] * scale, tf32_flops=None,
                  half_flops=figures["bf16_flops"] * scale, bandwidth=figures["bandwidth"],
                  op_overhead_s=figures["op_overhead_s"], step_overhead_s=CPU_STEP_OVERHEAD_S,
                  power_watts=catalog.CPU_WATTS_PER_CORE * cpu.physical_cores,
                  source=source, key=key if local else f"{cpu.name}/{cpu.logical_cores}", here=local)


def device_for(hardware: HardwareProfile, device_type: str, cache_dir) -> Device | None:
    """The figures of the device a plan trains on; None where nothing is known (MPS, an unknown GPU)."""
    if device_type == "cpu":
        return cpu_device(hardware, cache_dir)
    if device_type == "cuda" and hardware.primary_gpu is not None:
        return gpu_device(hardware.primary_gpu.name)
    return None
