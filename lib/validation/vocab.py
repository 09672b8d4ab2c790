"""GPT-2 124M with GPT-2's own 50,257-token vocabulary, for the checks that need the real model's size.

The gpt2 defconfig trains the embedded byte-level text (a vocabulary of 256, about 86M parameters); with
GPT-2's tokenizer the embedding and the tied output layer hold 50,257 x 768 weights more (124M in all),
and the step's logits and cross-entropy, (micro-batch x 1024 x 50,257) in bf16 and again in fp32, become
the largest activations of the step. Nothing is downloaded (a GPU machine may reach no network): the
corpus is random token ids in nanoGPT's format (train.bin, val.bin, meta.json), which kfit reads as it
reads a tokenized corpus (CONFIG_DATASET_DIR), so the planner, the trainer and the measured step all see
the vocabulary through the same path as a real run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .. import config as kconfig
from ..fileio import write_atomic, write_text
from ..data.text import GPT2_VOCAB
from ..models.registry import vocab_rows

MODEL = "gpt2-50k"  # the name the checks use for this model
PADDED_VOCAB = vocab_rows(GPT2_VOCAB, True)  # 50,304 (CONFIG_PAD_VOCAB): no unaligned dimension in the head
LABEL = "gpt2-124m-50k"  # ... and in their tables
TRAIN_TOKENS, VAL_TOKENS = 1 << 20, 1 << 16  # 1,023 and 63 windows of 1,024: enough for any micro-batch here


def write_corpus(directory: Path, *, train_tokens: int = TRAIN_TOKENS, val_tokens: int = VAL_TOKENS,
                 seed: int = 0) -> Path:
    """Random token ids below GPT2_VOCAB in `directory` (uint16, nanoGPT's format); kept when already there."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = directory / "meta.json"
    if not meta.exists():
        rng = np.random.default_rng(seed)
        for name, count in (("train.bin", train_tokens), ("val.bin", val_tokens)):
            write_atomic(directory / name, rng.integers(0, GPT2_VOCAB, count, dtype=np.uint16).tobytes())
        write_text(meta, json.dumps({"vocab_size": GPT2_VOCAB, "dtype": "uint16"}))  # last: the corpus is whole
    return directory


def corpus_assignments(workdir: Path, vocab_size: int = GPT2_VOCAB) -> dict:
    """The config assignments that train GPT-2 on the synthetic corpus under `workdir`, its model's head
    `vocab_size` rows: GPT2_VOCAB, as it is (CONFIG_PAD_VOCAB off: the head the checks have always measured),
    or PADDED_VOCAB (on)."""
    if vocab_size not in (GPT2_VOCAB, PADDED_VOCAB):
        raise ValueError(f"a head of {vocab_size} rows: the corpus's {GPT2_VOCAB} tokens, or {PADDED_VOCAB} padded")
    return {"DATASET_DIR": True, "DATA_DIR": str(write_corpus(workdir / "gpt2-vocab-corpus")),
            "PAD_VOCAB": vocab_size == PADDED_VOCAB}


def make_config(workdir: Path, name: str, assignments: dict | None = None, *, base: str = "gpt2",
                vocab_size: int = GPT2_VOCAB) -> kconfig.Config:
    """The `base` defconfig (gpt2: GPT-2 124M, context 1024) on GPT-2's vocabulary (its model's head
    `vocab_size` rows: PADDED_VOCAB pads it), with `assignments`."""
    config = kconfig.make_defconfig(base, out=workdir / f"{name}.config")
    return kconfig.derive(config, {**corpus_assignments(workdir, vocab_size), **(assignments or {})})
