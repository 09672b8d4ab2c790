#!/usr/bin/env python3
"""Data loader throughput across worker counts and prefetch depths (make bench-data).

The configured data set (the .config, with the command line's overrides) is loaded as training loads it:
its training split, in the epoch's sample order cut into micro-batches (lib.trainer.windows), through the
DataLoader the trainer builds (windows.make_loader: batches of indices, the worker count, the prefetch
depth, pinned memory where a CUDA or ROCm GPU is present). Each point reads BATCHES batches; its
throughput counts the batches after the first one (the first waits for the workers to start, shown apart
as "start ms"). The points run in interleaved rounds, so a burst of other processes' load falls on every
point alike, and each point keeps its best round.

The loader runs alone here: training beside it takes cores too (on a CPU, the same ones), so the best
setting here is an upper bound of what the loader gives a run.

Environment: BATCH (samples per batch; default the config's MANUAL batch size, else 32), BATCHES (per
point and round, default 200), WORKERS (comma-separated worker counts, default 0,1,2,... up to the usable
cores, at most 4), PREFETCH (comma-separated depths for the points with workers, default 1,2,4), ROUNDS
(default 2).
Best: the most batches/s; points within TIE of it count as equal and the one with the fewest workers, then
the shallowest prefetch, wins (fewer processes, less memory held).
Last line: data-loader: best workers=W prefetch=P batches_per_s=X
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from kfit_env import config_to_plan, run_main  # noqa: E402
from lib.env import env_number, env_text  # noqa: E402
from lib.errors import KfitError  # noqa: E402

TIE = 0.05  # points within 5% of the fastest are a tie


@dataclass
class Point:
    workers: int
    prefetch: int  # 0: none (no workers)
    rates: list[float] = field(default_factory=list)  # batches/s per round
    starts: list[float] = field(default_factory=list)  # seconds to the first batch per round

    @property
    def best(self) -> float:
        return max(self.rates)

    def label(self) -> str:
        return f"workers={self.workers} prefetch={self.prefetch}"


def counts(name: str, default: list[int], minimum: int) -> list[int]:
    """A comma-separated list of whole numbers from the environment: one error line naming the variable."""
    text = env_text(name)
    if not text:
        return default
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        values = []
    if not values or any(v < minimum for v in values):
        raise KfitError(f"{name}={text!r} must be whole numbers >= {minimum} separated by commas, e.g. {name}="
                        + ",".join(str(v) for v in default))
    return sorted(set(values))


def points_for(workers: list[int], prefetch: list[int]) -> list[Point]:
    return [Point(w, 0) if w == 0 else Point(w, p) for w in workers for p in ([0] if w == 0 else prefetch)]


def measure(point: Point, split, batches: list[list[int]], pin_memory: bool) -> None:
    """One round of `point`: batches/s after the first batch, and the wait for the first."""
    from lib.trainer.windows import make_loader

    started = time.perf_counter()
    feed = iter(make_loader(split, batches, point.workers, point.prefetch, pin_memory))
    next(feed)
    first = time.perf_counter()
    n = 0
    for _ in feed:
        n += 1
    point.starts.append(first - started)
    point.rates.append(n / max(time.perf_counter() - first, 1e-9))
    del feed  # its workers end now, not beside the next point's


def best_point(points: list[Point]) -> Point:
    fastest = max(p.best for p in points)
    return min((p for p in points if p.best >= fastest * (1 - TIE)), key=lambda p: (p.workers, p.prefetch))


def table(points: list[Point], batch: int) -> list[str]:
    lines = [f"{'workers':>7} {'prefetch':>8} {'batches/s':>10} {'samples/s':>11} {'start ms':>9}"]
    for p in points:
        lines.append(f"{p.workers:>7} {p.prefetch or '-':>8} {p.best:>10.1f} {p.best * batch:>11,.0f} "
                     f"{min(p.starts) * 1e3:>9.0f}")
    return lines


def summary(best: Point) -> str:
    return f"data-loader: best workers={best.workers} prefetch={best.prefetch} batches_per_s={best.best:.1f}"


def main() -> int:
    import os

    from lib.hardware import resolve_hardware
    from lib.task import load_task
    from lib.trainer.windows import epoch_micro_batches

    config, note = config_to_plan()
    if note:
        print(note)
    batch = env_number("BATCH", int, config.batch_size if config.hyperparam_mode == "manual" and config.batch_size
                       else 32, minimum=1)
    per_round = env_number("BATCHES", int, 200, minimum=2)
    rounds = env_number("ROUNDS", int, 2, minimum=1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = counts("WORKERS", list(range(0, min(4, cores) + 1)), 0)
    prefetch = counts("PREFETCH", [1, 2, 4], 1)
    hardware = resolve_hardware()
    pin_memory = hardware.accelerator in ("cuda", "rocm")
    split = load_task(config).train
    order = [b for epoch in range(per_round * batch // max(1, len(split)) + 1)
             for b in epoch_micro_batches(len(split), batch, config.seed, epoch)]
    batches = order[:per_round]
    print(f"{config.model}: {len(split):,} training samples, batches of {batch}, {len(batches)} batches a point, "
          f"{rounds} round(s); {cores} usable cores{', pinned memory' if pin_memory else ''}")
    points = points_for(workers, prefetch)
    for r in range(rounds):  # interleaved: each round visits every point, starting one further along
        for point in points[r % len(points):] + points[:r % len(points)]:
            measure(point, split, batches, pin_memory)
    for line in table(points, batch):
        print(line)
    best = best_point(points)
    print(f"fastest within {TIE:.0%}, fewest workers first: CONFIG_DATALOADER_WORKERS_MANUAL=y "
          f"CONFIG_DATALOADER_WORKERS={best.workers}"
          + (f" CONFIG_DATA_PREFETCH_FACTOR={best.prefetch}" if best.workers else "")
          + " (the loader alone: training takes cores beside it)")
    print(summary(best))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
