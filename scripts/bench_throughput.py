#!/usr/bin/env python3
"""Training throughput at the planner's micro-batch against a micro-batch sweep (make bench-throughput).

For each case the plan is resolved on this machine (lib.planning.make_plan
with the detected hardware) in a fresh cache directory, so no step-time
calibration exists (the memory traces are copied in, so planning stays warm).
Then real optimizer steps run, as the trainer runs them (lib.task's data,
model and loss; lib.step's optimizer and autocast; gradient accumulation over
micro-batches weighted by their share; gradient clipping), at the plan's
micro-batch and at every micro-batch of SWEEP up to the effective batch, all
at the same effective batch. Each point's step is a window of the effective
batch cut as the trainer cuts it (lib.trainer.windows.rank_batches, the
largest rank's slice): full micro-batches, then a short one where the
micro-batch does not divide it (the resolver may plan such a one: 171 for 512
runs 171 + 171 + 170), each weighted by its samples. The points are measured in
interleaved rounds (other processes' load then falls on every point alike);
each point's time is the median of its steps, warm-up excluded.
Step time: the plan's prediction (lib.steptime) with no calibration, against
the later rounds; then lib.steptime.calibrate with the first round's steps (as many as the trainer
times, lib.trainer.timing) at
the plan's micro-batch, the plan re-resolved, and its prediction against the
later rounds (never the steps it was calibrated with).
Intra-op threads: lib.threads' decision for the machine as each case starts.

Paired: in each round after the first, the plan's samples/s over the best point's in the same round (the
best: the highest median over those rounds), for the first plan and the re-resolved one; the median of the
worse plan's ratios and a bootstrap 90% interval of that median. Rounds share their moment, so the ratio
of two points in one round cancels a busy machine's drift between rounds.

Runs in a row (RUNS): after the first calibration, RUNS more runs of the same config, each planned from
the calibrations so far, timed as the trainer times its first steps and calibrating the next: their
predicted step times, and the largest move from one run's prediction to the next.

LOAD=N (--load N): N busy processes (a Python loop each) run for the whole bench, started and stopped by it.
Last line: throughput: cases=N load=L worst_paired_ratio=P min_ratio_to_best=R max_run_to_run_move=M
max_step_time_err_calibrated=E max_step_time_err_uncalibrated=U
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lib import config as kconfig  # noqa: E402
from lib.step import autocast_for, make_optimizer, seed_everything  # noqa: E402
from lib.trainer import timing  # noqa: E402
from lib.trainer.windows import rank_batches  # noqa: E402

SWEEP = (8, 16, 32, 64, 128, 256, 512)
# defconfig -> settings merged on top. ResNet-18 trains at 16-35 samples/s on this 2-core CPU (one
# thread, under load): a 512-sample step takes 15-30 s, so it runs at 128 to keep the bench near 4 minutes.
CASES = {"lenet5": {}, "resnet18": {"TARGET_EFFECTIVE_BATCH": 128}, "gpt2-tiny": {}}
ROUND_S = 0.4  # each point runs at least this long per round (at least one step)
# The plan's point in the first round runs the steps lib.steptime.calibrate gets: as many as the trainer
# times for it (lib.trainer.timing: at least STEPS steps and MIN_SECONDS of them).
CALIBRATION_S = timing.MIN_SECONDS
CALIBRATION_STEPS = timing.STEPS
CASE_BUDGET_S = 25.0  # no round starts after a case has measured this long, once it has MIN_ROUNDS
# The first round calibrates; the others are compared with the predictions. ResNet-18's steps (1.6-2.2 s)
# fill a round with one step per point: with 3 rounds its measured step time was a median of two steps and
# the cross-validated ratio judged the plan on one round; 5 give four steps, and halves of 3 and 2 rounds.
MIN_ROUNDS = 5
MAX_ROUNDS = 10
RUNS = 4  # runs in a row after the first calibration, for the predictions' run-to-run move
BOOTSTRAP = 2000  # resamples of the paired ratios for the median's 90% interval


@dataclass
class Point:
    micro: int
    window: int  # samples per optimizer step over all processes: the effective batch
    world_size: int = 1
    steps: list[list[float]] = field(default_factory=list)  # seconds of each step, per round

    @property
    def batches(self) -> list[tuple[int, float]]:
        """(samples, weight) of each micro-batch of a step: the trainer's own cut of the largest rank's
        slice of a window (it sets the pace), full micro-batches, then a short one."""
        window = list(range(self.window))
        return [(len(b), w) for b, w in rank_batches(window, self.world_size - 1, self.world_size, self.micro)]

    @property
    def sizes(self) -> list[int]:
        return [n for n, _ in self.batches]

    @property
    def samples(self) -> int:
        """Per optimizer step on this process."""
        return sum(self.sizes)

    def seconds(self, rounds: slice = slice(None)) -> float:
        return statistics.median(t for r in self.steps[rounds] for t in r)

    def samples_per_second(self, rounds: slice = slice(None)) -> float:
        return self.samples / self.seconds(rounds)


class Runner:
    """A case's model and optimizer, taking real optimizer steps."""

    def __init__(self, config, plan, task) -> None:
        from lib.hardware.allocator import keep_freed_memory

        keep_freed_memory()  # the C heap as the trainer's process has it (lib.api.train_planned)
        seed_everything(config.seed)
        self.config, self.plan, self.task = config, plan, task
        self.model = task.build(plan.gradient_checkpointing)
        self.model.train()
        self.optimizer = make_optimizer(config, self.model)
        self.next = 0
        self.warm: set[int] = set()

    def _indices(self, n: int) -> list[int]:
        size = len(self.task.train)
        start, self.next = self.next, (self.next + n) % size
        return [(start + i) % size for i in range(n)]

    def _micro_batch(self, n: int, weight: float) -> None:
        x, y = self.task.train[self._indices(n)]
        with autocast_for(self.plan):
            loss = self.task.loss(self.model(x), y)
        (loss * weight).backward()

    def step(self, batches: list[tuple[int, float]]) -> float:
        """Seconds of one optimizer step over micro-batches of (samples, weight), weighted as the trainer
        weighs them (their share of the window) and loaded from the split as the trainer loads them."""
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        for size, weight in batches:
            self._micro_batch(size, weight)
        if self.config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return time.perf_counter() - start

    def measure(self, point: Point, min_seconds: float = ROUND_S, min_steps: int = 1) -> list[float]:
        """One round at `point`: a warm-up micro-batch the first time, then steps for min_seconds (at least
        min_steps)."""
        if point.micro not in self.warm:
            self._micro_batch(point.micro, 1.0)
            self.optimizer.zero_grad(set_to_none=True)
            self.warm.add(point.micro)
        times: list[float] = []
        batches = point.batches
        while len(times) < min_steps or sum(times) < min_seconds:
            times.append(self.step(batches))
        point.steps.append(times)
        return times


