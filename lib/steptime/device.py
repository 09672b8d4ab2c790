"""How fast the device is: peak FLOP/s per precision, memory bandwidth, overheads and power.

GPUs: the catalog's datasheet figures (lib/hardware/catalog.py, `Peak`, each
with its source), found by the device's name, times the shares a training step
reaches per op class and GPU family (`Efficiency`, `FAMILIES`: matmul,
attention, convolutions eager and compiled, bandwidth), with its host-side
overheads (`Efficiency.op_overhead_s` per dispatched op, `kernel_floor_s`,
`optimizer_host_s`, `step_overhead_s`). A GPU the catalog does not know has no
figures: plans there carry no time prediction and keep the largest-divisor
micro-batch.

CPUs: measured on this machine by `measure_cpu` (a matmul at fp32 and bf16, a
large copy, a tiny training step for the per-op cost, a small CNN's forward and
backward at two batches for convolutions' rate and setup, all but bf16 run
round-robin for two seconds; in CPU time where torch runs one thread), cached per CPU, core count, thread count
and torch version in <cache dir>/steptime/cpu-<key>.json. A profile of another
machine's CPU (HW=file) is scaled from this one by its physical core count, and
says so.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

from ..errors import HardwareError
from ..hardware import HardwareProfile, catalog
from .cache import cpu_figures, write_json

# What a training step reaches of a GPU's datasheet peak, per op class (count.py attributes the FLOPs:
# matmuls, fused attention, convolutions; every other op is memory-bound bytes) and per GPU family
# (`FAMILIES`, by the catalog's arch). Calibration (lib.steptime.calibrate) scales the result by the
# machine's own ratio after a run. The figures, and the committed H100 measurements they rest on
# (docs/validation/, 2026-11-23, torch 2.11, bf16; replayed by tests/test_steptime_replay.py):
#
#   matmul 0.60     GPT-2 124M compiled, micro-batch 128 x 4 (step-time check, runs -2 and -4): 680.7 and
#                   691.7 ms measured against 726-740 ms predicted at 0.60 (+5-7%; 684.5 ms, +0.6% and -1.0%, since
#                   causal attention is counted at a flash-attention kernel's share: count.py); the diagnostics' kernel
#                   times (diag.jsonl, torch.profiler) matched 60% of the bf16 peak once each kernel's floor
#                   was added. Large bf16 GEMMs reach 70-75% on an H100; GPT-2's 768-wide ones less.
#   attention 0.60  no separate evidence: GPT-2 124M, whose FLOPs are 20% fused attention (head size 64),
#                   leaves no room for a slower attention (at 0.45 it would be +10% over), so it is the
#                   matmuls' share until a run shows otherwise.
#   conv 0.10       ResNet-18 eager bf16 at micro-batch 512, 32 px images: forward+backward 21.9 ms
#                   (diagnostics-2026-11-23/phase_times.jsonl) for 1.70 TFLOP of convolutions: 9.8% once its
#                   2.9 ms of elementwise bytes are taken off; ResNet-50 ran at 9-10% too.
#   conv compiled 0.18  the same step compiled: 10.1 ms (phase_times.jsonl; inductor runs the convolutions
#                   channels-last, cuDNN's faster bf16 kernels): 21% there; the trainer's compiled ResNet-18
#                   at 512 measured 15.1-20.9 ms in five runs (mean 18.3), which 0.18 puts at 17.3 ms.
#   unaligned 0.12  matmuls with a dimension that is not a whole number of 16 bytes (count.py), eager: GPT-2
#                   124M on its 50,257-token vocabulary, bf16, against the same model with its head padded to
#                   50,304 rows (2026-11-26, second run): at micro-batch 16 the step took 81.3 ms and 56.2
#                   padded (diagnostics-2026-11-26/batch_sweep.jsonl; the mfu check: 200.7 and 296.4
#                   samples/s); the head's 3.8 TFLOP take the 25.1 ms saved at 12.2% of the bf16 peak (9.7%
#                   at micro-batch 8, 11.8% at 4, 11.9% by the mfu check).
#   unaligned compiled 0.58  the same compiled with its loss, as kfit compiles it (lib/step.py forward_loss):
#                   the logits then stay inside inductor's graph, which pads the head's matmuls to aligned
#                   shapes. At micro-batch 16: 39.9 ms, 38.6 padded (2026-11-26, third run, diagnostics-
#                   2026-11-26/batch_sweep_loss.jsonl): 97% of the aligned share. Compiled alone, the
#                   model's logits are its output, which inductor does not pad: 57.7 and 50.0 ms, 26%.
#   bandwidth 0.75  elementwise kernels at large sizes reach 70-85% of the datasheet bandwidth.
#   op overhead 30 us  the host's time per counted op, eager (op_overhead.jsonl: 26-48 us on the VM's CPU,
#                   median of 20 steps); GPT-2-tiny's compiled forward+backward at 64 took 4.98 ms
#                   (phase_times.jsonl) against 4.81 predicted with COMPILE_OPS_FACTOR.
#   optimizer host 1.6 ms  clipping, the fused AdamW and zero_grad take the host 0.70-2.22 ms per step
#                   whatever the model (phase_times.jsonl: eight readings, median 1.6 ms): the optimizer's
#                   floor where its bytes take less (every model but GPT-2 124M's 2 GB of state).
#   step overhead 4.2 ms  the trainer around the step (the loss's .item(), the learning rate, metrics, the
#                   loader's hand-off): GPT-2-tiny's trainer steps at 64 measured 8.5-13.7 ms (five runs,
#                   mean 11.4) where the bare loop of the same step took 8.3 ms (phase_times.jsonl).
# Leave-one-model-out (docs/time.md): the figures that one model alone sets (conv compiled: ResNet-18;
# step overhead: GPT-2-tiny) cannot be checked on the others; the rest were set before these runs.
GPU_COMPUTE_EFFICIENCY = 0.6  # matmuls' share of the datasheet peak (the default family's)


@dataclass(frozen=True)
class Efficiency:
    """One GPU family's shares of its datasheet peaks, and its overheads (see the table above)."""

    matmul: float = GPU_COMPUTE_EFFICIENCY
    attention: float = 0.6
    conv: float = 0.10
    conv_compiled: float = 0.18
    unaligned: float = 0.12
    unaligned_compiled: float = 0.58
    bandwidth: float = 0.75
    kernel_floor_s: float = 6e-6  # device time every kernel takes however small (launch, ramp, tail)
    op_overhead_s: float = 30e-6  # eager PyTorch's host time per dispatched op (kernel launch included)
    optimizer_host_s: float = 1.6e-3  # the optimizer step's host time, its floor
    step_overhead_s: float = 4.2e-3  # the trainer's host time per optimizer step


