"""The LLM path end to end, through make as a user runs it: make data on a directory of text files, a Llama
defconfig on the CPU, make train, make sample decoding with the corpus's tokenizer."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = ROOT / "Makefile"
# what the Makefile or kfit would read from an enclosing environment (make's own included)
CLEARED = ("KCONFIG_CONFIG", "FRAGMENTS", "FORMAT", "HW", "GPU", "FREE_GB", "GPUS", "WORLD_SIZE", "RESUME", "OUT",
           "CORPUS", "TOKENIZER", "VOCAB", "RUN", "PROMPT", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
           "LOCAL_RANK", "RANK", "PYTHON", "VENV", "MAKEFLAGS", "MFLAGS", "GNUMAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES")

pytestmark = pytest.mark.slow


def make(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    result = subprocess.run(["make", "--no-print-directory", "-f", str(MAKEFILE), *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_data_train_sample(tmp_path: Path):
    import pydoc_data.topics as topics

    corpus = tmp_path / "texts"
    corpus.mkdir()
    keys = sorted(topics.topics)
    for i in range(4):
        (corpus / f"part{i}.txt").write_text("".join(topics.topics[k] for k in keys[i * 15:(i + 1) * 15]))
    out = make(tmp_path, "data", f"CORPUS={corpus}", "VOCAB=512").stdout
    assert "tokens/s" in out and 'CONFIG_DATA_DIR="data/texts"' in out
    meta = json.loads((tmp_path / "data" / "texts" / "meta.json").read_text())
    assert meta["vocab_size"] == 512 and meta["documents"] == 4

    (tmp_path / "corpus-fragment").write_text('CONFIG_DATASET_DIR=y\nCONFIG_DATA_DIR="data/texts"\n'
                                              'CONFIG_LLAMA_BLOCK_SIZE=64\nCONFIG_MAX_STEPS=2\n')
    make(tmp_path, "llama-tiny-defconfig", f"FRAGMENTS=cpu-smoke {tmp_path / 'corpus-fragment'}")
    trained = make(tmp_path, "train").stdout
    assert "Done: 2 steps" in trained
    run = next((tmp_path / "runs" / "smoke").glob("llama-*"))

    sampled = make(tmp_path, "sample", f"RUN={run}", "PROMPT=def ", "MAX_TOKENS=12", "SEED=1")
    assert "tokenizer data/texts/tokenizer.json" in sampled.stderr  # the corpus's tokenizer decoded it, not bytes
    text = sampled.stdout.rstrip("\n")
    assert text.startswith("def ") and len(text) > len("def ")
    assert sampled.stderr.startswith("# llama tiny")  # the run's own model, not gpt2's label

    # the export carries the tokenizer: a model.safetensors decodes on its own, with the data moved away
    make(tmp_path, "export", f"RUN={run}", f"OUT={tmp_path / 'exported'}")
    assert (tmp_path / "exported" / "tokenizer.json").read_bytes() == (tmp_path / "data" / "texts" /
                                                                      "tokenizer.json").read_bytes()
    (tmp_path / "data").rename(tmp_path / "moved")
    again = make(tmp_path, "sample", f"RUN={tmp_path / 'exported' / 'model.safetensors'}", "PROMPT=def ",
                 "MAX_TOKENS=12", "SEED=1")
    assert again.stdout == sampled.stdout
