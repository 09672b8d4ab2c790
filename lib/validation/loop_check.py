"""kfit's training loop against a minimal one on the same device: what the trainer costs per step.

`make bench-loop` compares the two on this CPU; this check does it on the device validated. The same model
(the task's, built with the same seed), the same data (the task's training split, a micro-batch indexed
at a time), the same optimizer and autocast as the plan's (lib.step: make_optimizer, autocast_for, so
only the loop differs), the same micro-batch (no accumulation, eager) train twice:

  kfit       lib.trainer.Trainer.fit() as `make train` runs it (its data loader, monitor, log lines,
             step timer and checkpoints), timed from the entry of optimizer step WARMUP + 1 to the entry of
             step WARMUP + STEPS + 1, the device synchronised at both (its setup, final evaluation and
             checkpoint are outside)
  reference  a random permutation per epoch, the split indexed with a slice of it and moved to the device,
             zero_grad / forward / loss / backward / clipping / step, the loss read every LOG_INTERVAL steps

The two alternate for ROUNDS rounds and each keeps its fastest (the least disturbed). overhead = kfit's
seconds per step over the reference's, less 1; the check passes within TOLERANCE.
"""

from __future__ import annotations

import time

from .. import config as kconfig
from .report import Context, Result, failed, passed

# device -> (defconfig, micro-batch, warm-up steps, timed steps). GPT-2-tiny at 64 is a host-bound step
# on an H100 (about 9 ms): the loop's own work shows there if anywhere. LeNet-5 at 32 on a CPU: short, as the
# test suite runs it.
CASES = {"cuda": ("gpt2-tiny", 64, 10, 100), "cpu": ("lenet5", 32, 3, 20)}
ROUNDS = 2
LOG_INTERVAL = 10  # the reference reads its loss as often as kfit logs (CONFIG_LOG_INTERVAL's default)
TOLERANCE = {"cuda": 0.10, "cpu": 0.5}  # a shared 2-core CPU moves 30% between runs


def config_for(ctx: Context, name: str, micro_batch: int, steps: int):
    config = kconfig.make_defconfig(name, out=ctx.workdir / f"loop-{name}.config")
    return kconfig.derive(config, {
        "HYPER_PARAM_MANUAL": True, "BATCH_SIZE": micro_batch, "GRADIENT_ACCUMULATION": 1,
        "DEVICE_CUDA" if ctx.device == "cuda" else "DEVICE_CPU": True, "COMPILE_MANUAL": True,
        "COMPILE_MODEL": False, "MAX_STEPS": steps, "EPOCHS": 1000, "EVAL_INTERVAL": 1000000,
        "LOG_INTERVAL": LOG_INTERVAL, "OUTPUT_DIR": str(ctx.workdir / "runs")})


def run_kfit(ctx: Context, config, plan, hardware, task, warmup: int, steps: int) -> float:
    """Seconds of `steps` steps of kfit's loop after `warmup`, at the entries of the trainer's steps."""
    from ..trainer import Trainer

    entries: list[float] = []
    trainer = Trainer(config, plan, hardware, log=lambda line: None, task=task)
    step = trainer.optimizer_step

    def timed(*args):
        if len(entries) in (warmup, warmup + steps):
            synchronize(ctx)
        entries.append(time.perf_counter())
        return step(*args)

    trainer.optimizer_step = timed
    trainer.fit()
    if len(entries) < warmup + steps + 1:
        raise RuntimeError(f"kfit's loop ran {len(entries)} steps of {warmup + steps + 1}")
    return entries[warmup + steps] - entries[warmup]


def synchronize(ctx: Context) -> None:
    if ctx.cuda is not None:
        ctx.cuda.synchronize()


def run_reference(ctx: Context, config, plan, task, warmup: int, steps: int) -> float:
    """The minimal loop on the plan's device: seconds of `steps` steps after `warmup`."""
    import torch

    from ..step import autocast_for, make_optimizer, seed_everything

    device = ctx.cuda.device if ctx.cuda is not None else "cpu"
    seed_everything(config.seed)
    model = task.build(False).train().to(device)
    optimizer = make_optimizer(config, model)
    autocast = autocast_for(plan)
    split, micro = task.train, plan.micro_batch
    n, order, at, started = len(split), torch.randperm(len(split)), 0, 0.0
    for i in range(warmup + steps):
        if i == warmup:
            synchronize(ctx)
            started = time.perf_counter()
        if at + micro > n:
            order, at = torch.randperm(n), 0
        x, y = (t.to(device, non_blocking=True) for t in split[order[at:at + micro].tolist()])
        at += micro
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = task.loss(model(x), y)
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        if (i + 1) % LOG_INTERVAL == 0:
            loss.item()
    synchronize(ctx)
    return time.perf_counter() - started


def judge(device: str, figures: dict) -> Result:
    overhead = figures["overhead"]
    text = (f"{figures['model']} micro-batch {figures['micro_batch']} {figures['precision']}: kfit "
            f"{figures['kfit_ms']:.2f} ms/step, reference {figures['reference_ms']:.2f} ms/step, "
            f"overhead {overhead:+.1%}")
    figures = {**figures, "tolerance": TOLERANCE[device]}
    if overhead <= TOLERANCE[device]:
        return passed(text, **figures)
    return failed(f"{text}: above {TOLERANCE[device]:.0%}", **figures)


def check_loop(ctx: Context) -> Result:
    import torch

    from ..hardware import resolve_hardware
    from ..hyperparams import ModelDescription, resolve
    from ..task import load_task

    name, micro, warmup, steps = CASES[ctx.device]
    config = config_for(ctx, name, micro, warmup + steps + 1)
    hardware = resolve_hardware() if ctx.device == "cuda" else resolve_hardware(gpu="cpu")
    plan = resolve(config, hardware, ModelDescription.from_config(config))
    task = load_task(config)
    kfit_s, ref_s = [], []
    for n in range(ROUNDS):  # a run directory each: a second run in the first's would resume it
        run = kconfig.derive(config, {"RUN_NAME": f"loop-{name}-{n}"})
        kfit_s.append(run_kfit(ctx, run, plan, hardware, task, warmup, steps))
        if ctx.device == "cpu":
            torch.set_num_threads(plan.cpu_threads)  # as kfit's configure_backends set them
        ref_s.append(run_reference(ctx, config, plan, task, warmup, steps))
        if ctx.out_of_time():
            break
    kfit, ref = min(kfit_s), min(ref_s)
    figures = {"model": name, "micro_batch": plan.micro_batch, "precision": plan.precision, "steps": steps,
               "warmup": warmup, "rounds": len(kfit_s), "kfit_ms": round(kfit / steps * 1e3, 3),
               "reference_ms": round(ref / steps * 1e3, 3), "overhead": round(kfit / ref - 1, 4),
               "kfit_rounds_s": [round(s, 4) for s in kfit_s], "reference_rounds_s": [round(s, 4) for s in ref_s]}
    return judge(ctx.device, figures)
