"""kfit's training loop against a minimal hand-written one: what the trainer costs per sample.

`make bench-loop` (scripts/bench_loop.py) runs it on this CPU and the validate-gpu `loop` check
(loop_check.py) on the device validated; both are this module. For each case, the same model (the task's
model definition, built with the same seed), the same training data (the task's split, indexed a micro-batch
at a time), the same loss (the task's), the same optimizer (AdamW, the same rate and weight-decay groups, the
same implementation: fused where kfit's lib/step.py runs it fused, CONFIG_GRAD_CLIP's clipping), the same
autocast as the plan's, the same micro-batch (no accumulation, eager, one process, the same intra-op threads,
loader workers and pinning) train twice:

  kfit       lib.trainer.Trainer.fit() as `make train` runs it, with the config's defaults (its data loader,
             monitor, log lines every CONFIG_LOG_INTERVAL steps, step timer, agreement and checkpoints)
  reference  the loop below, written as a user would with torch alone: a DataLoader over the split (a
             shuffled batch sampler's index lists, the split's items being whole batches, as kfit's loader),
             the batch moved to the device, zero_grad / forward / loss / backward / clip / step, and the loss
             read every LOG_INTERVAL steps

Neither evaluates while timed (NO_EVAL). One round is one kfit run with the reference's steps interleaved: at
the entry of every CHUNK-th of kfit's timed steps (after the warm-up steps) the reference runs CHUNK steps,
timed by themselves and left out of kfit's time, so both loops see the same load and neither pays a cold start
(kfit's time runs from step entry to step entry, so it holds the loop's own work after each step; its setup,
final evaluation and checkpoint are outside). On a GPU the device is synchronised at each such boundary. Each
side's rate is the samples its timed steps trained on (an epoch's last micro-batch is short on both) over their
seconds; a round's ratio is kfit's rate over the reference's, a case's the median round's, and its rates each
side's median round. overhead = 1/ratio - 1: kfit's seconds per sample over the reference's, less 1.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from .. import config as kconfig

LOG_INTERVAL = 10  # the reference reads its loss as often as kfit logs (CONFIG_LOG_INTERVAL's default)
# Neither loop evaluates while timed (EVAL_INTERVAL 0 would evaluate at each epoch's end: LeNet-5's epoch is
# 23 steps at 64, and its evaluations were a tenth of kfit's time); kfit's final evaluation comes after the timed
# steps.
NO_EVAL = 1_000_000

Clock = Callable[[], float]


@dataclass(frozen=True)
class Case:
    """One comparison: the defconfig, its micro-batch, timed and warm-up steps, and the reference's chunk."""

    name: str  # a defconfig, or vocab.MODEL (GPT-2 124M on GPT-2's 50,257-token vocabulary)
    micro_batch: int | None  # None: the planner's choice (AUTO) for this device, taken with accumulation 1
    steps: int
    warmup: int
    chunk: int
    compile: bool = False  # both loops compiled: kfit's as its plan compiles, the reference as nanoGPT does


@dataclass
class Comparison:
    """A case's outcome: per round, each side's (seconds, samples); the plan's settings beside them."""

    case: Case
    threads: int
    workers: int
    precision: str
    micro_batch: int = 0
    plan: object = None  # the timed config's plan, its config and hardware: what the MFU's FLOPs are counted from
    config: object = None
    hardware: object = None
    kfit_rounds: list[tuple[float, int]] = field(default_factory=list)
    reference_rounds: list[tuple[float, int]] = field(default_factory=list)

    @property
    def kfit(self) -> float:
        """kfit's samples/s: the median round's."""
        return statistics.median(n / s for s, n in self.kfit_rounds)

    @property
    def reference(self) -> float:
        return statistics.median(n / s for s, n in self.reference_rounds)

    @property
    def ratio(self) -> float:
        """kfit's rate over the reference's of the same round, interleaved with it: the median round's."""
        return statistics.median((kn / ks) / (rn / rs)
                                 for (ks, kn), (rs, rn) in zip(self.kfit_rounds, self.reference_rounds))

    @property
    def overhead(self) -> float:
        return 1 / self.ratio - 1