# Measured on: sm_90 (H100). The other families have no run of their own yet and take the same figures
# (their datasheet peaks differ; the shares are the H100's until a run of theirs says otherwise).
FAMILIES = {"hopper": Efficiency(), "default": Efficiency()}
ARCH_FAMILY = {"sm_90": "hopper"}
GPU_BANDWIDTH_EFFICIENCY = FAMILIES["default"].bandwidth
CPU_STEP_OVERHEAD_S = 2e-4
# torch.compile fuses elementwise chains into few kernels: what remains of eager's bytes (an estimate:
# inductor keeps the matmuls and cuts most intermediate round trips) and of its host time per counted op.
# The host share was measured on an H100 (docs/validation/diagnostics-2026-11-23/phase_times.jsonl, the
# host-bound forward+backward of GPT-2-tiny compiled vs eager): 0.62-0.68 (guards, the compiled graph's
# launches and autograd's own dispatch remain), 1.0 for LeNet-5; it was 0.25, which predicted the compiled
# GPT-2-tiny step at 3.7 ms against 12.4 ms measured. A measured run calibrates either. Both apply to the
# forward and backward of the model and its loss, which kfit compiles in one graph (lib/step.py forward_loss).
COMPILE_MEMORY_FACTOR = 0.4
COMPILE_OPS_FACTOR = 0.7

