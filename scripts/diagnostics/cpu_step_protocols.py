"""One-off CPU diagnostic (not part of kfit): how the way a step is timed moves what it reads, on make
bench-steptime's two models (lib/validation/steptime_transfer.py: the tiny MLP and LeNet-5), one torch thread,
the process's CPU time, medians over ROUNDS rounds.

Per model, three comparisons behind lib/steptime/measure.py's protocol:
  fastest     forward+backward at 128 over 16: each size's fastest run over the other's, against the median
              of the rounds' ratios (sizes 1-128 in turn each round, as measure.py's rounds run them);
  alternating a whole step (forward, backward, AdamW) at 128 over 16: single steps of each size in turn,
              against runs of four of one size (the first not counted), as training repeats a size;
  optimizer   the AdamW step back to back, and right after a backward at 16 and at 128.

Usage: .venv/bin/python scripts/diagnostics/cpu_step_protocols.py [ROUNDS]   (default 40; about a minute)
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

from lib import config as kc
from lib.hardware.allocator import keep_freed_memory
from lib.step import make_optimizer
from lib.validation.steptime_transfer import CPU_MODELS

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
median = statistics.median


def clocked(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    torch.set_num_threads(1)
    keep_freed_memory()
    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")  # AdamW, as the benchmark's
    for name, make_task in CPU_MODELS.items():
        task = make_task()
        torch.manual_seed(0)
        model = task.build(False)
        optimizer = make_optimizer(config, model)
        batches = {b: task.example_batch(b) for b in SIZES}

        def backward(b):
            model.zero_grad(set_to_none=True)
            task.loss(model(batches[b][0]), batches[b][1]).backward()

        def step(b):
            backward(b)
            optimizer.step()

        step(1)
        runs = {b: [] for b in SIZES}
        for _ in range(ROUNDS):
            for b in SIZES:
                runs[b].append(clocked(lambda: backward(b)))
        fastest = min(runs[128]) / min(runs[16])
        paired = median(a / b for a, b in zip(runs[128], runs[16]))
        single, block = {16: [], 128: []}, {16: [], 128: []}
        for r in range(ROUNDS):
            for b in (16, 128) if r % 2 else (128, 16):
                single[b].append(clocked(lambda: step(b)))
            for b in (16, 128) if r % 2 else (128, 16):
                block[b].append(median([clocked(lambda: step(b)) for _ in range(4)][1:]))
        ratio = {k: median(a / b for a, b in zip(v[128], v[16])) for k, v in (("single", single), ("block", block))}
        back_to_back = median(clocked(optimizer.step) for _ in range(ROUNDS))
        after = {b: [] for b in (16, 128)}
        for _ in range(ROUNDS):
            for b in after:
                backward(b)
                after[b].append(clocked(optimizer.step))
        print(f"{name:<7} fastest {fastest:.2f}x, median of rounds {paired:.2f}x | "
              f"step alternating {ratio['single']:.2f}x, in runs of one size {ratio['block']:.2f}x | AdamW back to back {back_to_back * 1e3:.2f} ms, after a "
              f"backward at 16 {median(after[16]) * 1e3:.2f}, at 128 {median(after[128]) * 1e3:.2f}", flush=True)


if __name__ == "__main__":
    main()
