"""Step-time prediction (lib.steptime): counted work, the roofline, calibration, and the fastest plan that fits."""

from __future__ import annotations

import dataclasses
import json
import sys
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch
import torch.utils.flop_counter
import torch.nn.functional as F

from lib import config as kc
from lib import steptime
from lib.hardware import catalog, resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.plan import BatchChoice
from lib.steptime import (
    Candidate, Counts, Device, Phase, StepTimeModel, balanced_micro_batches, count_step, device, fastest,
    gpu_device, window_sizes,
)
from lib.steptime.count import FIELDS
from lib.steptime.model import FLOAT8_CAST_TRAFFIC

CPU_FIGURES = {"threads": 2, "fp32_flops": 50e9, "bf16_flops": 100e9, "bandwidth": 20e9, "op_overhead_s": 5e-6,
               "conv_flops": 20e9, "conv_op_s": 1e-4}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache, fixed CPU figures and no real timings: every prediction here is deterministic."""
    monkeypatch.setenv("KFIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(steptime.MEASURE_ENV, "0")
    monkeypatch.setattr(device, "measure_cpu", lambda: dict(CPU_FIGURES))
    monkeypatch.setattr(sys.modules["lib.steptime.calibrate"], "current_load", lambda: 0.0)  # runs here: idle
    return tmp_path / "cache"


def fake_task(model_fn, x_shape, y_shape=(), classes=4):
    def example_batch(n):
        return torch.zeros((n, *x_shape)), torch.zeros((n, *y_shape), dtype=torch.long)
    split = list(range(10))
    return SimpleNamespace(build=lambda ckpt: model_fn(), example_batch=example_batch, train=split, eval=split,
                           loss=lambda out, y: F.cross_entropy(out, y))


def counted(model_fn, x_shape, batch):
    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")  # AdamW, no clipping
    phases, params = count_step(fake_task(model_fn, x_shape), config, batch=batch, precision="fp32",
                                device_type="cpu", gradient_checkpointing=False)
    return phases, params


def test_flops_of_linear_layers_match_the_hand_count():
    mlp = lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))  # noqa: E731
    b = 8
    phases, params = counted(mlp, (16,), b)
    assert params == 16 * 32 + 32 + 32 * 4 + 4
    assert phases["forward"].flops == 2 * b * (16 * 32 + 32 * 4)
    # backward: both weight gradients, and the input gradient of the second layer only (x needs none)
    assert phases["backward"].flops == 2 * b * (16 * 32 + 32 * 4) + 2 * b * 32 * 4
    assert phases["optimizer"].flops == 0 and phases["optimizer"].memory_bytes > 0
    # the first addmm reads bias, x and weight and writes its output: fp32 bytes
    assert phases["forward"].compute_bytes == 4 * ((32 + b * 16 + 16 * 32 + b * 32) + (4 + b * 32 + 32 * 4 + b * 4))


def test_flops_of_a_convolution_match_the_hand_count():
    def net():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))

    b = 2
    phases, _ = counted(net, (3, 8, 8), b)
    conv = 2 * b * 8 * 6 * 6 * 3 * 3 * 3  # output elements x kernel volume x 2
    linear = 2 * b * 8 * 6 * 6 * 4
    assert phases["forward"].flops == conv + linear
    assert phases["backward"].flops == conv + 2 * linear  # conv weight grad; linear weight and input grads
    assert phases["forward"].conv_flops == conv and phases["backward"].conv_flops == conv


def test_ops_are_kernels_and_the_optimizer_is_counted_in_its_steady_state():
    """prim.device queries are no kernels (they were 80% of GPT-2-tiny's count, each 'moving' its tensor), and
    the first optimizer step's state creation is not what every later step costs."""
    mlp = lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))  # noqa: E731
    phases, _ = counted(mlp, (16,), 8)
    # forward: addmm, relu, addmm, then the loss (log_softmax, nll_loss); a few more at most, never dozens
    assert 4 <= phases["forward"].ops <= 8
    # 4 parameters, AdamW on the CPU (one tensor at a time): no zeros_like of a first step among them
    assert phases["optimizer"].ops < 4 * 16


def test_gpu_time_has_a_kernel_floor_and_slower_convolutions():
    gpu = dataclasses.replace(FAKE_CPU, kind="gpu", conv_efficiency=0.25, kernel_floor_s=1e-3, op_overhead_s=0.0)
    counts = fake_counts(per_sample=Phase(flops=4e9, ops=10), optimizer=Phase())
    plain = StepTimeModel(counts=counts, device=gpu, precision="fp32").roofline_micro_seconds(1)
    conv = fake_counts(per_sample=Phase(flops=4e9, ops=10, conv_flops=4e9), optimizer=Phase())
    slow = StepTimeModel(counts=conv, device=gpu, precision="fp32").roofline_micro_seconds(1)
    # 3 x 4 GFLOP (forward and a backward of twice) at 1 GFLOP/s, and 30 kernels of 1 ms
    assert plain == pytest.approx(12 + 0.03) and slow == pytest.approx(12 / 0.25 + 0.03)


def test_compile_speeds_up_the_model_but_not_the_optimizer_it_never_compiles():
    gpu = gpu_device("NVIDIA H100 80GB HBM3")
    counts = fake_counts(per_sample=Phase(memory_bytes=1e6, ops=200), optimizer=Phase(memory_bytes=1e6, ops=100))
    eager = StepTimeModel(counts=counts, device=gpu, precision="bf16")
    compiled = dataclasses.replace(eager, compile=True)
    assert compiled.micro_seconds(1) < eager.micro_seconds(1)  # fewer bytes and host time per op
    assert compiled.optimizer_seconds() == eager.optimizer_seconds()


def test_cpu_attention_kernels_are_counted():
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(8, 24)
            self.head = torch.nn.Linear(8, 4)

        def forward(self, x):  # (b, t, 8) -> (b, 4)
            q, k, v = self.qkv(x).unsqueeze(1).split(8, dim=-1)
            return self.head(F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1).mean(1))

    b, t = 2, 5
    phases, _ = counted(Attention, (t, 8), b)
    attention = 4 * b * t * t * 8  # QK^T and AV: 2 matmuls of b x t x t x d, 2 FLOPs each
    assert phases["forward"].flops == 2 * b * t * 8 * 24 + attention + 2 * b * 8 * 4


