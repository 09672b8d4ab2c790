"""float8 training (CONFIG_FLOAT8_*, lib/float8.py): planned on GPUs with float8 tensor cores, with their float8
peak for the linear layers' matrix multiplies; refused in one line elsewhere; and torchao's conversion of the
eligible layers, which trains (torchao emulates float8 matrix multiplies on a CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lib import config as kc
from lib.errors import PlanError
from lib.hardware import resolve_hardware
from lib.planning import Settings, make_plan

NO_TIMING = Settings(measure=False)


@pytest.fixture(scope="module")
def gpt2():
    return kc.defconfig_config("gpt2")


@pytest.mark.parametrize("gpu", ["h100", "l4", pytest.param("b200", marks=pytest.mark.slow)])  # b200: 16 s, as h100
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_is_planned_where_there_are_float8_tensor_cores_and_predicted_by_its_matmuls_and_casts(gpt2, gpu, recipe):
    hardware = resolve_hardware(gpu=gpu)
    on = make_plan(kc.derive(gpt2, {f"FLOAT8_{recipe.upper()}": True}), hardware, settings=NO_TIMING).plan
    off = make_plan(gpt2, hardware, settings=NO_TIMING).plan
    assert on.float8 == recipe and off.float8 is None and "float8 tensor cores" in on.reasons["float8"]
    if gpu == "l4":
        # 300 GB/s: casting GPT-2's 768-wide operands costs more than their float8 matmuls save (step-time
        # model: FLOAT8_CAST_TRAFFIC), so float8 is planned as asked and predicted slower
        assert on.predicted_samples_per_second < off.predicted_samples_per_second
        return
    # the same micro-batch split predicted faster: the linear layers' matmuls at the float8 peak
    if (on.micro_batch, on.grad_accum) == (off.micro_batch, off.grad_accum):
        assert on.predicted_step_seconds < off.predicted_step_seconds
    assert on.predicted_samples_per_second > off.predicted_samples_per_second


@pytest.mark.parametrize("gpu, where", [("a100-80gb", "compute capability 8.0"), ("t4", "compute capability 7.5"),
                                        ("mi300x", "AMD Instinct MI300X"), ("cpu", "the CPU")])
def test_float8_is_refused_in_one_line_without_float8_tensor_cores(gpt2, gpu, where):
    config = kc.derive(gpt2, {"FLOAT8_ROWWISE": True})
    with pytest.raises(PlanError) as err:
        make_plan(config, resolve_hardware(gpu=gpu), settings=NO_TIMING)
    message = str(err.value)
    assert "\n" not in message and "CONFIG_FLOAT8_ROWWISE needs float8 tensor cores" in message
    assert where in message and message.endswith("set CONFIG_FLOAT8_OFF")


def test_the_eligible_layers_leave_out_the_output_layer_shared_weights_and_unaligned_ones():
    from lib.float8 import eligible

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 32)
            self.a = torch.nn.Linear(32, 64)
            self.odd = torch.nn.Linear(64, 30)  # 30 is no multiple of 16
            self.b = torch.nn.Linear(30, 32)
            self.head = torch.nn.Linear(32, 64, bias=False)
            self.head.weight = self.embed.weight  # tied
            self.last = torch.nn.Linear(64, 16)

    assert eligible(Net()) == {"a"}  # head is tied, last is the output layer, odd and b unaligned


def _train(model, x, steps=6):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), x.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.slow  # float8 emulated on a CPU: tens of seconds under load
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_converted_model_trains_as_the_plain_one_and_keeps_its_state_dict(recipe):
    """What the engine does with a float8 plan: the model's state dict keeps nn.Linear's names and shapes (so
    checkpoints, export and INIT_FROM are as without), and its losses follow the bf16 model's closely."""
    from lib.float8 import convert
    from lib.models import build_model

    torch.manual_seed(0)
    model = build_model("llama", llama_preset="tiny", block_size=32, vocab_size=256)
    plain = build_model("llama", llama_preset="tiny", block_size=32, vocab_size=256)
    plain.load_state_dict(model.state_dict())
    before = {k: v.shape for k, v in model.state_dict().items()}
    assert convert(model, recipe) > 0 and {k: v.shape for k, v in model.state_dict().items()} == before
    assert type(model.lm_head).__name__ == "Linear"  # the output layer stays in the autocast precision
    x = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
    float8, bf16 = _train(model, x), _train(plain, x)
    assert float8[-1] < float8[0] and bf16[-1] < bf16[0]
    assert all(abs(a - b) / b < 0.05 for a, b in zip(float8, bf16)), (float8, bf16)


def test_a_float8_plan_trains_through_the_engine(make_config, tmp_path):
    """The trainer's engine converts the model where the plan says float8 (a plan made for an H100, trained
    here: torchao emulates the float8 matrix multiplies on a CPU), and the run's checkpoint loads into the
    plain model."""
    from lib.checkpoint import load_checkpoint
    from lib.models import build_model  # noqa: F401
    from lib.trainer import Trainer

    config = make_config("CONFIG_MAX_STEPS=2\nCONFIG_TARGET_EFFECTIVE_BATCH=8\nCONFIG_PRECISION_BF16=y\n",
                         base="llama-tiny")
    cpu = resolve_hardware(gpu="cpu")
    plan = dataclasses.replace(make_plan(config, cpu, settings=NO_TIMING).plan, float8="tensorwise",
                               precision="bf16")
    lines = []
    trainer = Trainer(config, plan, cpu, log=lines.append)
    assert any(type(m).__name__ == "Float8Linear" for m in trainer.engine.model.modules())
    result = trainer.fit()
    assert result.steps == 2
    state = load_checkpoint(next(result.run_dir.glob("*.pt")))
    plain = trainer.task.build(False)
    plain.load_state_dict(state["model"])