def sweep_points(window: int, plan_micro: int, world_size: int = 1) -> list[Point]:
    """SWEEP's micro-batches up to a process's share of the window, and the plan's (a divisor or not)."""
    share = -(-window // world_size)
    return [Point(m, window, world_size) for m in sorted({m for m in SWEEP if m <= share} | {plan_micro})]


def measure_case(config, plan, task, *, rounds: int = MIN_ROUNDS, budget_s: float = CASE_BUDGET_S,
                 round_s: float = ROUND_S, calibration_s: float = CALIBRATION_S,
                 calibration_steps: int = CALIBRATION_STEPS, after_first=None,
                 runner: Runner | None = None) -> dict[int, Point]:
    """Interleaved rounds over the sweep (and the plan's micro-batch) at the plan's effective batch per process.

    after_first(points) runs after round one (where the plan's point ran the calibration's steps) and may return
    a micro-batch to add (a re-resolved plan's).
    """
    window, world_size = plan.effective_batch, plan.world_size
    points = {p.micro: p for p in sweep_points(window, plan.micro_batch, world_size)}
    runner = runner or Runner(config, plan, task)
    started = time.perf_counter()
    done = 0
    while done < rounds or (time.perf_counter() - started < budget_s and done < MAX_ROUNDS):
        order = sorted(points) if done % 2 == 0 else sorted(points, reverse=True)
        for micro in order:
            first_at_plan = done == 0 and micro == plan.micro_batch
            if first_at_plan:
                runner.measure(points[micro], max(round_s, calibration_s), calibration_steps)
            else:
                runner.measure(points[micro], round_s)
        done += 1
        if done == 1 and after_first is not None:
            extra = after_first(points)
            if extra and extra not in points:
                points[extra] = Point(extra, window, world_size)
                runner.measure(points[extra], round_s)  # a warm-up in place of the calibration round
                points[extra].steps[0] = []
    return points


# --------------------------------------------------------------------------
# Plans, threads and predictions


def steptime():
    """lib.steptime, or None before it exists."""
    try:
        import lib.steptime as module
    except ImportError:
        return None
    return module


def predicted_seconds(config, hardware, plan) -> float | None:
    seconds = getattr(plan, "predicted_step_seconds", None)
    if seconds is None and steptime() is not None:
        seconds = steptime().predict_step_time(config, hardware, plan).seconds
    return seconds


def set_threads(config, hardware) -> tuple[int, str]:
    from lib.hardware.host import cpu_load
    from lib.planning import Settings
    from lib.threads import decide_cpu_threads

    # a 1 s sample: 0.2 s once caught 0.3 of a core busy between cases (none while they ran), and one thread
    idle = cpu_load(1.0).idle_cores
    threads, why = decide_cpu_threads(config, "cpu", hardware, 1, idle_cores=idle,
                                      omp_threads=Settings.from_environment().omp_threads)
    torch.set_num_threads(threads)
    return threads, why


@contextlib.contextmanager
def fresh_cache():
    """KFIT_CACHE_DIR in a temporary directory holding only the memory traces of the usual one."""
    from lib.memory import default_cache_dir

    usual = default_cache_dir() / "memory"
    previous = os.environ.get("KFIT_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        if usual.is_dir():
            shutil.copytree(usual, Path(tmp) / "memory")
        os.environ["KFIT_CACHE_DIR"] = tmp
        try:
            yield Path(tmp)
        finally:
            if previous is None:
                os.environ.pop("KFIT_CACHE_DIR", None)
            else:
                os.environ["KFIT_CACHE_DIR"] = previous


@dataclass
class Row:
    case: str
    threads: int
    plan: tuple[int, int]
    calibrated_plan: tuple[int, int]
    points: dict[int, Point]
    predicted: float | None  # seconds of the plan's step, uncalibrated
    predicted_calibrated: float | None
    busy_cores: float | None = None  # other processes' CPU use while the case was measured
    predictions: list[float] = field(default_factory=list)  # the runs in a row's predicted step seconds

    def paired(self) -> tuple[float, float, float]:
        """(median, 5th, 95th percentile of the median by bootstrap) of the worse plan's per-round samples/s
        over the best point's in the same round, over the rounds after the calibration round."""
        later = slice(1, None)
        best = self.best(later)

        def ratios(micro: int) -> list[float]:
            plan, top = self.points[micro].steps[1:], best.steps[1:]
            return [statistics.median(b) / statistics.median(a) for a, b in zip(plan, top) if a and b]

        worst = min((ratios(m) for m in {self.plan[0], self.calibrated_plan[0]}), key=lambda r: statistics.median(r))
        rng = random.Random(0)
        medians = sorted(statistics.median(rng.choices(worst, k=len(worst))) for _ in range(BOOTSTRAP))
        return (statistics.median(worst), medians[int(0.05 * BOOTSTRAP)], medians[int(0.95 * BOOTSTRAP) - 1])

    def run_to_run_move(self) -> float | None:
        """The largest |next / previous - 1| of the runs in a row's predictions."""
        p = self.predictions
        return max((abs(b / a - 1) for a, b in zip(p, p[1:])), default=None)

    def best(self, rounds: slice = slice(None)) -> Point:
        return max(self.points.values(), key=lambda p: p.samples_per_second(rounds))

    def ratio(self) -> float:
        """The worse of the two plans' samples/s over the sweep's best, cross-validated: the best micro-batch
        is picked on the even rounds and both rates are taken on the odd ones, then the other way round
        (the mean of the two, each at most 1: a plan faster than the best on held-out rounds is noise). The
        sweep's maximum over the same rounds it picked from is biased upwards by their noise (the fastest of
        eight noisy rates); rounds it was not picked on are not."""
        even, odd = slice(0, None, 2), slice(1, None, 2)
        splits = [(even, odd), (odd, even)]
        if not all(any(p.steps[half]) for p in self.points.values() for half in (even, odd)):
            splits = [(slice(None), slice(None))]  # a point with no steps in a half: nothing to hold out
        ratios = []
        for pick, judge in splits:
            best = self.best(pick).samples_per_second(judge)
            ratios.append(min(1.0, min(self.points[m].samples_per_second(judge)
                                       for m in (self.plan[0], self.calibrated_plan[0])) / best))
        return statistics.fmean(ratios)

    def measured(self, micro: int) -> float:
        return self.points[micro].seconds(slice(1, None))  # rounds after the calibration round

    def errors(self) -> tuple[float | None, float | None]:
        unc = None if self.predicted is None else abs(self.predicted / self.measured(self.plan[0]) - 1)
        cal = (None if self.predicted_calibrated is None else
               abs(self.predicted_calibrated / self.measured(self.calibrated_plan[0]) - 1))
        return unc, cal


def run_case(name: str, settings: dict, hardware, *, rounds: int = MIN_ROUNDS, budget_s: float = CASE_BUDGET_S,
             round_s: float = ROUND_S, runs: int = RUNS, log=print) -> Row:
    from lib.hardware.host import CPULoadMeter
    from lib.planning import make_plan
    from lib.task import load_task

    with fresh_cache(), tempfile.TemporaryDirectory() as tmp:
        config = kconfig.make_defconfig(name, out=Path(tmp) / "config")
        if settings:
            config = kconfig.derive(config, settings)
        threads, why = set_threads(config, hardware)  # before planning: the predictor times steps too
        plan = make_plan(config, hardware).plan
        if getattr(plan, "cpu_threads", threads) != threads:
            threads, why = plan.cpu_threads, plan.reasons["cpu_threads"]
            torch.set_num_threads(threads)
        log(f"{name}: {threads} thread(s): {why}")
        if plan.device_type != "cpu":
            raise SystemExit(f"{name}: planned for {plan.device_type}; this bench measures the CPU")
        predicted = predicted_seconds(config, hardware, plan)
        state = {"plan": plan, "predicted": None}

        def calibrate(points: dict[int, Point]) -> int | None:
            module = steptime()
            if module is None:
                return None
            module.calibrate(config, hardware, plan, points[plan.micro_batch].steps[0])
            again = make_plan(config, hardware).plan
            state.update(plan=again, predicted=predicted_seconds(config, hardware, again))
            return again.micro_batch

        task = load_task(config)
        meter = CPULoadMeter()
        runner = Runner(config, plan, task)
        points = measure_case(config, plan, task, rounds=rounds, budget_s=budget_s, round_s=round_s,
                              after_first=calibrate, runner=runner)
        again = state["plan"]
        predictions = runs_in_a_row(config, hardware, runner, runs) if steptime() is not None else []
        busy = meter.read().busy_cores
    return Row(case=name, threads=threads, plan=(plan.micro_batch, plan.grad_accum),
               calibrated_plan=(again.micro_batch, again.grad_accum), points=points,
               predicted=predicted, predicted_calibrated=state["predicted"], busy_cores=busy, predictions=predictions)


def runs_in_a_row(config, hardware, runner: Runner, runs: int = RUNS) -> list[float]:
    """`runs` runs of the config, each planned from the calibrations so far (its prediction kept), timed as
    the trainer times its first steps and calibrating the next (lib.steptime.calibrate)."""
    from lib.planning import make_plan

    predictions = []
    for _ in range(runs):
        plan = make_plan(config, hardware).plan
        predictions.append(predicted_seconds(config, hardware, plan))
        point = Point(plan.micro_batch, plan.effective_batch, plan.world_size)
        steps = runner.measure(point, CALIBRATION_S, CALIBRATION_STEPS)
        steptime().calibrate(config, hardware, plan, steps)
    return predictions


# --------------------------------------------------------------------------
# Output


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _rate(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


def table(rows: list[Row]) -> list[str]:
    lines = [f"{'case':<20} {'busy':>4} {'thr':>3} {'micro':>5} {'samples/s by micro-batch':<44} "
             f"{'plan/s':>8} {'best':>10} {'ratio':>5} {'paired (90%)':>18} {'step s':>7} {'pred':>7} {'err':>6} "
             f"{'cal':>5} {'pred':>7} {'err':>6}  runs in a row (predicted ms)"]
    for r in rows:
        best = r.best()
        sweep = " ".join(f"{m}:{_rate(p.samples_per_second())}" for m, p in sorted(r.points.items()))
        unc, cal = r.errors()
        plan_micro, cal_micro = r.plan[0], r.calibrated_plan[0]
        mid, lo, hi = r.paired()
        runs = " ".join(f"{p * 1e3:.1f}" for p in r.predictions)
        move = r.run_to_run_move()
        lines.append(f"{r.case:<20} {_f(r.busy_cores, '.1f'):>4} {r.threads:>3} {plan_micro:>5} {sweep:<44} "
                     f"{_rate(r.points[plan_micro].samples_per_second()):>8} "
                     f"{_rate(best.samples_per_second()) + '@' + str(best.micro):>10} {r.ratio():>5.2f} "
                     f"{f'{mid:.2f} ({lo:.2f}-{hi:.2f})':>18} "
                     f"{r.measured(plan_micro):>7.3f} {_f(r.predicted, '.3f'):>7} {_f(unc, '.1%'):>6} "
                     f"{cal_micro:>5} {_f(r.predicted_calibrated, '.3f'):>7} {_f(cal, '.1%'):>6}  "
                     f"{runs}{f' (move {move:.1%})' if move is not None else ''}")
    return lines


def summary(rows: list[Row], load: int = 0) -> str:
    def worst(values):
        values = [v for v in values if v is not None]
        return max(values) if values else math.nan

    return (f"throughput: cases={len(rows)} load={load} worst_paired_ratio={min(r.paired()[0] for r in rows):.3f} "
            f"min_ratio_to_best={min(r.ratio() for r in rows):.3f} "
            f"max_run_to_run_move={worst(r.run_to_run_move() for r in rows):.3f} "
            f"max_step_time_err_calibrated={worst(r.errors()[1] for r in rows):.3f} "
            f"max_step_time_err_uncalibrated={worst(r.errors()[0] for r in rows):.3f}")


@contextlib.contextmanager
def background_load(cores: int):
    """`cores` busy processes (a Python loop each) while the bench runs, stopped on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, cores))]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="defconfigs to run (comma-separated)")
    parser.add_argument("--load", type=int, default=int(os.environ.get("LOAD") or 0),
                        help="busy background processes to run meanwhile (LOAD=)")
    args = parser.parse_args(argv)
    with background_load(args.load):
        time.sleep(1.0 if args.load else 0.0)  # the busy processes running before anything is sampled
        return _bench(args)


def _bench(args) -> int:
    from lib.hardware import detect

    hardware = detect()
    from lib.hardware.host import cpu_load

    print(f"CPU: {hardware.cpu.name}, {args.load} busy background process(es), {cpu_load().describe()}")
    rows = []
    for name in args.cases.split(","):
        # detected again for each case: its idle cores are the load now (the background load's included)
        rows.append(run_case(name, CASES.get(name, {}), detect() if args.load else hardware))
    print("samples/s of real optimizer steps at the plan's effective batch; busy: cores other processes used "
          "meanwhile; 'ratio': the plan's micro-batch "
          "(the worse of uncalibrated and calibrated) over the best; step s: measured after the first round; "
          "pred/err: predicted step time and |pred/measured - 1|, uncalibrated then calibrated; paired: the "
          "median over rounds of the plan's samples/s over the best's in the same round (the worse plan), its "
          "bootstrap 90% interval; runs in a row: each run's predicted step time, planned from the runs before")
    for line in table(rows):
        print(line)
    print(summary(rows, args.load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
