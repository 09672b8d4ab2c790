"""The Task layer: every model, built-in or custom, reaches the trainer and planner the same way."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from lib import config as kc
from lib.errors import ConfigError
from lib.models.custom import build_custom
from lib.task import load_task
from tests.helpers import MISTAKES

FACTORY = textwrap.dedent('''
    import torch

    def make_batch(batch_size, generator):
        x = torch.randn(batch_size, 4, generator=generator)
        return x, x.sum(dim=1, keepdim=True)

    def build():
        return torch.nn.Linear(4, 1), make_batch, torch.nn.functional.mse_loss

    def not_a_triple():
        return torch.nn.Linear(4, 1)

    def short_batches():
        return torch.nn.Linear(4, 1), lambda b, g: (torch.zeros(b - 1, 4), torch.zeros(b - 1, 1)), print

    NOT_CALLABLE = 3
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A factory in a module outside the project, importable from the directory make runs in."""
    (tmp_path / "my_models.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    yield "my_models"
    sys.modules.pop("my_models", None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def custom_config(tmp_path, factory: str, **extra):
    lines = ["CONFIG_MODEL_CUSTOM=y", f'CONFIG_CUSTOM_MODEL_FACTORY="{factory}"',
             "CONFIG_CUSTOM_TRAIN_SAMPLES=96", "CONFIG_CUSTOM_EVAL_SAMPLES=32", "CONFIG_DEVICE_CPU=y"]
    lines += [f"CONFIG_{k}={v}" for k, v in extra.items()]
    (tmp_path / "defconfig").write_text("\n".join(lines) + "\n")
    return kc.make_defconfig(str(tmp_path / "defconfig"), out=tmp_path / ".config")


def test_custom_task_draws_seeded_disjoint_splits(tmp_path, user_module):
    config = custom_config(tmp_path, f"{user_module}:build")
    task, again = load_task(config), load_task(config)
    assert (len(task.train), len(task.eval), task.info.kind) == (96, 32, "custom")
    x, y = task.train[[0, 5]]
    assert torch.equal(x, again.train[[0, 5]][0]) and torch.allclose(y, x.sum(dim=1, keepdim=True))
    assert not torch.equal(task.train[[0]][0], task.eval[[0]][0])
    assert isinstance(task.build(False), torch.nn.Linear) and task.build(False) is not task.build(False)
    assert task.example_batch(200)[0].shape == (200, 4)  # wraps around a small split


@pytest.mark.parametrize("attr, message", [
    ("missing", "has no missing"),
    ("NOT_CALLABLE", "is not callable"),
    ("not_a_triple", "must return (model, make_batch or dataset, loss_fn)"),
])
def test_factory_problems_are_named(attr, message, user_module):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_custom(f"{user_module}:{attr}")


def test_unimportable_module_says_where_to_put_it():
    with pytest.raises(ConfigError, match="cannot import no_such_module.*PYTHONPATH"):
        build_custom("no_such_module:build")


def test_make_batch_of_the_wrong_size_is_refused(tmp_path, user_module):
    config = custom_config(tmp_path, f"{user_module}:short_batches")
    with pytest.raises(ConfigError, match="returned 95 inputs"):
        load_task(config)


def test_custom_model_trains_through_the_one_loop(tmp_path, user_module):
    from lib.hardware import resolve_hardware
    from lib.hyperparams import ModelDescription, TierPolicy, resolve
    from lib.trainer import train

    config = custom_config(tmp_path, f"{user_module}:build", EPOCHS=5, TARGET_EFFECTIVE_BATCH=32, WARMUP_STEPS=0, LEARNING_RATE='"0.1"',
                           OUTPUT_DIR='"runs"', LOG_INTERVAL=100)
    hardware = resolve_hardware(gpu="cpu")
    plan = resolve(config, hardware, ModelDescription.from_config(config), 1, TierPolicy())
    losses = []
    result = train(config, plan, hardware, run_dir=tmp_path / "run", log=lambda _: None,
                   on_eval=lambda step, epoch, metrics: losses.append(metrics["eval_loss"]))
    assert result.steps == 15 and set(result.final_eval) == {"eval_loss"}
    assert losses[-1] < losses[0] / 2  # a linear model learns a sum


# --------------------------------------------------------------------------
# A mistake in a custom model is one error naming the factory (issue 16, defect 7)



@pytest.fixture
def mistakes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("kfit_mistake_")]:
        del sys.modules[name]
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("case", list(MISTAKES))
def test_a_custom_model_mistake_is_one_error_naming_the_factory(case, mistakes):
    source, factory, needles = MISTAKES[case]
    module = f"kfit_mistake_{case.replace('-', '_')}"
    (mistakes / f"{module}.py").write_text(source)
    config = custom_config(mistakes, f"{module}:{factory}")
    with pytest.raises(ConfigError) as err:
        load_task(config)
    message = str(err.value)
    assert message.startswith(f'CONFIG_CUSTOM_MODEL_FACTORY="{module}:{factory}": ') and "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_a_builtin_is_not_a_factory():
    with pytest.raises(ConfigError, match=r'^CONFIG_CUSTOM_MODEL_FACTORY="os:getcwd": os:getcwd is built into '
                                          r'Python.*a Python function of yours'):
        build_custom("os:getcwd")
    from lib.memory.cache import model_fingerprint

    with pytest.raises(ConfigError, match="os:getcwd"):  # the trace cache's key reads the factory first
        model_fingerprint(type("C", (), {"model": "custom", "custom_model_factory": "os:getcwd"})())


def test_the_check_changes_neither_the_model_nor_the_random_state(tmp_path, user_module):
    from lib.models.custom import check

    custom = build_custom(f"{user_module}:build")
    model = torch.nn.Sequential(custom.model, torch.nn.BatchNorm1d(1), torch.nn.Dropout(0.5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, 4)
    state = torch.random.get_rng_state()
    check(type(custom)(model, custom.make_batch, torch.nn.functional.mse_loss), x, x.sum(1, keepdim=True), "m:f")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # running stats untouched
    assert torch.equal(torch.random.get_rng_state(), state) and all(p.grad is None for p in model.parameters())
