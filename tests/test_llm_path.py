"""The LLM path end to end, through make as a user runs it: make data on a directory of text files, a Llama
defconfig on the CPU with the fragment make data wrote, make train keeping the corpus's tokenizer, make sample
and make export decoding with the run's copy even after the corpus was tokenized again."""

import hashlib
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
    # it ends with the line that trains on what it wrote, through the fragment it wrote beside the data
    assert out.splitlines()[-1] == "  make llama-tiny-defconfig FRAGMENTS=data/texts/fragment && make train"
    meta = json.loads((tmp_path / "data" / "texts" / "meta.json").read_text())
    assert meta["vocab_size"] == 512 and meta["documents"] == 4

    # the documented path, literally: cpu-smoke and make data's fragment (and a shorter context and run)
    (tmp_path / "short").write_text("CONFIG_LLAMA_BLOCK_SIZE=64\nCONFIG_MAX_STEPS=2\n")
    make(tmp_path, "llama-tiny-defconfig", f"FRAGMENTS=cpu-smoke data/texts/fragment {tmp_path / 'short'}")
    trained = make(tmp_path, "train").stdout
    assert "Done: 2 steps" in trained
    run = next((tmp_path / "runs" / "smoke").glob("llama-*"))

    # the run keeps its tokenizer, with its sha256 in sha256sum's format
    tokenizer = (tmp_path / "data" / "texts" / "tokenizer.json").read_bytes()
    assert (run / "tokenizer.json").read_bytes() == tokenizer
    digest = hashlib.sha256(tokenizer).hexdigest()
    assert (run / "tokenizer.sha256").read_text() == f"{digest}  tokenizer.json\n"
    # the corpus tokenized again with the same VOCAB (two ids swapped): the run still decodes with its own
    retokenized = json.loads(tokenizer)
    vocab = retokenized["model"]["vocab"]
    a, b = "d", "e"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "data" / "texts" / "tokenizer.json").write_text(json.dumps(retokenized))

    sampled = make(tmp_path, "sample", f"RUN={run}", "PROMPT=def ", "MAX_TOKENS=12", "SEED=1")
    assert f"tokenizer {run / 'tokenizer.json'}," in sampled.stderr  # the run's copy, not the corpus's
    assert "warning" not in sampled.stderr
    text = sampled.stdout.rstrip("\n")
    assert text.startswith("def ") and len(text) > len("def ")
    assert sampled.stderr.startswith("# llama tiny")  # the run's own model, not gpt2's label

    # the export carries the run's tokenizer: a model.safetensors decodes on its own, with the data moved away
    make(tmp_path, "export", f"RUN={run}", f"OUT={tmp_path / 'exported'}")
    assert (tmp_path / "exported" / "tokenizer.json").read_bytes() == tokenizer
    assert (tmp_path / "exported" / "tokenizer.sha256").read_text() == f"{digest}  tokenizer.json\n"

    # without the run's copy, the corpus's differs from the sha256 the run recorded: refused, never decoded
    from lib.errors import KfitError
    from lib.sample import tokenizer_for

    (run / "tokenizer.json").rename(tmp_path / "kept.json")
    with pytest.raises(KfitError, match="not the tokenizer this run trained with"):
        tokenizer_for(512, (run,), tmp_path / "data" / "texts")
    (run / "tokenizer.sha256").unlink()  # a run that kept neither: the corpus's, with one warning line
    warned = []
    assert tokenizer_for(512, (run,), tmp_path / "data" / "texts", warned.append).name.startswith("tokenizer ")
    assert len(warned) == 1 and warned[0].startswith("warning: decoding with ")

    (tmp_path / "data").rename(tmp_path / "moved")
    again = make(tmp_path, "sample", f"RUN={tmp_path / 'exported' / 'model.safetensors'}", "PROMPT=def ",
                 "MAX_TOKENS=12", "SEED=1")
    assert again.stdout == sampled.stdout


def test_help_says_sample_serves_both_language_models(tmp_path: Path):
    [line] = [line for line in make(tmp_path, "help").stdout.splitlines() if line.startswith("  sample ")]
    assert "GPT-2 or Llama" in line


def test_run_keeps_its_corpus_tokenizer_and_never_writes_through_a_link(tmp_path: Path):
    from types import SimpleNamespace

    from lib.fileio import UnsafeFileError
    from lib.trainer.rundir import keep_tokenizer

    data, run = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    run.mkdir()
    (data / "train.bin").write_bytes(b"\0\0")
    (data / "tokenizer.json").write_text('{"v": 1}')
    config = SimpleNamespace(dataset="dir", data_dir=str(data))
    lines = []
    first = keep_tokenizer(run, config, lines.append)
    assert (run / "tokenizer.json").read_text() == '{"v": 1}' and first == hashlib.sha256(b'{"v": 1}').hexdigest()
    assert keep_tokenizer(run, config, lines.append) == first and not lines  # resumed: nothing to say
    (data / "tokenizer.json").write_text('{"v": 2}')  # tokenized again before a resume: said, and kept from then
    second = keep_tokenizer(run, config, lines.append)
    assert len(lines) == 1 and "not the tokenizer this run started with" in lines[0]
    assert (run / "tokenizer.sha256").read_text().split()[0] == second != first
    # a link planted in the run directory is refused, its target left alone
    (run / "tokenizer.json").unlink()
    (tmp_path / "elsewhere").write_text("theirs")
    (run / "tokenizer.json").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeFileError):
        keep_tokenizer(run, config, lines.append)
    assert (tmp_path / "elsewhere").read_text() == "theirs"
    # data without a tokenizer (bytes, the embedded text): nothing kept
    assert keep_tokenizer(tmp_path / "other", SimpleNamespace(dataset="embedded", data_dir=None)) is None
