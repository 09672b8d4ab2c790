"""Adam and AdamW run torch's fused kernel where every parameter is on CUDA or on the CPU (lib/step.py), and the
memory tracer traces that implementation for either target (lib/memory/trace.py step_optimizer): no list-sized
temporaries.
A CPU-only torch builds CUDA parameters as fake tensors, which the optimizer's own device checks accept."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lib import config as kc
from lib import step
from lib.memory.trace import step_optimizer


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    base = kc.make_defconfig("lenet5", out=tmp_path_factory.mktemp("c") / ".config")
    return {name: kc.derive(base, {f"OPTIMIZER_{name.upper()}": True}) for name in ("adamw", "adam", "sgd")}


def model_on(device: str) -> torch.nn.Module:
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.empty(8, 4, device=device))
    model.bias = torch.nn.Parameter(torch.empty(8, device=device))
    return model


def implementation(optimizer: torch.optim.Optimizer) -> str:
    group = optimizer.param_groups[0]
    return "fused" if group.get("fused") else "foreach" if group.get("foreach") else "default"


@pytest.mark.parametrize("name", ["adamw", "adam"])
def test_adam_and_adamw_are_fused_when_every_parameter_is_on_cuda_or_the_cpu(configs, name):
    with FakeTensorMode():
        optimizer = step.make_optimizer(configs[name], model_on("cuda"))
    assert implementation(optimizer) == "fused" and optimizer._step_supports_amp_scaling  # GradScaler reads nothing
    assert implementation(step.make_optimizer(configs[name], model_on("cpu"))) == "fused"


def test_the_fused_cpu_step_matches_torchs_default(configs):
    """The same AdamW update as the per-parameter loop the CPU ran before, to float rounding."""
    torch.manual_seed(0)
    fused, default = model_on("cpu"), model_on("cpu")
    for module in (fused, default):
        torch.manual_seed(0)
        for p in module.parameters():
            torch.nn.init.normal_(p)
    optimizers = [step.make_optimizer(configs["adamw"], fused), torch.optim.AdamW(
        [{"params": [default.weight], "weight_decay": configs["adamw"].weight_decay},
         {"params": [default.bias], "weight_decay": 0.0}], lr=configs["adamw"].learning_rate)]
    assert implementation(optimizers[0]) == "fused" and implementation(optimizers[1]) == "default"
    for _ in range(3):
        grads = [torch.randn_like(p) for p in fused.parameters()]
        for module, optimizer in zip((fused, default), optimizers):
            for p, g in zip(module.parameters(), grads):
                p.grad = g.clone()
            optimizer.step()
    for a, b in zip(fused.parameters(), default.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_sgd_and_a_model_across_devices_keep_torchs_default(configs):
    with FakeTensorMode():
        assert implementation(step.make_optimizer(configs["sgd"], model_on("cuda"))) == "default"
        mixed = model_on("cuda")
        mixed.extra = torch.nn.Parameter(torch.empty(3))  # one on the CPU: fused would refuse the list
        assert implementation(step.make_optimizer(configs["adamw"], mixed)) == "default"


def test_a_torch_without_fused_cuda_kernels_keeps_the_default(configs, monkeypatch):
    monkeypatch.setattr(step, "_fused_devices", lambda: ["cpu"])
    assert not step.fused_on(configs["adamw"], "cuda")
    with FakeTensorMode():
        assert implementation(step.make_optimizer(configs["adamw"], model_on("cuda"))) == "default"


def test_the_tracer_steps_the_implementation_the_trainer_runs(configs):
    model = model_on("cpu")  # the tracer's fake model lives on the CPU whatever the target
    assert implementation(step_optimizer(configs["adamw"], model, "cuda")) == "fused"
    assert implementation(step_optimizer(configs["sgd"], model, "cuda")) == "foreach"
    assert implementation(step_optimizer(configs["adamw"], model, "cpu")) == "fused"
    assert implementation(step_optimizer(configs["sgd"], model, "cpu")) == "default"


def test_fused_adamw_traces_no_temporaries_where_foreach_traced_a_list(configs):
    """Under fake tensors, during the optimizer step: fused holds the two states and the step counters; foreach
    adds a parameter-sized list of temporaries."""
    from torch.distributed._tools.mem_tracker import MemTracker

    steps = {}
    for fused in (True, False):
        with FakeTensorMode():
            model = torch.nn.Linear(256, 256)
            optimizer = step_optimizer(configs["adamw"], model, "cuda")
            for group in optimizer.param_groups:
                group["fused"], group["foreach"] = fused, not fused
            model(torch.randn(8, 256)).sum().backward()
            optimizer.step()  # the states exist; the next step is the one measured
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
            with tracker:
                optimizer.step()
            snapshot = next(iter(tracker.get_tracker_snapshot("peak").values()))
            steps[fused] = {str(k).split(".")[-1]: v for k, v in snapshot.items()}
    params = 256 * 256 * 4 + 256 * 4
    assert steps[True]["OPT"] == 2 * params + 2 * 4 and steps[True]["TEMP"] == 0  # exp_avg, exp_avg_sq, steps
    assert steps[False]["OPT"] - steps[True]["OPT"] >= 256 * 256 * 4, steps  # foreach's list of temporaries
