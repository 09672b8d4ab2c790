"""A step-time model calibrated at one micro-batch, predicting another, on this CPU: the prediction against
real steps timed independently of it (make bench-steptime, tests/test_steptime_replay.py).

Two models: a tiny MLP (256-512-512-10) and LeNet-5 (its defconfig). For each, lib.steptime's model of an
AdamW step is built from its counted FLOPs and bytes and this CPU's measured figures (steptime.device's
cpu_device), and real steps (forward, backward, AdamW) are timed at SIZES, interleaved round by round. The
transfer error is what `calibrate` would make of it: one factor fitted at one size (measured / predicted),
applied to the other, against the other's measurement; both ways.

Twice per model: the roofline alone (the counts over this CPU's measured figures: what a GPU's plan rests
on), and the model as kfit's CPU plans build it, with measure.py's real forward+backward timings at powers
of two up to the larger size within its budget (lib.steptime.calibrate's _measured): the transfer a plan
on this CPU sees (the optimizer measured too, by the size whose backward it followed). Both model the bare
step that is timed: no trainer's per-step overhead.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import torch

from .. import config as kc
from ..hardware import resolve_hardware
from ..steptime import Counts, StepTimeModel, count_step
from ..steptime.device import cpu_device
from ..steptime.measure import BUDGET_S, power_sizes, time_micro_batches

SIZES = (16, 128)


def tiny_net():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 10))


def tiny_task():
    from types import SimpleNamespace

    def example_batch(n):
        return torch.randn(n, 256), torch.randint(0, 10, (n,))

    return SimpleNamespace(build=lambda ckpt: tiny_net(), example_batch=example_batch, train=[0], eval=[0],
                           loss=torch.nn.functional.cross_entropy)


def lenet_task():
    from ..steptime.count import task_for

    return task_for(kc.read_config(kc.DEFCONFIG_DIR / "lenet5"))


CPU_MODELS = {"mlp": tiny_task, "lenet5": lenet_task}


BLOCK = 4  # steps of one size in a row per round: the first enters that size, the median of the others counts


def measured_steps(task, rounds: int = 30) -> dict[int, list[float]]:
    """CPU seconds of a real AdamW step (forward, backward, optimizer) per size in each of `rounds`, the
    sizes interleaved round by round (alternating which goes first), after a warm-up round. A round runs
    BLOCK steps of each size in a row, as training repeats one size, and keeps the median of all but the
    first: a step right after the other size's ran slower or faster by that size's traffic through the
    caches (alternating single steps, the MLP's at 128 over 16 read 2.60-2.66x; in runs of one size
    2.74-2.97x: scripts/diagnostics/cpu_step_protocols.py). The process's CPU time (time.process_time;
    one torch thread), not the wall clock: other processes only ever add to a step's wall time, and more
    to a long step's than to a short one's. On this shared 2-core machine at load 6-8 the fastest wall
    time of the MLP's step at 128 was 2.4x its CPU time, at 16 1.0x, so wall times made the sizes disagree
    by the load, not by the step (wall times of the MLP at 16 and 128: 6.0 and 8.7 ms one run, 3.6 and
    15.5 the next)."""
    from ..step import make_optimizer

    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")  # AdamW, as the counts
    torch.manual_seed(0)
    model = task.build(False)
    model.train()
    optimizer = make_optimizer(config, model)
    batches = {b: task.example_batch(b) for b in SIZES}
    times: dict[int, list[float]] = {b: [] for b in SIZES}

    def step(b) -> float:
        x, y = batches[b]
        start = time.process_time()
        task.loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.process_time() - start

    for round_ in range(rounds + 1):
        for b in SIZES if round_ % 2 else SIZES[::-1]:
            block = [step(b) for _ in range(BLOCK)]
            if round_:
                times[b].append(statistics.median(block[1:]))
    return times


def step_ratio(times: dict[int, list[float]]) -> float:
    """The large size's step over the small one's: the median of the rounds' ratios, each of two steps taken
    back to back. CPU time still moves with the load here (a VM's stolen time, shared caches: the MLP's
    fastest step at 16 was 3.3, 3.9 and 4.9 ms in three runs a minute apart), and the fastest of each size
    came from different moments, so their ratio moved by 25%; a round's two steps share their moment."""
    small, large = SIZES
    return statistics.median(t1 / t0 for t0, t1 in zip(times[small], times[large]))


