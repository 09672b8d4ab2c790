"""The probe: real trial steps on the CPU (PROBE_ALWAYS), bisection driven by injected out-of-memory, and the cache."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lib import probe
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.task import load_task
from tests.test_trainer import CPU, make_config, one_thread  # noqa: F401 (fixtures)


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
    # divisors of 96 up to 48 are tried: 48 fails, then bisection finds 16 (24 fails)
    assert (probed.micro_batch, probed.grad_accum, probed.effective_batch) == (16, 6, 96)
    assert probed.eval_batch == 16 and "probe measured" in probed.reasons["micro_batch"]
    assert "trial steps" in lines[0] and "48 failed" in lines[0] and "16 ok" in lines[0]
    cached = json.loads((cache_dir / "probe.json").read_text())
    [entry] = cached.values()
    assert entry["max_micro"] == 16 and entry["trial_steps"] >= 4 and entry["seconds"] > 0
    never = probe.maybe_probe(dataclasses.replace(config, probe="never"), plan, CPU, task, log=lines.append)
    assert never == plan
    auto = probe.maybe_probe(dataclasses.replace(config, probe="auto"), plan, CPU, task, log=lines.append)
    assert auto == plan  # AUTO probes GPUs only


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
    assert (probed.micro_batch, probed.grad_accum, probed.eval_batch) == (64, 8, 300)  # 64: largest divisor <= 100
    assert "cached" in lines[0] and "CONFIG_PROBE_ALWAYS" in lines[0]
