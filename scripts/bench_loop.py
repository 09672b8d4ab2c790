#!/usr/bin/env python3
"""kfit's training loop against a minimal hand-written one (make bench-loop).

For each case, the same model (kfit's model definition, built with the same seed), the same training data
(the data set's split, indexed a micro-batch at a time: LeNet-5's digits are normalised and resized per
batch), the same optimizer (AdamW, the same rate and weight-decay groups, the same implementation: fused where
kfit's lib/step.py runs it fused, CONFIG_GRAD_CLIP's clipping), the same micro-batch (no accumulation, fp32,
eager, one process, the same intra-op threads and loader workers) train twice:

  kfit       lib.trainer.Trainer.fit() as `make train` runs it, with the config's defaults (its data loader,
             monitor, log lines every CONFIG_LOG_INTERVAL steps, step timer, agreement and checkpoints)
  reference  the loop below, written without kfit as a user would with torch alone: a DataLoader over the
             split (a shuffled batch sampler's index lists, the split's items being whole batches, as kfit's
             loader), zero_grad / forward / loss / backward / clip / step, and the loss read every
             LOG_INTERVAL steps

Neither evaluates while timed (NO_EVAL), and the heap is kept as `make train` keeps it on a CPU whose RAM is
not short (lib/hardware/allocator.py keep_freed_memory). The instrument is this script's own: time.perf_counter()
(or with --cpu-time the main thread's CPU time). One round is one kfit run with the reference's steps
interleaved: at the entry of every CHUNK-th of kfit's STEPS timed steps (after WARMUP warm-up steps) the
reference runs CHUNK steps, timed by themselves and left out of kfit's time, so both loops see the same load
and neither pays a cold start (kfit's time runs from step to step entry, so it holds the loop's own work after
each step; its setup, final evaluation and checkpoint are outside). Each side's rate is the samples its timed
steps trained on (an epoch's last micro-batch is short on both) over their seconds; a round's ratio is kfit's
rate over the reference's, a case's the median round's, and the samples/s columns each side's median round.

Last line: loop-overhead: cases=N rounds=R min_ratio=X max_overhead=Y (X: the smallest ratio over the cases,
Y = 1/X - 1: kfit's seconds per sample over the reference's, less 1; negative where kfit was faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torch.utils.data import BatchSampler, DataLoader, RandomSampler  # noqa: E402

from bench_throughput import fresh_cache  # noqa: E402  the memory traces kept, the step timer's calibration not

# defconfig -> (micro-batch, timed steps, warm-up steps, steps per chunk); GPT-2-tiny is context 128, 5-6
# steps/s here; a chunk is 0.1-1 s of steps, so a load that changes over seconds falls on both loops alike
CASES = {"lenet5": (64, 300, 30, 10), "gpt2-tiny": (16, 40, 5, 4)}
ROUNDS = 3
LOG_INTERVAL = 10  # the reference reads its loss as often as kfit logs (CONFIG_LOG_INTERVAL's default)
# Neither loop evaluates while timed (EVAL_INTERVAL 0 would evaluate at each epoch's end: LeNet-5's epoch is
# 23 steps, and its evaluations were a tenth of kfit's time); kfit's final evaluation comes after the timed steps.
NO_EVAL = 1_000_000
# The instrument: wall-clock seconds, or with --cpu-time the main thread's CPU seconds (with one intra-op thread,
# all of a step's work; a loaded machine's waits for a core are left out, on both sides alike)
clock = time.perf_counter


def config_for(name: str, micro_batch: int, steps: int, out: Path):
    from lib import config as kconfig

    config = kconfig.make_defconfig(name, out=out / f"{name}.config")
    return kconfig.derive(config, {
        "HYPER_PARAM_MANUAL": True, "BATCH_SIZE": micro_batch, "GRADIENT_ACCUMULATION": 1,
        "DEVICE_CPU": True, "PRECISION_FP32": True, "COMPILE_MANUAL": True, "COMPILE_MODEL": False,
        "OPTIMIZER_ADAMW": True, "MAX_STEPS": steps, "EPOCHS": 1000, "EVAL_INTERVAL": NO_EVAL,
        "LOG_INTERVAL": LOG_INTERVAL, "OUTPUT_DIR": str(out / "runs")})


class Reference:
    """The minimal loop, written without kfit as a user would with torch alone, run `run(n)` steps at a time."""

    def __init__(self, build, split, lr: float, weight_decay: float, grad_clip: float, fused: bool,
                 micro_batch: int, workers: int, seed: int) -> None:
        torch.manual_seed(seed)
        model = build()
        model.train()
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                       {"params": rest, "weight_decay": 0.0}], lr=lr,
                                      **({"fused": True} if fused else {}))
        self.steps = self.loop(model, optimizer, split, grad_clip, micro_batch, workers, seed)

    @staticmethod
    def loop(model, optimizer, split, grad_clip: float, micro_batch: int, workers: int, seed: int):
        """Yields each step's samples."""
        generator = torch.Generator().manual_seed(seed)
        # the split's items are whole batches: a shuffled batch sampler's index lists, no collation (kfit's loader)
        batches = BatchSampler(RandomSampler(split, generator=generator), micro_batch, drop_last=False)
        step = 0
        while True:
            for x, y in DataLoader(split, batch_size=None, sampler=batches, num_workers=workers, generator=generator):
                optimizer.zero_grad(set_to_none=True)
                logits = model(x)
                loss = F.cross_entropy(logits.flatten(0, 1) if logits.dim() == 3 else logits,
                                       y.flatten() if logits.dim() == 3 else y)
                loss.backward()
                if grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                optimizer.step()
                step += 1
                if step % LOG_INTERVAL == 0:
                    loss.item()
                yield len(y)

    def run(self, n: int) -> tuple[float, int]:
        """(seconds, samples) of the next n steps."""
        started, samples = clock(), 0
        for _ in range(n):
            samples += next(self.steps)
        return clock() - started, samples


