"""CONFIG_FREEZE: frozen parameters get no gradient and no optimizer state, the planner counts exactly that,
a pattern that matches nothing is one error line, and the run says how many parameters train."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lib.errors import ConfigError
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.memory import model_fingerprint
from lib.memory.trace import step_optimizer, trace_step, training_steps
from lib.models.freeze import freeze
from lib.planning.memory_policy import PLANNER
from lib.step import autocast_for, make_optimizer
from lib.task import load_task

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from bench_memory_instruments import allocator_peak  # noqa: E402  (bench-memory's instrument)

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py
FACTORY = "tests.checkpoint_freeze_models"
CPU = resolve_hardware(gpu="cpu")
ADAMW_STATES = 2  # exp_avg, exp_avg_sq per parameter, and a 4-byte step counter per tensor
STEP_COUNTER = 4


def custom(make_config, factory: str, freeze_patterns: str = "", extra: str = ""):
    return make_config(f'CONFIG_CUSTOM_MODEL_FACTORY="{FACTORY}:{factory}"\nCONFIG_CUSTOM_TRAIN_SAMPLES=64\n'
                       f'CONFIG_CUSTOM_EVAL_SAMPLES=16\nCONFIG_FREEZE="{freeze_patterns}"\n' + extra,
                       base="custom-transformer")


def frozen_state_bytes(model: torch.nn.Module) -> int:
    """What freezing takes away under AdamW: one gradient and two states per frozen scalar, one step
    counter per frozen tensor."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    return sum(p.numel() * p.element_size() for p in frozen) * (1 + ADAMW_STATES) + STEP_COUNTER * len(frozen)


# -- the config and the freezing itself ------------------------------------------------


def test_patterns_are_words_separated_by_spaces_or_commas(make_config):
    config = make_config('CONFIG_FREEZE="encoder.*, decoder.0.*  encoder.*"\n')
    assert config.freeze == ("encoder.*", "decoder.0.*")
    assert make_config("").freeze == ()


def test_freeze_sets_requires_grad_and_the_optimizer_keeps_only_what_trains(make_config):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    assert freeze(model, ("0.*",)) == 4 * 8 + 8
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True]
    optimizer = make_optimizer(make_config(""), model)
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(model[2].weight), id(model[2].bias)}
    torch.nn.functional.cross_entropy(model(torch.randn(3, 4)), torch.tensor([0, 1, 0])).backward()
    optimizer.step()
    assert model[0].weight.grad is None and model[2].weight.grad is not None
    assert len(optimizer.state) == 2  # no state for the frozen layer


def test_a_pattern_that_matches_nothing_names_the_symbol_and_real_names():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    with pytest.raises(ConfigError) as err:
        freeze(model, ("0.*", "encoder.*"))
    message = str(err.value)
    assert message.startswith('CONFIG_FREEZE="0.* encoder.*": \'encoder.*\' matches no parameter of the model '
                              "(Sequential)") and "0.weight" in message and "\n" not in message
    assert model[0].weight.requires_grad  # nothing frozen when refusing
    with pytest.raises(ConfigError, match=r"'0' matches no parameter.*\(a module's parameters: 0\.\*\)"):
        freeze(model, ("0",))
    with pytest.raises(ConfigError, match="freezes every parameter.*nothing to train"):
        freeze(model, ("*",))


def test_a_tied_weight_is_matched_under_either_name():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight
            self.other = torch.nn.Linear(4, 4)

    model = Tied()
    assert freeze(model, ("head.weight",)) == 40 and not model.embed.weight.requires_grad


def test_gpt2_embeddings_freeze_and_a_wrong_pattern_is_refused_when_the_task_loads(make_config):
    config = make_config('CONFIG_FREEZE="transformer.wte.* transformer.wpe.*"\n', base="gpt2-tiny")
    model = load_task(config).build(False)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"transformer.wte.weight", "transformer.wpe.weight"}  # wte is the output layer's too (tied)
    with pytest.raises(ConfigError, match=r"^CONFIG_FREEZE=\"transformer\.wt\.\*\": 'transformer\.wt\.\*' matches no "
                                          r"parameter of the model \(GPT2\).*transformer\.wte\.weight"):
        load_task(make_config('CONFIG_FREEZE="transformer.wt.*"\n', base="gpt2-tiny"))


def test_the_command_line_refuses_a_wrong_pattern_in_one_line(make_config, tmp_path, monkeypatch, capsys):
    from lib.cli import main

    config = custom(make_config, "encoder_decoder", "encodr.*")
    before = Path(config.source).read_bytes()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KCONFIG_CONFIG", config.source)
    for name in ("HW", "GPU", "GPUS", "WORLD_SIZE", "FORMAT", "FREE_GB"):
        monkeypatch.delenv(name, raising=False)
    capsys.readouterr()
    assert main(["plan"]) != 0
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.strip()]
    assert line.startswith('error: CONFIG_FREEZE="encodr.*": \'encodr.*\' matches no parameter') and "encoder.0" in line
    assert "Traceback" not in err and Path(config.source).read_bytes() == before


