"""The probe: real trial steps on the CPU (PROBE_ALWAYS), bisection driven by injected out-of-memory, and the cache."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lib import probe
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.task import load_task
from tests.helpers import CPU

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KFIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_device(limit: int, fixed: int = 100):
    """fits() of a device where a batch of b takes fixed + b bytes and `limit` bytes exist."""
    tried = []

    def fits(b: int):
        tried.append(b)
        return fixed + b if fixed + b <= limit else None

    return fits, tried


def test_search_bisects_down_over_the_candidates():
    candidates = [1, 2, 4, 8, 16, 32, 64]
    fits, tried = fake_device(limit=100 + 20)
    best, trials = probe.search(fits, candidates, start=6, budget=None, grow=True)
    assert best == 16 and tried == [64, 4, 16, 32]  # bisection over the indices
    assert [ok for _, ok, _ in trials] == [False, True, True, False]


def test_search_grows_only_with_clear_room_under_the_budget():
    candidates = [1, 2, 4, 8, 16, 32, 64, 128]
    fits, tried = fake_device(limit=10_000)
    best, _ = probe.search(fits, candidates, start=2, budget=100 + 60, grow=True)
    assert best == 32 and tried == [4, 8, 16, 32, 64]  # 64 is over the budget: a failure like OOM
    fits, tried = fake_device(limit=10_000)
    assert probe.search(fits, candidates, start=2, budget=None, grow=True)[0] == 4  # no budget: no growth
    fits, tried = fake_device(limit=50)
    assert probe.search(fits, candidates, start=3, budget=None, grow=True) == (None, [(8, False, None),
                        (2, False, None), (1, False, None)])


def test_probe_always_on_cpu_bisects_to_what_fits_and_caches_it(make_config, monkeypatch, cache_dir):
    config = make_config("CONFIG_PROBE_ALWAYS=y\nCONFIG_TARGET_EFFECTIVE_BATCH=96\n")
    plan = dataclasses.replace(resolve(config, CPU, ModelDescription.from_config(config)), micro_batch=48,
                               grad_accum=2, eval_batch=96)  # as a plan for a larger device would be
    monkeypatch.setenv("KFIT_INJECT_OOM_ABOVE", "20")  # a device that holds 20 samples
    task, lines = load_task(config), []
    probed = probe.maybe_probe(config, plan, CPU, task, log=lines.append)
    # the resolver's candidates for 96 (ceil(96 / k) for each k) are tried: 48 fails, then bisection
    # finds 20 (24 fails), which needs 5 micro-batches (4 x 20 + 16) where divisors of 96 needed 6 (of 16)
    assert (probed.micro_batch, probed.grad_accum, probed.effective_batch) == (20, 5, 96)
    assert probed.eval_batch == 16 and "probe measured" in probed.reasons["micro_batch"]
    assert "4 x 20 + 16" in probed.reasons["grad_accum"] and "96 unchanged" in probed.reasons["grad_accum"]
    assert "trial steps" in lines[0] and "48 failed" in lines[0] and "20 ok" in lines[0] and "24 failed" in lines[0]
    cached = json.loads((cache_dir / "probe.json").read_text())
    assert cached.pop("schema") == probe.CACHE_SCHEMA
    [entry] = cached.values()
    assert entry["max_micro"] == 20 and entry["trial_steps"] >= 4 and entry["seconds"] > 0
    never = probe.maybe_probe(dataclasses.replace(config, probe="never"), plan, CPU, task, log=lines.append)
    assert never == plan
    auto = probe.maybe_probe(dataclasses.replace(config, probe="auto"), plan, CPU, task, log=lines.append)
    assert auto == plan  # AUTO probes GPUs only


@pytest.mark.parametrize("layout", [dict(strategy="fsdp", world_size=2),
                                    dict(strategy="none", world_size=2, tensor_parallel=2),
                                    dict(strategy="none", world_size=2, pipeline_parallel=2)])
def test_the_probe_stands_aside_where_a_process_holds_a_share_of_the_model(make_config, monkeypatch, layout):
    """Its trials build a whole replica, which no process of an FSDP, tensor-parallel or pipeline run holds: a
    device limit that a replica's trial would hit must not move the plan."""
    config = make_config("CONFIG_PROBE_ALWAYS=y\nCONFIG_TARGET_EFFECTIVE_BATCH=96\n")
    plan = dataclasses.replace(resolve(config, CPU, ModelDescription.from_config(config)), **layout)
    monkeypatch.setenv("KFIT_INJECT_OOM_ABOVE", "1")
    lines = []
    assert probe.maybe_probe(config, plan, CPU, load_task(config), log=lines.append) == plan
    assert lines == ["Probe: skipped: the plan shards, splits or cuts the model over processes, and the probe's "
                     "trials hold a whole replica; the memory planner's trace of one process's share stands"]


