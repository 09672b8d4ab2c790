"""Real forward+backward times at a few micro-batch sizes on this machine's CPU, and the optimizer's, when
they are cheap.

A roofline says a larger micro-batch is never slower per sample; on a CPU
that is false (LeNet-5 at 512 ran at about 0.7x of 128-256 here: the
activations fall out of the caches). So where real steps are cheap, a few
are timed: powers of two up to the largest micro-batch the plan may use,
smallest first, each with a warm-up and one timed run, while the next size's
cost (guessed from the last one timed, at the same time per sample) fits
the budget (`budget_for`: BUDGET_S seconds in all, more for a long run); then
more rounds of all of them while the budget lasts, round-robin so that a busy machine slows them all
alike, each run after one of its own size and followed by the optimizer, as in training. The model,
optimizer and batch are the trainer's (lib.step, lib.task), seeded by
CONFIG_SEED, and the C heap keeps freed memory as a CPU training process's
does (lib.hardware.allocator.keep_freed_memory). Results are cached per
machine, model, precision and checkpointing in
<cache dir>/steptime/measured-<key>.json, with the sizes left out, so a
machine measures a model once; later plans there cost nothing.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace
from typing import Callable, NamedTuple

from ..config import Config

BUDGET_S = 3.0
# A long run affords more: RUN_FRACTION of its estimated length, up to MAX_BUDGET_S. With 3 s the ladder
# reached ResNet-18's (32 px) micro-batch 16-32 of 128 here, with 10 s 64-128.
RUN_FRACTION = 0.01
MAX_BUDGET_S = 10.0
# Sizes are timed smallest first, each an untimed run then a timed one and the optimizer after it
# (PLANNED_RUNS runs), then in rounds of all of them the same way, so a busy machine slows them all alike:
# REPEATS rounds, more (up to MAX_REPEATS) while half the budget lasts, fewer where the budget runs out.
# The largest size's fastest run sets the level (other processes only ever slow a run down), the median
# of each round's ratios to it the rest (`typical`), from PAIRED_ROUNDS rounds. Choosing sizes up front,
# largest first by an estimate rescaled at micro-batch 1, timed 1 and 16 of ResNet-18's 1-128 here (the
# rescale is ~2.5x pessimistic at 64, where the time per sample is lower), so 32-64, 9% faster, were only
# extrapolated; the ladder timed 1-32. 50 rounds, not 20: the MLP's forward+backward at 16 (1 ms) moved
# 9% between plans with 20.
REPEATS = 3
PLANNED_RUNS = 2
MAX_REPEATS = 50
PAIRED_ROUNDS = 5
# Cached timings from another way of taking them are taken again (2: the median of rounds' ratios, each
# run after one of its size, the optimizer after a backward, by size; 3: with each size's spread and the load)
TIMINGS_FORMAT = 3
START_RATIO = 1.5  # a training step reaches less than the matmul peak: assume 1.5x the roofline at first


class Timing(NamedTuple):
    micro: float  # seconds of one forward+backward
    optimizer: float  # seconds of the optimizer step after it


class Timings(NamedTuple):
    """What time_micro_batches took: each a dict by micro-batch size."""

    micro: dict[int, float]  # seconds of forward+backward
    optimizer: dict[int, float]  # seconds of the optimizer step after a backward of that size
    spread: dict[int, float]  # the relative half-width of a 90% interval of the size's figure (`spreads`)
    busy_cores: float | None = None  # other processes' CPU use meanwhile, in cores (lib.hardware.host)


def power_sizes(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`."""
    return [2**k for k in range(max(1, limit).bit_length()) if 2**k <= limit]


def budget_for(run_seconds: float | None) -> float:
    """Seconds of timing for a run estimated at `run_seconds` (None: unknown)."""
    return min(MAX_BUDGET_S, max(BUDGET_S, RUN_FRACTION * (run_seconds or 0.0)))


def affordable(sizes: list[int], estimate: Callable[[int], float], budget_s: float) -> bool:
    """Whether the smallest size's PLANNED_RUNS runs fit the budget by the roofline (x START_RATIO)."""
    return bool(sizes) and estimate(min(sizes)) * START_RATIO * PLANNED_RUNS <= budget_s


def typical(first: dict[int, Timing], rounds: list[dict[int, Timing]]) -> tuple[dict[int, float], dict[int, float]]:
    """(forward+backward seconds by size, optimizer seconds by the size whose backward it followed) from the
    ladder's runs (`first`) and the rounds'. The largest size's fastest forward+backward sets the level,
    every other figure the median of its ratios to that within a round: a round's runs share their moment,
    while each size's fastest came from a different one, and the small sizes' fastest lay further below
    their typical run (here the MLP's forward+backward at 128 over 16: 3.6-4.3x fastest over fastest,
    3.5-3.9x by the median of rounds; scripts/diagnostics/cpu_step_protocols.py). Too few rounds for a
    median: each one's fastest run."""
    if len(rounds) < PAIRED_ROUNDS:
        runs = {size: [t, *(r[size] for r in rounds)] for size, t in first.items()}
        return ({size: min(t.micro for t in ts) for size, ts in runs.items()},
                {size: min(t.optimizer for t in ts) for size, ts in runs.items()})
    anchor = max(first)
    level = min(t.micro for t in [first[anchor], *(r[anchor] for r in rounds)])

    def at(size: int, part: str) -> float:
        return level * statistics.median(getattr(r[size], part) / r[anchor].micro for r in rounds)

    return {size: at(size, "micro") for size in first}, {size: at(size, "optimizer") for size in first}


