"""The fastest plan that fits: the micro-batch (and gradient checkpointing) with the highest predicted samples/s.

For a per-process share S of the target and a memory cap C, the candidates
are, for each accumulation count k >= ceil(S / C), the balanced micro-batch
ceil(S / k): the smallest that needs only k micro-batches (the last one
short when it does not divide S; the trainer weighs it by its samples).
Every divisor of S up to C is among them, and any other micro-batch with the
same k runs the same number of micro-batches, less evenly. Each candidate's
predicted throughput carries an interval (model.py, `uncertainty`: the spread
of the timings it rests on, how far it lies from them, the load they were
taken under); candidates whose interval overlaps the best's are a tie,
broken towards the configured checkpointing setting, then

  by the roofline (a GPU's): the larger micro-batch. Fewer, larger steps are
      what contention on the host hurts least (fewer launches for a busy host
      to queue), and the roofline's optimism about small batches stays unused.
  by sizes timed on this CPU: the highest samples/s the candidate reaches at
      worst (the low end of its interval). A size past the timed ones, or
      timed with a wide spread, is only possibly faster; and a larger size is
      not the safe side on a shared CPU: under one busy core LeNet-5's 512
      trained 20% slower than 256 (make bench-throughput LOAD=1), its working
      set sharing the caches with the other process.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import batch_split
from .model import StepTimeModel



@dataclass(frozen=True)
class Candidate:
    micro_batch: int
    grad_accum: int
    gradient_checkpointing: bool
    seconds: float  # one optimizer step
    samples_per_second: float  # over all processes
    measured: bool = True  # within the micro-batch sizes timed on this device (or none were)
    share: int | None = None  # one process's samples per step (None: micro_batch x grad_accum)
    uncertainty: float = 0.0  # the relative half-width of the interval around `seconds` (model.uncertainty)

    def interval(self) -> tuple[float, float]:
        """The samples/s interval: (slowest, fastest) within the uncertainty."""
        return self.samples_per_second / (1 + self.uncertainty), self.samples_per_second / (1 - min(0.9, self.uncertainty))

    def describe(self) -> str:
        """'21 x 24 + 8 x 1 = 512 -> 9,870 samples/s': the step's micro-batches of one process, which multiply."""
        share = self.share or self.micro_batch * self.grad_accum
        text = batch_split(share, self.micro_batch).text()
        if self.gradient_checkpointing:
            text += " with checkpointing"
        rate = self.samples_per_second
        return f"{text} -> {rate:,.0f} samples/s" if rate >= 100 else f"{text} -> {rate:.3g} samples/s"


def balanced_micro_batches(share: int, cap: int) -> list[int]:
    """ceil(share / k) for every k >= ceil(share / cap), largest first: about 2 sqrt(share) values.

    Left out: a size whose last micro-batch would be one sample (share % micro == 1), which the trainer
    joins to the one before (lib.trainer.windows.split_batches), running one sample more than planned."""
    sizes, k = [], -(-share // max(1, min(cap, share)))
    while True:
        micro = -(-share // k)
        if micro == 1 or share % micro != 1:
            sizes.append(micro)
        if micro == 1:
            return sizes
        k = -(-share // (micro - 1))  # the first k whose balanced micro-batch is smaller


def candidates(model: StepTimeModel, *, share: int, cap: int, world_size: int,
               gradient_checkpointing: bool) -> list[Candidate]:
    out = []
    for micro in balanced_micro_batches(share, cap):
        accum = -(-share // micro)
        seconds = model.seconds(micro, accum, share)
        out.append(Candidate(micro, accum, gradient_checkpointing, seconds, share * world_size / seconds,
                             model.measured_covers(micro), share, model.uncertainty(micro)))
    return out


def ties(ranked: list[Candidate]) -> list[Candidate]:
    """The candidates whose interval overlaps the fastest's (ranked: fastest first)."""
    slowest_best = ranked[0].interval()[0]
    return [c for c in ranked if c.interval()[1] >= slowest_best]


def fastest(options: list[Candidate], configured_checkpointing: bool, *,
            timed: bool = False) -> tuple[Candidate, list[Candidate]]:
    """(the choice, every option fastest first) under the tie rule above; `timed`: the candidates rest on
    sizes timed on this device."""
    ranked = sorted(options, key=lambda c: -c.samples_per_second)

    def safe(c: Candidate) -> float:
        return c.interval()[0] if timed else c.micro_batch

    choice = max(ties(ranked), key=lambda c: (c.gradient_checkpointing == configured_checkpointing, safe(c)))
    return choice, ranked
