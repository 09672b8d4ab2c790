"""The memory predictor: real fake-tensor traces of real models (LeNet-5 and GPT-2 tiny keep it fast)."""

from __future__ import annotations

import pytest

from lib import config as kc
from lib.memory import (
    MemoryPredictor, default_cache_dir, device_overheads, fingerprint, largest_fitting,
)


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("configs")
    return {name: kc.make_defconfig(name, out=tmp / f"{name}.config")
            for name in ("lenet5", "gpt2-tiny", "resnet18")}


@pytest.fixture(scope="module")
def predictor():
    return MemoryPredictor()  # the session's cache (conftest): warm runs trace nothing


def peak(predictor, config, batch, **kw):
    kw = {"device_type": "cpu", "precision": "fp32", **kw}
    return predictor.predict(config, batch=batch, **kw)


def test_peak_grows_with_batch_and_is_close_to_linear(predictor, configs):
    peaks = [peak(predictor, configs["gpt2-tiny"], b).peak_bytes for b in (1, 8, 16, 32)]
    assert peaks == sorted(peaks) and len(set(peaks)) == 4
    per_sample_low, per_sample_high = (peaks[2] - peaks[1]) / 8, (peaks[3] - peaks[2]) / 16
    assert per_sample_high == pytest.approx(per_sample_low, rel=0.1)


def test_breakdown_sums_to_the_peak_and_names_the_state(predictor, configs):
    p = peak(predictor, configs["lenet5"], 64, device_type="cuda", precision="bf16")
    assert sum(p.breakdown.values()) == p.peak_bytes
    params = p.trace.breakdown["parameters"]
    assert params > 0 and p.trace.breakdown["gradients"] == params
    assert {"blas_workspace", "allocator_fragmentation"} <= set(p.breakdown)


def test_bf16_activations_are_smaller_than_fp32(predictor, configs):
    fp32 = peak(predictor, configs["gpt2-tiny"], 16).trace.breakdown["activations"]
    bf16 = peak(predictor, configs["gpt2-tiny"], 16, precision="bf16").trace.breakdown["activations"]
    assert bf16 < 0.8 * fp32


def test_adamw_keeps_more_optimizer_state_than_sgd(predictor, configs):
    adamw = configs["lenet5"]
    sgd = kc.derive(adamw, {"OPTIMIZER_SGD": True})
    assert adamw.optimizer == "adamw" and sgd.optimizer == "sgd"
    state = lambda c: peak(predictor, c, 16).trace.breakdown["optimizer_state"]  # noqa: E731
    assert state(adamw) > 1.5 * state(sgd) > 0


@pytest.mark.parametrize("name,batch", [("gpt2-tiny", 16), ("resnet18", 16)])
def test_gradient_checkpointing_saves_activations(predictor, configs, name, batch):
    plain = peak(predictor, configs[name], batch).trace.breakdown["activations"]
    ckpt = peak(predictor, configs[name], batch, gradient_checkpointing=True).trace.breakdown["activations"]
    assert ckpt < 0.7 * plain


def test_evaluation_needs_less_than_training(predictor, configs):
    train = peak(predictor, configs["gpt2-tiny"], 16)
    evaluate = peak(predictor, configs["gpt2-tiny"], 16, train=False)
    assert evaluate.peak_bytes < train.peak_bytes
    assert evaluate.trace.breakdown["gradients"] == evaluate.trace.breakdown["optimizer_state"] == 0


def test_cache_hit_skips_tracing_and_survives_the_process(tmp_path, configs):
    first = MemoryPredictor(tmp_path)
    a = peak(first, configs["lenet5"], 8)
    peak(first, configs["lenet5"], 8)
    assert first.traces == 1
    assert list((tmp_path / "memory").glob("*.json"))
    second = MemoryPredictor(tmp_path)  # a new process: reads the JSON cache
    assert peak(second, configs["lenet5"], 8) == a and second.traces == 0
    assert second.cached_batches(configs["lenet5"], device_type="cpu", precision="fp32") == [8]


def test_damaged_cache_file_is_traced_again(tmp_path, configs):
    predictor = MemoryPredictor(tmp_path)
    peak(predictor, configs["lenet5"], 4)
    for path in (tmp_path / "memory").glob("*.json"):
        path.write_text("{not json")
    again = MemoryPredictor(tmp_path)
    assert peak(again, configs["lenet5"], 4).peak_bytes > 0 and again.traces == 1


def test_fingerprint_covers_what_changes_a_trace(configs):
    c = configs["lenet5"]
    key = lambda config=c, **kw: fingerprint(config, **{  # noqa: E731
        "device_type": "cpu", "precision": "fp32", "gradient_checkpointing": False, "train": True, **kw})[0]
    base = key()
    assert base == key()
    assert len({base, key(precision="bf16"), key(device_type="cuda"), key(gradient_checkpointing=True),
                key(config=kc.derive(c, {"OPTIMIZER_SGD": True})), key(config=configs["resnet18"])}) == 6
    # evaluation runs no optimizer: changing it keeps the evaluation traces
    assert key(train=False) == key(config=kc.derive(c, {"OPTIMIZER_SGD": True}), train=False)
    assert key(config=kc.derive(c, {"TARGET_EFFECTIVE_BATCH": 64, "EPOCHS": 2})) == base


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KFIT_CACHE_DIR", str(tmp_path / "k"))
    assert default_cache_dir() == tmp_path / "k"
    monkeypatch.delenv("KFIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "kfit"


def test_device_overheads_are_named_and_zero_on_cpu(predictor, configs):
    trace = peak(predictor, configs["gpt2-tiny"], 8).trace
    assert device_overheads(trace, "cpu") == {}
    cuda = device_overheads(trace, "cuda")
    assert set(cuda) == {"blas_workspace", "attention_workspace", "allocator_fragmentation"}
    assert "cudagraph_pool" in device_overheads(trace, "cuda", "reduce-overhead")


def test_largest_fitting_finds_the_boundary_in_few_calls():
    calls = []

    def linear(b):
        calls.append(b)
        return 1000 + 37 * b

    budget = 1000 + 37 * 411 + 5
    assert largest_fitting(linear, budget, 65536) == 411
    assert len(set(calls)) <= 6
    assert largest_fitting(linear, 10**9, 512) == 512
    assert largest_fitting(linear, 999, 512) == 0
    convex = lambda b: b * b  # noqa: E731
    assert largest_fitting(convex, 10_000, 65536) == 100
    assert largest_fitting(convex, 10_000 - 1, 65536) == 99
