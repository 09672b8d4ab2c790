"""Token streams: the standard library's pydoc topics, or a local corpus directory."""

import json
from pathlib import Path

import numpy as np
import torch

from .files import data_directory
from .info import TokenStreams
from ..errors import DataError

VAL_FRACTION = 0.1
BYTE_VOCAB = 256
GPT2_VOCAB = 50257  # what nanoGPT's prepare scripts emit when meta.json is absent
SAMPLE_TOKENS = 1 << 20  # ids checked per .bin file: a strided sample keeps huge corpora quick
HOLDING = ("either train.bin and val.bin (uint16 tokens, nanoGPT format, optional meta.json "
           "with vocab_size) or one or more *.txt files")


def split_tail(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The last VAL_FRACTION of the stream is validation, so the two never overlap."""
    cut = len(tokens) - int(len(tokens) * VAL_FRACTION)
    return tokens[:cut], tokens[cut:]


def byte_tokens(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def embedded_text() -> TokenStreams:
    import pydoc_data.topics as module

    text = "".join(module.topics[key] for key in sorted(module.topics))
    train, val = split_tail(byte_tokens(text.encode("utf-8")))
    return TokenStreams(train, val, BYTE_VOCAB, module.__file__,
                        "Python pydoc topics (standard library), byte-level")


def read_vocab_size(directory: Path) -> int:
    path = directory / "meta.json"
    if not path.exists():
        return GPT2_VOCAB
    try:
        vocab = json.loads(path.read_text())["vocab_size"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path} is not JSON with a vocab_size entry ({e}): write "
                        f'{{"vocab_size": N}} or delete it to use {GPT2_VOCAB}') from e
    # bool is an int in Python: true would read as a vocabulary of 1
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 0 < vocab <= 1 << 16:
        raise DataError(f"{path} gives vocab_size {json.dumps(vocab)}: uint16 tokens need an integer "
                        f"in 1..65536: write {{\"vocab_size\": N}}")
    return vocab


def read_bin(path: Path, vocab: int) -> torch.Tensor:
    if not path.is_file():
        raise DataError(f"{path} not found: a nanoGPT corpus needs both train.bin and val.bin")
    size = path.stat().st_size
    if size == 0 or size % 2:
        raise DataError(f"{path} is {size} bytes: uint16 tokens need a non-zero even size; "
                        f"regenerate it with the corpus's prepare script")
    tokens = np.fromfile(path, dtype="<u2")
    top = int(tokens[:: max(1, len(tokens) // SAMPLE_TOKENS)].max())
    if top >= vocab:
        raise DataError(f"{path} holds token id {top}, not below vocab_size {vocab}: put the "
                        f"right vocab_size in {path.parent / 'meta.json'}")
    # torch has no general uint16 arithmetic; int32 keeps every id exact.
    return torch.from_numpy(tokens.astype(np.int32))


def read_txt(directory: Path, files: list[Path]) -> bytes:
    chunks = []
    for path in files:
        data = path.read_bytes()
        if not data:
            raise DataError(f"text file {path} is empty: add text to it or remove it from "
                            f"{directory}")
        chunks.append(data)
    return b"".join(chunks)


def corpus_text(data_dir: str) -> TokenStreams:
    directory = data_directory(data_dir, HOLDING)
    if (directory / "train.bin").exists() or (directory / "val.bin").exists():
        vocab = read_vocab_size(directory)
        return TokenStreams(read_bin(directory / "train.bin", vocab),
                            read_bin(directory / "val.bin", vocab), vocab, str(directory),
                            f"token corpus {directory} (train.bin / val.bin)")
    files = sorted(p for p in directory.glob("*.txt") if p.is_file())
    if not files:
        raise DataError(f"data directory {directory} has no usable files: it needs {HOLDING}")
    train, val = split_tail(byte_tokens(read_txt(directory, files)))
    return TokenStreams(train, val, BYTE_VOCAB, str(directory),
                        f"text corpus {directory} ({len(files)} .txt files), byte-level")
