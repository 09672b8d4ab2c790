"""make bench-throughput's measuring and output (scripts/bench_throughput.py) on a tiny case."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from lib import config as kc
from lib.hardware import resolve_hardware
from lib.hyperparams import resolve
from lib.plan import ModelDescription
from lib.task import load_task

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench_throughput as bench  # noqa: E402



def test_sweep_points_keep_the_effective_batch():
    assert [(p.micro, len(p.sizes)) for p in bench.sweep_points(64, 64)] == [(8, 8), (16, 4), (32, 2), (64, 1)]
    assert [p.micro for p in bench.sweep_points(96, 48)] == [8, 16, 32, 48, 64]  # the plan's own joins the sweep
    assert bench.Point(64, 96).sizes == [64, 32]  # a short last micro-batch, as the trainer cuts the window
    # a plan's micro-batch that does not divide the share: the resolver's 171 for 512, as the trainer runs it
    [plan] = [p for p in bench.sweep_points(512, 171) if p.micro == 171]
    assert plan.batches == [(171, 171 / 512), (171, 171 / 512), (170, 170 / 512)] and plan.samples == 512
    two = bench.Point(86, 512, world_size=2)  # one rank's 256 of each 512-sample window
    assert two.sizes == [86, 86, 84] and two.samples == 256 and sum(w for _, w in two.batches) == 0.5
    assert [p.micro for p in bench.sweep_points(512, 86, world_size=2)] == [8, 16, 32, 64, 86, 128, 256]


def test_measures_real_steps_and_prints_table_and_summary(tmp_path):
    config = kc.derive(kc.make_defconfig("lenet5", out=tmp_path / ".config"),
                       {"HYPER_PARAM_MANUAL": True, "BATCH_SIZE": 8, "GRADIENT_ACCUMULATION": 2})
    plan = resolve(config, resolve_hardware(gpu="cpu"), ModelDescription.from_config(config))
    calls = []
    points = bench.measure_case(config, plan, load_task(config), rounds=2, budget_s=0.0, round_s=0.0, calibration_s=0.0,
                                calibration_steps=1,
                                after_first=lambda pts: calls.append(sorted(pts)) or 16)
    assert calls == [[8, 16]] and sorted(points) == [8, 16]
    assert all(len(p.steps) == 2 and all(len(r) == 1 and r[0] > 0 for r in p.steps) for p in points.values())
    row = bench.Row(case="lenet5", threads=1, plan=(8, 2), calibrated_plan=(16, 1), points=points,
                    predicted=points[8].seconds() * 1.5, predicted_calibrated=None)
    assert row.errors()[0] == pytest.approx(abs(1.5 * points[8].seconds() / row.measured(8) - 1))
    assert 0 < row.ratio() <= 1
    header, line = bench.table([row])
    assert header.split()[:4] == ["case", "busy", "thr", "micro"] and line.split()[:4] == ["lenet5", "-", "1", "8"]
    assert re.search(r" 8:\S+ 16:\S+ ", line) and line.rstrip().endswith("-")
    assert re.fullmatch(r"throughput: cases=1 load=0 worst_paired_ratio=\d\.\d{3} min_ratio_to_best=\d\.\d{3} "
                        r"max_run_to_run_move=nan max_step_time_err_calibrated=nan "
                        r"max_step_time_err_uncalibrated=\d+\.\d{3}", bench.summary([row]))


def test_a_plan_that_does_not_divide_the_share_runs_the_trainers_micro_batches(tmp_path, monkeypatch):
    config = kc.derive(kc.make_defconfig("lenet5", out=tmp_path / ".config"),
                       {"HYPER_PARAM_MANUAL": True, "BATCH_SIZE": 8, "GRADIENT_ACCUMULATION": 2})
    plan = dataclasses.replace(resolve(config, resolve_hardware(gpu="cpu"), ModelDescription.from_config(config)),
                               micro_batch=6, grad_accum=3)  # 16 samples: 6 + 6 + 4
    ran = []
    original = bench.Runner._micro_batch
    monkeypatch.setattr(bench.Runner, "_micro_batch",
                        lambda self, n, weight: ran.append((n, weight)) or original(self, n, weight))
    points = bench.measure_case(config, plan, load_task(config), rounds=1, budget_s=0.0, round_s=0.0,
                                calibration_s=0.0)
    assert sorted(points) == [6, 8, 16] and points[6].samples == points[8].samples == 16
    # ascending in round one: 6 (a warm-up micro-batch of 6, then one step), 8, 16
    assert ran[:4] == [(6, 1.0), (6, 0.375), (6, 0.375), (4, 0.25)]
    assert points[6].samples_per_second() == pytest.approx(16 / points[6].seconds())


def _row(rounds: dict[int, list[float]]) -> "bench.Row":
    points = {m: bench.Point(m, 64) for m in rounds}
    for m, seconds in rounds.items():
        points[m].steps = [[s] for s in seconds]
    return bench.Row(case="x", threads=1, plan=(64, 1), calibrated_plan=(64, 1), points=points,
                     predicted=None, predicted_calibrated=None)


def test_ratio_picks_the_best_on_rounds_it_does_not_judge_on():
    # one lucky round makes 32 the maximum over all rounds (0.95 s median against 1.0): a noise win
    noisy = _row({64: [1.0, 1.0], 32: [0.8, 1.1]})
    assert noisy.best().micro == 32
    assert noisy.ratio() == pytest.approx(1.0)  # held out, 32 is no faster than the plan (1.1 counts as 1)
    assert _row({64: [1.0, 1.0], 32: [0.8, 0.95]}).ratio() == pytest.approx((0.95 + 0.8) / 2)  # faster both ways
    # a real gap shows in every round, held out or not
    assert _row({64: [1.2, 1.2], 32: [1.0, 1.0]}).ratio() == pytest.approx(1 / 1.2)
    # a point that missed a half (the re-resolved plan's joins after round one): all rounds
    late = _row({64: [1.0, 1.0], 32: [1.1, 1.1]})
    late.points[64].steps[1] = []
    assert late.ratio() == pytest.approx(1.0)


def test_paired_ratios_compare_the_plan_with_the_best_within_each_round():
    # a drift that slows every point alike in round 3 leaves the paired ratios alone
    row = _row({64: [9.9, 1.0, 1.2, 2.4, 1.2], 32: [9.9, 0.8, 1.0, 2.0, 1.0]})
    mid, low, high = row.paired()
    assert mid == pytest.approx(0.8 / 1.0, rel=0.05) and low <= mid <= high <= 1.0
    assert _row({64: [1.0] * 5, 32: [1.1] * 5}).paired() == (1.0, 1.0, 1.0)  # the plan is the best


def test_runs_in_a_row_report_the_largest_move_between_predictions():
    row = _row({64: [1.0, 1.0]})
    assert row.run_to_run_move() is None
    row.predictions = [0.100, 0.110, 0.099]
    assert row.run_to_run_move() == pytest.approx(0.1)


def test_the_background_load_runs_while_asked_and_stops():
    import psutil

    before = {p.pid for p in psutil.Process().children()}  # an earlier test's helpers may still be there
    with bench.background_load(1):
        children = [p for p in psutil.Process().children() if p.pid not in before]
        assert len(children) == 1 and children[0].is_running()
    assert not children[0].is_running() or children[0].status() == psutil.STATUS_ZOMBIE
