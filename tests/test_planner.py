"""The memory planner policy through resolve(): budgets, the chosen batch, failures, custom models."""

from __future__ import annotations

import json
import textwrap

import pytest

from lib import config as kc
from lib.errors import PlanError
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, TierPolicy, resolve
from lib.memory.predict import PeakCurve, affine_runs
from lib.planning.memory_policy import PLANNER, PlannerPolicy, memory_budget

GIB = 2**30


@pytest.fixture(scope="module")
def gpt2_tiny(tmp_path_factory):
    base = kc.make_defconfig("gpt2-tiny", out=tmp_path_factory.mktemp("c") / ".config")
    return kc.derive(base, {"TARGET_EFFECTIVE_BATCH": 1024})


def plan(config, hardware, policy=None, world_size=1):
    return resolve(config, hardware, ModelDescription.from_config(config), world_size, policy)


def test_planner_is_the_default_and_fills_the_plan(gpt2_tiny):
    p = plan(gpt2_tiny, resolve_hardware(gpu="t4", free_gb=0.3))
    assert p.policy == "planner" and p.precision == "fp16"
    assert p.budget_bytes == int(0.3 * GIB * kc.DEFAULT_SHARE)
    assert p.predicted_peak_bytes <= p.budget_bytes
    assert sum(p.memory_breakdown.values()) == p.predicted_peak_bytes
    assert {"parameters", "gradients", "optimizer_state", "activations"} <= set(p.memory_breakdown)
    # the fastest micro-batch that fits need not divide the target: the last one of a step is then short
    assert p.effective_batch == 1024 and (p.grad_accum - 1) * p.micro_batch < 1024 <= p.grad_accum * p.micro_batch
    assert p.eval_batch >= p.micro_batch and p.eval_predicted_peak_bytes <= p.budget_bytes
    data = json.loads(json.dumps(p.to_dict()))
    for key in ("predicted_peak_bytes", "budget_bytes", "memory_breakdown", "max_micro_batch",
                "eval_predicted_peak_bytes"):
        assert data[key] is not None


def test_capped_batch_fits_and_the_next_one_does_not(gpt2_tiny):
    hardware = resolve_hardware(gpu="t4", free_gb=0.3)
    p = plan(gpt2_tiny, hardware)
    cap = p.max_micro_batch
    assert cap < 1024  # capped by memory, not by the target
    peak = lambda b: PLANNER.predictor.predict(gpt2_tiny, batch=b, device_type="cuda", precision="fp16",  # noqa: E731
                                               compile_mode=p.compile_mode,
                                               gradient_checkpointing=p.gradient_checkpointing).peak_bytes
    assert peak(cap) <= p.budget_bytes < peak(cap + 1)
    assert f"{cap + 1} would need" in p.reasons["micro_batch"]
    more = plan(gpt2_tiny, resolve_hardware(gpu="t4", free_gb=0.6))
    assert more.max_micro_batch > cap  # twice the memory, a larger batch


def test_memory_profile_scales_the_budget(gpt2_tiny):
    hardware = resolve_hardware(gpu="t4", free_gb=1.0)
    sizes = []
    for symbol, share in kc.MEMORY_PROFILES.items():
        config = kc.derive(gpt2_tiny, {f"MEMORY_PROFILE_{symbol}": True})
        assert memory_budget(config, hardware, "cuda")[0] == int(GIB * share)
        sizes.append(plan(config, hardware).max_micro_batch)
    assert sizes == sorted(sizes) and sizes[0] < sizes[2]


def test_batch_one_too_big_is_a_plan_error_with_numbers_and_advice(gpt2_tiny):
    with pytest.raises(PlanError) as err:
        plan(gpt2_tiny, resolve_hardware(gpu="t4", free_gb=0.02))
    text = str(err.value)
    assert "does not fit even at micro-batch 1" in text and "budget is 18MiB" in text  # 0.02 GiB x 90%
    # the peak with the ladder's rungs taken, saying so, then what else would help
    assert "even with the out-of-memory ladder's gradient checkpointing on" in text and "CONFIG_GPT2_PRESET" in text
    assert "\n" not in text
    assert "CONFIG_MEMORY_PROFILE_EXTREME" in text