def test_the_trace_cache_key_includes_the_patterns(make_config):
    plain, frozen = custom(make_config, "encoder_decoder"), custom(make_config, "encoder_decoder", "encoder.*")
    assert "freeze" not in model_fingerprint(plain)  # configs without it keep their keys
    assert model_fingerprint(frozen)["freeze"] == ["encoder.*"]
    other = custom(make_config, "encoder_decoder", "decoder.0.*")
    assert model_fingerprint(other) != model_fingerprint(frozen)


# -- the planner counts exactly what freezing takes away -----------------------------------


@pytest.mark.parametrize("factory, patterns, output_gradient", [
    # a layer in the middle: backward still runs through it, so only its gradient and state go
    ("middle", "2.*", 0),
    # a whole encoder: also the gradient of its output (batch x 512 floats), which backward no longer computes
    ("encoder_decoder", "encoder.*", 64 * 512 * 4),
])
def test_the_planned_peak_drops_by_exactly_the_frozen_gradients_and_optimizer_state(make_config, factory, patterns,
                                                                                     output_gradient):
    plain, frozen = custom(make_config, factory), custom(make_config, factory, patterns)
    model = load_task(frozen).build(False)
    expected = frozen_state_bytes(model) + output_gradient
    before, after = (PLANNER.predictor.predict(c, batch=64, device_type="cpu", precision="fp32") for c in (plain, frozen))
    assert before.peak_bytes - after.peak_bytes == expected
    assert before.breakdown["gradients"] - after.breakdown["gradients"] == sum(
        p.numel() * 4 for p in model.parameters() if not p.requires_grad)
    # the plans: the same micro-batch, the predicted peaks apart by the same bytes
    target = "CONFIG_TARGET_EFFECTIVE_BATCH=64\n"
    plans = [resolve(c, CPU, ModelDescription.from_config(c)) for c in
             (custom(make_config, factory, "", target), custom(make_config, factory, patterns, target))]
    assert plans[0].micro_batch == plans[1].micro_batch == 64
    assert plans[0].predicted_peak_bytes - plans[1].predicted_peak_bytes == expected


def test_a_real_step_agrees_with_the_frozen_prediction(make_config):
    """bench-memory's allocator instrument on the step the tracer traces, frozen and not (within its 5%)."""
    peaks = {}
    for patterns in ("", "encoder.*"):
        config = custom(make_config, "encoder_decoder", patterns)
        task = load_task(config)

        def run():
            model = task.build(False)
            x, y = task.example_batch(64)
            training_steps(model, step_optimizer(config, model, "cpu"), task.loss, x, y, grad_clip=config.grad_clip,
                           autocast=autocast_for(SimpleNamespace(precision="fp32", device_type="cpu")), foreach=False)

        traced = trace_step(task, config, batch=64, precision="fp32", device_type="cpu", gradient_checkpointing=False)
        peaks[patterns] = traced.peak_bytes, allocator_peak(run)
        assert traced.peak_bytes == pytest.approx(peaks[patterns][1], rel=0.05)
    predicted_saving = peaks[""][0] - peaks["encoder.*"][0]
    measured_saving = peaks[""][1] - peaks["encoder.*"][1]
    assert predicted_saving == pytest.approx(measured_saving, rel=0.05)


# -- the run ------------------------------------------------------------------------------


def test_the_run_says_trainable_and_total_parameters_and_frozen_weights_stay(make_config):
    from lib.trainer import train

    config = custom(make_config, "encoder_decoder", "encoder.*", "CONFIG_MAX_STEPS=2\nCONFIG_LEARNING_RATE=\"1e-2\"\n")
    plan = resolve(config, CPU, ModelDescription.from_config(config))
    lines: list[str] = []
    result = train(config, plan, CPU, log=lines.append)
    assert result.steps == 2
    total, encoder = 32 * 512 + 512 + 512 * 64 + 64 + 64 * 2 + 2, 32 * 512 + 512
    [line] = [line for line in lines if line.startswith("Model:")]
    assert f"{total - encoder:,} trainable / {total:,} parameters (CONFIG_FREEZE: encoder.*)" in line
    saved = torch.load(result.run_dir / "checkpoint.pt", weights_only=False)["model"]
    start = load_task(config).build(False).state_dict()  # the factory seeds its weights
    assert torch.equal(saved["encoder.0.weight"], start["encoder.0.weight"])
    assert not torch.equal(saved["decoder.0.weight"], start["decoder.0.weight"])
