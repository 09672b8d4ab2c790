"""Real forward+backward times at a few micro-batch sizes on this machine's CPU, when they are cheap.

A roofline says a larger micro-batch is never slower per sample; on a CPU
that is false (LeNet-5 at 512 ran at about 0.7x of 128-256 here: the
activations fall out of the caches). So where real steps are cheap, a few
are timed: powers of two up to the largest micro-batch the plan may use,
largest first, as many as the predicted cost of a few runs of each fits
`BUDGET_S` (seconds in all), timed round-robin so that a busy machine slows
them all alike. The model, optimizer and batch are the
trainer's (lib.step, lib.task), seeded by CONFIG_SEED. Results are cached per
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
# Sizes are timed in rounds, one run of each per round after a warm-up run of each, so a busy
# machine slows them all alike; REPEATS rounds, more (up to MAX_REPEATS) while half the budget lasts,
# fewer (one at least) where the estimate was optimistic and the budget ran out. The fastest run of
# each size counts: other processes only ever slow a run down.
REPEATS = 3
MAX_REPEATS = 20
START_RATIO = 1.5  # a training step reaches less than the matmul peak: assume 1.5x the roofline at first


def power_sizes(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`."""
    return [2**k for k in range(max(1, limit).bit_length()) if 2**k <= limit]


def affordable(sizes: list[int], estimate: Callable[[int], float], budget_s: float) -> list[int]:
    """The sizes to time, largest first, whose REPEATS + 1 runs fit the budget together."""
    chosen, cost = [], 0.0
    for size in sorted(sizes, reverse=True):
        each = estimate(size) * START_RATIO * (REPEATS + 1)
        if cost + each <= budget_s:
            chosen.append(size)
            cost += each
    return chosen


def time_micro_batches(config: Config, task, *, precision: str, gradient_checkpointing: bool,
                       sizes: list[int], estimate: Callable[[int], float],
                       budget_s: float = BUDGET_S) -> tuple[dict[int, float], float | None]:
    """(seconds of forward+backward by size, seconds of one optimizer step), timed on the CPU.

    Only the sizes `affordable` within the budget by `estimate(size)` (one forward+backward) are timed.
    """
    from ..step import autocast_for, make_optimizer, seed_everything

    if not affordable(sizes, estimate, budget_s):
        return {}, None
    started = time.perf_counter()
    seed_everything(config.seed)
    model = task.build(gradient_checkpointing)
    model.train()
    optimizer = make_optimizer(config, model)
    autocast = autocast_for(SimpleNamespace(precision=precision, device_type="cpu"))
    batches = {size: task.example_batch(size) for size in sizes}

    def run(size: int) -> float:
        x, y = batches[size]
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = task.loss(model(x), y)
        loss.backward()
        return time.perf_counter() - start

    # The roofline can be several times off on a CPU (ResNet-18's convolutions: about 5x slow, so only
    # micro-batches 1-2 looked affordable): one timed micro-batch of the smallest size rescales the
    # estimate. Per sample, the smallest size is the slowest, so the rescaled estimate stays on the safe side.
    smallest = min(sizes)
    run(smallest)
    ratio = run(smallest) / max(estimate(smallest), 1e-9)
    left = budget_s - (time.perf_counter() - started)
    chosen = affordable(sizes, lambda size: estimate(size) * ratio / START_RATIO, left)
    batches = {size: batches[size] for size in chosen}
    warm = []
    for size in chosen:  # a warm-up run each, largest first; the estimate was optimistic if the budget went
        run(size)
        warm.append(size)
        if time.perf_counter() - started > budget_s:
            break
    best = {size: float("inf") for size in warm}
    rounds = 0
    while rounds < 1 or (time.perf_counter() - started < budget_s and (
            rounds < REPEATS or (rounds < MAX_REPEATS and time.perf_counter() - started < budget_s / 2))):
        for size in warm:
            best[size] = min(best[size], run(size))
        rounds += 1
    optimizer.step()  # creates the optimizer state; the next steps are timed
    optimizer_s = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        optimizer.step()
        optimizer_s = min(optimizer_s, time.perf_counter() - start)
    return best, optimizer_s