MEASURE_FORMAT = 4  # 2: CPU time, a training step's op cost, convolutions' rate and setup; 3: interleaved, heap kept;
# 4: the convolutions pooled between, as LeNet-5's


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
    attention_efficiency: float = 1.0  # fused attention's FLOP/s over the matmuls'
    conv_compiled_efficiency: float | None = None  # convolutions' over the matmuls' under torch.compile
    optimizer_host_s: float = 0.0  # the optimizer step's host floor
    compute_efficiency: float = 1.0  # the matmuls' share of the datasheet peak that fp32_flops etc. include
    conv_op_s: float = 0.0  # a CPU's setup per convolution op (forward or backward), beyond op_overhead_s
    unaligned_efficiency: float = 1.0  # matmuls with an unaligned dimension: FLOP/s over the aligned ones'
    unaligned_compiled_efficiency: float | None = None  # ... under torch.compile
    fp8_flops: float | None = None  # float8 matmuls (lib/float8.py); None: no float8 tensor cores

    def flops(self, precision: str, tf32: bool) -> float:
        if precision in ("bf16", "fp16"):
            return self.half_flops
        return self.tf32_flops if tf32 and self.tf32_flops else self.fp32_flops

    def peak_flops(self, precision: str, tf32: bool) -> float:
        """The datasheet peak of `precision` (a CPU: its measured rate): what model FLOPs utilisation divides by."""
        return self.flops(precision, tf32) / self.compute_efficiency


def family(arch: str | None) -> str:
    """The GPU family whose efficiencies apply to a catalog arch ("sm_90" -> "hopper")."""
    return ARCH_FAMILY.get(arch or "", "default")


def gpu_device(name: str) -> Device | None:
    """A catalog GPU's figures, by key, alias or torch name; None when the catalog does not know it."""
    try:
        entry = catalog.lookup(name)
    except HardwareError:
        return None
    peak = entry.peak
    return _gpu(entry.name, entry.arch, fp32=peak.fp32_tflops, tf32=peak.tf32_tflops, half=peak.half_tflops,
                bandwidth=peak.bandwidth_gbs, watts=entry.tdp_watts, what=f"{entry.key} datasheet peaks",
                fp8=peak.fp8_tflops)


def profile_gpu_device(gpu) -> Device:
    """A HW= profile GPU's own speed figures (GPUInfo.speed), with its family's efficiencies."""
    speed = gpu.speed
    return _gpu(gpu.name, gpu.arch, fp32=speed.fp32_tflops, tf32=speed.tf32_tflops, half=speed.half_tflops,
                bandwidth=speed.bandwidth_gbs, watts=speed.tdp_watts, what="the HW= profile's peaks",
                fp8=speed.fp8_tflops)


def _gpu(name: str, arch: str, *, fp32: float, tf32: float | None, half: float, bandwidth: float, watts: float,
         what: str, fp8: float | None = None) -> Device:
    name_of_family = family(arch)
    e = FAMILIES[name_of_family]
    eff, bw = e.matmul, e.bandwidth
    return Device(kind="gpu", name=name, fp32_flops=fp32 * 1e12 * eff,
                  tf32_flops=tf32 * 1e12 * eff if tf32 else None,
                  half_flops=half * 1e12 * eff, bandwidth=bandwidth * 1e9 * bw,
                  fp8_flops=fp8 * 1e12 * eff if fp8 else None,
                  op_overhead_s=e.op_overhead_s, step_overhead_s=e.step_overhead_s,
                  conv_efficiency=e.conv / eff, conv_compiled_efficiency=e.conv_compiled / eff,
                  attention_efficiency=e.attention / eff, unaligned_efficiency=e.unaligned / eff,
                  unaligned_compiled_efficiency=e.unaligned_compiled / eff,
                  optimizer_host_s=e.optimizer_host_s,
                  kernel_floor_s=e.kernel_floor_s, compute_efficiency=eff,
                  power_watts=float(watts), key=name,
                  source=f"{what} x {name_of_family} efficiencies (matmul {eff:.0%}, "
                         f"conv {e.conv:.0%}/{e.conv_compiled:.0%} compiled, bandwidth {bw:.0%})")


# --------------------------------------------------------------------------
# CPUs: measured