def fake_counts(per_sample=Phase(flops=1e6, compute_bytes=1e4, memory_bytes=5e4, ops=10),
                optimizer=Phase(memory_bytes=1e5, ops=4), train=1000, eval_samples=100):
    backward = Phase(*(2 * getattr(per_sample, f) for f in FIELDS))

    def at(b):
        scale = lambda p: Phase(p.flops * b, p.compute_bytes * b, p.memory_bytes * b, p.ops,  # noqa: E731
                                p.conv_flops * b)
        return {"forward": scale(per_sample), "backward": scale(backward), "optimizer": optimizer}
    return Counts(phases={1: at(1), 2: at(2)}, parameters=1000, train_samples=train, eval_samples=eval_samples)


FAKE_CPU = Device(kind="cpu", name="fake", fp32_flops=1e9, tf32_flops=None, half_flops=4e9, bandwidth=1e9,
                  op_overhead_s=1e-5, step_overhead_s=1e-3, power_watts=10.0, source="fake", key="fake", here=True)


def test_roofline_with_a_fake_device():
    model = StepTimeModel(counts=fake_counts(), device=FAKE_CPU, precision="fp32")
    b = 4  # forward + backward: 3e6 FLOPs, 3e4 compute bytes, 1.5e5 other bytes, 30 ops per micro-batch
    expected = 3e6 * b / 1e9 + 3e4 * b / 1e9 + 1.5e5 * b / 1e9 + 30 * 1e-5  # a CPU adds; nothing overlaps
    assert model.micro_seconds(b) == pytest.approx(expected)
    optimizer = 1e5 / 1e9 + 4 * 1e-5
    assert model.seconds(b, 3) == pytest.approx(3 * expected + optimizer + 1e-3)
    assert StepTimeModel(counts=fake_counts(), device=FAKE_CPU, precision="bf16").micro_seconds(b) < expected
    gpu = dataclasses.replace(FAKE_CPU, kind="gpu")  # the host queues ahead: max(device, host), not the sum
    assert StepTimeModel(counts=fake_counts(), device=gpu, precision="fp32").micro_seconds(b) == pytest.approx(
        max(max(3e6 * b / 1e9, 3e4 * b / 1e9) + 1.5e5 * b / 1e9, 30 * 1e-5))


def test_a_short_last_micro_batch_is_timed_as_the_trainer_cuts_it():
    assert window_sizes(512, 171) == [171, 171, 170]
    assert window_sizes(513, 256) == [256, 129, 128]  # a lone trailing sample: the last two halve
    from lib.trainer.windows import split_batches

    for samples, micro in ((512, 171), (513, 256), (1437, 512), (7, 3), (64, 64)):
        assert window_sizes(samples, micro) == [len(b) for b in split_batches(list(range(samples)), micro)]
    model = StepTimeModel(counts=fake_counts(), device=FAKE_CPU, precision="fp32")
    parts = model.parts(171, 3, 512)
    assert parts["micro_batches"] == pytest.approx(2 * model.micro_seconds(171) + model.micro_seconds(170))


def test_measured_efficiency_scales_the_roofline_between_measured_sizes():
    base = StepTimeModel(counts=fake_counts(), device=FAKE_CPU, precision="fp32")
    measured = dataclasses.replace(base, measured={64: base.micro_seconds(64) * 2, 256: base.micro_seconds(256) * 4})
    assert measured.efficiency(64) == pytest.approx(2) and measured.efficiency(256) == pytest.approx(4)
    assert measured.efficiency(128) == pytest.approx(3)  # halfway in log2
    assert measured.efficiency(8) == pytest.approx(2) and measured.efficiency(1024) == pytest.approx(4)
    assert "measured" in measured.source


def test_balanced_candidates_include_every_divisor_and_no_lone_last_sample():
    sizes = balanced_micro_batches(512, 200)
    assert sizes[:3] == [171, 128, 103] and sizes[-1] == 1
    assert {d for d in range(1, 201) if 512 % d == 0} <= set(sizes)
    # 3 and 2 would leave a last micro-batch of one sample, which the trainer joins to the one before
    assert balanced_micro_batches(7, 100) == [7, 4, 1]
    assert all(512 % m != 1 for m in sizes if m > 1)


def test_catalog_gpus_have_datasheet_peaks_with_sources():
    for entry in catalog.CATALOG.values():
        peak = entry.peak
        assert peak.source.startswith("https://") and peak.bandwidth_gbs > 0
        assert peak.half_tflops > peak.fp32_tflops > 0
        assert (peak.tf32_tflops is not None) == entry.tf32
    h100 = gpu_device("NVIDIA H100 80GB HBM3")
    assert h100.flops("bf16", False) == pytest.approx(989.4e12 * device.GPU_COMPUTE_EFFICIENCY)
    assert h100.flops("fp32", True) == pytest.approx(494.7e12 * device.GPU_COMPUTE_EFFICIENCY)
    assert h100.flops("fp32", False) == pytest.approx(66.9e12 * device.GPU_COMPUTE_EFFICIENCY)
    assert gpu_device("Some Unknown GPU") is None


@pytest.fixture
def lenet(tmp_path):
    return kc.make_defconfig("lenet5", out=tmp_path / ".config")


def test_calibration_round_trip(cache, lenet):
    cpu = resolve_hardware(gpu="cpu")
    plan = resolve(lenet, cpu, ModelDescription.from_config(lenet))
    before = steptime.predict_step_time(lenet, cpu, plan)
    assert not before.calibrated and before.seconds == pytest.approx(plan.predicted_step_seconds)
    assert sum(before.parts.values()) == pytest.approx(before.seconds)
    after = steptime.calibrate(lenet, cpu, plan, [0.5, 0.4, 0.6])
    assert after.calibrated and after.seconds == pytest.approx(0.5)  # the median, at the planned micro-batch
    assert json.loads((cache / "steptime" / steptime.CALIBRATION_FILE).read_text())
    steptime.calibrate(lenet, cpu, plan, [50.0])  # one run on a busy machine
    steptime.calibrate(lenet, cpu, plan, [0.52])
    assert steptime.predict_step_time(lenet, cpu, plan).seconds == pytest.approx(0.52)  # the median run
    again = resolve(lenet, cpu, ModelDescription.from_config(lenet))
    assert again.predicted_step_seconds == pytest.approx(0.52) and "calibrated" in again.reasons["step_time"]


