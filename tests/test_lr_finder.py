"""The LR range test: its suggestion on a problem with a known best LR, exact restore, and `make find-lr`."""

from __future__ import annotations

import copy
import itertools
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lib import config as kc
from lib import lr_finder
from tests.helpers import least_squares, minibatches

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The CI box has 2 cores shared with other jobs: two intra-op threads then spin against each other
    # (measured 15x slower). One thread keeps this file fast; the behaviour under test is the same.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def defaults(tmp_path_factory):
    """The sweep settings `make find-lr` uses by default (Kconfig defaults)."""
    c = kc.make_defconfig("lenet5", out=tmp_path_factory.mktemp("cfg") / "config")
    return dict(min_lr=c.lr_finder_min_lr, max_lr=c.lr_finder_max_lr, steps=c.lr_finder_steps,
                smoothing=c.lr_finder_smoothing, diverge=c.lr_finder_diverge)


# Plain (stochastic) gradient descent on least squares with largest curvature L diverges above 2/L;
# the best constant step for the stiffest direction is 1/L (and 2/(L+mu), the best worst-case rate,
# is within a factor 2 of it). The range test reads minibatches, as it does on real data.
@pytest.mark.parametrize("L,kappa,seed", [(4.0, 10.0, 0), (4.0, 10.0, 1), (0.5, 100.0, 2), (300.0, 1.0, 3)])
def test_suggestion_is_within_a_factor_of_3_of_the_best_lr_on_least_squares(defaults, L, kappa, seed):
    X, y = least_squares(L, kappa, seed)
    torch.manual_seed(seed)
    model = torch.nn.Linear(X.shape[1], 1, bias=False)
    result = lr_finder.range_test(model, lambda m: torch.optim.SGD(m.parameters(), lr=1.0),
                                  minibatches(X, y, 32, seed), F.mse_loss, **defaults)
    best = 1 / L
    assert best / 3 < result.suggestion < 3 * best, (result.suggestion, best)
    assert result.suggestion == pytest.approx(result.min_lr / lr_finder.EDGE_FACTOR)


def test_model_and_optimizer_state_are_restored_exactly():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    F.cross_entropy(model(x), y).backward()
    optimizer.step()  # momentum buffers and BatchNorm running statistics now hold state
    model.eval()
    before_model = copy.deepcopy(model.state_dict())
    before_optimizer = copy.deepcopy(optimizer.state_dict())

    result = lr_finder.range_test(model, optimizer, itertools.repeat((x, y)), F.cross_entropy, steps=30)
    assert len(result.lrs) > 5

    after = model.state_dict()
    assert after.keys() == before_model.keys()
    for name, value in before_model.items():
        assert torch.equal(after[name], value), name
    state = optimizer.state_dict()
    assert state["param_groups"] == before_optimizer["param_groups"]  # the LR is back to 0.01
    for key, values in before_optimizer["state"].items():
        for name, tensor in values.items():
            assert torch.equal(state["state"][key][name], tensor), (key, name)
    assert not model.training  # the mode is restored too
    assert all(p.grad is None for p in model.parameters())


def test_smoothing_is_bias_corrected_and_divergence_stops_the_sweep():
    X, y = least_squares(4.0, 10.0, 0)
    result = lr_finder.range_test(torch.nn.Linear(16, 1, bias=False),
                                  lambda m: torch.optim.SGD(m.parameters(), lr=1.0),
                                  minibatches(X, y, 32, 0), F.mse_loss, min_lr=1e-4, max_lr=1e4, steps=200,
                                  smoothing=0.05, diverge=4.0)
    assert result.smoothed[0] == pytest.approx(result.losses[0])  # no pull towards zero at the start
    assert result.stop_reason == "diverged" and len(result.lrs) < 200
    assert result.smoothed[-1] > 4.0 * min(result.smoothed)
    assert result.lrs[-1] < 1e3  # stopped long before the end of the range


def test_suggestion_rule():
    lrs = lr_finder.lr_schedule(1e-4, 1.0, 5)
    assert lrs[0] == pytest.approx(1e-4) and lrs[-1] == pytest.approx(1.0)
    low, steep, suggestion = lr_finder.suggest(lrs, [3.0, 2.9, 1.0, 0.5, 5.0])
    assert (low, steep) == (lrs[3], lrs[1]) and suggestion == pytest.approx(lrs[3] / 3)
    assert lr_finder.suggest(lrs, [1.0, 2.0, 3.0, 4.0, 5.0]) == (None, None, None)  # only rose: range too high
    summary = lr_finder.summarize([SimpleNamespace(suggestion=s) for s in (1e-3, 4e-3, 2e-3, None)])
    assert (summary.suggestion, summary.low, summary.high, summary.failed) == (2e-3, 1e-3, 4e-3, 1)
    assert summary.spread == pytest.approx(4.0)


