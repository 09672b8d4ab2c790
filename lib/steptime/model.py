"""The step-time model: counted work (count.py) over the device's speed (device.py), corrected by measurement.

One micro-batch (forward + backward) takes, on a GPU,

    compute = matmul flops / peak FLOP/s + attention flops / attention FLOP/s + conv flops / conv FLOP/s
              + unaligned matmul flops / their FLOP/s
    device  = max(compute, compute bytes / bandwidth) + other bytes / bandwidth + ops x kernel floor
    host    = ops x per-op overhead
    time    = (device^P + host^P)^(1/P)     (OVERLAP_P: the host queues kernels ahead of the device)

and on a CPU, where one core does the arithmetic, the loads and the dispatch one after another,

    time    = compute + (compute bytes + other bytes) / bandwidth + ops x per-op cost
              + convolution ops x their setup

the sum, not a roofline's max: a small matmul's fixed cost is reading (packing) its weights, the compute
bytes (here, M = 16..128 rows of K = 256 or 512 by N = 512: 31-37 us + FLOPs / 70-91 GFLOP/s, the 31-37 us
its 0.5-1 MiB of weights at ~30 GB/s), and the FLOPs then come on top (device.py measures each figure).

with torch.compile cutting the elementwise bytes and the op count
(device.COMPILE_*) of the forward and backward (the model's and its loss's, compiled in one
graph) and running its convolutions at the family's compiled share; the optimizer step is
never compiled. Each op class has its own share of the peak per GPU family
(device.FAMILIES, with the runs that set them). An optimizer step is

    micro-batches of the window + max(the optimizer's own time, its host floor) + a fixed per-step overhead

a fixed part (the optimizer, the trainer's overhead, and on a host-bound GPU the
ops' launches) and a part that grows with the samples, so a calibration at one
micro-batch carries to the others (tests/test_steptime_replay.py replays it).

where a window of `samples` per process is cut as the trainer cuts it
(lib/trainer/windows.py: full micro-batches, then a short one). Two
measurements refine it, each on the machine it was taken on:

  measured    real forward+backward times at a few micro-batch sizes (measure.py): the ratio
              measured / roofline, interpolated in log2(micro-batch), scales the roofline. This is
              what makes a CPU's cache effects visible (bigger is not always faster there).
  calibrated  a real run's median step time over the model's prediction for that step
              (calibrate.py, `calibrated`): one factor for every candidate. On a GPU it scales the
              bound that limits the calibrated step's micro-batches, the host's time or the device's,
              and leaves the other: a small micro-batch that is host-bound says nothing of the
              device's speed at a large one (the H100 sweep of 2026-11-26: ResNet-18 calibrated at 128,
              host-bound, predicted 512 at +38% scaling both, -25% scaling the host alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

from ..units import micro_batch_sizes
from .comm import Communication
from .count import Counts, Phase
from .device import COMPILE_MEMORY_FACTOR, COMPILE_OPS_FACTOR, Device


# How a GPU step's host and device times combine: the host queues kernels ahead of the device, so the step
# takes the larger, but not exactly the larger where the two are close (the queue starts empty each step,
# and an op waits for its inputs). A p-norm is max(device, host) far from the corner and up to 2^(1/P) x it
# on the corner. Over the committed H100 steps (tests/test_steptime_replay.py): with the plain max (P
# infinite), 71 of 96 calibrated transfers within 10%, mean 8.2%; P = 4: 79, mean 7.0%, and GPT-2 124M on
# 50,257 tokens within 7.3% uncalibrated (13.2%); ResNet-18's eager steps, host-bound at 64-128 and
# device-bound at 512, rise smoothly between (9.3, 11.3, 15.0, 22.5 ms at 64-512). P = 3 fits the transfers
# a little better (83) and the uncalibrated cases worse (24.9% at worst against the 25% asked).
OVERLAP_P = 4.0

# How well a predicted step time is known, as the relative half-width of an interval around it: two
# candidates whose intervals overlap are a tie (choose.py). A roofline's ranking is good to a few percent
# (ROOFLINE_SPREAD each side: 3% apart is a tie). Timings on this CPU carry their rounds' spread (measure.py,
# at least SPREAD_FLOOR each side: a size's figure moved by that between plans here), FEW_ROUNDS_SPREAD where
# too few rounds gave none, and EXTRAPOLATION_SPREAD per doubling past the largest size timed or away from the
# nearest micro-batch a run calibrated; other processes' share of the cores adds up to LOAD_SPREAD (a
# shared CPU's timings move more between plans, also on its CPU time: caches and memory are shared).
ROOFLINE_SPREAD = 0.015
SPREAD_FLOOR = 0.05
FEW_ROUNDS_SPREAD = 0.10
EXTRAPOLATION_SPREAD = 0.05
LOAD_SPREAD = 0.10


def combined(device: float, host: float) -> float:
    """A GPU step's time from its device and host times (OVERLAP_P); a CPU's (host 0) is its device time."""
    return (device**OVERLAP_P + host**OVERLAP_P) ** (1 / OVERLAP_P) if host else device


def log2_interpolated(points: list[tuple[float, float]], batch: float) -> float:
    """The value at `batch` of (log2 batch, value) points, sorted: linear in log2 between them, held beyond."""
    x = math.log2(max(batch, 1))
    if x <= points[0][0]:
        return points[0][1]
    for (x0, r0), (x1, r1) in zip(points, points[1:]):
        if x <= x1:
            return r0 + (r1 - r0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def window_sizes(samples: int, micro_batch: int) -> list[int]:
    """The micro-batch sizes of a window of `samples`, as the trainer cuts it (lib.units.micro_batch_sizes)."""
    return micro_batch_sizes(samples, micro_batch)


# Bytes float8 training moves per byte of a matmul operand it casts (a bf16 operand: 2 bytes an element).
# Eager, torchao reads each operand twice (its amax, then the scaled cast) and writes it once in float8:
# (2 + 2 + 1) / 2; compiled, inductor fuses the amax into the op that made the operand: (2 + 1) / 2. On an H200
# (validate-gpu's scale check, 2026-11-27) Llama 3.2 1B at 8k compiled ran x1.07 faster in float8 tensorwise
# than in bf16 (187.1 -> 175.0 ms), where the matmuls at the float8 peak alone predicted x1.37; these casts
# take the prediction to x1.25 (docs/validation/README.md).
FLOAT8_CAST_TRAFFIC = {False: 2.5, True: 1.5}


@dataclass(frozen=True)
class StepTimeModel:
    counts: Counts
    device: Device
    precision: str
    tf32: bool = False
    compile: bool = False
    measured: dict[int, float] = field(default_factory=dict)  # micro-batch -> seconds of forward+backward
    # micro-batch -> seconds of the optimizer step after a backward of that size (measure.py): its state and
    # gradients leave the caches as the micro-batch's activations pass through
    measured_optimizer: dict[int, float] = field(default_factory=dict)
    correction: float = 1.0  # a real run's step time over this model's prediction (1.0: not calibrated)
    calibrated_at: int | None = None  # the micro-batch the calibration ran at
    correction_bound: str = "all"  # what `correction` scales: "all", or a GPU's "host" or "device" time
    # runs calibrated at several micro-batches: (micro-batch, its factor), log2-interpolated between them and
    # held beyond, in place of `correction` (calibrate.py, calibrated_by_runs)
    corrections: tuple[tuple[int, float], ...] = ()
    calibration_spread: tuple[tuple[int, float], ...] = ()  # (micro-batch, the runs' relative spread there)
    measured_spread: dict[int, float] = field(default_factory=dict)  # micro-batch -> measure.spreads' figure
    load: float = 0.0  # other processes' share of the usable cores while timed, or now (the larger)
    communication: Communication | None = None  # several processes' collectives (comm.py)
    # the linear layers' matmuls in float8 (lib/float8.py) at the device's float8 peak; attention, convolutions
    # and unaligned matmuls keep the precision's; torchao's casts of their operands charged as memory traffic
    # (FLOAT8_CAST_TRAFFIC)
    float8: bool = False
    # processes per tensor-parallel group (CONFIG_TP): each computes its share of every split layer, taken as
    # the whole model's work at micro-batch / tensor (the split matmuls keep their rows, lose columns: the
    # same FLOPs and bytes per process as a 1/tensor batch of the whole), its kernels as many as the whole's
    tensor: int = 1
    # pipeline stages (CONFIG_PP) and their schedule: a process computes its stages' share (1 / pipeline) of
    # each micro-batch, and the schedule's fill and drain (the bubble) leave it idle (lib/pipeline.py)
    pipeline: int = 1
    pipeline_schedule: str = "1F1B"
    # processes per context-parallel group (CONFIG_CP): each computes the whole model at 1/context of every
    # sample's tokens, its attention balanced to 1/context of the whole's: the whole's work at micro-batch /
    # context, as under TP (lib/context_parallel.py)
    context: int = 1
    # micro-batch -> micro_seconds: a plan weighs tens of candidates of up to hundreds of micro-batches each
    # (not copied by dataclasses.replace, so a changed model starts empty)
    _micro_memo: dict[float, float] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def split(self) -> int:
        """The processes that share each sample's work: a tensor-parallel group's times a context-parallel one's."""
        return self.tensor * self.context

    # -- the roofline --------------------------------------------------------

    def _seconds(self, work: Phase, compiled: bool) -> float:
        return combined(*self._bounds(work, compiled))

    def _bounds(self, work: Phase, compiled: bool) -> tuple[float, float]:
        """(device seconds, host seconds) of `work`: on a GPU the step takes the larger; a CPU's time is all
        one (host 0)."""
        dev = self.device
        memory_bytes, ops = work.memory_bytes, work.ops
        if compiled:  # the model and its loss fused in one graph (lib/step.py forward_loss)
            memory_bytes, ops = memory_bytes * COMPILE_MEMORY_FACTOR, ops * COMPILE_OPS_FACTOR
        peak = dev.flops(self.precision, self.tf32)
        conv = dev.conv_compiled_efficiency if compiled and dev.conv_compiled_efficiency else dev.conv_efficiency
        unaligned = (dev.unaligned_compiled_efficiency if compiled and dev.unaligned_compiled_efficiency
                     else dev.unaligned_efficiency)
        matmuls = work.matmul_flops / peak
        if self.float8 and dev.fp8_flops:  # the converted layers' matmuls at the float8 peak, their casts moved
            matmuls = work.float8_flops / dev.fp8_flops + (work.matmul_flops - work.float8_flops) / peak
            memory_bytes += (max(0.0, work.matmul_operand_bytes - work.float8_excluded_operand_bytes)
                             * FLOAT8_CAST_TRAFFIC[compiled])
        compute = (matmuls + work.attention_flops / (peak * dev.attention_efficiency)
                   + work.conv_flops / (peak * conv) + work.unaligned_flops / (peak * unaligned))
        host = ops * dev.op_overhead_s
        if dev.kind == "cpu":  # one core does it all, one thing after another: nothing overlaps
            return (compute + (work.compute_bytes + memory_bytes) / dev.bandwidth + host
                    + work.conv_ops * dev.conv_op_s), 0.0
        device = max(compute, work.compute_bytes / dev.bandwidth) + memory_bytes / dev.bandwidth
        device += ops * dev.kernel_floor_s
        return device, host

    def factor(self, micro_batch: float) -> float:
        """The calibration's factor for a step of `micro_batch`: the runs' own where they ran at it."""
        if self.corrections:
            return log2_interpolated(sorted((math.log2(m), f) for m, f in self.corrections), micro_batch)
        return self.correction

    def _corrected(self, work: Phase, efficiency: float, factor: float | None = None) -> float:
        """`work`'s seconds with the calibration applied to the bound it was fitted on."""
        c = self.correction if factor is None else factor
        if self.correction_bound == "all":
            return self._seconds(work, self.compile) * efficiency * c
        device, host = (t * efficiency for t in self._bounds(work, self.compile))
        return combined(device * c, host) if self.correction_bound == "device" else combined(device, host * c)

    def roofline_micro_seconds(self, batch: float) -> float:
        return self._seconds(self.counts.micro_batch(batch), self.compile)

    # -- refined by measurement ------------------------------------------------

    @cached_property
    def _efficiency_points(self) -> list[tuple[float, float]]:
        return sorted((math.log2(b), t / self.roofline_micro_seconds(b)) for b, t in self.measured.items())

    def efficiency(self, batch: float) -> float:
        """measured / roofline at `batch`: interpolated in log2(batch) between measured sizes, held beyond them."""
        return log2_interpolated(self._efficiency_points, batch) if self.measured else 1.0

    def micro_seconds(self, batch: float) -> float:
        """Forward and backward of one micro-batch, before calibration. Past the largest measured size the
        time per sample is held at that size's: a roofline's gain from a larger batch is what a CPU's
        caches take back, and nothing measured says otherwise."""
        if batch not in self._micro_memo:
            if self.measured and batch > (largest := max(self.measured)):
                self._micro_memo[batch] = self.measured[largest] * batch / largest
            else:
                self._micro_memo[batch] = self.roofline_micro_seconds(batch) * self.efficiency(batch)
        return self._micro_memo[batch]

    def measured_covers(self, batch: int) -> bool:
        """Whether `batch` is within the measured sizes (or nothing was measured: all is roofline alike)."""
        return not self.measured or batch <= max(self.measured)

    def forward_seconds(self, batch: float) -> float:
        """One evaluation forward (no backward), scaled as the micro-batch is; a tensor-parallel process's
        share, with a third of a training micro-batch's collectives (forward only)."""
        share = batch / self.split
        seconds = self._corrected(self.counts.at(share, "forward"), self.efficiency(share), self.factor(share))
        if self.communication is not None:
            seconds += (self.communication.tensor_seconds(batch) + self.communication.context_seconds(batch)) / 3
        return seconds

    def corrected_micro_seconds(self, batch: float, factor: float | None = None) -> float:
        """One micro-batch's forward and backward, calibration included (`factor`: the step's, where the
        micro-batch is a window's short last one)."""
        factor = self.factor(batch) if factor is None else factor
        if self.correction_bound == "all":
            return self.micro_seconds(batch) * factor
        return self._corrected(self.counts.micro_batch(batch), 1.0, factor)  # a GPU's: nothing measured

    def optimizer_seconds(self, batch: float = 1) -> float:
        """One optimizer step after a micro-batch of `batch`."""
        if self.measured_optimizer:
            return log2_interpolated(sorted((math.log2(b), t) for b, t in self.measured_optimizer.items()), batch)
        return max(self._seconds(self.counts.at(1, "optimizer"), compiled=False), self.device.optimizer_host_s)

    # -- one optimizer step ----------------------------------------------------

    def parts(self, micro_batch: int, grad_accum: int, samples: int | None = None) -> dict[str, float]:
        """Seconds of one optimizer step by part, calibration included; they sum to `seconds`."""
        if self.pipeline > 1:
            return self._pipeline_parts(micro_batch, grad_accum, samples)
        sizes = window_sizes(samples or micro_batch * grad_accum, micro_batch)
        f = self.factor(micro_batch)
        micro = [self.corrected_micro_seconds(s / self.split, f) for s in sizes]
        last = (sizes[-1] if sizes else micro_batch) / self.split
        parts = {"micro_batches": sum(micro), "optimizer": self.optimizer_seconds(last) * f / self.split,
                 "step_overhead": self.device.step_overhead_s * (1.0 if self.correction_bound == "device" else f)}
        if self.communication is not None:
            parts["communication"] = self.communication.exposed_seconds(micro, sizes)
        return parts

    def _pipeline_parts(self, micro_batch: int, grad_accum: int, samples: int | None) -> dict[str, float]:
        """A pipeline process's step: the equal micro-batches the schedule cuts its share into
        (lib/pipeline.py micro_batches), each through its stages (1 / pipeline of the whole model's time: the
        blocks are cut evenly), then the bubble: the schedule's fill and drain, (pipeline - 1) stage-times of
        a micro-batch, over the stages per process of the interleaved schedule; the sends of the first
        micro-batch's activations down the stages and of the last one's gradient back, which nothing
        overlaps; its stages' share of the optimizer step."""
        from ..pipeline import micro_batches, stages_per_process

        n, size = micro_batches(samples or micro_batch * grad_accum, micro_batch, self.pipeline,
                                self.pipeline_schedule)
        f = self.factor(micro_batch)
        stage = self.corrected_micro_seconds(size / self.split, f) / self.pipeline
        parts = {"micro_batches": n * stage,
                 "pipeline_bubble": (self.pipeline - 1) / stages_per_process(self.pipeline_schedule) * stage,
                 "optimizer": self.optimizer_seconds(size / self.split) * f / (self.split * self.pipeline),
                 "step_overhead": self.device.step_overhead_s * (1.0 if self.correction_bound == "device" else f)}
        if self.communication is not None:
            parts["communication"] = (self.communication.exposed_seconds([stage] * n, [size] * n)
                                      + 2 * (self.pipeline - 1) * self.communication.pipeline_seconds(size))
        return parts

    def seconds(self, micro_batch: int, grad_accum: int, samples: int | None = None) -> float:
        """One optimizer step: `grad_accum` micro-batches of `micro_batch` (the last one short when
        `samples` per process is not a multiple), the optimizer and the fixed overhead."""
        return sum(self.parts(micro_batch, grad_accum, samples).values())

    def uncertainty(self, micro_batch: float) -> float:
        """The relative half-width of the interval around a step of `micro_batch` (ROOFLINE_SPREAD and the
        figures after it)."""
        x = math.log2(max(micro_batch, 1))
        if self.measured:
            u = max(SPREAD_FLOOR, log2_interpolated(sorted((math.log2(b), v) for b, v in self.measured_spread.items()),
                                                    micro_batch) if self.measured_spread else FEW_ROUNDS_SPREAD)
            u += EXTRAPOLATION_SPREAD * max(0.0, x - math.log2(max(self.measured)))
        else:
            u = ROOFLINE_SPREAD
        if self.calibration_spread and self.device.kind == "cpu":
            # a run's own micro-batch is known as well as its runs agree, the others by the nearest, less the
            # further away
            # (a GPU's calibrated step keeps the roofline's interval: its ranking is the roofline's)
            distance, spread = min((abs(x - math.log2(m)), v) for m, v in self.calibration_spread)
            by_runs = max(SPREAD_FLOOR, spread) + EXTRAPOLATION_SPREAD * distance
            u = min(u, by_runs) if self.measured else by_runs
        return u + LOAD_SPREAD * min(1.0, self.load)

    @property
    def source(self) -> str:
        """Where the figure comes from, for the plan's reasons."""
        if self.corrections:
            points = ", ".join(f"{m} (x{f:.2f})" for m, f in sorted(self.corrections))
            how = f"calibrated by runs at micro-batch {points}"
        elif self.correction != 1.0 or self.calibrated_at is not None:
            scaled = "" if self.correction_bound == "all" else f" of its {self.correction_bound} time"
            how = f"calibrated by a run at micro-batch {self.calibrated_at} (x{self.correction:.2f}{scaled})"
        elif self.measured:
            sizes = sorted(self.measured)
            how = f"measured on this device at micro-batch {sizes[0]}-{sizes[-1]}"
        else:
            how = f"roofline: {self.device.source}"
        if self.measured and (self.calibrated_at is not None or self.corrections):
            how += f", measured at micro-batch {min(self.measured)}-{max(self.measured)}"
        return how


