#!/usr/bin/env python3
"""What the live monitor costs a training step (make bench-monitor).

Real LeNet-5 training steps on the embedded digits (the lenet5 defconfig),
without a monitor and with one sampling every 1 s and every 0.1 s; the monitored
loops call update() every step, as the trainer does, and log_entry() every 10
steps, and draw the progress bar into a terminal-like sink.  The modes are
interleaved over several repeats, so a burst of load from other processes does
not land on one mode only.

Environment: STEPS (per timed run, default 400: long enough for the 1 s
sampler to tick in it), REPEATS (default 7), BATCH (micro-batch, default 32).  ms/step is the median over repeats; overhead % is
the median over repeats of each repeat's ratio to its own unmonitored run.
"""

from __future__ import annotations

import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402

from kfit_env import run_main  # noqa: E402
from lib.config import make_defconfig  # noqa: E402
from lib.env import env_number  # noqa: E402
from lib.hardware import resolve_hardware  # noqa: E402
from lib.monitor import Monitor  # noqa: E402
from lib.task import load_task  # noqa: E402
from lib.step import make_optimizer  # noqa: E402

LOG_EVERY = 10
MODES = (("no monitor", None), ("monitor 1s", 1.0), ("monitor 0.1s", 0.1))


class TerminalSink(io.TextIOBase):
    """A terminal that shows nothing: the bar is drawn (and paid for) but not printed."""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        return len(s)


def main() -> None:
    steps = env_number("STEPS", int, 400, minimum=1)
    repeats = env_number("REPEATS", int, 7, minimum=1)
    batch = env_number("BATCH", int, 32, minimum=1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        config = make_defconfig("lenet5", out=tmp_path / "config")
        task = load_task(config)
        torch.manual_seed(config.seed)
        hardware = resolve_hardware()  # this machine: on an NVIDIA GPU the sampler reads NVML too
        device = torch.device("cpu" if hardware.accelerator == "cpu" else "cuda")
        model = task.build(False).to(device)
        optimizer = make_optimizer(config, model)
        n = len(task.train)
        batches = [tuple(t.to(device) for t in task.train[[(i + j) % n for j in range(batch)]])
                   for i in range(0, n, batch)]
        step_no = [0]

        def train_steps(count: int, monitor: Monitor | None) -> float:
            """Seconds for `count` optimizer steps."""
            start = time.perf_counter()
            for _ in range(count):
                x, y = batches[step_no[0] % len(batches)]
                optimizer.zero_grad(set_to_none=True)
                loss = task.loss(model(x), y)
                loss.backward()
                optimizer.step()
                value = loss.item()
                step_no[0] += 1
                if monitor is not None:
                    monitor.update(step_no[0], 1, value, config.learning_rate, step_no[0] * batch)
                    if step_no[0] % LOG_EVERY == 0:
                        monitor.log_entry({"step": step_no[0], "epoch": 1, "loss": value,
                                           "lr": config.learning_rate, "samples_per_s": 0.0})
            return time.perf_counter() - start

        def timed(interval: float | None) -> float:
            if interval is None:
                return train_steps(steps, None)
            with Monitor(tmp_path / "run", 10**9, device, hardware, interval_s=interval,
                         log=lambda line: None, stream=TerminalSink()) as monitor:
                return train_steps(steps, monitor)

        train_steps(steps // 2, None)  # warm-up: allocator, caches, thread pool
        ms = {name: [] for name, _ in MODES}
        for r in range(repeats):
            for name, interval in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                ms[name].append(timed(interval) * 1000 / steps)

        # Each cost in isolation: a sampler tick, update(), log_entry().
        with Monitor(tmp_path / "probe", 10**9, device, hardware,
                     log=lambda line: None, stream=TerminalSink()) as monitor:
            sample_us = per_call_us(monitor._sample)
            counter = iter(range(1, 10**9))
            update_us = per_call_us(lambda: monitor.update(next(counter), 1, 0.5, 0.01, 32))
            entry = {"step": 1, "epoch": 1, "loss": 0.5, "lr": 0.01, "samples_per_s": 1.0}
            log_us = per_call_us(lambda: monitor.log_entry(entry), calls=200)

    base = statistics.median(ms["no monitor"])
    # Each repeat runs every mode back to back: the ratio within a repeat cancels slow
    # drifts of the machine's load, and the median over repeats drops the bursts.
    overheads = {name: statistics.median(t / b - 1 for t, b in zip(ms[name], ms["no monitor"])) * 100
                 for name, _ in MODES}
    where = hardware.primary_gpu.name if hardware.gpus else f"{hardware.cpu.name} ({torch.get_num_threads()} threads)"
    print(f"LeNet-5, micro-batch {batch}, {steps} steps x {repeats} repeats on {where}")
    print(f"{'mode':<14}{'steps':>7}{'ms/step':>10}{'overhead %':>12}")
    for name, _ in MODES:
        print(f"{name:<14}{steps * repeats:>7}{statistics.median(ms[name]):>10.3f}{overheads[name]:>+12.2f}")
    # Other processes on the same cores make the timed comparison noise: say how busy they were.
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"per call: sampler tick {sample_us:.1f} us, update() {update_us:.2f} us, log_entry() {log_us:.1f} us")
    # On a shared machine the run-to-run noise exceeds the monitor's cost, so also add the
    # costs up: update() every step, log_entry() every LOG_EVERY steps, ticks in proportion.
    for name, interval in MODES[1:]:
        cost_us = update_us + log_us / LOG_EVERY + sample_us * (base / 1000) / interval
        print(f"{name}: summed cost {cost_us:.1f} us per {base:.2f} ms step = {cost_us / (base * 10):.3f}%")
    print(f"monitor: overhead_pct={overheads['monitor 1s']:.2f} sample_cost_us={sample_us:.1f}")


def per_call_us(fn, calls: int = 2000) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


if __name__ == "__main__":
    sys.exit(run_main(main))