def test_repeated_resolves_with_derived_configs_hit_the_cache(tmp_path, gpt2_tiny, monkeypatch):
    # its own trace counter and caches: the session's are shared with another pytest worker, whose writes
    # (a step-time calibration, say) between the two plans once made the second trace 3 more sizes
    monkeypatch.setenv("KFIT_CACHE_DIR", str(tmp_path))
    policy = PlannerPolicy(cache_dir=str(tmp_path))
    hardware = resolve_hardware(gpu="a10g", free_gb=1.0)
    first = plan(gpt2_tiny, hardware, policy)
    traced = policy.predictor.traces
    again = plan(gpt2_tiny, hardware, policy)
    assert again == first and policy.predictor.traces == traced
    # an HPO trial with another target: the memory search is reused (at most the new micro-batch is traced)
    plan(kc.derive(gpt2_tiny, {"TARGET_EFFECTIVE_BATCH": 512}), hardware, policy)
    assert policy.predictor.traces <= traced + 1


def test_the_search_stops_at_the_share_and_a_moved_budget_traces_nothing(tmp_path):
    policy = PlannerPolicy(cache_dir=str(tmp_path))  # a cold cache of its own
    lenet = kc.make_defconfig("lenet5", out=tmp_path / ".config")
    cpu = resolve_hardware(gpu="cpu")
    p = plan(lenet, cpu, policy)
    assert p.max_micro_batch == 512 and "the search stops there" in p.reasons["micro_batch"]
    # the share, evaluation at the split, and the micro-batch the step time chose where it is below the share
    # (on a CPU a near-tie may keep 256: lib/steptime/choose.py)
    from lib.threads import using_threads

    with using_threads(p.cpu_threads):  # a CPU trace is keyed by the threads it ran at: the plan's
        cached = policy.predictor.cached_batches(lenet, device_type="cpu", precision="fp32")
    assert cached == sorted({p.micro_batch, 512})
    traced = policy.predictor.traces
    assert traced == (2 if p.micro_batch == 512 else 3)
    for percent in (40, 60, 90):  # RAM available moves between runs: the budget with it
        moved = kc.derive(lenet, {"MEMORY_PROFILE_CUSTOM": True, "MEMORY_PROFILE_PERCENT": percent})
        assert plan(moved, cpu, policy).micro_batch == p.micro_batch
    assert policy.predictor.traces == traced


@pytest.mark.slow
def test_a_binding_budget_that_moves_is_read_off_the_traced_line(tmp_path, gpt2_tiny):
    policy = PlannerPolicy(cache_dir=str(tmp_path))
    for free_gb in (0.27, 0.33):  # the first budgets trace the curves around them (and a new micro-batch)
        assert plan(gpt2_tiny, resolve_hardware(gpu="t4", free_gb=free_gb), policy).max_micro_batch < 1024
    traced = policy.predictor.traces
    caps = []
    for free_gb in (0.28, 0.3, 0.32, 0.31):
        p = plan(gpt2_tiny, resolve_hardware(gpu="t4", free_gb=free_gb), policy)
        caps.append(p.max_micro_batch)
        peak = lambda b: PLANNER.predictor.predict(gpt2_tiny, batch=b, device_type="cuda",  # noqa: E731
                                                   precision="fp16", compile_mode=p.compile_mode,
                                                   gradient_checkpointing=p.gradient_checkpointing).peak_bytes
        assert peak(p.max_micro_batch) <= p.budget_bytes < peak(p.max_micro_batch + 1)  # exact, as traced
    assert policy.predictor.traces == traced and len(set(caps)) == 4
    cache = json.loads(next((tmp_path / "memory").glob("*.json")).read_text())
    assert "affine" in cache  # the line, recorded for people reading the cache


