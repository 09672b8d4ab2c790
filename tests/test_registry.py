"""The model registry (lib/models/registry.py) is the one answer to "which models ...": the config's model
names, the data and build arguments of a task, the advice a report gives and the help a refusal names all come
from it. (tests/test_hygiene.py checks that no list of model names stands in for it.)"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from lib import config as kc
from lib import report
from lib.config.kconfig import new_kconfig
from lib.errors import KfitError
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, TierPolicy, resolve
from lib.models.registry import MODELS, can_checkpoint, spec_for
from lib.planning.memory_policy import PlannerPolicy


def test_the_models_menu_offers_the_registrys_models():
    [choice] = [c for c in new_kconfig().choices if c.syms and all(s.name.startswith("MODEL_") for s in c.syms)]
    assert {s.name.removeprefix("MODEL_").lower() for s in choice.syms} == set(MODELS)


@pytest.mark.parametrize("defconfig, model", [("lenet5", "lenet5"), ("resnet50", "resnet50"),
                                              ("gpt2-tiny", "gpt2"), ("llama-tiny", "llama"),
                                              ("custom-transformer", "custom")])
def test_the_configs_model_is_the_menus_choice(defconfig, model, tmp_path):
    assert kc.make_defconfig(defconfig, out=tmp_path / ".config").model == model


def test_the_registry_says_which_models_checkpoint_and_train_on_text():
    assert {n for n in MODELS if can_checkpoint(n)} == {"resnet18", "resnet50", "gpt2", "llama"}
    assert {n for n, spec in MODELS.items() if spec.text} == {"gpt2", "llama"}
    assert can_checkpoint("custom", SimpleNamespace(grad_checkpointing=False)) and not can_checkpoint("custom")
    with pytest.raises(KfitError, match="unknown model 'bert': choose one of lenet5, resnet18"):
        spec_for("bert")


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A plan whose memory caps the micro-batch under each process's share, without gradient checkpointing."""
    lenet = kc.make_defconfig("lenet5", out=tmp_path_factory.mktemp("c") / ".config")
    plan = resolve(lenet, resolve_hardware(gpu="cpu"), ModelDescription.from_config(lenet), policy=TierPolicy())
    assert plan.effective_batch > 1
    return dataclasses.replace(plan, policy="planner", max_micro_batch=1, gradient_checkpointing=False)


@pytest.mark.parametrize("defconfig, advised", [("llama-tiny", True), ("gpt2-tiny", True), ("resnet18", True),
                                                ("lenet5", False), ("custom-transformer", True)])
def test_memory_capped_models_that_checkpoint_are_told_to(defconfig, advised, capped, tmp_path, monkeypatch):
    """check-hardware's advice: gradient checkpointing for every model the registry says has it (Llama's was
    missing while a literal list answered; the custom transformer's repeated blocks get the checkpoint wrapper)."""
    def no_other_profile(*args, **kwargs):
        raise KfitError("not planned in this test")

    monkeypatch.setattr(report, "make_plan", no_other_profile)
    config = kc.make_defconfig(defconfig, out=tmp_path / ".config")
    advice = report.recommendations(config, resolve_hardware(gpu="cpu"), capped)
    assert any("CONFIG_GRADIENT_CHECKPOINTING=y" in a for a in advice) is advised


@pytest.mark.parametrize("defconfig, smaller", [
    ("gpt2-tiny", "a smaller preset (CONFIG_GPT2_PRESET_*) or a shorter CONFIG_GPT2_BLOCK_SIZE"),
    ("llama-tiny", "a smaller preset (CONFIG_LLAMA_PRESET_*) or a shorter CONFIG_LLAMA_BLOCK_SIZE"),
    ("lenet5", None)])
def test_a_refusal_names_what_makes_the_model_smaller(defconfig, smaller, tmp_path):
    policy = PlannerPolicy()
    policy.__dict__["predictor"] = SimpleNamespace(predict=lambda config, **kw: SimpleNamespace(peak_bytes=2**30))
    one = SimpleNamespace(breakdown={"parameters": 2**31}, peak_bytes=2**31)
    config = kc.make_defconfig(defconfig, out=tmp_path / ".config")
    refusal = policy._no_fit(config, one, 2**20, "a test's budget", "cpu", "bf16", {})
    assert [h for h in refusal.helps if "smaller preset" in h] == ([smaller] if smaller else [])


def test_a_task_builds_each_text_model_from_its_registry_arguments(tmp_path):
    from lib.models import GPT2, Llama
    from lib.task import load_task

    for defconfig, kind in (("llama-tiny", Llama), ("gpt2-tiny", GPT2)):
        config = kc.make_defconfig(defconfig, out=tmp_path / f"{defconfig}.config")
        task = load_task(config)
        assert task.info.block_size == spec_for(config.model).block_size(config)
        model = task.build(True)
        assert isinstance(model, kind) and model.grad_checkpointing


def test_every_model_declares_its_shape_key_and_its_name_leads_it():
    """The model part of every cache key comes from the model's own spec: a family without one cannot be
    planned from a cache (a ConfigError), so a new family never shares another's keys."""
    from lib.errors import ConfigError
    from lib.models import registry

    assert all(spec.shape_key is not None for spec in MODELS.values())
    config = kc.defconfig_config("gpt2-tiny")
    assert registry.shape_key(config)["model"] == "gpt2" and list(registry.shape_key(config))[0] == "model"
    toy = dataclasses.replace(MODELS["gpt2"], name="toy", shape_key=None)
    with pytest.MonkeyPatch.context() as m:
        m.setitem(MODELS, "toy", toy)
        with pytest.raises(ConfigError, match="declares no shape_key"):
            registry.shape_key(dataclasses.replace(config, model="toy"))


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_each_preset_of_a_family_gets_its_own_keys_and_label(name, tmp_path):
    """Every preset of a text family is its own model to the trace cache and the probe's cache (the probe's key
    named GPT-2's preset only, so two Llama sizes shared a probe result), and names its runs and studies."""
    from lib.memory.cache import model_fingerprint
    from lib.models import registry
    from lib.probe import fingerprint
    from lib.task import load_task

    family = name.split("-")[0].upper()
    base = kc.defconfig_config(name)
    presets = [s.name.removeprefix(f"{family}_PRESET_").lower() for s in new_kconfig().syms.values()
               if s.name.startswith(f"{family}_PRESET_") and s.choice is not None]
    configs = []
    for preset in presets:
        try:
            configs.append(kc.derive(base, {f"{family}_PRESET_{preset.upper()}": True}))
        except KfitError:
            continue  # a preset that needs other settings (custom dimensions)
    assert len(configs) >= 3
    assert len({registry.label(c) for c in configs}) == len(configs)
    assert len({str(model_fingerprint(c)) for c in configs}) == len(configs)
    hardware = resolve_hardware(gpu="h100")
    plan = resolve(base, hardware, None)
    task = load_task(base)
    assert len({fingerprint(c, plan, hardware, task) for c in configs}) == len(configs)