def spreads(rounds: list[dict[int, Timing]]) -> dict[int, float]:
    """Each size's relative half-width of a 90% interval of its figure, from the rounds' ratios to the
    largest size (scaled median absolute deviation, over the square root of the rounds: the median's);
    the largest size's own, the median of the others'. Empty with fewer than PAIRED_ROUNDS rounds."""
    if len(rounds) < PAIRED_ROUNDS:
        return {}
    anchor = max(rounds[0])
    out = {size: relative_spread([r[size].micro / r[anchor].micro for r in rounds])
           for size in rounds[0] if size != anchor}
    out[anchor] = statistics.median(out.values()) if out else 0.0
    return out


def relative_spread(values: list[float]) -> float:
    """The relative half-width of a 90% interval of the values' median: their median absolute deviation as a
    normal standard deviation (x 1.4826), the median's standard error (x 1.253 / sqrt(n)), 90% (x 1.645);
    0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    mad = statistics.median(abs(v - mid) for v in values)
    return 1.645 * 1.253 * 1.4826 * mad / mid / len(values) ** 0.5


def step_clock() -> Callable[[], float]:
    """The clock a timing reads: on one intra-op thread the thread's CPU time, else the wall clock. Another
    process sharing the core takes turns with a run; a short run often fits between its turns and a long one
    never does, so on a busy machine the wall clock favoured small micro-batches (LeNet-5 planned at 16 x 32,
    1.75x slower than 512 x 1 timed back to back); the thread's CPU time is what each run costs, whoever
    else runs, and the real run's share of the core scales every size alike. Several threads wait for each
    other, and that wait is part of the step: the wall clock."""
    import torch

    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def time_micro_batches(config: Config, task, *, precision: str, gradient_checkpointing: bool,
                       sizes: list[int], estimate: Callable[[int], float],
                       budget_s: float = BUDGET_S) -> Timings:
    """Seconds of forward+backward by size, seconds of the optimizer step by the size of the backward before
    it, and each size's spread, timed on the CPU, with the load other processes put on it meanwhile.

    Nothing is timed where the smallest size is not `affordable` by `estimate(size)` (one forward+backward).
    """
    from ..hardware.allocator import keep_freed_memory
    from ..hardware.host import CPULoadMeter
    from ..step import autocast_for, make_optimizer, seed_everything

    if not affordable(sizes, estimate, budget_s):
        return Timings({}, {}, {})
    keep_freed_memory()  # the C heap as a CPU run has it (lib.api.train_planned), unless RAM is short there
    seed_everything(config.seed)
    model = task.build(gradient_checkpointing)
    model.train()
    optimizer = make_optimizer(config, model)
    autocast = autocast_for(SimpleNamespace(precision=precision, device_type="cpu"))
    batches: dict[int, tuple] = {}

    clock = step_clock()

    def run(size: int) -> float:
        x, y = batches[size] if size in batches else batches.setdefault(size, task.example_batch(size))
        start = clock()
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = task.loss(model(x), y)
        loss.backward()
        return clock() - start

    def timed(size: int) -> Timing:
        """One untimed run, then one timed and the optimizer after it. A run right after another size's
        runs slower or faster by that size's traffic through the caches, where training repeats one size:
        the MLP's step at 128 over 16 read 2.60-2.66x alternating single steps, 2.74-2.97x in runs of one
        size. The optimizer comes after a backward, as in training: its gradients fresh, its state out of
        the caches (LeNet-5's AdamW step took 0.18-0.33 ms back to back here, 0.50-0.75 after a backward
        at 16, 0.66-0.84 at 128; scripts/diagnostics/cpu_step_protocols.py)."""
        run(size)
        micro = run(size)
        start = clock()
        optimizer.step()
        return Timing(micro, clock() - start)

    run(min(sizes))
    optimizer.step()  # creates the optimizer state
    try:
        meter = CPULoadMeter()
    except Exception:  # noqa: BLE001 - no psutil, no /proc: the load is unknown
        meter = None
    # the budget is the timings': a process's first optimizer imports torch._dynamo (2.1-3.5 s here), which
    # took most of a first plan's 3 s before one size was timed
    started = time.perf_counter()

    def elapsed() -> float:
        return time.perf_counter() - started

    first: dict[int, Timing] = {}
    for size in sorted(sizes):
        if first:  # the next size at the last one's time per sample: on a CPU it rarely falls much further
            last = max(first)
            if elapsed() + first[last].micro * size / last * PLANNED_RUNS + first[last].optimizer > budget_s:
                break
        first[size] = timed(size)  # its untimed run warms up: the allocator grows, oneDNN builds its primitives
    rounds: list[dict[int, Timing]] = []
    cost = sum(PLANNED_RUNS * t.micro + t.optimizer for t in first.values())
    while elapsed() + cost <= budget_s and (  # more only where a whole round still fits
            len(rounds) + 1 < REPEATS or (len(rounds) + 1 < MAX_REPEATS and elapsed() < budget_s / 2)):
        rounds.append({size: timed(size) for size in sorted(first)})
    micro, optimizer_s = typical(first, rounds)
    return Timings(micro, optimizer_s, spreads(rounds), None if meter is None else meter.read().busy_cores)