def test_peak_curve_reads_answers_off_proven_lines():
    def shape(b):  # convex, piecewise affine, affine from 64 on: the shape of a ResNet's trace
        return max(500 * b + 82_000, 1000 * b + 50_000)

    calls = []
    curve = PeakCurve(lambda b: calls.append(b) or (shape(b),))
    for budget in (300_000, 1_000_000, 36_000, 90_000, 10**12):
        want = max((b for b in range(1, 4097) if shape(b) <= budget), default=0)
        assert curve.largest_fitting(budget, 4096) == want
    assert len(calls) <= 16
    calls.clear()  # a budget that moves within a proven stretch costs no trace
    assert curve.largest_fitting(700_000, 4096) == 650 and curve.at(651) == shape(651) and calls == []
    assert affine_runs({1: 10, 2: 20, 3: 30, 5: 60, 7: 90}) == [(1, 3), (3, 7)]


def test_tier_policy_plans_carry_no_prediction(gpt2_tiny):
    tiers = kc.derive(gpt2_tiny, {"HYPER_PARAM_POLICY_TIERS": True})
    p = plan(tiers, resolve_hardware(gpu="h100"))
    assert p.policy == "tiers" and p.predicted_peak_bytes is None and p.memory_breakdown is None
    assert plan(gpt2_tiny, resolve_hardware(gpu="h100"), TierPolicy()).policy == "tiers"
    custom = ModelDescription("custom")  # scale 1.0, as GPT-2
    assert TierPolicy().max_micro_batch(hardware=resolve_hardware(gpu="cpu"), model=custom, device_type="cpu",
                                        compile=False, precision="fp32")[0] == 16


@pytest.mark.parametrize("extra,world_size", [({}, 1), ({"PARALLEL_FSDP": True}, 2)])
def test_a_manual_batch_gets_the_planners_memory_and_a_note_where_it_does_not_fit(gpt2_tiny, extra, world_size):
    """MANUAL plans showed predicted_peak_bytes null, so a user who fixed the batch could not ask whether it
    fits. The figures are the planner's own at that batch; past the budget it is a note, never a refusal."""
    manual = kc.derive(gpt2_tiny, {"HYPER_PARAM_MANUAL": True, "BATCH_SIZE": 16, **extra})
    hardware = resolve_hardware(gpu="t4", free_gb=0.3)
    p = plan(manual, hardware, world_size=world_size)
    assert p.policy == "manual" and p.micro_batch == 16
    sharding = dict(strategy="fsdp", world_size=2, local_world_size=2) if extra else {}
    assert p.strategy == sharding.get("strategy", "none")
    want = PLANNER.predictor.predict(manual, batch=16, device_type="cuda", precision=p.precision,
                                     compile_mode=p.compile_mode, **sharding).peak_bytes
    assert p.predicted_peak_bytes == want and sum(p.memory_breakdown.values()) == want
    assert p.eval_predicted_peak_bytes > 0 and p.budget_bytes == int(0.3 * GIB * kc.DEFAULT_SHARE)
    fits = not any("over the budget" in note for note in p.notes)
    assert fits == (want <= p.budget_bytes)
    huge = plan(kc.derive(manual, {"BATCH_SIZE": 4096}), hardware, world_size=world_size)
    assert huge.micro_batch == 4096 and huge.predicted_peak_bytes > huge.budget_bytes
    [note] = [n for n in huge.notes if "over the budget" in n]
    assert "micro-batch 4096 is predicted to peak at" in note and "is predicted to fit" in note


def test_cpu_budget_is_available_ram():
    cpu = resolve_hardware(gpu="cpu")
    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")
    assert memory_budget(config, cpu, "cpu")[0] == int(cpu.cpu.ram_available_bytes * kc.DEFAULT_SHARE)