def test_runs_calibrate_the_micro_batch_they_ran_at_and_correct_the_others_between(cache, lenet, monkeypatch):
    cpu = resolve_hardware(gpu="cpu")
    plan = resolve(lenet, cpu, ModelDescription.from_config(lenet))
    at = {m: dataclasses.replace(plan, micro_batch=m, grad_accum=512 // m) for m in (64, 128, 256, 512)}
    base = {m: steptime.predict_step_time(lenet, cpu, p).seconds for m, p in at.items()}
    steptime.calibrate(lenet, cpu, at[128], [base[128] * 2])
    # one micro-batch calibrated: one factor for every candidate, the ranking as it was
    assert all(steptime.predict_step_time(lenet, cpu, p).seconds == pytest.approx(base[m] * 2) for m, p in at.items())
    steptime.calibrate(lenet, cpu, at[512], [base[512] * 0.5])
    steptime.calibrate(lenet, cpu, at[512], [base[512] * 0.6])
    steptime.calibrate(lenet, cpu, at[512], [base[512] * 9.0])  # one slow run among three: the median holds
    now = {m: steptime.predict_step_time(lenet, cpu, p) for m, p in at.items()}
    assert now[128].seconds == pytest.approx(base[128] * 2) and now[512].seconds == pytest.approx(base[512] * 0.6)
    assert now[256].seconds == pytest.approx(base[256] * (2 + 0.6) / 2)  # halfway in log2, between the runs
    assert now[64].seconds == pytest.approx(base[64] * 2)  # held past the runs
    assert "calibrated by runs at micro-batch 128 (x2.00), 512 (x0.60)" in now[256].source
    # each run's micro-batch is known as well as its runs agree (512's disagree); away from them, less
    assert now[128].uncertainty < now[256].uncertainty < now[512].uncertainty
    # the ranking the planner sees with timing on; with it off (KFIT_STEPTIME_MEASURE=0, as here) one factor
    from lib.threads import using_threads

    with using_threads(plan.cpu_threads):  # the calibrations' key: the plan's threads
        ranked = steptime.step_time_model(lenet, cpu, device_type="cpu", precision="fp32")
        one = steptime.step_time_model(lenet, cpu, device_type="cpu", precision="fp32", per_micro_batch=False)
    assert ranked.seconds(512, 1) < ranked.seconds(128, 4) and "calibrated by runs" in ranked.source
    assert one.seconds(512, 1) / base[512] == pytest.approx(one.seconds(128, 4) / base[128])
    again = resolve(lenet, cpu, ModelDescription.from_config(lenet))
    assert again.micro_batch == plan.micro_batch  # reproducible plans: no run moved the choice

    # runs on a busy machine neither push out the idle ones nor outvote them; they widen the interval
    calibration = sys.modules["lib.steptime.calibrate"]
    monkeypatch.setattr(calibration, "current_load", lambda: 0.9)
    for _ in range(calibration.CALIBRATION_RUNS + 2):
        steptime.calibrate(lenet, cpu, at[512], [base[512] * 3.0])
    assert steptime.predict_step_time(lenet, cpu, at[512]).seconds == pytest.approx(base[512] * 0.6)
    runs = next(iter(json.loads((cache / "steptime" / steptime.CALIBRATION_FILE).read_text()).values()))
    loaded = [r for r in runs if r["micro_batch"] == 512 and r["load"] > calibration.LOADED_SHARE]
    assert len(loaded) == calibration.CALIBRATION_RUNS and len([r for r in runs if r["micro_batch"] == 512]) == 8
    # where only loaded runs ran, they are what there is, and the load widens the interval
    steptime.calibrate(lenet, cpu, at[64], [base[64] * 4.0])
    loaded_64 = steptime.predict_step_time(lenet, cpu, at[64])
    assert loaded_64.seconds == pytest.approx(base[64] * 4.0) and loaded_64.uncertainty > now[128].uncertainty


def test_plan_json_and_text_show_the_predictions(cache, lenet):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from cli_plan import format_plan

    cpu = resolve_hardware(gpu="cpu")
    model = ModelDescription.from_config(lenet)
    plan = resolve(lenet, cpu, model)
    data = json.loads(json.dumps(plan.to_dict()))
    for key in ("predicted_step_seconds", "predicted_samples_per_second", "predicted_run_seconds",
                "predicted_energy_kwh"):
        assert isinstance(data[key], float) and data[key] > 0, key
    assert data["predicted_samples_per_second"] == pytest.approx(512 / data["predicted_step_seconds"])
    assert data["predicted_run_seconds"] > 120 * data["predicted_step_seconds"]  # 40 epochs x 3 steps + evaluations
    text = format_plan(plan, lenet, cpu, model)
    assert "step time" in text and "run time" in text and "kWh" in text
    h100 = resolve(lenet, resolve_hardware(gpu="h100"), model)
    assert h100.predicted_step_seconds > 0 and "h100 datasheet" in h100.reasons["step_time"]
    assert "700 W" in h100.reasons["step_time"]  # the board's power limit
    other = resolve_hardware(gpu="h100")
    other = dataclasses.replace(other, gpus=(dataclasses.replace(other.gpus[0], name="NVIDIA Mystery GPU"),))
    mystery = resolve(lenet, other, model)
    assert mystery.predicted_step_seconds is None and "unknown" in mystery.reasons["step_time"]
    assert mystery.micro_batch == 512  # no speed figures: the largest divisor that fits, as before


class FixedPolicy:
    """A batch policy with a fixed memory cap and flat memory predictions."""

    name = "planner"

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def choose(self, **_) -> BatchChoice:
        at = SimpleNamespace(peak_bytes=1, breakdown={"parameters": 1})
        return BatchChoice(max_micro=self.cap, reason=f"memory allows {self.cap}", eval_batch=self.cap,
                           eval_reason="fixed", budget_bytes=2, eval_peak_bytes=1, predict=lambda b: at)


def test_resolve_takes_a_faster_micro_batch_that_does_not_divide_the_target(cache, lenet, monkeypatch):
    # per micro-batch costs dominate (many ops): fewer micro-batches is faster. With memory for 200 of
    # 512, 171 x 3 (171 + 171 + 170) beats the largest divisor, 128 x 4.
    heavy = StepTimeModel(counts=fake_counts(per_sample=Phase(flops=1e3, ops=2000)), device=FAKE_CPU,
                          precision="fp32")
    monkeypatch.setattr(steptime, "step_time_model", lambda *a, **k: heavy)
    plan = resolve(lenet, resolve_hardware(gpu="cpu"), ModelDescription("lenet5"), policy=FixedPolicy(200))
    assert (plan.micro_batch, plan.grad_accum, plan.effective_batch) == (171, 3, 512)
    assert "fastest predicted" in plan.reasons["micro_batch"] and "128 x 4" in plan.reasons["micro_batch"]
    assert "171 x 2 + 170 x 1 = 512" in plan.reasons["grad_accum"]
    assert plan.predicted_step_seconds == pytest.approx(heavy.seconds(171, 3, 512))
    # samples cost the same at any size and nothing else counts: every candidate ties, the largest is kept
    flat = StepTimeModel(counts=fake_counts(per_sample=Phase(flops=1e6), optimizer=Phase()),
                         device=dataclasses.replace(FAKE_CPU, step_overhead_s=0.0), precision="fp32")
    monkeypatch.setattr(steptime, "step_time_model", lambda *a, **k: flat)
    plan = resolve(lenet, resolve_hardware(gpu="cpu"), ModelDescription("lenet5"), policy=FixedPolicy(512))
    assert (plan.micro_batch, plan.grad_accum) == (512, 1)


def test_the_trainer_records_predicted_against_measured_and_calibrates(cache, lenet, tmp_path, monkeypatch):
    from lib.trainer import timing, train
    from lib.trainer.timing import SKIP, STEPS

    monkeypatch.setattr(timing, "MIN_SECONDS", 0.0)  # STEPS steps, however short

    config = kc.derive(lenet, {"DEVICE_CPU": True, "TARGET_EFFECTIVE_BATCH": 32, "MAX_STEPS": SKIP + STEPS + 1,
                               "EPOCHS": 1, "OUTPUT_DIR": str(tmp_path / "runs"), "MONITOR": False})
    cpu = resolve_hardware(gpu="cpu")
    plan = resolve(config, cpu, ModelDescription.from_config(config))
    lines: list[str] = []
    result = train(config, plan, cpu, log=lines.append)
    assert any(line.startswith("Predicted: ") and "to finish" in line for line in lines)
    events = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [e for e in events if e.get("event") == "step_time"]
    assert len(timed) == 1 and timed[0]["steps_timed"] == STEPS and timed[0]["measured_step_seconds"] > 0
    assert timed[0]["predicted_step_seconds"] == pytest.approx(plan.predicted_step_seconds)
    after = steptime.predict_step_time(config, cpu, plan)
    assert after.calibrated and after.seconds == pytest.approx(timed[0]["measured_step_seconds"])


def test_short_steps_are_timed_for_min_seconds(monkeypatch):
    from types import SimpleNamespace

    from lib.trainer import timing

    monkeypatch.setattr(timing, "STEPS", 10)
    events = []
    plan = SimpleNamespace(micro_batch=8, grad_accum=1, precision="fp32", gradient_checkpointing=False,
                           cpu_offload=False, compile=False, predicted_step_seconds=0.1, reasons={})
    timer = timing.StepTimer(None, None, lambda *a, **k: events.append(k), calibrate=False)
    monkeypatch.setattr(timing, "MIN_SECONDS", 3.0)
    for _ in range(timing.SKIP + 10):
        timer.record(plan, 0.25)
    assert not events  # ten steps of 0.25 s: short of MIN_SECONDS
    timer.record(plan, 0.25)
    timer.record(plan, 0.25)
    assert events[-1]["steps_timed"] == 12
    slow = timing.StepTimer(None, None, lambda *a, **k: events.append(k), calibrate=False)
    for _ in range(timing.SKIP + 10):
        slow.record(plan, 1.0)
    assert events[-1]["steps_timed"] == 10  # long steps: STEPS of them


def test_a_gpus_steps_are_timed_by_their_marks_on_the_stream_with_one_wait(monkeypatch):
    """On a GPU the trainer marks each step's end with a CUDA event and never waits per step: the timer reads
    the device's time between consecutive marks once, when it reports (here, events that say when the stream
    reached them: the host's times are what a step without waiting took, far shorter)."""
    from types import SimpleNamespace

    from lib.trainer import timing

    monkeypatch.setattr(timing, "STEPS", 10)
    monkeypatch.setattr(timing, "MIN_SECONDS", 0.0)
    waits = []

    class Mark:
        def __init__(self, at_ms):
            self.at_ms = at_ms

        def elapsed_time(self, end):
            return end.at_ms - self.at_ms

        def synchronize(self):
            waits.append(self.at_ms)

    events = []
    plan = SimpleNamespace(micro_batch=8, grad_accum=1, precision="bf16", gradient_checkpointing=False,
                           cpu_offload=False, compile=False, predicted_step_seconds=0.02, reasons={})
    timer = timing.StepTimer(None, None, lambda *a, **k: events.append(k), calibrate=False)
    at = 0.0
    for i in range(timing.SKIP + 10):
        at += 50.0 if i < timing.SKIP else 20.0  # the warm-up steps slower; then 20 ms each on the device
        timer.record(plan, 0.001, Mark(at))
    assert len(waits) == 1 and events[-1]["steps_timed"] == 10
    assert events[-1]["measured_step_seconds"] == pytest.approx(0.020)
    # without marks (a CPU, where each step is read), the host's times
    host = timing.StepTimer(None, None, lambda *a, **k: events.append(k), calibrate=False)
    for _ in range(timing.SKIP + 10):
        host.record(plan, 0.005)
    assert events[-1]["measured_step_seconds"] == pytest.approx(0.005)


def test_real_micro_batches_are_timed_within_the_budget():
    from lib.steptime.measure import BUDGET_S, MAX_BUDGET_S, affordable, budget_for, power_sizes, time_micro_batches

    assert budget_for(None) == budget_for(60) == BUDGET_S and budget_for(600) == 6.0  # 1% of a long run
    assert budget_for(10 * 3600) == MAX_BUDGET_S

    assert power_sizes(100) == [1, 2, 4, 8, 16, 32, 64] and power_sizes(1) == [1]
    assert affordable([2, 4, 8], lambda b: 0.01 * b, 0.06) and not affordable([4, 8], lambda b: 0.01 * b, 0.06)
    config = kc.read_config(kc.DEFCONFIG_DIR / "lenet5")
    mlp = lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))  # noqa: E731
    task = fake_task(mlp, (16,))
    timed = time_micro_batches(config, task, precision="fp32", gradient_checkpointing=False,
                               sizes=[1, 4, 16], estimate=lambda b: 1e-5, budget_s=0.5)
    measured, optimizer = timed.micro, timed.optimizer
    assert sorted(measured) == sorted(optimizer) == [1, 4, 16] and all(0 < t < 0.5 for t in measured.values())
    assert all(0 < t < 0.5 for t in optimizer.values())
    # each size's spread from the rounds (the budget affords more than PAIRED_ROUNDS), and the load meanwhile
    assert sorted(timed.spread) == [1, 4, 16] and all(0 <= v < 1 for v in timed.spread.values())
    assert timed.busy_cores is not None and timed.busy_cores >= 0
    assert time_micro_batches(config, task, precision="fp32", gradient_checkpointing=False, sizes=[1, 4],
                              estimate=lambda b: 10.0, budget_s=0.5)[:3] == ({}, {}, {})  # nothing affordable


