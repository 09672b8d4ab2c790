"""lib/step.py forward_loss: the model and its loss as one function, compiled as one graph where the plan compiles."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lib.step import forward_loss


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 5))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 8), torch.tensor([0, 1, 4, 2])


def test_without_compile_it_is_the_loss_of_the_models_output():
    model, (x, y) = _model(), _batch()
    step = forward_loss(model, F.cross_entropy, SimpleNamespace(compile=False, compile_mode=None))
    assert torch.equal(step(x, y), F.cross_entropy(model(x), y))


@pytest.fixture
def graphs(monkeypatch):
    """torch.compile as lib/step.py calls it, with a backend that keeps each graph dynamo hands it (and runs it
    as traced): what would be one inductor kernel set is one graph here."""
    kept: list[torch.fx.GraphModule] = []
    real = torch.compile

    def keep(gm, _inputs):
        kept.append(gm)
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: real(fn, backend=keep))
    torch._dynamo.reset()
    yield kept
    torch._dynamo.reset()


def test_compiled_the_loss_is_in_the_models_graph_and_trains_the_same(graphs):
    model, (x, y) = _model(), _batch()
    eager = _model()
    step = forward_loss(model, F.cross_entropy, SimpleNamespace(compile=True, compile_mode="default"))
    loss = step(x, y)
    assert len(graphs) == 1  # one graph: the head's output and the cross-entropy fuse
    targets = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert F.cross_entropy in targets, targets
    calls = [node for node in graphs[0].graph.nodes if node.op in ("call_module", "call_function")]
    assert len(calls) >= 4  # two linears, the activation and the loss

    expected = F.cross_entropy(eager(x), y)
    loss.backward()
    expected.backward()
    assert loss.item() == pytest.approx(expected.item())
    for got, want in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad, want.grad)


@pytest.mark.slow  # inductor compiles GPT-2-tiny with its loss on this CPU: about 30 s
def test_the_trainer_compiled_trains_as_it_does_eager(tmp_path):
    """kfit's loop with CONFIG_COMPILE_MODEL: the model and its loss compiled as one graph (lib/trainer/engine.py)
    reach the eager run's evaluation loss on the same seed and batches."""
    from lib import api
    from lib import config as kc

    base = kc.make_defconfig("gpt2-tiny", out=tmp_path / ".config")
    losses = {}
    for compiled in (False, True):
        config = kc.derive(base, {"HYPER_PARAM_MANUAL": True, "BATCH_SIZE": 4, "GRADIENT_ACCUMULATION": 2,
                                  "COMPILE_MANUAL": True, "COMPILE_MODEL": compiled, "MAX_STEPS": 4, "EPOCHS": 1000,
                                  "EVAL_INTERVAL": 1000, "MONITOR": False, "PROBE_NEVER": True,
                                  "DATALOADER_WORKERS_MANUAL": True, "DATALOADER_WORKERS": 0})
        lines: list[str] = []
        result = api.train(config, output_dir=tmp_path / f"runs-{compiled}", log=lines.append)
        assert result.steps == 4
        losses[compiled] = result.final_eval["eval_loss"]
    assert losses[True] == pytest.approx(losses[False], rel=1e-3), losses


def test_every_model_is_compiled_however_many_came_before_it_in_the_process(graphs):
    """dynamo keeps a function's graphs on its code, which every forward_loss shares: without a reset the 9th
    model in a process (an HPO trial, a validation check) ran eager, past dynamo's recompile limit of 8."""
    plan = SimpleNamespace(compile=True, compile_mode="default")
    for width in range(4, 16):  # 12 models, each its own shapes
        model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 3))
        before = len(graphs)
        forward_loss(model, F.cross_entropy, plan)(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]))
        assert len(graphs) == before + 1, width
