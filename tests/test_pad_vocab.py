"""CONFIG_PAD_VOCAB: a text model's embedding and output layer get a multiple of 64 rows; the loss, the memory
and step-time predictions see the padded model, and sampling decodes with the vocabulary's own tokenizer and
never picks a padded row."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lib import config as kc
from lib.memory import model_fingerprint
from lib.models.registry import vocab_rows
from lib.sample import generate, tokenizer_for
from lib.task import load_task


def corpus(directory: Path, vocab: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, count in (("train.bin", 4096), ("val.bin", 1024)):
        (directory / name).write_bytes(rng.integers(0, vocab, count, dtype=np.uint16).tobytes())
    (directory / "meta.json").write_text(json.dumps({"vocab_size": vocab, "dtype": "uint16"}))
    return directory


def gpt2_tiny(tmp_path: Path, vocab: int, **assignments) -> kc.Config:
    config = kc.make_defconfig("gpt2-tiny", out=tmp_path / f"{vocab}-{len(assignments)}.config")
    return kc.derive(config, {"DATASET_DIR": True, "DATA_DIR": str(corpus(tmp_path / f"c{vocab}", vocab)),
                              "GPT2_BLOCK_SIZE": 32, **assignments})


def test_rows_round_up_to_64_only_when_asked():
    assert [vocab_rows(v, True) for v in (50257, 256, 300, 64, 1)] == [50304, 256, 320, 64, 64]
    assert vocab_rows(50257, False) == vocab_rows(50257, None) == 50257


def test_the_model_is_padded_by_default_and_trains_on_its_real_ids(tmp_path):
    config = gpt2_tiny(tmp_path, 300)
    assert config.pad_vocab is True
    task = load_task(config)
    model = task.build(False)
    assert model.transformer.wte.weight.shape[0] == 320 and model.lm_head.weight.shape[0] == 320
    x, y = task.example_batch(2)
    loss = task.loss(model(x), y)
    loss.backward()
    assert torch.isfinite(loss) and int(y.max()) < 300

    plain = gpt2_tiny(tmp_path, 300, PAD_VOCAB=False)
    assert load_task(plain).build(False).transformer.wte.weight.shape[0] == 300
    # a padded model is another model to trace and count; the embedded text's 256 bytes are padded alike
    assert model_fingerprint(config) != model_fingerprint(plain)
    embedded = kc.make_defconfig("gpt2-tiny", out=tmp_path / "embedded.config")
    assert embedded.pad_vocab is True and "pad_vocab" not in model_fingerprint(embedded)


def test_image_models_have_no_vocabulary_to_pad(tmp_path):
    assert kc.make_defconfig("lenet5", out=tmp_path / ".config").pad_vocab is None


def test_a_padded_model_samples_with_the_vocabularys_tokenizer_and_never_a_padded_row(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(300)}, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    run = tmp_path / "run"
    run.mkdir()
    tok.save(str(run / "tokenizer.json"))
    found = tokenizer_for(320, (run,))  # the model's 320 rows: this tokenizer's 300, padded
    assert found.vocab_size == 300 and found.name.startswith("tokenizer ")
    assert tokenizer_for(256).vocab_size == 256

    class PaddedRowsWin(torch.nn.Module):  # the padded rows have the largest logits: they must still never come
        def forward(self, idx):
            logits = torch.zeros(*idx.shape, 320)
            logits[..., 300:] = 100.0
            logits[..., 7] = 1.0
            return logits

    g = torch.Generator().manual_seed(0)
    out = generate(PaddedRowsWin(), [0], max_tokens=20, temperature=1.0, top_k=None, block_size=4, generator=g,
                   device=torch.device("cpu"), vocab_size=found.vocab_size)
    assert max(out) < 300
    assert generate(PaddedRowsWin(), [0], max_tokens=3, temperature=0, top_k=None, block_size=4, generator=g,
                    device=torch.device("cpu"), vocab_size=300) == [7, 7, 7]


def test_gpt2s_own_tokenizer_decodes_its_padded_50304_rows():
    pytest.importorskip("tiktoken")
    tok = tokenizer_for(50304)
    assert tok.name == "tiktoken gpt2" and tok.vocab_size == 50257
