"""The fastest plan that fits: the micro-batch (and gradient checkpointing) with the highest predicted samples/s.

For a per-process share S of the target and a memory cap C, the candidates
are, for each accumulation count k >= ceil(S / C), the balanced micro-batch
ceil(S / k): the smallest that needs only k micro-batches (the last one
short when it does not divide S; the trainer weighs it by its samples).
Every divisor of S up to C is among them, and any other micro-batch with the
same k runs the same number of micro-batches, less evenly. Predicted
throughputs within `TIE` of the best (`MEASURED_TIE` where they come from
micro-batches timed on this CPU) count as a tie, broken towards the
configured checkpointing setting, then a micro-batch within the sizes timed
on this device (past them the time per sample is only held, not known), then
the larger micro-batch (fewer launches, and the roofline's optimism about
small batches stays unused).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import batch_split
from .model import StepTimeModel

TIE = 0.03
# Timings of a shared CPU move between plans by more than the roofline's 3%: LeNet-5's 512 against 256
# per sample was 0.90, 1.01, 1.04 and 1.06 over four plans here (in the bench's sweeps the two are within
# a few percent), ResNet-18's 16 against 32 0.88-0.99. Within 10% the larger of the timed sizes is kept:
# on the four models of make bench-throughput the larger was never slower beyond the noise.
MEASURED_TIE = 0.10


@dataclass(frozen=True)
class Candidate:
    micro_batch: int
    grad_accum: int
    gradient_checkpointing: bool
    seconds: float  # one optimizer step
    samples_per_second: float  # over all processes
    measured: bool = True  # within the micro-batch sizes timed on this device (or none were)
    share: int | None = None  # one process's samples per step (None: micro_batch x grad_accum)

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
                             model.measured_covers(micro), share))
    return out


def fastest(options: list[Candidate], configured_checkpointing: bool,
            tie: float = TIE) -> tuple[Candidate, list[Candidate]]:
    """(the choice, every option fastest first) under the tie rule above."""
    ranked = sorted(options, key=lambda c: -c.samples_per_second)
    best = ranked[0].samples_per_second
    near = [c for c in ranked if c.samples_per_second >= best * (1 - tie)]
    choice = max(near, key=lambda c: (c.gradient_checkpointing == configured_checkpointing, c.measured,
                                      c.micro_batch))
    return choice, ranked
