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
alike, the optimizer stepped after each round's largest size as training steps it. The model,
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
from typing import Callable

from ..config import Config

BUDGET_S = 3.0
# A long run affords more: RUN_FRACTION of its estimated length, up to MAX_BUDGET_S. With 3 s the ladder
# reached ResNet-18's (32 px) micro-batch 16-32 of 128 here, with 10 s 64-128.
RUN_FRACTION = 0.01
MAX_BUDGET_S = 10.0
# Sizes are timed smallest first, a warm-up and one timed run each (PLANNED_RUNS), then in rounds, one
# run of each per round and the optimizer after the largest, so a busy machine slows them all alike:
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
# Cached timings from another way of taking them are taken again (2: the median of rounds' ratios, the
# optimizer after a backward)
TIMINGS_FORMAT = 2
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


def typical(first: dict[int, float], rounds: list[dict[int, float]],
            optimizer: list[float]) -> tuple[dict[int, float], float]:
    """(seconds per size, seconds of the optimizer) from the ladder's runs (`first`), the rounds' and the
    optimizer's (one after each round's largest size). The largest size at its fastest run, the others and
    the optimizer at the median of their ratios to it within a round: a round's runs share their moment,
    while each size's fastest came from a different one, and the small sizes' fastest lay further below
    their typical run (here the MLP's forward+backward at 128 over 16: 3.9-4.1x fastest over fastest,
    3.3-3.9x by the median of rounds). Too few rounds for a median: each one's fastest run."""
    if len(rounds) < PAIRED_ROUNDS:
        return {size: min([t] + [r[size] for r in rounds]) for size, t in first.items()}, min(optimizer)
    anchor = max(first)
    level = min([first[anchor]] + [r[anchor] for r in rounds])
    return ({size: level * statistics.median(r[size] / r[anchor] for r in rounds) for size in first},
            level * statistics.median(o / r[anchor] for o, r in zip(optimizer, rounds)))


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

    def optimize() -> float:
        start = time.perf_counter()
        optimizer.step()
        return time.perf_counter() - start

    run(min(sizes))
    optimize()  # creates the optimizer state
    # the budget is the timings': a process's first optimizer imports torch._dynamo (2.1-3.5 s here), which
    # took most of a first plan's 3 s before one size was timed
    started = time.perf_counter()

    def elapsed() -> float:
        return time.perf_counter() - started

    first: dict[int, float] = {}
    for size in sorted(sizes):
        if first:  # the next size at the last one's time per sample: on a CPU it rarely falls much further
            last = max(first)
            if elapsed() + first[last] * size / last * PLANNED_RUNS > budget_s:
                break
        run(size)  # warm-up: the allocator grows, oneDNN builds its primitives for the new shapes
        first[size] = run(size)
    # The optimizer is timed as training runs it, right after a backward: its gradients fresh and its state
    # out of the caches. Back to back, LeNet-5's AdamW step took 0.18 ms here, after a backward 0.47.
    rounds: list[dict[int, float]] = []
    steps: list[float] = []
    while elapsed() + sum(first.values()) <= budget_s and (  # more only where a whole round still fits
            len(rounds) + 1 < REPEATS or (len(rounds) + 1 < MAX_REPEATS and elapsed() < budget_s / 2)):
        rounds.append({size: run(size) for size in sorted(first)})
        steps.append(optimize())  # after the largest size's backward
    while len(steps) < REPEATS:  # the budget went to the ladder: after the smallest size's backward
        run(min(first))
        steps.append(optimize())
    return typical(first, rounds, steps)
