"""Real forward+backward times at a few micro-batch sizes on this machine's CPU, when they are cheap.

A roofline says a larger micro-batch is never slower per sample; on a CPU
that is false (LeNet-5 at 512 ran at about 0.7x of 128-256 here: the
activations fall out of the caches). So where real steps are cheap, a few
are timed: powers of two up to the largest micro-batch the plan may use,
smallest first, each with a warm-up and one timed run, while the next size's
cost (guessed from the last one timed, at the same time per sample) fits
the budget (`budget_for`: BUDGET_S seconds in all, more for a long run); then
more rounds of all of them while the budget lasts, round-robin so that a busy machine slows them all alike. The model,
optimizer and batch are the trainer's (lib.step, lib.task), seeded by
CONFIG_SEED, and the C heap keeps freed memory as a CPU training process's
does (lib.hardware.allocator.keep_freed_memory). Results are cached per
machine, model, precision and checkpointing in
<cache dir>/steptime/measured-<key>.json, with the sizes left out, so a
machine measures a model once; later plans there cost nothing.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Callable

from ..config import Config

BUDGET_S = 3.0
# A long run affords more: RUN_FRACTION of its estimated length, up to MAX_BUDGET_S. With 3 s the ladder
# reached ResNet-18's (32 px) micro-batch 16-32 of 128 here, with 10 s 64-128.
RUN_FRACTION = 0.01
MAX_BUDGET_S = 10.0
# Sizes are timed smallest first, a warm-up and one timed run each (PLANNED_RUNS), then in rounds, one
# run of each per round, so a busy machine slows them all alike: REPEATS rounds, more (up to MAX_REPEATS)
# while half the budget lasts, fewer where the budget runs out. The fastest run of each size counts: other
# processes only ever slow a run down. Choosing sizes up front, largest first by an estimate rescaled at
# micro-batch 1, timed 1 and 16 of ResNet-18's 1-128 here (the rescale is ~2.5x pessimistic at 64, where
# the time per sample is lower), so 32-64, 9% faster, were only extrapolated; the ladder timed 1-32.
REPEATS = 3
PLANNED_RUNS = 2
MAX_REPEATS = 20
START_RATIO = 1.5  # a training step reaches less than the matmul peak: assume 1.5x the roofline at first


def power_sizes(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`."""
    return [2**k for k in range(max(1, limit).bit_length()) if 2**k <= limit]


def budget_for(run_seconds: float | None) -> float:
    """Seconds of timing for a run estimated at `run_seconds` (None: unknown)."""
    return min(MAX_BUDGET_S, max(BUDGET_S, RUN_FRACTION * (run_seconds or 0.0)))


def affordable(sizes: list[int], estimate: Callable[[int], float], budget_s: float) -> bool:
    """Whether the smallest size's PLANNED_RUNS runs fit the budget by the roofline (x START_RATIO)."""
    return bool(sizes) and estimate(min(sizes)) * START_RATIO * PLANNED_RUNS <= budget_s


def time_micro_batches(config: Config, task, *, precision: str, gradient_checkpointing: bool,
                       sizes: list[int], estimate: Callable[[int], float],
                       budget_s: float = BUDGET_S) -> tuple[dict[int, float], float | None]:
    """(seconds of forward+backward by size, seconds of one optimizer step), timed on the CPU.

    Nothing is timed where the smallest size is not `affordable` by `estimate(size)` (one forward+backward).
    """
    from ..hardware.allocator import keep_freed_memory
    from ..step import autocast_for, make_optimizer, seed_everything

    if not affordable(sizes, estimate, budget_s):
        return {}, None
    keep_freed_memory()  # the C heap as a CPU run has it (lib.api.train_planned), unless RAM is short there
    seed_everything(config.seed)
    model = task.build(gradient_checkpointing)
    model.train()
    optimizer = make_optimizer(config, model)
    # the budget is the timings': a process's first optimizer imports torch._dynamo (2.1 s here), which took
    # most of a first plan's 3 s before one size was timed
    started = time.perf_counter()
    autocast = autocast_for(SimpleNamespace(precision=precision, device_type="cpu"))

    batches: dict[int, tuple] = {}

    def run(size: int) -> float:
        x, y = batches[size] if size in batches else batches.setdefault(size, task.example_batch(size))
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = task.loss(model(x), y)
        loss.backward()
        return time.perf_counter() - start

    def elapsed() -> float:
        return time.perf_counter() - started

    best: dict[int, float] = {}
    for size in sorted(sizes):
        if best:  # the next size at the last one's time per sample: on a CPU it rarely falls much further
            last = max(best)
            if elapsed() + best[last] * size / last * PLANNED_RUNS > budget_s:
                break
        run(size)  # warm-up: the allocator grows, oneDNN builds its primitives for the new shapes
        best[size] = run(size)
    rounds = 1  # more only where a whole round still fits the budget
    while elapsed() + sum(best.values()) <= budget_s and (
            rounds < REPEATS or (rounds < MAX_REPEATS and elapsed() < budget_s / 2)):
        for size in best:
            best[size] = min(best[size], run(size))
        rounds += 1
    optimizer.step()  # creates the optimizer state; the next steps are timed
    optimizer_s = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        optimizer.step()
        optimizer_s = min(optimizer_s, time.perf_counter() - start)
    return best, optimizer_s