def test_timed_sizes_and_the_optimizer_share_the_largest_sizes_level_by_the_median_of_each_rounds_ratio():
    from lib.steptime.measure import PAIRED_ROUNDS, Timing, typical

    first = {16: Timing(0.012, 0.005), 128: Timing(0.050, 0.009)}
    # the machine slows by half in the middle rounds; each round's ratio stays 1:4, the optimizer after 16
    # 1:10 of the step at 128, after 128 1:5; one lucky run at 16 (0.008) would make fastest-over-fastest 1:5
    slow = (1.0, 1.5, 1.5, 1.0, 1.2)
    rounds = [{16: Timing(0.010 * k, 0.004 * k), 128: Timing(0.040 * k, 0.008 * k)} for k in slow]
    rounds[2][16] = Timing(0.008, 0.006)
    assert len(rounds) == PAIRED_ROUNDS
    sizes, optimizer = typical(first, rounds)
    assert sizes == {16: pytest.approx(0.010), 128: pytest.approx(0.040)}
    assert optimizer == {16: pytest.approx(0.004), 128: pytest.approx(0.008)}
    # too few rounds for a median: each one's fastest run
    assert typical(first, rounds[:2]) == ({16: 0.010, 128: 0.040}, {16: 0.004, 128: 0.008})