def test_probe_confirms_a_micro_batch_that_does_not_divide_the_share(make_config, monkeypatch):
    config = make_config("CONFIG_PROBE_ALWAYS=y\nCONFIG_TARGET_EFFECTIVE_BATCH=100\n")
    plan = dataclasses.replace(resolve(config, CPU, ModelDescription.from_config(config)), micro_batch=34,
                               grad_accum=3, effective_batch=100)  # 34 + 34 + 32, as the resolver may plan
    monkeypatch.setenv("KFIT_INJECT_OOM_ABOVE", "40")
    lines = []
    probed = probe.maybe_probe(config, plan, CPU, load_task(config), log=lines.append)
    tried = lines[0].split("micro-batch ")[1].split(";")[0]
    assert tried.startswith("34 ok")  # it starts at the planned 34, not at a divisor below it (25)
    assert (probed.micro_batch, probed.grad_accum, probed.effective_batch) == (34, 3, 100)
    assert probed.reasons["grad_accum"] == plan.reasons["grad_accum"]
    assert probed.reasons["micro_batch"].startswith(plan.reasons["micro_batch"])
    assert "probe measured: confirmed" in probed.reasons["micro_batch"]


def test_apply_keeps_a_confirmed_plan_and_lowers_to_the_fewest_micro_batches_that_fit(make_config):
    config = make_config("CONFIG_TARGET_EFFECTIVE_BATCH=512\n")
    plan = dataclasses.replace(resolve(config, CPU, ModelDescription.from_config(config)), micro_batch=171,
                               grad_accum=3, effective_batch=512)
    for fits in (171, 200, 512):  # a larger one that fits does not override the resolver's choice
        kept = probe.apply(plan, {"max_micro": fits, "eval_batch": 7}, "cached")
        assert (kept.micro_batch, kept.grad_accum, kept.effective_batch, kept.eval_batch) == (171, 3, 512, 7)
    lowered = probe.apply(plan, {"max_micro": 150, "eval_batch": 7}, "cached")
    assert (lowered.micro_batch, lowered.grad_accum, lowered.effective_batch) == (128, 4, 512)
    lowered = probe.apply(plan, {"max_micro": 100, "eval_batch": 7}, "cached")  # 6 micro-batches: 5 x 86 + 82
    assert (lowered.micro_batch, lowered.grad_accum, lowered.effective_batch) == (86, 6, 512)
    assert "5 x 86 + 82" in lowered.reasons["grad_accum"] and "100 is the largest" in lowered.reasons["micro_batch"]
    two = dataclasses.replace(plan, world_size=2, micro_batch=86, grad_accum=3, effective_batch=512)
    lowered = probe.apply(two, {"max_micro": 70, "eval_batch": 7}, "cached")  # 256 per process: 4 x 64
    assert (lowered.micro_batch, lowered.grad_accum, lowered.effective_batch) == (64, 4, 512)


def test_probe_auto_on_a_gpu_uses_the_cache_without_running(make_config, cache_dir):
    config = make_config("CONFIG_TARGET_EFFECTIVE_BATCH=512\n")
    config = dataclasses.replace(config, device="auto")
    h100 = resolve_hardware(gpu="h100")
    plan = resolve(config, h100, ModelDescription.from_config(config))
    task = load_task(config)
    key = probe.fingerprint(config, plan, h100, task)
    assert key != probe.fingerprint(config, dataclasses.replace(plan, precision="fp32"), h100, task)
    assert key != probe.fingerprint(config, dataclasses.replace(plan, compile=not plan.compile), h100, task)
    cache_dir.mkdir(exist_ok=True)
    (cache_dir / "probe.json").write_text(json.dumps({key: {"max_micro": 100, "eval_batch": 300}}))
    lines = []
    probed = probe.maybe_probe(config, plan, h100, task, log=lines.append)
    # 100 fits, under the plan's micro-batch: 6 micro-batches of 512, balanced (5 x 86 + 82), not the 8 of
    # the largest divisor (64)
    assert (probed.micro_batch, probed.grad_accum, probed.eval_batch) == (86, 6, 300)
    assert probed.effective_batch == plan.effective_batch == 512
    assert "cached" in lines[0] and "CONFIG_PROBE_ALWAYS" in lines[0]