def base_config(name: str, out: Path, device: str, compile: bool):
    """The case's defconfig (vocab.MODEL: GPT-2 124M on its own vocabulary) on `device` (fp32 on a CPU; the
    plan's precision on a GPU), AdamW, compiled or eager as the case says."""
    from . import vocab

    config = vocab.make_config(out, f"loop-{name}") if name == vocab.MODEL else \
        kconfig.make_defconfig(name, out=out / f"loop-{name}.config")
    on_device = {"DEVICE_CUDA": True} if device == "cuda" else {"DEVICE_CPU": True, "PRECISION_FP32": True}
    return kconfig.derive(config, {**on_device, "COMPILE_MANUAL": True, "COMPILE_MODEL": compile,
                                   "OPTIMIZER_ADAMW": True, "PROBE_NEVER": True})


def config_for(name: str, micro_batch: int, steps: int, out: Path, device: str, compile: bool = False):
    """The case's config at `micro_batch`, no accumulation, `steps` steps, no evaluation while timed."""
    return kconfig.derive(base_config(name, out, device, compile), {
        "HYPER_PARAM_MANUAL": True, "BATCH_SIZE": micro_batch, "GRADIENT_ACCUMULATION": 1, "MAX_STEPS": steps,
        "EPOCHS": 1000, "EVAL_INTERVAL": NO_EVAL, "LOG_INTERVAL": LOG_INTERVAL, "OUTPUT_DIR": str(out / "runs")})


def planned_micro_batch(name: str, out: Path, device: str, compile: bool, hardware) -> int:
    """The micro-batch kfit's planner chooses (AUTO) for the case's model on this device."""
    from ..planning import make_plan

    config = base_config(name, out, device, compile)
    return make_plan(config, hardware).plan.micro_batch


class Reference:
    """The minimal loop, written as a user would with torch alone, run `run(n)` steps at a time."""

    def __init__(self, task, config, plan, clock: Clock, synchronize: Callable[[], None]) -> None:
        from ..step import autocast_for, fused_on

        self.clock, self.synchronize = clock, synchronize
        torch.manual_seed(config.seed)
        model = task.build(False).to(plan.device_type)
        model.train()
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        fused = fused_on(config, plan.device_type)  # the AdamW implementation kfit's optimizer runs
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                       {"params": rest, "weight_decay": 0.0}], lr=config.learning_rate,
                                      **({"fused": True} if fused else {}))
        loss = self.compiled_loss(model, task.loss) if plan.compile else (lambda x, y: task.loss(model(x), y))
        self.steps = self.loop(model, optimizer, loss, task.train, config, plan, autocast_for(plan))

    @staticmethod
    def compiled_loss(model, loss_fn):
        """nanoGPT's recipe: the model computes its loss in forward, and the whole module is compiled."""
        class WithLoss(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, x, y):
                return loss_fn(self.model(x), y)

        torch.compiler.reset()
        return torch.compile(WithLoss())

    @staticmethod
    def loop(model, optimizer, loss_of, split, config, plan, autocast):
        """Yields each step's samples."""
        generator = torch.Generator().manual_seed(config.seed)
        device = plan.device_type
        # the split's items are whole batches: a shuffled batch sampler's index lists, no collation (kfit's loader)
        # compiled, as nanoGPT draws them: every batch full (a short one would recompile the reference's graph)
        batches = BatchSampler(RandomSampler(split, generator=generator), plan.micro_batch, drop_last=plan.compile)
        step = 0
        while True:
            for x, y in DataLoader(split, batch_size=None, sampler=batches, num_workers=plan.num_workers,
                                   pin_memory=plan.pin_memory, generator=generator):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                with autocast:
                    loss = loss_of(x, y)
                loss.backward()
                if config.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                step += 1
                if step % LOG_INTERVAL == 0:
                    loss.item()
                yield len(y)

    def run(self, n: int) -> tuple[float, int]:
        """(seconds, samples) of the next n steps, the device synchronised at their end."""
        started, samples = self.clock(), 0
        for _ in range(n):
            samples += next(self.steps)
        self.synchronize()
        return self.clock() - started, samples


