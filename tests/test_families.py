"""A model family kept in one file (lib/models/families/): a test adds a toy causal language model as one file,
and kfit configures, plans, trains, samples and caches it with nothing written anywhere else."""

from __future__ import annotations

import json
import sys

import pytest

from lib import api, resources
from lib import config as kc
from lib.config.kconfig import new_kconfig
from lib.env import cache_dir
from lib.errors import ConfigError
from lib.memory.cache import model_fingerprint
from lib.models import registry
from lib.models.registry import MODELS

# The whole family: its Kconfig entries (the model choice's member and its own options) and its ModelSpec.
TOY = '''"""A toy causal language model: each position mixes the mean of the embeddings up to it."""

from ..registry import ModelSpec, vocabulary

KCONFIG = """
choice MODEL
config MODEL_TOY
\tbool "Toy causal language model (a family in one file)"
endchoice

if MODEL_TOY

config TOY_WIDTH
\tint "Toy model width"
\trange 8 1024
\tdefault 32

config TOY_BLOCK_SIZE
\tint "Toy model context (tokens)"
\trange 8 4096
\tdefault 64

endif
"""


def _build(vocab_size=256, block_size=64, width=32, **_):
    import torch

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab_size, width)
            self.position = torch.nn.Embedding(block_size, width)
            self.mix = torch.nn.Linear(width, width)
            self.head = torch.nn.Linear(width, vocab_size)

        def forward(self, idx):
            steps = torch.arange(idx.shape[1], device=idx.device)
            x = self.embed(idx) + self.position(steps)
            x = torch.cumsum(x, dim=1) / (steps + 1)[:, None]
            return self.head(torch.relu(self.mix(x)))

    return Toy()


def _from_weights(config, weights):
    vocab, block = weights["embed.weight"].shape[0], weights["position.weight"].shape[0]
    return _build(vocab, block, weights["mix.weight"].shape[0]), vocab, block


FAMILY = ModelSpec(
    "toy", "text", supports_checkpointing=False, tier_scale=1.0, builder=_build,
    build_args=lambda config, info: dict(vocab_size=vocabulary(config, info), block_size=info.block_size,
                                         width=config.options.toy_width),
    block_size=lambda config: config.options.toy_block_size,
    shape_key=lambda config: dict(width=config.options.toy_width, block_size=config.options.toy_block_size),
    from_weights=_from_weights, title="Toy")
'''


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The toy family's file in a folder of families of its own, and kfit finding it there."""
    folder = tmp_path / "families"
    folder.mkdir()
    (folder / "toy.py").write_text(TOY)
    monkeypatch.setattr(resources, "FAMILY_DIRS", [*resources.FAMILY_DIRS, folder])
    module = f"{registry.__package__}.families.toy"
    try:
        for name, spec in registry.families().items():
            monkeypatch.setitem(MODELS, name, spec)
        yield MODELS["toy"]
    finally:
        sys.modules.pop(module, None)


def _toy(tmp_path, **overrides):
    return api.load_config("lenet5", {"MODEL_TOY": True, "MAX_STEPS": 6, "EPOCHS": 1000, "EVAL_INTERVAL": 3,
                                      "LOG_INTERVAL": 3, "MONITOR": False, "PROBE_NEVER": True,
                                      "OUTPUT_DIR": str(tmp_path / "runs"), **overrides})


def test_a_family_in_one_file_is_configured_from_its_own_kconfig_entries(toy_family, tmp_path):
    config = _toy(tmp_path, TOY_WIDTH=48)
    assert config.model == "toy" and config.options.toy_width == 48 and config.options.toy_block_size == 64
    assert "MODEL_TOY" in new_kconfig().syms and config.options.model == "toy"
    # strict as every option: a value out of the family's own range is an error naming it
    with pytest.raises(ConfigError, match="TOY_WIDTH"):
        _toy(tmp_path, TOY_WIDTH=4)


def test_a_family_in_one_file_has_its_own_cache_key(toy_family, tmp_path):
    """Its shape_key is its part of every trace and probe cache key: no two families' configs share one."""
    toy, wider = _toy(tmp_path), _toy(tmp_path, TOY_WIDTH=64)
    assert registry.shape_key(toy)["model"] == "toy"
    keys = [model_fingerprint(c) for c in (toy, wider, api.load_config("gpt2-tiny"))]
    assert len({repr(sorted(k.items())) for k in keys}) == 3, keys


def test_a_family_in_one_file_plans_trains_and_samples(toy_family, tmp_path):
    from lib.sample import sample

    config = _toy(tmp_path)
    plan = api.resolve_plan(config, gpu="cpu")
    assert plan.model == "toy" and plan.micro_batch >= 1 and plan.predicted_peak_bytes > 0
    # its traces were cached under its own key
    keys = [json.loads(path.read_text()).get("key") for path in (cache_dir() / "memory").glob("*.json")]
    assert any('"toy"' in json.dumps(key) for key in keys), keys
    lines: list[str] = []
    result = api.train(config, log=lines.append)
    assert result.steps == 6 and result.final_eval["eval_loss"] < 10, lines
    text, about = sample(result.run_dir, "Hello", max_tokens=8, temperature=0, log=lines.append)
    assert about["model"] == "toy" and about["vocab_size"] == 256 and about["block_size"] == 64
    assert isinstance(text, str) and len(text.encode("utf-8", "surrogateescape")) >= 1


def test_a_family_file_declares_its_spec_by_its_name(tmp_path, monkeypatch):
    folder = tmp_path / "families"
    folder.mkdir()
    (folder / "oddity.py").write_text(TOY)  # FAMILY is named "toy", not "oddity"
    monkeypatch.setattr(resources, "FAMILY_DIRS", [folder])
    try:
        with pytest.raises(ConfigError, match="oddity.py: a model family's file declares FAMILY"):
            registry.families()
    finally:
        sys.modules.pop(f"{registry.__package__}.families.oddity", None)