def test_memory_warning_reads_the_plans_prediction_when_there_is_one():
    hardware = SimpleNamespace(primary_gpu=None, cpu=SimpleNamespace(ram_available_bytes=16 * 2**30))
    plan = SimpleNamespace(micro_batch=64, device_type="cpu", predicted_peak_bytes=2**30, budget_bytes=4 * 2**30)
    assert lr_finder.memory_warning(plan, hardware, 64) is None
    assert "predicted peak 4.00GiB is 100% of the memory budget" in lr_finder.memory_warning(plan, hardware, 256)
    plain = SimpleNamespace(micro_batch=64, device_type="cpu")  # a plan without a prediction (tiers policy)
    assert lr_finder.memory_warning(plain, hardware, 64) is None
    assert "above the plan's micro-batch 64" in lr_finder.memory_warning(plain, hardware, 128)


def test_report_chart_follows_the_window_and_keeps_its_label_off_the_markers():
    lrs = lr_finder.lr_schedule(1e-5, 10.0, 40)
    smoothed = tuple(2.0 - i / 30 if i < 30 else 1.0 + (i - 29) for i in range(40))
    low, steep, suggestion = lr_finder.suggest(lrs, smoothed)
    result = lr_finder.RangeTest(lrs=tuple(lrs), losses=smoothed, smoothed=smoothed, stop_reason="diverged",
                                 seconds=0.1, min_lr=low, steepest_lr=steep, suggestion=suggestion)
    page = lr_finder.render_report([result], lr_finder.summarize([result]), title="t", facts=[("model", "m")])
    [svg] = re.findall(r"<svg\b[^>]*>", page)
    assert "viewBox=" in svg and not re.search(r'\swidth="', svg)  # drawn at the column's width, not 760 px
    assert f"suggestion {suggestion:.2g}" in page and "<polygon" in page
    axes = lr_finder._axes([result])
    # The label's row (13 px text on baseline label_y) ends above the markers' row, which ends above the plot.
    assert axes.label_y + 4 < axes.marker_y - 8 and axes.marker_y <= axes.margin[0]


# --------------------------------------------------------------------------
# Through make, as a user runs it


def test_make_find_lr_uses_the_per_device_batch_and_applies_the_median(tmp_path):
    fragment = tmp_path / "fragment"
    fragment.write_text('CONFIG_DEVICE_CPU=y\nCONFIG_HYPER_PARAM_POLICY_TIERS=y\nCONFIG_TARGET_EFFECTIVE_BATCH=64\n'
                        'CONFIG_LR_FINDER_STEPS=40\nCONFIG_LR_FINDER_MIN_LR="1e-5"\nCONFIG_LR_FINDER_MAX_LR="10"\n')
    config = tmp_path / "config"
    kc.make_defconfig("lenet5", [str(fragment)], out=config)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS")) and k not in
           ("BATCH", "HW", "GPU", "FREE_GB", "GPUS", "OMP_NUM_THREADS")}
    # 4 processes would share the target 64: each runs 16 samples, and so does the range test.
    env.update(KCONFIG_CONFIG=str(config), WORLD_SIZE="4", RUNS="2", APPLY="1", OMP_NUM_THREADS="1")
    result = subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "find-lr"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "one process on cpu (fp32) at batch 16 (the plan's per-device micro-batch; training steps micro-batches " \
        "16 x 1 x 4 processes = 64" in out
    assert len(re.findall(r"^  run \d \(seed \d+\): \d+ steps", out, re.M)) == 2
    suggested = float(re.search(r"Suggested learning rate at the measured batch 16: (\S+) \(median of 2 runs",
                                out).group(1))
    # AdamW at 4 x the measured batch: the square-root rule doubles it (each figure rounded to two digits)
    converted = float(re.search(r"at the effective batch 64: (\S+) \(square-root scaling", out).group(1))
    assert converted == pytest.approx(2 * suggested, rel=0.06)
    report = Path(re.search(r"Report: (\S+)", out).group(1))
    html = (tmp_path / report).read_text()
    assert "<svg" in html and "<polyline" in html and f"<b>{suggested:.2g}</b>" in html
    assert (tmp_path / report).parent.parent == tmp_path / "runs"
    assert kc.read_config(config).learning_rate == converted  # APPLY=1 went through the strict writer
    assert (tmp_path / "config.old").is_file()


def test_a_batch_larger_than_the_training_set_is_refused_before_the_sweep(tmp_path, monkeypatch):
    """BATCH=100000 trained on all 1,437 samples while the report said 100000."""
    from lib.errors import KfitError
    from lib.hardware import resolve_hardware
    from lib.hyperparams import ModelDescription, TierPolicy, resolve
    from lib.task import load_task

    config = kc.make_defconfig("lenet5", out=tmp_path / "config")
    plan = resolve(config, resolve_hardware(gpu="cpu"), ModelDescription.from_config(config), 1, TierPolicy())
    task = load_task(config)
    swept = []
    monkeypatch.setattr(lr_finder, "range_test", lambda *a, **k: swept.append(1))
    with pytest.raises(KfitError, match=rf"batch 100000 is larger than the training set \({len(task.train):,} "
                                        rf"samples\).*give BATCH={len(task.train)} or less"):
        lr_finder.find_lr(config, plan, batch=100000, task=task)
    assert swept == []
    lr_finder.find_lr(config, plan, batch=len(task.train), task=task)  # all of them is a batch
    assert swept == [1]
