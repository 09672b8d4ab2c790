"""Model zoo: shapes, parameter counts, GPT-2 invariants, checkpointing and trainability."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from lib.models import GPT2_PRESETS, MODEL_NAMES, build_model, count_parameters

IMAGE_MODELS = ("lenet5", "resnet18", "resnet50")


def tiny_gpt2(**kwargs) -> nn.Module:
    return build_model("gpt2", gpt2_preset="tiny", vocab_size=256, block_size=32, **kwargs)


def meta_count(name: str, **kwargs) -> int:
    # The meta device builds shapes only: instant, and nothing is allocated.
    with torch.device("meta"):
        return count_parameters(build_model(name, **kwargs))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.mark.parametrize("in_channels", [1, 3])
@pytest.mark.parametrize("image_size", [28, 32, 224])
@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_image_model_output_shape(name: str, image_size: int, in_channels: int) -> None:
    model = build_model(name, num_classes=7, in_channels=in_channels, image_size=image_size).eval()
    batch = 2 if image_size == 224 else 4
    with torch.no_grad():
        logits = model(torch.randn(batch, in_channels, image_size, image_size))
    assert logits.shape == (batch, 7)


def test_gpt2_tiny_logits_shape() -> None:
    model = tiny_gpt2().eval()
    with torch.no_grad():
        logits = model(torch.randint(0, 256, (3, 32)))
    assert logits.shape == (3, 32, 256)
    assert logits.dtype == torch.float32


@pytest.mark.parametrize(("name", "kwargs", "expected"), [
    ("lenet5", dict(image_size=32), 61_706),
    ("lenet5", dict(image_size=28), 61_706),
    ("resnet18", dict(num_classes=1000, in_channels=3, image_size=224), 11_689_512),
    ("resnet50", dict(num_classes=1000, in_channels=3, image_size=224), 25_557_032),
    ("resnet18", dict(num_classes=10, in_channels=3, image_size=32), 11_173_962),
    ("gpt2", dict(gpt2_preset="124m"), 124_439_808),
])
def test_exact_parameter_counts(name: str, kwargs: dict, expected: int) -> None:
    assert meta_count(name, **kwargs) == expected


@pytest.mark.parametrize(("preset", "expected"), [
    ("355m", 354.8e6),
    ("774m", 774e6),
    ("1558m", 1.557e9),
])
def test_gpt2_large_preset_parameter_counts(preset: str, expected: float) -> None:
    count = meta_count("gpt2", gpt2_preset=preset, vocab_size=50257, block_size=1024)
    assert abs(count - expected) / expected < 0.005


def test_gpt2_weight_tying() -> None:
    model = tiny_gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    untied = sum(p.numel() for p in model.state_dict().values()) - model.lm_head.weight.numel()
    assert count_parameters(model) == untied


def test_gpt2_preset_fixes_shape_but_not_context() -> None:
    model = build_model("gpt2", gpt2_preset="tiny", block_size=64, vocab_size=100, dropout=0.1)
    assert (model.config.n_layer, model.config.n_head, model.config.n_embd) == (4, 4, 128)
    assert (model.config.block_size, model.config.vocab_size, model.config.dropout) == (64, 100, 0.1)
    assert GPT2_PRESETS["tiny"].block_size == 1024  # the preset itself is untouched


def test_gpt2_is_causal() -> None:
    model = tiny_gpt2().eval()
    idx = torch.randint(0, 256, (2, 32))
    changed = idx.clone()
    changed[:, 20] = (idx[:, 20] + 1) % 256
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def _loss_and_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(1)  # same dropout masks for both runs
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, -2), y.flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_checkpointing_is_exact(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    ckpt = copy.deepcopy(model)
    ckpt.grad_checkpointing = True
    loss, grads = _loss_and_grads(model.train(), x, y)
    loss_ckpt, grads_ckpt = _loss_and_grads(ckpt.train(), x, y)
    torch.testing.assert_close(loss_ckpt, loss)
    assert grads.keys() == grads_ckpt.keys()
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], msg=name)


def test_resnet18_checkpointing_matches() -> None:
    model = build_model("resnet18", num_classes=5, in_channels=3, image_size=16)
    # Undo the zero-init of the last BN gammas, which would leave most branch grads at zero.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
    _assert_checkpointing_is_exact(model, torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,)))


def test_gpt2_checkpointing_matches_with_dropout() -> None:
    model = tiny_gpt2(dropout=0.1)
    idx = torch.randint(0, 256, (2, 32))
    _assert_checkpointing_is_exact(model, idx, torch.roll(idx, -1, dims=1))


def test_eval_output_unchanged_by_checkpointing_flag() -> None:
    model = tiny_gpt2().eval()
    idx = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        expected = model(idx)
        model.grad_checkpointing = True
        torch.testing.assert_close(model(idx), expected)


def test_unknown_model_name() -> None:
    with pytest.raises(ValueError, match="unknown model 'vgg16'") as err:
        build_model("vgg16")
    assert all(name in str(err.value) for name in MODEL_NAMES)


def test_unknown_gpt2_preset() -> None:
    with pytest.raises(ValueError, match="unknown gpt2 preset '7b'") as err:
        build_model("gpt2", gpt2_preset="7b")
    assert all(preset in str(err.value) for preset in GPT2_PRESETS)


def test_gpt2_rejects_sequence_longer_than_block_size() -> None:
    model = tiny_gpt2()
    with pytest.raises(ValueError, match="sequence length 33 exceeds block_size 32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_lenet_rejects_small_images() -> None:
    with pytest.raises(ValueError, match="image_size >= 28, got 27"):
        build_model("lenet5", image_size=27)


def _sgd_losses(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x).flatten(0, -2), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_lenet5_sgd_reduces_loss() -> None:
    model = build_model("lenet5", image_size=28).train()
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    losses = _sgd_losses(model, x, y, lr=0.1, steps=20)
    assert losses[-1] < 0.9 * losses[0]


def test_gpt2_tiny_sgd_reduces_loss() -> None:
    model = tiny_gpt2().train()
    idx = torch.randint(0, 256, (4, 32))
    losses = _sgd_losses(model, idx, torch.roll(idx, -1, dims=1), lr=0.1, steps=15)
    assert losses[-1] < 0.9 * losses[0]


# --------------------------------------------------------------------------
# CONFIG_DROPOUT: an image model's dropout before its classifier's last Linear layer

LENET5_KEYS = [f"{part}.{i}.{kind}" for part, layers in (("features", (0, 3)), ("classifier", (1, 3, 5)))
               for i in layers for kind in ("weight", "bias")]


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_image_dropout_keeps_the_state_dict_keys(name: str) -> None:
    with torch.device("meta"):
        plain, dropped = build_model(name, in_channels=3), build_model(name, in_channels=3, dropout=0.3)
    # at 0 the model is the one it always was: no Dropout module, the same keys; at any rate the same keys
    assert not any(isinstance(m, nn.Dropout) for m in plain.modules())
    assert [m.p for m in dropped.modules() if isinstance(m, nn.Dropout)] == [0.3]
    assert list(plain.state_dict()) == list(dropped.state_dict())
    if name == "lenet5":
        assert list(plain.state_dict()) == LENET5_KEYS
    else:
        assert list(plain.state_dict())[-2:] == ["fc.weight", "fc.bias"]
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1"):
        build_model(name, dropout=1.0)


def test_lenet5_dropout_is_active_in_training_and_off_in_evaluation() -> None:
    model = build_model("lenet5", image_size=28, dropout=0.5)
    plain = build_model("lenet5", image_size=28)
    plain.load_state_dict(model.state_dict())
    seen = []
    model.dropout.register_forward_hook(lambda module, inputs, output: seen.append((inputs[0], output)))
    x = torch.randn(64, 1, 28, 28)
    with torch.no_grad():
        model.train()
        first, second = model(x), model(x)
        assert not torch.equal(first, second)  # a fresh mask each pass
        before, after = seen[0]
        assert before.shape == (64, 84)  # the input of the last Linear (120 -> 84 -> classes)
        zeroed = ((after == 0) & (before != 0)).sum() / (before != 0).sum()
        assert 0.4 < zeroed < 0.6
        kept = after != 0
        assert torch.allclose(after[kept], 2 * before[kept])  # the rest scaled by 1 / (1 - p)
        model.eval()
        plain.eval()
        assert torch.equal(model(x), model(x)) and torch.equal(model(x), plain(x))
        assert torch.equal(*seen[-1])


def test_the_dropout_symbol_is_the_image_models_and_reaches_the_model(tmp_path) -> None:
    from lib import config as kc
    from lib.errors import ConfigError
    from lib.memory import model_fingerprint
    from lib.models.registry import MODELS
    from lib.task import load_task

    lenet = kc.defconfig_config("lenet5")
    assert lenet.dropout == 0.0  # the default: no Dropout module, every existing run unchanged
    for name, spec in MODELS.items():
        if spec.builder is None:
            continue
        symbol = kc.derive(lenet, {f"MODEL_{name.upper()}": True})
        assert (symbol.dropout is not None) == (spec.data == "images"), name
    with pytest.raises(ConfigError, match="CONFIG_DROPOUT.*depends on MODEL_LENET5"):
        kc.derive(kc.defconfig_config("gpt2-tiny"), {"DROPOUT": "0.2"})
    for bad, needle in (("1", r"is out of range: it must be in \[0, 1\)"), ("x", "is not a number")):
        with pytest.raises(ConfigError, match=f'CONFIG_DROPOUT="{bad}" {needle}'):
            kc.derive(lenet, {"DROPOUT": bad})
    dropped = kc.derive(lenet, {"DROPOUT": "0.25"})
    assert load_task(dropped).build(False).dropout.p == 0.25
    # its masks are saved for backward, so a memory trace at 0 is not reused; at 0 the trace key is as it was
    assert "dropout" not in model_fingerprint(lenet) and model_fingerprint(dropped)["dropout"] is True


# --------------------------------------------------------------------------
# Custom models through the command line (issue 16, defect 7): one error line, never the planner's
# fake-tensor logs or a traceback


# plan's rows (every case) are in tests/test_bad_input.py, in-process; here the other commands, as processes
@pytest.mark.parametrize("case, command", [("shapes", "train"), ("vector-loss", "find-lr")])
def test_custom_model_mistakes_are_one_error_line_in_every_command(case, command, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from lib import config as kc
    from tests.helpers import MISTAKES

    if case == "builtin":
        factory, needles = "os:getcwd", ("built into Python",)
    else:
        module = f"kfit_mistake_{case.replace('-', '_')}"
        (tmp_path / f"{module}.py").write_text(MISTAKES[case][0])
        factory, needles = f"{module}:{MISTAKES[case][1]}", MISTAKES[case][2]
    (tmp_path / "mine").write_text(f'CONFIG_MODEL_CUSTOM=y\nCONFIG_CUSTOM_MODEL_FACTORY="{factory}"\n'
                                   "CONFIG_CUSTOM_TRAIN_SAMPLES=96\nCONFIG_CUSTOM_EVAL_SAMPLES=32\n")
    kc.make_defconfig(str(tmp_path / "mine"), out=tmp_path / ".config")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "GPUS", "HW", "GPU", "NNODES", "RESUME")}
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, str(root / "scripts" / "kfit.py"), command], cwd=tmp_path,
                            env={**env, "KCONFIG_CONFIG": ".config"}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "fake_tensor" not in result.stderr, result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.strip()]
    assert line.startswith(f'error: CONFIG_CUSTOM_MODEL_FACTORY="{factory}": '), line
    for needle in needles:
        assert needle in line, line
    assert not (tmp_path / "runs").exists()


def test_llama_checkpointed_blocks_recompute_whether_or_not_their_inputs_were_cast() -> None:
    """FSDP2's bf16 policy casts a block's float inputs (the rotary tables too) before forward; torch 2.11 skips
    that hook when backward recomputes a checkpointed block, and the recompute then saved float32 tables where
    forward saved bf16 ones (CheckpointError, seen tracing Llama for an H200). A hook that casts in forward only
    stands in for that FSDP here: the block must give the same saved dtypes either way."""
    torch.manual_seed(0)
    model = build_model("llama", llama_preset="tiny", block_size=16, vocab_size=64, grad_checkpointing=True)
    model.to(torch.bfloat16).train()

    def cast_in_forward_only(module, args):
        if torch._C._current_graph_task_id() != -1:  # inside backward: a recompute, as torch 2.11's FSDP2 skips
            return None
        return tuple(a.to(torch.bfloat16) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    for block in model.layers:
        block.register_forward_pre_hook(cast_in_forward_only)
    idx = torch.randint(0, 64, (2, 16))
    model(idx).float().logsumexp(-1).sum().backward()  # raised CheckpointError before the block cast its tables
    assert all(p.grad is not None for p in model.parameters())


def test_a_gpt2_of_a_custom_size_is_built_and_trained_at_its_dimensions(tmp_path):
    """CONFIG_GPT2_PRESET_CUSTOM: GPT2_LAYERS, GPT2_HEADS and GPT2_WIDTH, read from the tree (config.options)."""
    from lib import api
    from lib.models.registry import gpt2_shape, shape_key

    config = api.load_config("gpt2-tiny", {"GPT2_PRESET_CUSTOM": True, "GPT2_LAYERS": 3, "GPT2_HEADS": 2,
                                           "GPT2_WIDTH": 64, "MAX_STEPS": 2, "EPOCHS": 100, "MONITOR": False,
                                           "PROBE_NEVER": True, "HYPER_PARAM_MANUAL": True, "BATCH_SIZE": 4,
                                           "GRADIENT_ACCUMULATION": 1})
    assert (gpt2_shape(config).n_layer, gpt2_shape(config).n_head, gpt2_shape(config).n_embd) == (3, 2, 64)
    assert shape_key(config)["dims"] == [3, 2, 64]
    lines: list[str] = []
    result = api.train(config, output_dir=tmp_path, log=lines.append)
    assert result.steps == 2
    from lib.sample import load_run_model

    model, about = load_run_model(result.run_dir)  # rebuilt from the run's config at its own size
    assert len(model.transformer.h) == 3 and model.transformer.wte.weight.shape[1] == 64, lines
    assert about["preset"] == "custom"