def calibrated(model: StepTimeModel, seconds: float, micro_batch: int, grad_accum: int,
               samples: int | None = None) -> StepTimeModel:
    """`model` scaled so that it predicts `seconds` for this step. On a GPU whose micro-batches are not
    measured, the factor scales the bound that limits the step's micro-batch (the host's time, with the
    trainer's overhead, or the device's), solved so the step comes out at `seconds`; where no factor of that
    bound reaches it, or on a CPU (whose time is one sum), the whole step is scaled."""
    base = replace(model, correction=1.0, correction_bound="all", corrections=())
    predicted = base.seconds(micro_batch, grad_accum, samples)
    if not predicted > 0:
        return base
    whole = replace(base, correction=seconds / predicted, calibrated_at=micro_batch)
    if model.device.kind == "cpu" or model.measured:
        return whole
    device, host = base._bounds(base.counts.micro_batch(micro_batch), base.compile)
    bound = "host" if host >= device else "device"

    def step_at(c: float) -> float:
        return replace(whole, correction=c, correction_bound=bound).seconds(micro_batch, grad_accum, samples)

    lo, hi = 1e-3, 1e3  # the step's time grows with the factor: bisect in log space
    if not step_at(lo) <= seconds <= step_at(hi):
        return whole
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if step_at(mid) < seconds else (lo, mid)
    return replace(whole, correction=math.sqrt(lo * hi), correction_bound=bound)