def cpu_model(task, cache_dir: Path) -> StepTimeModel:
    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")
    phases = {b: count_step(task, config, batch=b, precision="fp32", device_type="cpu",
                            gradient_checkpointing=False)[0] for b in (1, 2)}
    parameters = sum(p.numel() for p in task.build(False).parameters())
    counts = Counts(phases=phases, parameters=parameters, train_samples=1, eval_samples=1)
    # a bare step, as measured_steps times it: no trainer around it (its per-step overhead, 0.2 ms, was 12%
    # of the MLP's step at 16 and none of the measurement's), as the H100 replays model their bare loops
    device = dataclasses.replace(cpu_device(resolve_hardware(gpu="cpu"), cache_dir), step_overhead_s=0.0)
    return StepTimeModel(counts=counts, device=device, precision="fp32")


def with_timings(model: StepTimeModel, task) -> StepTimeModel:
    """The model with measure.py's timings of the task at powers of two up to the larger size, as a CPU
    plan's (calibrate._measured: the same call, within its default budget)."""
    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")
    timed = time_micro_batches(config, task, precision="fp32", gradient_checkpointing=False,
                               sizes=power_sizes(max(SIZES)), estimate=model.roofline_micro_seconds, budget_s=BUDGET_S)
    return (dataclasses.replace(model, measured=timed.micro, measured_optimizer=timed.optimizer,
                                measured_spread=timed.spread) if timed.micro else model)


def transfer_errors(predicted: dict[int, float], ratio: float) -> dict[tuple[int, int], float]:
    """Calibrated at one size (one factor), the error at the other, against the measured ratio; both ways."""
    small, large = SIZES
    up = predicted[large] / predicted[small] / ratio - 1
    return {(small, large): up, (large, small): 1 / (1 + up) - 1}


def cpu_transfer(cache_dir: Path, rounds: int = 30, trials: int = 3) -> dict[str, dict]:
    """Per CPU model: measured step seconds at SIZES, and per way of predicting them ("roofline", "timed":
    with measure.py's timings) the predicted seconds and the transfer errors.

    In `trials` turns, each measure.py's timings then the steps' rounds: this VM's speed drifts over
    minutes, and the MLP's measured 128/16 ratio with it (2.21-2.80x in six runs of 100 rounds each), so
    one turn's prediction and its measurement came from different states of the machine. The errors are
    the prediction's (each size's median over the turns) against the rounds of every turn; "trial_errors"
    each turn's own."""
    out = {}
    small, large = SIZES
    for name, make_task in CPU_MODELS.items():
        task = make_task()
        model = cpu_model(task, cache_dir)  # this CPU's figures measured afresh (a few seconds) the first time
        turns = []
        for _ in range(trials):
            timed = with_timings(model, task)
            turns.append(({b: timed.seconds(b, 1) for b in SIZES}, measured_steps(task, rounds)))
        times = {b: [t for _, steps in turns for t in steps[b]] for b in SIZES}
        ratio = step_ratio(times)  # measured[large] / measured[small], over every turn's rounds
        row = {"measured": {b: statistics.median(t) for b, t in times.items()}, "ratio": ratio,
               "fastest_ratio": min(times[large]) / min(times[small]),  # the statistic measure.py no longer keeps
               "trial_errors": [max(map(abs, transfer_errors(p, step_ratio(steps)).values())) for p, steps in turns]}
        roofline = {b: model.seconds(b, 1) for b in SIZES}
        timed = {b: statistics.median(p[b] for p, _ in turns) for b in SIZES}  # each size's median over turns
        for way, predicted in (("roofline", roofline), ("timed", timed)):
            row[way] = {"predicted": predicted, "errors": transfer_errors(predicted, ratio)}
        out[name] = row
    return out
