"""Gradient checkpointing for every model: a Hugging Face model through its own switch, any other through
PyTorch's activation-checkpoint wrapper on its repeated blocks (or CONFIG_CHECKPOINT_MODULES' classes); the
tracer traces it, the planner may choose it, the out-of-memory ladder's rung applies to it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

from lib.config import DEFAULT_SHARE
from lib.errors import ConfigError
from lib.hyperparams import ModelDescription, resolve
from lib.memory import model_fingerprint
from lib.models import checkpointing
from lib.models.registry import can_checkpoint, checkpointing_for
from lib.planning.memory_policy import PLANNER
from lib.task import load_task
from tests import checkpoint_freeze_models as zoo
from tests.helpers import CPU, assert_same_weights, manual, run

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py
FACTORY = "tests.checkpoint_freeze_models"


def custom(make_config, factory: str, extra: str = ""):
    return make_config(f'CONFIG_CUSTOM_MODEL_FACTORY="{FACTORY}:{factory}"\nCONFIG_CUSTOM_TRAIN_SAMPLES=32\n'
                       "CONFIG_CUSTOM_EVAL_SAMPLES=8\n" + extra, base="custom-transformer")


def grads(model: nn.Module, x, y) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # GPT-2's dropout: the same masks (checkpointing replays the RNG when it recomputes)
    zoo.lm_loss(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# -- how a model checkpoints ---------------------------------------------------------------


def test_the_repeated_blocks_are_the_outermost_layers_a_list_holds_several_of():
    stack = zoo.Stack(depth=3)
    assert checkpointing.find(stack) == checkpointing.Checkpointing("blocks", ("Block",), 3)
    transformer = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=3,
                                 dim_feedforward=32, batch_first=True)  # encoder and decoder layers: both, not the attention inside
    how = checkpointing.find(transformer)
    assert how.classes == ("TransformerDecoderLayer", "TransformerEncoderLayer") and how.count == 5
    assert checkpointing.find(zoo.mlp()[0]) is None  # leaves only: nothing worth recomputing
    assert checkpointing.find(zoo.hf_llama()[0]).kind == "hf"
    own = zoo.Stack()
    own.grad_checkpointing = False
    assert checkpointing.find(own).kind == "own"


def test_named_classes_override_and_a_wrong_name_lists_the_classes_there_are():
    model = zoo.hf_llama()[0]
    assert checkpointing.find(model, ("LlamaDecoderLayer",)) == checkpointing.Checkpointing(
        "blocks", ("LlamaDecoderLayer",), 2)
    with pytest.raises(ConfigError) as err:
        checkpointing.find(model, ("LlamaLayer",))
    message = str(err.value)
    assert message.startswith('CONFIG_CHECKPOINT_MODULES="LlamaLayer": the model (LlamaForCausalLM) has no module '
                              "of class LlamaLayer: name classes it has: ") and "LlamaDecoderLayer" in message
    assert "\n" not in message


@pytest.mark.parametrize("factory, classes", [("blocks", ()), ("hf_llama", ()), ("hf_gpt2", ()),
                                              ("hf_llama", ("LlamaDecoderLayer",))])
def test_switching_on_recomputes_the_same_gradients_and_keeps_names_and_parameters(factory, classes):
    model, make_batch, _ = getattr(zoo, factory)()
    how = checkpointing.find(model, classes)
    x, y = make_batch(2, torch.Generator().manual_seed(0))
    names, params = list(model.state_dict()), [id(p) for p in model.parameters()]
    plain = grads(model, x, y)
    checkpointing.switch(model, how, True)
    assert checkpointing.is_on(model, how)
    assert list(model.state_dict()) == names and [id(p) for p in model.parameters()] == params
    again = grads(model, x, y)
    assert again.keys() == plain.keys() or [k.replace("_checkpoint_wrapped_module.", "") for k in again] == list(plain)
    for a, b in zip(plain.values(), again.values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    checkpointing.switch(model, how, False)
    assert not checkpointing.is_on(model, how) and list(model.state_dict()) == names


def test_the_one_answer_for_every_model(make_config):
    assert can_checkpoint(make_config("", base="gpt2-tiny")) and not can_checkpoint(make_config(""))  # LeNet-5
    assert checkpointing_for(custom(make_config, "hf_llama")).kind == "hf"
    assert checkpointing_for(custom(make_config, "blocks")).classes == ("Block",)
    assert not can_checkpoint(custom(make_config, "mlp"))
    named = custom(make_config, "hf_llama", 'CONFIG_CHECKPOINT_MODULES="LlamaMLP, LlamaAttention"\n')
    assert checkpointing_for(named).classes == ("LlamaMLP", "LlamaAttention")


def test_config_mistakes_are_one_error_line(make_config):
    with pytest.raises(ConfigError, match=r"^CONFIG_GRADIENT_CHECKPOINTING=y: the model \(Sequential\) .* has no way "
                                          r"to checkpoint .*CONFIG_CHECKPOINT_MODULES, or say n$"):
        load_task(custom(make_config, "mlp", "CONFIG_GRADIENT_CHECKPOINTING=y\n"))
    with pytest.raises(ConfigError, match="CONFIG_CHECKPOINT_MODULES=\"Blok\": the model \\(Stack\\) has no module of "
                                          "class Blok: name classes it has: Block"):
        load_task(custom(make_config, "blocks", 'CONFIG_CHECKPOINT_MODULES="Blok"\n'))
    with pytest.raises(ConfigError, match="'Block-1' is not a class name"):
        custom(make_config, "blocks", 'CONFIG_CHECKPOINT_MODULES="Block-1"\n')
    with pytest.raises(ConfigError, match="CHECKPOINT_MODULES"):  # a custom model's setting only
        make_config('CONFIG_CHECKPOINT_MODULES="Block"\n', base="gpt2-tiny")


def test_the_trace_cache_key_includes_the_named_classes(make_config):
    assert "checkpoint_modules" not in model_fingerprint(custom(make_config, "blocks"))
    named = model_fingerprint(custom(make_config, "blocks", 'CONFIG_CHECKPOINT_MODULES="Block"\n'))
    assert named["checkpoint_modules"] == ["Block"]


# -- traced, planned, trained ----------------------------------------------------------------


@pytest.mark.parametrize("factory", ["hf_llama", "blocks"])
def test_the_tracer_traces_the_checkpointed_model(make_config, factory):
    config = custom(make_config, factory)
    plain, ckpt = (PLANNER.predictor.predict(config, batch=8, device_type="cpu", precision="fp32",
                                             gradient_checkpointing=on) for on in (False, True))
    assert ckpt.peak_bytes < plain.peak_bytes and ckpt.breakdown["activations"] < plain.breakdown["activations"] / 2
    assert ckpt.breakdown["parameters"] == plain.breakdown["parameters"]


def test_a_hugging_face_model_with_checkpointing_is_planned_and_trained(make_config):
    auto = custom(make_config, "hf_llama", "CONFIG_GRADIENT_CHECKPOINTING=y\nCONFIG_TARGET_EFFECTIVE_BATCH=8\n")
    plan = resolve(auto, CPU, ModelDescription.from_config(auto))
    # everything fits here: the planner weighed both settings and recomputing only costs time
    assert not plan.gradient_checkpointing and plan.micro_batch == 8
    assert plan.reasons["gradient_checkpointing"].startswith("AUTO: off against CONFIG_GRADIENT_CHECKPOINTING=y")
    plain, ckpt = (PLANNER.predictor.predict(auto, batch=8, device_type="cpu", precision="fp32",
                                             gradient_checkpointing=on) for on in (False, True))
    assert ckpt.peak_bytes < plain.peak_bytes
    config = custom(make_config, "hf_llama", manual(8, 1, "CONFIG_GRADIENT_CHECKPOINTING=y\nCONFIG_MAX_STEPS=2\n"))
    trainer, result = run(config)
    assert trainer.plan.gradient_checkpointing and result.steps == 2
    assert checkpointing.is_on(trainer.model, trainer.engine.checkpointing)


def ram(mib: float):
    return dataclasses.replace(CPU, cpu=dataclasses.replace(CPU.cpu, ram_available_bytes=int(mib * 2**20)))


@pytest.mark.slow  # cold traces of a Hugging Face model
def test_where_only_checkpointing_fits_the_planner_takes_it_for_a_hugging_face_model(make_config):
    config = custom(make_config, "hf_llama", "CONFIG_TARGET_EFFECTIVE_BATCH=8\n")
    one = PLANNER.predictor.predict(config, batch=1, device_type="cpu", precision="fp32")
    ckpt = PLANNER.predictor.predict(config, batch=1, device_type="cpu", precision="fp32", gradient_checkpointing=True)
    assert ckpt.peak_bytes < one.peak_bytes
    between = (one.peak_bytes + ckpt.peak_bytes) / 2 / DEFAULT_SHARE / 2**20  # a budget only ckpt fits at 1
    plan = resolve(config, ram(between), ModelDescription.from_config(config))
    assert plan.gradient_checkpointing and plan.reasons["oom_ladder"] == "before training: gradient checkpointing on"


def test_the_ladder_switches_a_wrapped_model_on_with_the_same_steps(make_config, monkeypatch):
    monkeypatch.setattr("lib.trainer.evaluation.Evaluator.__call__", lambda self, *args: {"eval_loss": 0.0})
    text = manual(4, 1, "CONFIG_MAX_STEPS=2\nCONFIG_LEARNING_RATE=\"1e-3\"\n")
    clean, clean_result = run(custom(make_config, "blocks", text))
    monkeypatch.setenv("KFIT_INJECT_OOM_ABOVE", "0")
    adapted, result = run(custom(make_config, "blocks", text))
    assert adapted.progress.rungs == ["checkpointing"] and adapted.plan.gradient_checkpointing
    assert checkpointing.is_on(adapted.model, adapted.engine.checkpointing)
    assert result.samples == clean_result.samples == 8
    assert_same_weights(adapted.model, clean.model, atol=2e-5)  # the same samples, the same math
    assert json.loads((result.run_dir / "plan.json").read_text())["gradient_checkpointing"] is True


@pytest.mark.slow
def test_make_train_climbs_to_the_checkpointing_rung_on_a_hugging_face_model(tmp_path):
    """KFIT_INJECT_OOM_ABOVE=0 make train: every micro-batch fails until a rung other than halving is taken."""
    from lib import config as kc

    (tmp_path / "mine").write_text(f'CONFIG_MODEL_CUSTOM=y\nCONFIG_CUSTOM_MODEL_FACTORY="{FACTORY}:hf_llama"\n'
                                   "CONFIG_CUSTOM_TRAIN_SAMPLES=32\nCONFIG_CUSTOM_EVAL_SAMPLES=8\nCONFIG_DEVICE_CPU=y\n"
                                   "CONFIG_MAX_STEPS=2\nCONFIG_TARGET_EFFECTIVE_BATCH=4\nCONFIG_PROBE_NEVER=y\n")
    from tests.test_make import make, ok  # make with the variables of an enclosing make cleared

    kc.make_defconfig(str(tmp_path / "mine"), out=tmp_path / ".config")
    result = ok(make(tmp_path, "train", env={"KFIT_INJECT_OOM_ABOVE": "0"}))
    out = result.stdout + result.stderr
    assert "out-of-memory ladder rung 1: gradient checkpointing on" in out and "Done: 2 steps" in out
    [run_dir] = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "plan.json").read_text())["gradient_checkpointing"] is True
