#!/usr/bin/env python3
"""kfit's training loop against a minimal hand-written one (make bench-loop).

For each case, the same model (kfit's model definition, built with the same seed), the same training data
(the data set's split, indexed a micro-batch at a time: LeNet-5's digits are normalised and resized per
batch), the same optimizer (AdamW, the same rate and weight-decay groups, CONFIG_GRAD_CLIP's clipping), the same micro-batch
(no accumulation, fp32, eager, one process, the same intra-op threads) train twice:

  kfit       lib.trainer.Trainer.fit() as `make train` runs it, with the config's defaults (its data loader,
             monitor, log lines every CONFIG_LOG_INTERVAL steps, step timer, agreement and checkpoints)
  reference  the loop below, written without kfit: a random permutation per epoch, the split indexed with
             a slice of it, zero_grad / forward / loss / backward / step, and the loss read every LOG_INTERVAL
             steps

The instrument is this script's own: time.perf_counter() around a whole run of STEPS steps after WARMUP
warm-up steps (kfit: from the entry of step WARMUP + 1 to the entry of step WARMUP + STEPS + 1, so every
timed step includes the loop's own work after it; the run's setup, final evaluation and checkpoint are
outside). The two alternate for ROUNDS rounds, and each side's figure is its median round, so a change
in the machine's load falls on both alike.

Last line: loop-overhead: cases=N rounds=R max_overhead=X (X: the largest of kfit's seconds per step over
the reference's, less 1, over the cases; negative where kfit was faster).
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

from bench_throughput import fresh_cache  # noqa: E402  the memory traces kept, the step timer's calibration not

# defconfig -> (micro-batch, timed steps, warm-up steps); GPT-2-tiny is context 128, 5-6 steps/s here
CASES = {"lenet5": (64, 300, 30), "gpt2-tiny": (16, 40, 5)}
ROUNDS = 3
LOG_INTERVAL = 10  # the reference reads its loss as often as kfit logs (CONFIG_LOG_INTERVAL's default)


def config_for(name: str, micro_batch: int, steps: int, out: Path):
    from lib import config as kconfig

    config = kconfig.make_defconfig(name, out=out / f"{name}.config")
    return kconfig.derive(config, {
        "HYPER_PARAM_MANUAL": True, "BATCH_SIZE": micro_batch, "GRADIENT_ACCUMULATION": 1,
        "DEVICE_CPU": True, "PRECISION_FP32": True, "COMPILE_MANUAL": True, "COMPILE_MODEL": False,
        "OPTIMIZER_ADAMW": True, "MAX_STEPS": steps, "EPOCHS": 1000, "EVAL_INTERVAL": 0,
        "LOG_INTERVAL": LOG_INTERVAL, "OUTPUT_DIR": str(out / "runs")})


def run_kfit(config, plan, hardware, task, warmup: int, steps: int) -> float:
    """Seconds of `steps` steps of kfit's loop after `warmup`, timed at the entries of the trainer's steps."""
    from lib.trainer import Trainer

    entries: list[float] = []
    trainer = Trainer(config, plan, hardware, log=lambda line: None, task=task)
    step = trainer.optimizer_step

    def timed(*args):
        entries.append(time.perf_counter())
        return step(*args)
    trainer.optimizer_step = timed
    trainer.fit()
    assert len(entries) == warmup + steps + 1, len(entries)
    return entries[warmup + steps] - entries[warmup]


def reference(build, split, lr: float, weight_decay: float, grad_clip: float, micro_batch: int, warmup: int,
              steps: int, seed: int) -> float:
    """The minimal loop: seconds of `steps` steps after `warmup`."""
    torch.manual_seed(seed)
    model = build()
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=lr)
    n, order, at, started = len(split), torch.randperm(len(split)), 0, 0.0
    for i in range(warmup + steps):
        if i == warmup:
            started = time.perf_counter()
        if at + micro_batch > n:
            order, at = torch.randperm(n), 0
        index = order[at:at + micro_batch]
        at += micro_batch
        x, y = split[index.tolist()]
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1) if logits.dim() == 3 else logits,
                               y.flatten() if logits.dim() == 3 else y)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        if (i + 1) % LOG_INTERVAL == 0:
            loss.item()
    return time.perf_counter() - started


def bench(name: str, micro_batch: int, steps: int, warmup: int, rounds: int, out: Path) -> dict:
    from lib.hardware import resolve_hardware
    from lib.hyperparams import ModelDescription, resolve
    from lib.task import load_task

    config = config_for(name, micro_batch, warmup + steps + 1, out)
    hardware = resolve_hardware(gpu="cpu")
    plan = resolve(config, hardware, ModelDescription.from_config(config))
    task = load_task(config)
    kfit_s, ref_s = [], []
    for _ in range(rounds):
        kfit_s.append(run_kfit(config, plan, hardware, task, warmup, steps))
        torch.set_num_threads(plan.cpu_threads)  # as kfit's configure_backends
        ref_s.append(reference(lambda: task.build(False), task.train, config.learning_rate, config.weight_decay,
                               config.grad_clip, micro_batch, warmup, steps, config.seed))
    kfit, ref = statistics.median(kfit_s), statistics.median(ref_s)
    return {"case": name, "micro_batch": micro_batch, "steps": steps, "threads": plan.cpu_threads,
            "workers": plan.num_workers, "reference": steps * micro_batch / ref, "kfit": steps * micro_batch / kfit,
            "overhead": kfit / ref - 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="defconfigs, comma-separated")
    parser.add_argument("--steps", type=int, help="timed steps per run (default: each case's)")
    parser.add_argument("--warmup", type=int, help="warm-up steps per run (default: each case's)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        print(f"error: unknown case {unknown[0]}: choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    rows = []
    with fresh_cache(), tempfile.TemporaryDirectory() as tmp:
        for name in names:
            micro, steps, warmup = CASES[name]
            rows.append(bench(name, micro, args.steps or steps, args.warmup if args.warmup is not None else warmup,
                              args.rounds, Path(tmp)))
    print(f"{'case':<10} {'micro-batch':>11} {'steps':>6} {'threads':>7} {'workers':>7} "
          f"{'reference/s':>12} {'kfit/s':>10} {'overhead':>9}")
    for r in rows:
        print(f"{r['case']:<10} {r['micro_batch']:>11} {r['steps']:>6} {r['threads']:>7} {r['workers']:>7} "
              f"{r['reference']:>12,.1f} {r['kfit']:>10,.1f} {r['overhead']:>+9.1%}")
    worst = max(r["overhead"] for r in rows)
    print(f"loop-overhead: cases={len(rows)} rounds={args.rounds} max_overhead={worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
