"""The fastest plan that fits: the micro-batch (and gradient checkpointing) with the highest predicted samples/s.

For a per-process share S of the target and a memory cap C, the candidates
are, for each accumulation count k >= ceil(S / C), the balanced micro-batch
ceil(S / k): the smallest that needs only k micro-batches (the last one
short when it does not divide S; the trainer weighs it by its samples).
Every divisor of S up to C is among them, and any other micro-batch with the
same k runs the same number of micro-batches, less evenly. Predicted
throughputs within `TIE` of the best count as a tie, broken towards the
configured checkpointing setting, then towards the larger micro-batch (fewer
launches, and the roofline's optimism about small batches stays unused),
except on a CPU within the sizes timed there (or with none timed): where the time per
sample has flattened, the smallest tied micro-batch of at least half the
largest tied one, since the larger working set buys nothing and sits nearest
to the caches' and glibc's cliffs. Measured on this 2-core CPU (LeNet-5,
effective batch 512, one thread): 512 x 1 and 256 x 2 ran at the same speed
alone (36.6 and 37.1 ms a step), but after steps at other sizes in the same
process (the trainer's evaluation, a sweep) 512 x 1 took 48-60 ms for the
next 15 steps and 256 x 2 still 37-38 ms; in five make bench-throughput runs
512 ran at 0.64-1.00 of the sweep's best, 256 at 0.95-1.00. Halving at most
keeps a flat prediction from sliding down to a few samples. Past the timed
sizes the time per sample is only held (model.py), which understates a larger
micro-batch where timing stopped early (a slow model, a busy machine): ties
there go to the larger one. Preferring timed sizes instead kept ResNet-18 at
micro-batch 8 of a target of 128 after a busy machine timed only 1-8 (9
samples/s against 23 at 128 in make bench-throughput), and GPT-2-tiny and the
custom transformer at 32 of 64 (0.74-0.93 of the best).
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import StepTimeModel

TIE = 0.03


@dataclass(frozen=True)
class Candidate:
    micro_batch: int
    grad_accum: int
    gradient_checkpointing: bool
    seconds: float  # one optimizer step
    samples_per_second: float  # over all processes
    measured: bool = True  # within the micro-batch sizes timed on this device (or none were)

    def describe(self) -> str:
        text = f"{self.micro_batch} x {self.grad_accum}"
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
                             model.measured_covers(micro)))
    return out


def fastest(options: list[Candidate], configured_checkpointing: bool,
            cpu: bool = False) -> tuple[Candidate, list[Candidate]]:
    """(the choice, every option fastest first) under the tie rule above; `cpu`: the device is a CPU."""
    ranked = sorted(options, key=lambda c: -c.samples_per_second)
    best = ranked[0].samples_per_second
    near = [c for c in ranked if c.samples_per_second >= best * (1 - TIE)]
    preferred = any(c.gradient_checkpointing == configured_checkpointing for c in near)
    near = [c for c in near if (c.gradient_checkpointing == configured_checkpointing) == preferred]
    largest = max(near, key=lambda c: c.micro_batch)
    if cpu and largest.measured:
        return min((c for c in near if 2 * c.micro_batch >= largest.micro_batch), key=lambda c: c.micro_batch), ranked
    return largest, ranked