def test_timings_taken_under_load_are_taken_again_when_quieter_and_never_replace_quieter_ones(cache, lenet,
                                                                                               monkeypatch):
    from lib.steptime.measure import Timings

    calibration = sys.modules["lib.steptime.calibrate"]
    cpu = resolve_hardware(gpu="cpu")
    calls = []

    def timed(load: float, level: float):
        def fake(config, task, *, sizes, **_):
            calls.append(load)
            return Timings({s: level * s for s in sizes}, {s: 1e-4 for s in sizes}, {s: 0.01 for s in sizes},
                           busy_cores=load * 2)
        return fake

    monkeypatch.setattr("lib.hardware.host.usable_cores", lambda: 2.0)

    def model(now: float, load: float, level: float):
        monkeypatch.setattr(calibration, "current_load", lambda: now)
        monkeypatch.setattr(calibration, "time_micro_batches", timed(load, level))
        return steptime.step_time_model(lenet, cpu, device_type="cpu", precision="fp32", measure_up_to=8)

    busy = model(now=0.9, load=0.9, level=0.002)  # timed under load: kept, its interval wide
    assert calls == [0.9] and busy.measured[8] == pytest.approx(0.016) and busy.load == pytest.approx(0.9)
    assert busy.uncertainty(8) > 0.1
    assert model(now=0.8, load=0.1, level=0.001).measured[8] == pytest.approx(0.016) and calls == [0.9]  # cached
    quiet = model(now=0.0, load=0.0, level=0.001)  # quieter now than when timed: timed again, replaced
    assert calls == [0.9, 0.0] and quiet.measured[8] == pytest.approx(0.008) and quiet.load == 0.0
    # a quieter timing is not replaced by a busier one, and it is used from then on
    monkeypatch.setattr(calibration, "current_load", lambda: 0.9)
    assert steptime.step_time_model(lenet, cpu, device_type="cpu", precision="fp32",
                                    measure_up_to=8).measured[8] == pytest.approx(0.008)
    assert calls == [0.9, 0.0]


def test_the_optimizer_costs_what_was_measured_after_the_last_micro_batch_of_the_step():
    base = StepTimeModel(counts=fake_counts(), device=FAKE_CPU, precision="fp32")
    measured = dataclasses.replace(base, measured={16: 0.16, 64: 0.6}, measured_optimizer={16: 0.004, 64: 0.006})
    assert measured.optimizer_seconds(16) == 0.004 and measured.optimizer_seconds(32) == pytest.approx(0.005)
    assert measured.optimizer_seconds(1) == 0.004 and measured.optimizer_seconds(512) == 0.006  # held
    # 3 x 64 then 8: the optimizer follows the short micro-batch's backward
    assert measured.parts(64, 4, samples=200)["optimizer"] == pytest.approx(0.004)
    assert measured.parts(64, 4)["optimizer"] == pytest.approx(0.006)


