"""Models nobody in this project wrote (scripts/zoo.py: Hugging Face families from small configs) plan
through the custom-model factory, traced (no measured fallback), and a mixture of experts trains."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lib import config as kconfig
from lib.api import resolve_plan
from lib.memory import MemoryPredictor
from scripts import zoo

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_thread")


def zoo_config(tmp_path, name: str, **changes):
    config = kconfig.make_defconfig("custom-transformer", out=tmp_path / ".config")
    return kconfig.derive(config, {"CUSTOM_MODEL_FACTORY": f"scripts.zoo:{name}", **changes})


# the llama and mixtral traces stay in the quick tier; the others' cold traces take 15-40 s on 2 cores
@pytest.mark.parametrize("name", [n if n in ("llama", "mixtral") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in zoo.FACTORIES])
def test_every_zoo_model_plans_from_a_trace(tmp_path, name):
    config = zoo_config(tmp_path, name, TARGET_EFFECTIVE_BATCH=16)
    plan = resolve_plan(config)
    assert plan.micro_batch * plan.grad_accum == 16
    reason = plan.reasons["micro_batch"]
    assert reason.startswith("predicted peak") and "measured by real steps" not in reason, reason
    # the trace saw the model's own parts: attention where it has any, none in the convolutional and
    # state-space families
    trace = MemoryPredictor().trace(config, batch=plan.micro_batch, device_type="cpu", precision=plan.precision)
    assert ("attention" in trace.features) == (name not in ("convnext", "mamba"))
    assert trace.breakdown["gradients"] == trace.breakdown["parameters"] > 0


@pytest.mark.slow
def test_a_mixture_of_experts_plans_and_trains_through_make(tmp_path):
    """Mixtral's fp32 grouped matmul has no fake kernel in torch (bf16 only); kfit's traces it."""
    (tmp_path / ".config").write_text(zoo_config(tmp_path, "mixtral", MAX_STEPS=3).text)

    def make(*args):
        return subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)

    plan = make("plan")
    assert plan.returncode == 0 and "Traceback" not in plan.stderr, plan.stdout + plan.stderr
    assert "predicted peak" in plan.stdout and "measured by real steps" not in plan.stdout
    train = make("train")
    assert train.returncode == 0 and "Traceback" not in train.stderr, train.stdout[-3000:] + train.stderr[-3000:]
    assert "step 3" in train.stdout or "3 steps" in train.stdout + train.stderr, train.stdout[-2000:]
