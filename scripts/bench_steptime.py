#!/usr/bin/env python3
"""The step-time model calibrated at one micro-batch, predicting another, on this CPU (make bench-steptime).

lib/validation/steptime_transfer.py's measurement (tests/test_steptime_replay.py runs the same one): a tiny
MLP and LeNet-5, AdamW steps timed at micro-batches 16 and 128 in the process's CPU time (one torch thread),
interleaved round by round (a few steps of one size in a row each, as training repeats a size), against
lib.steptime's prediction from counted FLOPs and bytes and this CPU's measured figures. A case's transfer
error: one factor fitted at one size, applied to the other, against its measurement (as
lib.steptime.calibrate applies a measured step), both ways. The instrument, time.process_time,
is independent of the predictor. Run it on an idle machine: beside other work the steps' own ratio moves.

Each model is measured in --trials turns, each measure.py's timings then the rounds of steps: the VM's speed
drifts over minutes, and the steps' own ratio with it. The errors are the prediction's (each size's median
over the turns) against the rounds of all turns; the last column has each turn's worst error against its own rounds. The column
before it is the measured ratio of each size's fastest step, beside the median of the rounds' ratios the
errors are against (the statistic calibrate's median step matches; measure.py's too).

Two predictions per model: "timed", as kfit's CPU plans build the model (measure.py's real forward+backward
and optimizer timings at powers of two up to 128, the per-step overhead from the model), and
"roofline", the counts over this CPU's measured figures alone (what a GPU's plan rests on).

Last line: steptime-transfer: models=N max_error=X% roofline_max_error=Y% trials=T trial_max_error=Z%
goal=10% load=L (X: the timed prediction's worst, Y: the roofline's, Z: the timed prediction's worst in one
turn; L: the 1-minute load average before).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOAL = 0.10


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive count")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive, default=30,
                        help="rounds at each size, each a few steps of that size in a row (default 30)")
    parser.add_argument("--trials", type=positive, default=3, help="turns of timings then rounds (default 3)")
    args = parser.parse_args(argv)
    import torch

    from lib.validation.steptime_transfer import SIZES, cpu_transfer

    torch.set_num_threads(1)  # the process's CPU time is one thread's: the instrument
    from lib.hardware.allocator import keep_freed_memory

    keep_freed_memory()  # as `make train` on a CPU whose RAM is not short: no page faults for each step's tensors
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        rows = cpu_transfer(Path(tmp), rounds=args.rounds, trials=args.trials)
    small, large = SIZES
    print(f"{'model':<8} {'prediction':<10} {'measured ms':>16} {'predicted ms':>16} {'ratio measured':>15} "
          f"{'predicted':>10} {'calibrated at ' + str(small):>18} {'at ' + str(large):>8} {'fastest steps':>14} "
          f"{'per trial':>10}")
    worst = {"roofline": 0.0, "timed": 0.0}
    trial_worst = 0.0
    for name, row in rows.items():
        m = row["measured"]
        trial_worst = max(trial_worst, *row["trial_errors"])
        trials = "/".join(f"{e:.0%}" for e in row["trial_errors"])
        for way in worst:
            p, errors = row[way]["predicted"], row[way]["errors"]
            up, down = errors[(small, large)], errors[(large, small)]
            worst[way] = max(worst[way], abs(up), abs(down))
            print(f"{name:<8} {way:<10} {m[small] * 1e3:7.2f} {m[large] * 1e3:8.2f} {p[small] * 1e3:7.2f} "
                  f"{p[large] * 1e3:8.2f} {row['ratio']:14.2f}x {p[large] / p[small]:9.2f}x {up:+17.1%} {down:+8.1%} "
                  f"{row['fastest_ratio']:13.2f}x {trials:>10}")
    print(f"steptime-transfer: models={len(rows)} max_error={worst['timed']:.1%} "
          f"roofline_max_error={worst['roofline']:.1%} trials={args.trials} trial_max_error={trial_worst:.1%} "
          f"goal={GOAL:.0%} load={load:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
