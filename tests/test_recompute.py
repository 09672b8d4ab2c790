"""What a checkpointed GPT-2 or Llama block recomputes (CONFIG_ACTIVATION_CHECKPOINT_*; lib/models/checkpointing.py's
Recompute): the same gradients as no checkpointing, less recomputed than full checkpointing, and the choice
reaching the trainer's and the tracer's model through the config."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lib.models import build_model
from lib.models.checkpointing import Recompute

pytestmark = pytest.mark.usefixtures("one_thread")

POLICIES = [None, Recompute("full"), Recompute("selective_op"), Recompute("selective_layer", 2),
            Recompute("selective_layer", 3)]


class MatmulCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.mm += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return func(*args, **(kwargs or {}))


def step(family: str, recompute: Recompute | None):
    """(loss, gradients, matmuls run in backward) of one bf16-autocast step from the same weights."""
    torch.manual_seed(0)
    kw = dict(llama_preset="tiny") if family == "llama" else dict(gpt2_preset="tiny")
    model = build_model(family, block_size=32, vocab_size=300, grad_checkpointing=recompute is not None,
                        recompute=recompute, **kw)
    x = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), x.flatten())
    with MatmulCount() as count:
        loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()], count.mm


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_every_policy_gives_the_gradients_of_no_checkpointing_and_recomputes_less_than_full(family):
    base_loss, base_grads, base_mm = step(family, None)
    mm = {}
    for recompute in POLICIES[1:]:
        loss, grads, mm[recompute] = step(family, recompute)
        assert loss == base_loss
        for g, b in zip(grads, base_grads):
            torch.testing.assert_close(g, b, rtol=0, atol=0)  # the same ops on the same values
    full, op, every2, every3 = (mm[p] for p in POLICIES[1:])
    assert base_mm < op < full  # selective per op recomputes half a block's matmuls, full all of them
    assert base_mm < every3 < every2 < full


def test_the_policies_are_checked():
    with pytest.raises(ValueError, match="recompute policy 'some'"):
        Recompute("some")
    assert [Recompute("selective_layer", 2).checkpointed(i) for i in range(4)] == [False, True, False, True]
    assert all(Recompute("selective_op").checkpointed(i) for i in range(4))


@pytest.mark.parametrize("choice, policy", [("", "full"), ("CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_OP=y\n", "selective_op"),
                                            ("CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_LAYER=y\n"
                                             "CONFIG_ACTIVATION_CHECKPOINT_EVERY=3\n", "selective_layer")])
def test_the_config_reaches_the_model_and_the_trace_cache_key(make_config, choice, policy):
    from lib.memory import model_fingerprint
    from lib.task import load_task

    config = make_config("CONFIG_GRADIENT_CHECKPOINTING=y\n" + choice, "llama-tiny")
    model = load_task(config).build(True)
    assert model.recompute.policy == policy and model.grad_checkpointing
    assert ("recompute" in model_fingerprint(config)) == (policy != "full")  # full's keys stay as they were
    assert make_config("", "lenet5").recompute_policy is None  # the choice is the transformers'


@pytest.mark.slow  # two trainer runs: 8-20 s here
def test_selective_checkpointing_trains_on_this_cpu(make_config):
    """Two runs from one seed, full and selective per op: the same losses (the same gradients, step by step)."""
    from tests.helpers import manual, run

    losses = {}
    for name, text in (("full", ""), ("op", "CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_OP=y\n")):
        config = make_config(manual(8, 2, "CONFIG_GRADIENT_CHECKPOINTING=y\nCONFIG_MAX_STEPS=3\n"
                                          "CONFIG_PRECISION_FP32=y\n" + text), "llama-tiny")
        trainer, result = run(config)
        assert trainer.plan.gradient_checkpointing and result.steps == 3
        losses[name] = result.final_eval
    assert losses["op"] == losses["full"]


def test_the_plan_traces_the_choice(make_config):
    """At one micro-batch, the activations saved: none > per op > full."""
    from lib.memory import MemoryPredictor

    peaks = {}
    for name, text in (("none", ""), ("full", "CONFIG_GRADIENT_CHECKPOINTING=y\n"),
                       ("op", "CONFIG_GRADIENT_CHECKPOINTING=y\nCONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_OP=y\n")):
        config = make_config(text, "llama-tiny")
        peaks[name] = MemoryPredictor().trace(config, batch=8, device_type="cpu", precision="bf16").breakdown[
            "activations"]
    assert peaks["none"] > peaks["op"] > peaks["full"]