def _clock():
    """CPU time of this process where torch runs one thread, else wall time (several threads' CPU time adds up).

    A step's cost where it has its core is its CPU time, whatever else runs; the fastest wall time is not,
    on a shared machine. Here (2 cores, load 6-8, one thread) the fastest of 15 wall times of a 768x768
    matmul was 1.7x its CPU time (47 against 81 GFLOP/s), of a tiny MLP's 128-sample forward+backward 2.4x
    (13.5 against 5.5 ms) and of its 16-sample one 1.0x: the longer the call, the likelier a preemption,
    so wall time made the per-sample part look up to twice as dear as the fixed part."""
    import torch

    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


def _best(fn, repeats: int) -> float:
    clock = _clock()
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


# The micro-benchmarks run round-robin for MEASURE_BUDGET_S (at least MIN_ROUNDS rounds), each keeping its
# fastest run. This VM's speed drifts by 25% in windows of a fifth of a second (a 128x512x512 matmul's
# fastest of 20 calls moved between 770 and 1000 us over 8 s), so figures each timed in its own half
# second came from different moments: in six runs of the earlier best-of-5, one after another, the matmul
# read 59-84 GFLOP/s, the per-op cost 6.6-9.9 us and the convolutions' setup 123-263 us, and the model's
# predicted ratio of LeNet-5's step at 128 to 16 moved 3.06-4.53x. Interleaved over 2 s: 80-84 GFLOP/s,
# 10.0-10.9 us, 217-232 us, and 3.57-3.65x.
MEASURE_BUDGET_S = 2.0
MIN_ROUNDS = 3
MATMUL_N = 768


def _fastest(benchmarks: dict, budget_s: float) -> dict[str, float]:
    """Each benchmark's fastest run, after one warm-up each, the benchmarks run round-robin for budget_s."""
    clock = _clock()
    for fn in benchmarks.values():
        fn()
    best = {name: float("inf") for name in benchmarks}
    started, rounds = time.perf_counter(), 0
    while rounds < MIN_ROUNDS or time.perf_counter() - started < budget_s:
        for name, fn in benchmarks.items():
            start = clock()
            fn()
            best[name] = min(best[name], clock() - start)
        rounds += 1
    return best


def _matmul_flops(dtype, n: int = MATMUL_N, small: int = 256, call_budget_s: float = 0.1) -> float:
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