def run_round(config, plan, hardware, task, reference: Reference, case: Case
              ) -> tuple[tuple[float, int], tuple[float, int]]:
    """One kfit run with the reference's steps interleaved: kfit's (seconds, samples) of `case.steps` steps after
    `case.warmup`, timed at the entries of the trainer's steps, and the reference's of as many steps, `case.chunk`
    of them run at the entry of every chunk-th timed kfit step (and left out of kfit's time)."""
    from ..trainer import Trainer

    clock, synchronize = reference.clock, reference.synchronize
    warmup, steps, chunk = case.warmup, case.steps, case.chunk
    trainer = Trainer(config, plan, hardware, log=lambda line: None, task=task)
    step = trainer.optimizer_step
    calls, kfit, ref, resumed = [0], [0.0, 0], [0.0, 0], [0.0]

    def timed(windows, position, *args):
        k = calls[0] - warmup  # timed steps since the warm-up
        calls[0] += 1
        if 0 <= k <= steps and (k % chunk == 0 or k == steps):
            synchronize()
            if k > 0:  # kfit's steps since the reference's last chunk
                kfit[0] += clock() - resumed[0]
            if k < steps:
                seconds, samples = reference.run(min(chunk, steps - k))
                ref[0], ref[1] = ref[0] + seconds, ref[1] + samples
                resumed[0] = clock()
        if 0 <= k < steps:
            kfit[1] += len(windows[position])
        return step(windows, position, *args)
    torch.set_num_threads(plan.cpu_threads)  # as kfit's configure_backends sets them
    reference.run(warmup)  # the reference's warm-up, before kfit's (untimed)
    trainer.optimizer_step = timed
    trainer.fit()
    if calls[0] != warmup + steps + 1:
        raise RuntimeError(f"kfit's loop ran {calls[0]} steps of {warmup + steps + 1}")
    return (kfit[0], kfit[1]), (ref[0], ref[1])


def compare(case: Case, rounds: int, out: Path, device: str = "cpu", clock: Clock = time.perf_counter,
            synchronize: Callable[[], None] = lambda: None,
            out_of_time: Callable[[], bool] = lambda: False) -> Comparison:
    """`rounds` rounds of `case` on `device` (fewer where `out_of_time` says so after one), timed by `clock`."""
    from ..hardware import resolve_hardware
    from ..planning import make_plan
    from ..task import load_task

    hardware = resolve_hardware() if device == "cuda" else resolve_hardware(gpu="cpu")
    micro = case.micro_batch or planned_micro_batch(case.name, out, device, case.compile, hardware)
    config = config_for(case.name, micro, case.warmup + case.steps + 1, out, device, case.compile)
    plan = make_plan(config, hardware).plan
    task = load_task(config)
    result = Comparison(case, plan.cpu_threads, plan.num_workers, plan.precision, micro, plan, config, hardware)
    for n in range(rounds):  # a run directory each: a second run in the first's would resume it
        run = kconfig.derive(config, {"RUN_NAME": f"loop-{case.name}-{n}"})
        reference = Reference(task, config, plan, clock, synchronize)
        k, r = run_round(run, plan, hardware, task, reference, case)
        result.kfit_rounds.append(k)
        result.reference_rounds.append(r)
        if out_of_time():
            break
    return result


def table(results: list[Comparison], rounds: int) -> list[str]:
    """make bench-loop's table, one row per case, and its last line: loop-overhead: cases=N rounds=R
    min_ratio=X max_overhead=Y (X: the smallest ratio over the cases, Y = 1/X - 1)."""
    lines = [f"{'case':<10} {'micro-batch':>11} {'steps':>6} {'threads':>7} {'workers':>7} "
             f"{'reference/s':>12} {'kfit/s':>10} {'ratio':>6} {'overhead':>9}"]
    for r in results:
        lines.append(f"{r.case.name:<10} {r.micro_batch:>11} {r.case.steps:>6} {r.threads:>7} {r.workers:>7} "
                     f"{r.reference:>12,.1f} {r.kfit:>10,.1f} {r.ratio:>6.3f} {r.overhead:>+9.1%}")
    worst = min(results, key=lambda r: r.ratio)
    lines.append(f"loop-overhead: cases={len(results)} rounds={rounds} min_ratio={worst.ratio:.3f} "
                 f"max_overhead={worst.overhead:.3f}")
    return lines
