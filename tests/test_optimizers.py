"""CONFIG_OPTIMIZER_CUSTOM: any torch.optim optimizer by name, or a user's module:function; trained like the
built-in ones, its memory traced from its real state, and anything kfit's loop cannot run refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lib import config as kc
from lib.errors import ConfigError
from lib.memory import MemoryPredictor
from lib.step import make_optimizer
from lib.threads import using_threads
from tests.helpers import run

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def custom(tmp_path, name: str, **more):
    base = kc.make_defconfig("lenet5", ["cpu-smoke"], out=tmp_path / ".config")
    return kc.derive(base, {"OPTIMIZER_CUSTOM": True, "OPTIMIZER_NAME": name, "OUTPUT_DIR": str(tmp_path / "runs"),
                            "HYPER_PARAM_MANUAL": True, "BATCH_SIZE": 64, "GRADIENT_ACCUMULATION": 1, **more})


def test_a_torch_optimizer_by_name_trains_and_its_traced_peak_is_the_measured_one(tmp_path):
    """Adagrad (one state tensor per parameter, where AdamW has two): the planner's trace of the step and the
    step run for real under the CPU allocator (lib.memory.measured, the instrument make bench-memory uses)
    agree within the planner's stated bound (at most 2% or 1 MiB under, 5% or 1 MiB off)."""
    config = custom(tmp_path, "Adagrad")
    with using_threads(1):
        trainer, result = run(config)
    assert result.steps == config.max_steps and isinstance(trainer.engine.optimizer, torch.optim.Adagrad)
    case = dict(config=config.source, device="cpu", batch=64, train=True, precision="fp32",
                gradient_checkpointing=False)
    Path(config.source).write_text(config.text)
    code = ("import json,sys; from lib.memory.measured import measure_case; "
            "print(json.dumps(measure_case(json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(case)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.strip().splitlines()[-1])["peak"]
    predictor = MemoryPredictor()
    with using_threads(1):
        trace = predictor.trace(config, batch=64, device_type="cpu", precision="fp32", gradient_checkpointing=False)
    adamw = predictor.trace(kc.derive(config, {"OPTIMIZER_ADAMW": True}), batch=64, device_type="cpu",
                            precision="fp32", gradient_checkpointing=False)
    predictor.close()
    assert measured - trace.peak_bytes <= max(0.02 * measured, MiB)
    assert abs(trace.peak_bytes - measured) <= max(0.05 * measured, MiB), (trace.peak_bytes, measured)
    # its state is its own: one tensor per parameter, half AdamW's
    assert trace.breakdown["optimizer_state"] * 2 == pytest.approx(adamw.breakdown["optimizer_state"], rel=0.01)


def test_a_function_of_the_users_builds_the_optimizer(tmp_path, monkeypatch):
    (tmp_path / "my_optim.py").write_text(
        "import torch\n"
        "def build(groups, lr):\n"
        "    return torch.optim.RMSprop(groups, lr=lr, alpha=0.9)\n"
        "def not_an_optimizer(groups, lr):\n"
        "    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = torch.nn.Linear(3, 2)
    built = make_optimizer(custom(tmp_path, "my_optim:build"), model)
    assert isinstance(built, torch.optim.RMSprop) and built.param_groups[0]["alpha"] == 0.9
    assert [g["weight_decay"] for g in built.param_groups] == [pytest.approx(0.01), 0.0]  # the decay groups
    with pytest.raises(ConfigError, match='CONFIG_OPTIMIZER_NAME="my_optim:not_an_optimizer" returned int'):
        make_optimizer(custom(tmp_path, "my_optim:not_an_optimizer"), model)


@pytest.mark.parametrize("name, words", [
    ("LBFGS", "needs a closure"), ("SparseAdam", "sparse gradients only"), ("Adagradd", "is not a torch.optim"),
    ("Muon", "refused the model's parameters"), ("no_such_module:f", "cannot be loaded"),
])
def test_what_the_loop_cannot_run_is_one_error_naming_the_setting(tmp_path, name, words):
    with pytest.raises(ConfigError, match=f'CONFIG_OPTIMIZER_NAME="{name}".*{words}'):
        make_optimizer(custom(tmp_path, name), torch.nn.Conv2d(1, 2, 3))


def test_a_name_that_is_neither_a_class_nor_module_function_is_refused_when_read(tmp_path):
    with pytest.raises(ConfigError, match='CONFIG_OPTIMIZER_NAME="torch optim" must be a torch.optim class name'):
        custom(tmp_path, "torch optim")