def _op_step():
    """A training step whose ops do almost nothing: a 6-layer MLP of width 4 at batch 1, forward, backward and
    an AdamW step (one tensor at a time, as on a CPU). Its time over the ops count.py counts in it is the cost
    of a dispatched op, autograd's nodes, nn.Module calls and the optimizer's Python loop included, which a
    loop of bare adds (1.7 us here) leaves out: 10-11 us a counted op here."""
    import torch

    net = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(4, 4), torch.nn.ReLU())])
    optimizer = torch.optim.AdamW(net.parameters(), foreach=False)
    x = torch.randn(1, 4)

    def step():
        net(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer's state exists from here on: what every later step costs
    return step


# The batches the convolutions are timed at: 2 and 16 read a faster rate than larger batches here; 4 and
# 64 agree with them.
CONV_BATCHES = (4, 64)


def _conv_steps() -> dict:
    """A small CNN's forward+backward per CONV_BATCHES: the slope between them is convolutions' rate, what is
    left at the smaller their setup (`_conv_figures`).

    Small-channel convolutions are slow on a CPU and vary by shape (fwd+bwd here: 1->6 channels 5x5 at 32 px
    6.5 GFLOP/s, 6->16 at 14 px 27.5, 3->16 3x3 at 32 px 18.3, 64->64 3x3 at 16 px 42; each call 200-250 us
    to set up at batch 1): the shapes timed are a grey-scale CNN's first two layers (1->6 and 6->16, 5x5,
    32 px, pooled between them as LeNet-5 pools), what kfit trains on a CPU. Without the pooling the second
    layer ran at 28 px and outweighed the first 12 to 1 (in LeNet-5 2 to 1), so the rate read 31-42 GFLOP/s
    where pooled it reads 18-19, and the roofline put LeNet-5's step from 16 to 128 samples at 3.4-3.6x
    where it measured 4.4-5.0x (make bench-steptime; pooled 4.5-4.9x, docs/benchmarks.md). Wider convolutions run faster than this predicts, which
    calibration and measure.py's real timings correct."""
    import torch

    net = torch.nn.Sequential(torch.nn.Conv2d(1, 6, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Conv2d(6, 16, 5))

    def step_at(batch):
        x = torch.randn(batch, 1, 32, 32)
        return lambda: net(x).sum().backward()

    return {batch: step_at(batch) for batch in CONV_BATCHES}


def _conv_figures(times: dict, counts: dict, op_s: float, bandwidth: float) -> tuple[float, float]:
    """(FLOP/s of convolutions, seconds per convolution op beyond op_s) from `_conv_steps`' fastest times
    and counts by batch."""
    (t0, c0), (t1, c1) = ((times[b], counts[b]) for b in CONV_BATCHES)

    def bytes_s(c):
        return (c.compute_bytes + c.memory_bytes) / bandwidth

    rate = (c1.conv_flops - c0.conv_flops) / max(1e-9, (t1 - bytes_s(c1)) - (t0 - bytes_s(c0)))
    setup = (t0 - bytes_s(c0) - c0.conv_flops / rate - c0.ops * op_s) / max(1.0, c0.conv_ops)
    return rate, max(0.0, setup)


def measure_cpu(budget_s: float | None = None) -> dict:
    """Matmul FLOP/s at fp32 and bf16, copy bandwidth, the per-op cost of a training step, and small
    convolutions' FLOP/s and setup per op on this CPU (about budget_s, default MEASURE_BUDGET_S, + half a
    second; CPU time where torch runs one thread)."""
    import torch

    from ..hardware.allocator import keep_freed_memory
    from .count import counted

    # the C heap as a CPU run has it (lib.api.train_planned; measure.py does the same), unless RAM is short:
    # with glibc's adaptive defaults the convolutions' setup read 34-70 us here, with the heap kept 195-213
    keep_freed_memory()
    started = time.perf_counter()
    result: dict = {"threads": torch.get_num_threads()}
    result["bf16_flops"] = _matmul_flops(torch.bfloat16)  # emulated on most CPUs: too slow for the rounds
    a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
    src = torch.empty(2**24)  # 64 MiB: past any cache
    dst = torch.empty_like(src)
    benchmarks = {"matmul": lambda: torch.mm(a, b), "copy": lambda: dst.copy_(src), "op": _op_step(),
                  **{f"conv{batch}": step for batch, step in _conv_steps().items()}}
    counts = {name: counted(fn) for name, fn in benchmarks.items() if name not in ("matmul", "copy")}
    best = _fastest(benchmarks, MEASURE_BUDGET_S if budget_s is None else budget_s)
    result["fp32_flops"] = 2 * MATMUL_N**3 / best["matmul"]
    result["bandwidth"] = 2 * src.numel() * src.element_size() / best["copy"]
    result["op_overhead_s"] = best["op"] / counts["op"].ops
    result["conv_flops"], result["conv_op_s"] = _conv_figures(
        {b: best[f"conv{b}"] for b in CONV_BATCHES}, {b: counts[f"conv{b}"] for b in CONV_BATCHES},
        result["op_overhead_s"], result["bandwidth"])
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
                  conv_efficiency=figures["conv_flops"] / figures["fp32_flops"], conv_op_s=figures["conv_op_s"],
                  power_watts=catalog.CPU_WATTS_PER_CORE * cpu.physical_cores,
                  source=source, key=key if local else f"{cpu.name}/{cpu.logical_cores}", here=local)


def device_for(hardware: HardwareProfile, device_type: str, cache_dir) -> Device | None:
    """The figures of the device a plan trains on; None where nothing is known (MPS, an unknown GPU)."""
    if device_type == "cpu":
        return cpu_device(hardware, cache_dir)
    gpu = hardware.primary_gpu
    if device_type == "cuda" and gpu is not None:
        return profile_gpu_device(gpu) if gpu.speed is not None else gpu_device(gpu.name)
    return None
