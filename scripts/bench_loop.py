#!/usr/bin/env python3
"""kfit's training loop against a minimal hand-written one (make bench-loop).

The comparison is lib/validation/loop_compare.py's (the validate-gpu `loop` check runs the same one on a GPU):
for each case the same model, data, loss, optimizer (fused AdamW where kfit's is), clipping, micro-batch,
threads and workers train in kfit's Trainer.fit() and in a minimal torch loop, the reference's steps
interleaved in chunks inside kfit's run so a shared machine's load falls on both, neither evaluating while
timed; each side's rate is the samples its timed steps trained on over their seconds, a case's ratio the median
round's. Here on this CPU, fp32, the heap kept as `make train` keeps it on a CPU whose RAM is not short
(lib/hardware/allocator.py keep_freed_memory). The instrument: time.perf_counter(), or with --cpu-time the
main thread's CPU time.

Last line: loop-overhead: cases=N rounds=R min_ratio=X max_overhead=Y (X: the smallest ratio over the cases,
Y = 1/X - 1: kfit's seconds per sample over the reference's, less 1; negative where kfit was faster).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_throughput import fresh_cache  # noqa: E402  the memory traces kept, the step timer's calibration not

from lib.validation.loop_compare import Case, compare, table  # noqa: E402

# defconfig -> (micro-batch, timed steps, warm-up steps, steps per chunk); GPT-2-tiny is context 128, 5-6
# steps/s here; a chunk is 0.1-1 s of steps, so a load that changes over seconds falls on both loops alike
CASES = {"lenet5": (64, 300, 30, 10), "gpt2-tiny": (16, 40, 5, 4)}
ROUNDS = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="defconfigs, comma-separated")
    parser.add_argument("--steps", type=int, help="timed steps per run (default: each case's)")
    parser.add_argument("--warmup", type=int, help="warm-up steps per run (default: each case's)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the main thread's CPU seconds, not wall-clock (a loaded machine; one thread)")
    args = parser.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"error: unknown case {unknown[0]}: choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    from lib.hardware.allocator import keep_freed_memory

    keep_freed_memory()  # as `make train` on a CPU whose RAM is not short (lib/api.py): both loops reuse the heap
    clock = time.thread_time if args.cpu_time else time.perf_counter
    results = []
    with fresh_cache(), tempfile.TemporaryDirectory() as tmp:
        for name in names:
            micro, steps, warmup, chunk = CASES[name]
            case = Case(name, micro, args.steps or steps, args.warmup if args.warmup is not None else warmup, chunk)
            results.append(compare(case, args.rounds, Path(tmp), clock=clock))
    print("\n".join(table(results, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