def test_past_the_measured_sizes_the_time_per_sample_is_held_and_ties_go_to_the_surer_candidate():
    from lib.steptime.model import EXTRAPOLATION_SPREAD, FEW_ROUNDS_SPREAD, LOAD_SPREAD, ROOFLINE_SPREAD, SPREAD_FLOOR

    base = StepTimeModel(counts=fake_counts(), device=FAKE_CPU, precision="fp32")
    measured = dataclasses.replace(base, measured={16: 0.16, 32: 0.30}, measured_spread={16: 0.02, 32: 0.08})
    assert measured.micro_seconds(64) == pytest.approx(0.60) and measured.micro_seconds(128) == pytest.approx(1.2)
    assert measured.measured_covers(32) and not measured.measured_covers(33) and base.measured_covers(4096)
    # the interval: the rounds' spread (at least the floor), wider past the timed sizes and under load
    assert base.uncertainty(64) == ROOFLINE_SPREAD
    assert measured.uncertainty(16) == SPREAD_FLOOR and measured.uncertainty(32) == pytest.approx(0.08)
    assert measured.uncertainty(128) == pytest.approx(0.08 + 2 * EXTRAPOLATION_SPREAD)
    assert dataclasses.replace(measured, measured_spread={}).uncertainty(16) == FEW_ROUNDS_SPREAD
    assert dataclasses.replace(measured, load=0.5).uncertainty(16) == pytest.approx(SPREAD_FLOOR + LOAD_SPREAD / 2)

    # by the roofline, within each other's interval (3% apart): fewer, larger micro-batches
    small = Candidate(32, 4, False, 1.0, 128.0, uncertainty=ROOFLINE_SPREAD)
    near = Candidate(64, 2, False, 1.02, 125.5, uncertainty=ROOFLINE_SPREAD)
    far = Candidate(64, 2, False, 1.05, 121.9, uncertainty=ROOFLINE_SPREAD)
    assert fastest([small, near], False)[0] is near and fastest([small, far], False)[0] is small
    # timed on this CPU: the higher samples/s at worst, so a size past the timed ones is only possibly faster
    inside = Candidate(32, 4, False, 1.0, 128.0, uncertainty=measured.uncertainty(32))
    past = Candidate(128, 1, False, 0.97, 132.0, uncertainty=measured.uncertainty(128))
    assert fastest([past, inside], False, timed=True)[0] is inside
    assert fastest([past, inside], False)[0] is past  # the roofline's rule would take the larger
    clear = Candidate(128, 1, False, 0.6, 213.0, uncertainty=measured.uncertainty(128))  # no overlap
    assert fastest([clear, inside], False, timed=True)[0] is clear
    # the configured checkpointing first within a tie
    ckpt = Candidate(32, 4, True, 1.01, 126.7, uncertainty=ROOFLINE_SPREAD)
    assert fastest([small, ckpt], True)[0] is ckpt and fastest([small, ckpt], False)[0] is small


def test_cpu_figures_are_each_benchmarks_fastest_over_interleaved_rounds(monkeypatch):
    """measure_cpu's benchmarks run round-robin (one warm-up each, then whole rounds until the budget is
    spent), so a drift of the machine's speed reaches them all alike; each keeps its fastest run."""
    order, clock = [], iter(range(10**6))
    monkeypatch.setattr(device, "_clock", lambda: lambda: next(clock) * 1e-3)
    costs = {"a": iter([99, 5, 3, 4] + [9] * 100), "b": iter([99, 7, 2, 8] + [9] * 100)}

    def bench(name):
        def run():
            order.append(name)
            for _ in range(next(costs[name]) - 1):
                next(clock)  # this run takes that many ms on the fake clock
        return run

    best = device._fastest({"a": bench("a"), "b": bench("b")}, budget_s=0.0)
    assert order == ["a", "b"] + ["a", "b"] * device.MIN_ROUNDS  # warm-ups, then rounds of both
    assert best == pytest.approx({"a": 3e-3, "b": 2e-3})  # the warm-ups' 99 ms never count


def test_measured_cpu_figures_are_positive_and_taken_in_the_heap_a_cpu_run_keeps(monkeypatch):
    """The figures are measured with the C heap as a CPU training run sets it (lib.hardware.allocator), not as
    whatever ran before in the process left it: the convolutions' setup read 34-70 us with glibc's adaptive
    defaults and 195-213 us with the heap kept, and whichever process measured first wrote the cache."""
    from lib.hardware import allocator

    calls = []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda: calls.append(1) or True)
    figures = device.measure_cpu(budget_s=0.0)  # the minimum rounds: well under a second here
    assert calls == [1]
    assert figures["threads"] == torch.get_num_threads()
    for key in ("fp32_flops", "bf16_flops", "bandwidth", "op_overhead_s", "conv_flops"):
        assert figures[key] > 0, key
    assert figures["conv_op_s"] >= 0


def test_matmuls_with_a_dimension_off_16_bytes_are_counted_apart():
    """A GPU's BLAS runs a matmul whose M, K or N is not a whole number of 16 bytes (GPT-2's 50,257-token
    head) with slower kernels: those FLOPs are counted as unaligned, and the step-time model charges them at
    their own share of the peak."""
    b = 8
    aligned = lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))  # noqa: E731
    phases, _ = counted(aligned, (16,), b)  # fp32: 4 elements are 16 bytes; every dimension is a multiple
    assert phases["forward"].unaligned_flops == 0 and phases["backward"].unaligned_flops == 0
    odd = lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6))  # noqa: E731
    phases, _ = counted(odd, (16,), b)
    head = 2 * b * 32 * 6  # the 6-wide layer's matmul: forward once; backward its input and weight gradients
    assert phases["forward"].unaligned_flops == head and phases["backward"].unaligned_flops == 2 * head
    assert phases["forward"].matmul_flops == 2 * b * 16 * 32
    h100 = gpu_device("h100")
    slow = Phase(flops=1e12, unaligned_flops=1e12)
    fast = Phase(flops=1e12)
    counts = lambda p: Counts(phases={1: {"forward": p, "backward": Phase(), "optimizer": Phase()},  # noqa: E731
                                      2: {"forward": p, "backward": Phase(), "optimizer": Phase()}},
                              parameters=1, train_samples=1, eval_samples=1)
    hopper = device.FAMILIES["hopper"]
    for compiled, share in ((False, hopper.unaligned), (True, hopper.unaligned_compiled)):
        t_slow, t_fast = (StepTimeModel(counts=counts(p), device=h100, precision="bf16",
                                        compile=compiled).micro_seconds(1) for p in (slow, fast))
        assert t_slow / t_fast == pytest.approx(device.GPU_COMPUTE_EFFICIENCY / share, rel=0.05)
    assert hopper.unaligned < hopper.unaligned_compiled < device.GPU_COMPUTE_EFFICIENCY  # inductor pads some