def run_round(config, plan, hardware, task, reference: Reference, warmup: int, steps: int,
              chunk: int) -> tuple[tuple[float, int], tuple[float, int]]:
    """One kfit run with the reference's steps interleaved: kfit's (seconds, samples) of `steps` steps after
    `warmup`, timed at the entries of the trainer's steps, and the reference's of as many steps, `chunk` of them
    run at the entry of every chunk-th timed kfit step (and left out of kfit's time)."""
    from lib.trainer import Trainer

    trainer = Trainer(config, plan, hardware, log=lambda line: None, task=task)
    step = trainer.optimizer_step
    calls, kfit, ref, resumed = [0], [0.0, 0], [0.0, 0], [0.0]

    def timed(windows, position, *args):
        i, now = calls[0], clock()
        calls[0] += 1
        if warmup < i <= warmup + steps:  # kfit's steps since the last entry (or the reference's chunk)
            kfit[0] += now - resumed[0]
        if warmup <= i < warmup + steps:
            kfit[1] += len(windows[position])
            if (i - warmup) % chunk == 0:
                seconds, samples = reference.run(min(chunk, warmup + steps - i))
                ref[0], ref[1] = ref[0] + seconds, ref[1] + samples
            resumed[0] = clock()
        return step(windows, position, *args)
    reference.run(warmup)  # the reference's warm-up, before kfit's (untimed)
    trainer.optimizer_step = timed
    trainer.fit()
    assert calls[0] == warmup + steps + 1, calls[0]
    return (kfit[0], kfit[1]), (ref[0], ref[1])


def bench(name: str, micro_batch: int, steps: int, warmup: int, rounds: int, chunk: int, out: Path) -> dict:
    from lib.hardware import resolve_hardware
    from lib.hyperparams import ModelDescription, resolve
    from lib.step import fused_on
    from lib.task import load_task

    config = config_for(name, micro_batch, warmup + steps + 1, out)
    hardware = resolve_hardware(gpu="cpu")
    plan = resolve(config, hardware, ModelDescription.from_config(config))
    task = load_task(config)
    fused = fused_on(config, "cpu")  # the reference runs the AdamW implementation kfit's optimizer runs
    kfit_rate, ref_rate = [], []  # samples/s of each round
    for _ in range(rounds):
        reference = Reference(lambda: task.build(False), task.train, config.learning_rate, config.weight_decay,
                              config.grad_clip, fused, micro_batch, plan.num_workers, config.seed)
        (k_s, k_n), (r_s, r_n) = run_round(config, plan, hardware, task, reference, warmup, steps, chunk)
        kfit_rate.append(k_n / k_s)
        ref_rate.append(r_n / r_s)
    # kfit's rate over the reference's of the same round, interleaved with it: the median round's
    ratio = statistics.median(k / r for k, r in zip(kfit_rate, ref_rate))
    return {"case": name, "micro_batch": micro_batch, "steps": steps, "threads": plan.cpu_threads,
            "workers": plan.num_workers, "reference": statistics.median(ref_rate), "kfit": statistics.median(kfit_rate),
            "ratio": ratio, "overhead": 1 / ratio - 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="defconfigs, comma-separated")
    parser.add_argument("--steps", type=int, help="timed steps per run (default: each case's)")
    parser.add_argument("--warmup", type=int, help="warm-up steps per run (default: each case's)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the main thread's CPU seconds, not wall-clock (a loaded machine; one thread)")
    args = parser.parse_args(argv)
    global clock
    clock = time.thread_time if args.cpu_time else time.perf_counter
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"error: unknown case {unknown[0]}: choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    from lib.hardware.allocator import keep_freed_memory

    keep_freed_memory()  # as `make train` on a CPU whose RAM is not short (lib/api.py): both loops reuse the heap
    rows = []
    with fresh_cache(), tempfile.TemporaryDirectory() as tmp:
        for name in names:
            micro, steps, warmup, chunk = CASES[name]
            rows.append(bench(name, micro, args.steps or steps, args.warmup if args.warmup is not None else warmup,
                              args.rounds, chunk, Path(tmp)))
    print(f"{'case':<10} {'micro-batch':>11} {'steps':>6} {'threads':>7} {'workers':>7} "
          f"{'reference/s':>12} {'kfit/s':>10} {'ratio':>6} {'overhead':>9}")
    for r in rows:
        print(f"{r['case']:<10} {r['micro_batch']:>11} {r['steps']:>6} {r['threads']:>7} {r['workers']:>7} "
              f"{r['reference']:>12,.1f} {r['kfit']:>10,.1f} {r['ratio']:>6.3f} {r['overhead']:>+9.1%}")
    worst = min(rows, key=lambda r: r["ratio"])
    print(f"loop-overhead: cases={len(rows)} rounds={args.rounds} min_ratio={worst['ratio']:.3f} "
          f"max_overhead={worst['overhead']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
