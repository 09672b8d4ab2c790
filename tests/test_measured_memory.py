"""Models the fake-tensor tracer cannot run are planned from real steps (lib/memory/measured.py), and the
fake kernels kfit supplies where torch's own refuses what real models run (lib/memory/fake.py)."""

from __future__ import annotations

import pytest
import torch

from lib import config as kconfig
from lib.errors import KfitError
from lib.memory import MemoryPredictor
from lib.memory.fake import FAKE_KERNELS, fake_kernels
from lib.memory.measured import MeasuredFit, MeasureError, allocator_peak, read_fit, write_fit

FACTORY = "tests.untraceable_model:build"


@pytest.fixture
def untraceable(tmp_path):
    config = kconfig.make_defconfig("custom-transformer", out=tmp_path / ".config")
    return kconfig.derive(config, {"CUSTOM_MODEL_FACTORY": FACTORY})


def real_peak(config, batch: int) -> int:
    """The allocator's peak of the traced sequence run for real here (the bench's instrument)."""
    from lib.memory import step_optimizer, training_steps
    from lib.task import load_task

    task = load_task(config)
    task.build(False)  # the factory's first model was built at load

    def run():
        model = task.build(False)
        x, y = task.example_batch(batch)
        training_steps(model, step_optimizer(config, model, "cpu"), task.loss, x, y,
                       autocast=torch.autocast("cpu", enabled=False), grad_clip=config.grad_clip, foreach=False)

    return allocator_peak(run)


@pytest.mark.usefixtures("one_thread")
def test_an_op_without_a_fake_kernel_is_planned_from_real_steps_and_cached(untraceable, tmp_path):
    predictor = MemoryPredictor(tmp_path / "cache")
    prediction = predictor.predict(untraceable, batch=32, device_type="cpu", precision="fp32")
    assert "measured" in prediction.trace.features and predictor.measured == 1 and predictor.traces == 0
    note = predictor.measured_note(prediction.trace, untraceable, device_type="cpu", precision="fp32", train=True)
    assert "measured by real steps on this cpu at micro-batch 1, 2, 4" in note
    assert "kfit_test::gate" in note and "\n" not in note
    # read off the line through the measured points, 8x past the last: within 2% of a real step there
    measured = real_peak(untraceable, 32)
    assert abs(prediction.trace.peak_bytes - measured) / measured < 0.02, (prediction.trace.peak_bytes, measured)
    # the breakdown adds up, with the exact sizes of what does not grow with the batch
    b = prediction.trace.breakdown
    assert sum(b.values()) == prediction.trace.peak_bytes
    assert b["parameters"] == b["gradients"] == 4 * sum(p.numel() for p in torch.nn.Linear(256, 256).parameters()) * 3 \
        + 4 * (256 * 10 + 10)
    assert b["optimizer_state"] == 2 * b["parameters"] + 8 * 4  # AdamW: two moments, and a float32 step per tensor
    # a second planner reads the cached fit: no real step runs again
    again = MemoryPredictor(tmp_path / "cache")
    assert again.predict(untraceable, batch=32, device_type="cpu", precision="fp32").peak_bytes == prediction.peak_bytes
    assert again.measured == 0


def test_a_damaged_fit_is_a_cache_miss_and_the_fit_reads_back(tmp_path, capsys):
    fit = MeasuredFit(points={1: 1000, 2: 1500, 4: 2500}, fixed={"parameters": 400, "buffers": 0, "gradients": 400,
                                                                 "optimizer_state": 0},
                      batch_bytes=10, parameters=100, eval_samples=5, reason="aten.x: no kernel", device_type="cpu",
                      seconds=1.5)
    path = tmp_path / "k.measured.json"
    write_fit(path, fit)
    assert read_fit(path) == fit
    assert fit.peak(3) == 2000 and fit.peak(8) > 4500  # the chord inside, the steepest slope past the last
    path.write_text('{"points": {"1": "many"}}')
    assert read_fit(path) is None
    assert "k.measured.json" in capsys.readouterr().err


def test_a_gpu_plan_for_an_untraceable_model_is_one_line_naming_the_op(untraceable, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: kfit measures on it")
    predictor = MemoryPredictor(tmp_path / "cache")
    with pytest.raises(KfitError) as err:
        predictor.predict(untraceable, batch=4, device_type="cuda", precision="bf16")
    message = str(err.value)
    assert "kfit_test::gate" in message and "run 'make plan' on a machine with that GPU" in message
    assert "\n" not in message and "Traceback" not in message


def test_a_model_whose_real_step_fails_too_is_one_error(tmp_path, monkeypatch):
    (tmp_path / "kfit_broken_model.py").write_text(
        "from tests.untraceable_model import Gated, make_batch, F\n"
        "class Broken(Gated):\n"
        "    calls = 0\n"
        "    def forward(self, x):\n"
        "        if x.shape[0] == 1 and not isinstance(x, __import__('torch')._subclasses.FakeTensor):\n"
        "            raise ValueError('no batches of one')\n"
        "        return super().forward(x)\n"
        "def build():\n    return Broken(), make_batch, lambda out, y: F.cross_entropy(out, y)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = kconfig.derive(kconfig.make_defconfig("custom-transformer", out=tmp_path / ".config"),
                            {"CUSTOM_MODEL_FACTORY": "kfit_broken_model:build"})
    with pytest.raises(MeasureError) as err:
        MemoryPredictor(tmp_path / "cache").predict(config, batch=4, device_type="cpu", precision="fp32")
    assert "ValueError: no batches of one" in str(err.value) and "kfit_test::gate" in str(err.value)


@pytest.mark.parametrize("a_shape,b_shape,offs", [((12, 8), (3, 8, 4), [3, 7, 12]),  # tokens x experts' weights
                                                  ((8, 12), (12, 4), [3, 7, 12]),  # the weight gradient
                                                  ((3, 4, 8), (3, 8, 4), None)])  # batched
def test_the_grouped_matmul_fake_kernel_gives_the_real_kernels_shape_in_fp32(a_shape, b_shape, offs):
    from torch._subclasses.fake_tensor import FakeTensorMode

    offsets = torch.tensor(offs, dtype=torch.int32) if offs else None
    real = torch._grouped_mm(torch.randn(a_shape), torch.randn(b_shape), offs=offsets)
    with FakeTensorMode() as mode:
        a, b = torch.empty(a_shape), torch.empty(b_shape)
        o = mode.from_tensor(offsets) if offs else None
        with pytest.raises(RuntimeError, match="BF16"):  # torch's own meta kernel (if this fails: drop ours)
            torch._grouped_mm(a, b, offs=o)
        with fake_kernels():
            fake = torch._grouped_mm(a, b, offs=o)
    assert fake.shape == real.shape and fake.dtype == real.dtype == torch.float32
    assert torch.ops.aten._grouped_mm.default in FAKE_KERNELS


def test_make_plan_for_a_gpu_not_here_is_one_error_line(untraceable, tmp_path):
    import subprocess
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: kfit measures on it")
    (tmp_path / ".config").write_text(untraceable.text)
    run = subprocess.run(["make", "-s", "--no-print-directory", "-f",
                          str(Path(__file__).resolve().parent.parent / "Makefile"), "plan", "GPU=h100"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode != 0 and len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    assert "kfit_test::gate" in errors[0] and "on a machine with that GPU" in errors[0]