FACTORY = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F

    def make_batch(n, generator):
        x = torch.randn(n, 24, generator=generator)
        return x, (x.sum(dim=1) > 0).long()

    def build():
        model = nn.Sequential(nn.Linear(24, 256), nn.ReLU(), nn.Linear(256, 2))
        return model, make_batch, lambda out, y: F.cross_entropy(out, y)
''')


def test_custom_model_from_a_file_plans_and_trains(tmp_path, monkeypatch):
    from lib.trainer import train

    (tmp_path / "my_factory_mod.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = kc.make_defconfig("custom-transformer", out=tmp_path / ".config")
    config = kc.derive(base, {"CUSTOM_MODEL_FACTORY": "my_factory_mod:build", "DEVICE_CPU": True,
                              "MAX_STEPS": 2, "EPOCHS": 1, "OUTPUT_DIR": str(tmp_path / "runs"),
                              "CUSTOM_TRAIN_SAMPLES": 256, "CUSTOM_EVAL_SAMPLES": 64})
    hardware = resolve_hardware(gpu="cpu")
    p = plan(config, hardware)
    assert p.model == "custom" and p.policy == "planner" and p.micro_batch == 64
    assert 0 < p.predicted_peak_bytes < 50 * 2**20
    result = train(config, p, hardware, log=lambda line: None)
    assert result.steps == 2
    on_gpu = plan(config, resolve_hardware(gpu="l4", free_gb=0.05))  # 37.5MB budget: blas workspace + a few
    assert on_gpu.predicted_peak_bytes <= on_gpu.budget_bytes


# --------------------------------------------------------------------------
# A trace-cache file of the wrong structure is a cache miss (issue 16, defect 15)

_TRACE = {"batch": 8, "peak_bytes": 1000, "breakdown": {"parameters": 600, "activations": 400}, "parameters": 10,
          "features": [], "eval_samples": 32, "seconds": 0.1}


@pytest.mark.parametrize("contents", [
    {"traces": {"8": {"peak_bytes": 1}}},  # was KeyError: 'features'
    {"traces": {"8": {**_TRACE, "extra": 1}}}, {"traces": {"x": _TRACE}}, {"traces": [1, 2]}, {"traces": {"8": 5}},
    {"traces": {"8": {**_TRACE, "peak_bytes": "1000"}}}, {"traces": {"9": _TRACE}}, [], {"other": 1}, "not json"])
def test_a_cache_file_of_another_structure_reads_as_empty(tmp_path, contents):
    from lib.memory.cache import read_traces

    path = tmp_path / "key.json"
    path.write_text(contents if isinstance(contents, str) else json.dumps(contents))
    assert read_traces(path) == {}
    path.write_text(json.dumps({"traces": {"8": _TRACE}}))
    assert read_traces(path) == {"8": _TRACE}
    assert read_traces(tmp_path / "missing.json") == {}


def test_the_predictor_retraces_and_replaces_a_cache_file_of_another_structure(tmp_path):
    from lib.memory.predict import MemoryPredictor

    config = kc.make_defconfig("lenet5", out=tmp_path / "config")
    step = dict(batch=8, device_type="cpu", precision="fp32")
    first = MemoryPredictor(cache_dir=tmp_path)
    good = first.trace(config, **step)
    [path] = (tmp_path / "memory").glob("*.json")
    path.write_text(json.dumps({"traces": {"8": {"peak_bytes": 1}}}))
    second = MemoryPredictor(cache_dir=tmp_path)  # a new process reads the damaged file
    assert second.trace(config, **step).peak_bytes == good.peak_bytes and second.traces == 1
    assert json.loads(path.read_text())["traces"]["8"]["features"] == list(good.features)


@pytest.mark.slow
def test_a_plan_for_a_simulated_gpu_is_the_same_from_a_cold_cache_and_a_warm_one(tmp_path, gpt2_tiny, monkeypatch):
    """make plan GPU=a10g FREE_GB=...: the same micro-batch and the same predicted figures whatever this machine's
    cache holds: cold, or warmed by plans for other budgets and GPUs (other traced points on the same lines) and
    a run's step-time calibration on this CPU (which applies to this CPU's plans only)."""
    from lib import steptime

    figures = ("micro_batch", "grad_accum", "max_micro_batch", "predicted_peak_bytes", "predicted_step_seconds",
               "predicted_samples_per_second", "eval_batch", "eval_predicted_peak_bytes")

    # no real steps timed on this CPU: its plan would time them at micro-batches sized to all of its RAM
    monkeypatch.setenv(steptime.MEASURE_ENV, "0")

    def planned(cache, gpu, free_gb, config=gpt2_tiny):
        monkeypatch.setenv("KFIT_CACHE_DIR", str(cache))
        return plan(config, resolve_hardware(gpu=gpu, free_gb=free_gb), PlannerPolicy(cache_dir=str(cache)))

    cold = planned(tmp_path / "cold", "a10g", 1.0)
    warm = tmp_path / "warm"
    for gpu, free in (("a10g", 2.0), ("a10g", 0.6), ("h100", 4.0), ("a10g", 1.5)):
        planned(warm, gpu, free)
    cpu = resolve_hardware(gpu="cpu")
    here = planned(warm, "cpu", None)
    steptime.calibrate(gpt2_tiny, cpu, here, [here.predicted_step_seconds * 3])  # a slow run on this CPU
    again = planned(warm, "a10g", 1.0)
    assert {f: getattr(again, f) for f in figures} == {f: getattr(cold, f) for f in figures}


@pytest.mark.parametrize("name", ["lenet5", *(pytest.param(n, marks=pytest.mark.slow)
                                             for n in ("gpt2-tiny", "llama-tiny", "resnet18"))])
@pytest.mark.parametrize("setting", [{}, {"OPTIMIZER_SGD": True, "SGD_MOMENTUM": "0.9"},
                                     {"OPTIMIZER_SGD": True, "SGD_MOMENTUM": "0"}, {"FREEZE": None}])
def test_the_state_floor_is_what_every_traced_step_holds_at_least(tmp_path, name, setting):
    """The planner refuses a replica whose parameters, gradients and optimizer state alone exceed the budget
    without tracing: sound only if that floor never exceeds a traced peak (frozen weights, SGD's states)."""
    from lib.memory import MemoryPredictor

    frozen = {"lenet5": "features.0.*", "gpt2-tiny": "*.bias", "llama-tiny": "embed.*", "resnet18": "*.bias"}
    setting = {k: frozen[name] if k == "FREEZE" else v for k, v in setting.items()}
    config = kc.derive(kc.make_defconfig(name, out=tmp_path / ".config"), setting)
    predictor = MemoryPredictor(tmp_path / "cache")
    floor = predictor.state_floor(config)
    for precision, ckpt in (("fp32", False), ("bf16", True)):
        trace = predictor.predict(config, batch=1, device_type="cpu", precision=precision,
                                  gradient_checkpointing=ckpt).trace
        held = sum(trace.breakdown[k] for k in ("parameters", "gradients", "optimizer_state"))
        # at most what the peak holds of them (SGD's momentum buffers may come with scratch), and most of it
        assert 0.6 * held <= floor <= held <= trace.peak_bytes, (precision, ckpt, floor, held)


def test_a_replica_whose_state_alone_exceeds_the_budget_is_refused_untraced(tmp_path):
    config = kc.make_defconfig("llama3-8b", out=tmp_path / ".config")
    policy = PlannerPolicy(str(tmp_path / "cache"))
    with pytest.raises(PlanError) as err:
        plan(config, resolve_hardware(gpu="h100"), policy)
    text = str(err.value)
    assert "its parameters, gradients and optimizer state alone take 119.66GiB" in text
    assert "CONFIG_PARALLEL_FSDP" in text and "SGD instead of adamw" in text and "checkpointing (" not in text
    assert policy.predictor.traces == 0