def test_float8_counts_what_it_casts_and_what_it_leaves_in_the_precisions_matmuls():
    """The aligned matmuls' operand bytes are counted (float8 casts them), and the output layer, which
    lib/float8.py leaves in bf16, is counted apart: its forward matmul, and in the backward its input and
    weight gradients. The step-time model puts only the rest at the float8 peak and charges their casts."""
    b, width = 8, 32
    mlp = lambda: torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 64))  # noqa: E731
    phases, _ = counted(mlp, (16,), b)
    forward, backward = phases["forward"], phases["backward"]
    head = 2 * b * width * 64
    assert forward.float8_excluded_flops == head and backward.float8_excluded_flops == 2 * head
    assert forward.float8_flops == 2 * b * 16 * width and backward.float8_flops == 2 * b * 16 * width
    assert forward.float8_excluded_operand_bytes == 4 * (b * width + width * 64)  # fp32 operands
    assert backward.float8_excluded_operand_bytes == 4 * (2 * b * 64 + 64 * width + width * b)
    # every aligned matmul's two operands: the first layer's x and W, the head's h and W; in the backward the
    # head's (grad, W) and (h, grad), the first layer's (x, grad) (x needs no gradient)
    assert forward.matmul_operand_bytes == 4 * (b * 16 + 16 * width + b * width + width * 64)
    assert backward.matmul_operand_bytes == 4 * (b * 64 + 64 * width + width * b + b * 64 + 16 * b + b * width)
    h100 = gpu_device("h100")
    cast = Phase(flops=1e12, matmul_operand_bytes=1e10)
    kept = Phase(flops=1e12, matmul_operand_bytes=1e10, float8_excluded_flops=1e12,
                 float8_excluded_operand_bytes=1e10)
    counts = lambda p: Counts(phases={n: {"forward": p, "backward": Phase(), "optimizer": Phase()}  # noqa: E731
                                      for n in (1, 2)}, parameters=1, train_samples=1, eval_samples=1)
    model = lambda p, f8, c: StepTimeModel(counts=counts({"cast": cast, "kept": kept}[p]), device=h100,  # noqa: E731
                                           precision="bf16", float8=f8, compile=c)
    for compiled in (False, True):
        plain, eight = model("cast", False, compiled), model("cast", True, compiled)
        matmuls = 1e12 / h100.flops("bf16", False) - 1e12 / h100.fp8_flops
        casts = 1e10 * FLOAT8_CAST_TRAFFIC[compiled] / h100.bandwidth
        assert plain.micro_seconds(1) - eight.micro_seconds(1) == pytest.approx(matmuls - casts, rel=0.02)
        assert model("kept", True, compiled).micro_seconds(1) == pytest.approx(
            model("kept", False, compiled).micro_seconds(1), rel=1e-9)  # the output layer alone: as bf16


def _gpu_model(**device_changes) -> StepTimeModel:
    """A GPU step of 1,000 ops (host-bound below about 140 samples) and 100 GFLOP per sample."""
    per = lambda b: Phase(flops=b * 1e11, ops=1000)  # noqa: E731
    counts = Counts(phases={b: {"forward": per(b), "backward": Phase(), "optimizer": Phase()} for b in (1, 2)},
                    parameters=1, train_samples=1, eval_samples=1)
    return StepTimeModel(counts=counts, device=dataclasses.replace(gpu_device("h100"), **device_changes),
                         precision="bf16")


def test_a_gpu_calibration_scales_the_bound_that_limits_the_calibrated_step():
    """A host-bound micro-batch says how slow the host is, not the device: calibrated there, the device-bound
    step of a large micro-batch keeps its roofline time, and the other way round; either way the calibrated
    step itself comes out at the measured time."""
    model = _gpu_model()
    small, large = 4, 512
    device_small, host_small = model._bounds(model.counts.micro_batch(small), False)
    assert host_small > device_small  # 4 samples: host-bound
    device_large, host_large = model._bounds(model.counts.micro_batch(large), False)
    assert device_large > host_large  # 512: device-bound

    measured = model.seconds(small, 1) * 2  # the host twice as slow as the model says
    host = steptime.calibrated(model, measured, small, 1)
    assert host.correction_bound == "host" and host.calibrated_at == small
    assert host.seconds(small, 1) == pytest.approx(measured, rel=1e-6)
    # the device-bound step keeps about its time (the slower host shows only through the overlap), not 2x it
    assert host.corrected_micro_seconds(large) == pytest.approx(
        steptime.model.combined(device_large, host_large * host.correction))
    assert model.micro_seconds(large) < host.corrected_micro_seconds(large) < 1.05 * model.micro_seconds(large)
    assert "host time" in host.source

    measured = model.seconds(large, 1) * 1.5  # the device slower
    device = steptime.calibrated(model, measured, large, 1)
    assert device.correction_bound == "device"
    assert device.seconds(large, 1) == pytest.approx(measured, rel=1e-6)
    assert model.micro_seconds(small) <= device.corrected_micro_seconds(small) < 1.05 * model.micro_seconds(small)


def test_a_gpu_steps_host_and_device_times_combine_as_the_larger_far_from_the_corner():
    """The host queues kernels ahead of the device: the larger time sets the step, up to 2^(1/P) x it where
    the two are equal (OVERLAP_P), and a CPU's time (host 0) is its own."""
    combined, p = steptime.model.combined, steptime.model.OVERLAP_P
    assert combined(1.0, 0.0) == 1.0 and combined(1.0, 0.1) == pytest.approx(1.0, abs=1e-4)
    assert combined(1.0, 1.0) == pytest.approx(2 ** (1 / p)) and combined(0.2, 3.0) == pytest.approx(3.0, rel=1e-3)


def test_a_calibration_no_bound_can_reach_scales_the_whole_step_and_a_cpus_always_does():
    model = _gpu_model()
    floor = model.device.step_overhead_s  # device-bound at 512, but faster than the trainer's own overhead
    whole = steptime.calibrated(model, floor / 2, 512, 1)
    assert whole.correction_bound == "all" and whole.seconds(512, 1) == pytest.approx(floor / 2)
    cpu = _gpu_model(kind="cpu")
    measured = cpu.seconds(8, 1) * 3
    fitted = steptime.calibrated(cpu, measured, 8, 1)
    assert fitted.correction_bound == "all" and fitted.correction == pytest.approx(3)
    assert fitted.seconds(64, 1) == pytest.approx(cpu.seconds(64, 1) * 3)


def test_a_compiled_step_fuses_the_loss_with_the_model():
    """kfit compiles the loss in one graph with the model (lib/step.py forward_loss): the fusion factors apply to
    every op and byte of the forward and backward, the loss's included."""
    h100 = gpu_device("h100")
    work = Phase(memory_bytes=1e9, ops=100)
    counts = Counts(phases={n: {"forward": work, "backward": Phase(), "optimizer": Phase()} for n in (1, 2)},
                    parameters=1, train_samples=1, eval_samples=1)
    model = StepTimeModel(counts=counts, device=dataclasses.replace(h100, kernel_floor_s=0.0), precision="bf16",
                          compile=True)
    device_s, host_s = model._bounds(work, True)
    assert device_s == pytest.approx(1e9 * steptime.device.COMPILE_MEMORY_FACTOR / h100.bandwidth)
    assert host_s == pytest.approx(100 * steptime.device.COMPILE_OPS_FACTOR * h100.op_overhead_s)
    assert model._bounds(work, False) == (pytest.approx(1e9 / h100.bandwidth), pytest.approx(100 * h100.op_overhead_s))


def test_a_run_calibrates_its_plan_whatever_threads_the_calling_process_has(cache, lenet):
    """A CPU step's key holds the thread count: calibrate took it at the process's threads and the prediction
    at the plan's, so on a busy machine (the plan at 1 thread, the process at 2) no calibration ever applied."""
    import dataclasses

    from lib.threads import using_threads

    cpu = resolve_hardware(gpu="cpu")
    plan = resolve(lenet, cpu, ModelDescription.from_config(lenet))
    for plan_threads, process_threads in ((1, 2), (2, 1)):
        at = dataclasses.replace(plan, cpu_threads=plan_threads)
        with using_threads(process_threads):
            after = steptime.calibrate(lenet, cpu, at, [0.5])
        assert after.calibrated and after.seconds == pytest.approx(0.5), (plan_threads, process_threads)


@pytest.mark.parametrize("T", [64, 256, 1024])
def test_causal_attention_is_counted_at_a_flash_kernels_share(T):
    """A causal scaled_dot_product_attention, forward and backward, counts the tiles at or below the diagonal:
    causal_share of what the same attention counts unmasked (torch's formulas count the full square)."""
    import torch.nn.functional as F

    from lib.steptime.count import causal_share, counted

    def attention(causal: bool) -> float:
        q, k, v = (torch.randn(1, 2, T, 16, requires_grad=True) for _ in range(3))
        return counted(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward())

    full, causal = attention(False), attention(True)
    assert full.attention_flops > 0
    assert causal.attention_flops == pytest.approx(full.attention_flops * causal_share(T, T), rel=1e-9)
    assert causal_share(1024, 1024) == 0.5625 and causal_share(8192, 8192) == pytest.approx(0.5078, abs=1e-4)
    assert causal_share(T, T) == min(1.0, 0.5 + 64 / T)


ATTENTION_KERNELS = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
GQA_FORMULAS = (torch.utils.flop_counter.sdpa_flop_count, torch.utils.flop_counter.sdpa_backward_flop_count)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 4), kv_heads=st.integers(1, 8), groups=st.sampled_from([1, 2, 4, 8]),
       q_len=st.integers(1, 300), k_len=st.integers(1, 300), dim=st.sampled_from([16, 64, 128]),
       kernel=st.sampled_from(ATTENTION_KERNELS), backward=st.booleans())
def test_grouped_query_attention_counts_as_its_kernels_run_it_whatever_torchs_formula_accepts(
        monkeypatch, batch, kv_heads, groups, q_len, k_len, dim, kernel, backward):
    """Every scaled_dot_product kernel, forward and backward, with fewer key/value heads than query heads counts
    what the same attention counts with the key/value heads repeated; torch 2.11's formulas assert equal heads
    (an H200 with torch 2.11 predicted no step for any Llama 3 model), so the check runs under such a formula."""
    import torch.utils.flop_counter as fc

    from lib.steptime.count import _attention_flops

    heads = kv_heads * groups
    q, g = torch.empty(batch, heads, q_len, dim, device="meta"), torch.empty(batch, heads, q_len, dim, device="meta")
    k, v = (torch.empty(batch, kv_heads, k_len, dim, device="meta") for _ in range(2))
    full_k, full_v = (torch.empty(batch, heads, k_len, dim, device="meta") for _ in range(2))
    strict_forward, strict_backward = GQA_FORMULAS  # torch's own, not an earlier example's stand-ins

    def equal_heads(shapes):
        assert len({s[1] for s in shapes}) == 1, "heads differ (torch 2.11's formula)"

    monkeypatch.setattr(fc, "sdpa_flop_count", lambda q, k, v: equal_heads((q, k, v)) or strict_forward(q, k, v))
    monkeypatch.setattr(fc, "sdpa_backward_flop_count",
                        lambda g, q, k, v: equal_heads((g, q, k, v)) or strict_backward(g, q, k, v))
    name = f"aten.{kernel}" + ("_backward" if backward else "")
    args, repeated = ((g, q, k, v), (g, q, full_k, full_v)) if backward else ((q, k, v), (q, full_k, full_v))
    assert _attention_flops(name, args) == _attention_flops(name, repeated) > 0
    assert _attention_flops(name, args) == (strict_backward(g.shape, q.shape, k.shape, v.shape) if backward
                                            else strict_forward(q.shape, k.shape, v.shape))  # torch 2.13's GQA formula
