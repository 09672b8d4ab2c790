"""Token streams: the standard library's pydoc topics, or a local corpus directory."""

import json
from pathlib import Path

import numpy as np
import torch

from .files import data_directory
from .info import TokenStreams
from .. import fileio
from ..errors import DataError

VAL_FRACTION = 0.1
BYTE_VOCAB = 256
GPT2_VOCAB = 50257  # what nanoGPT's prepare scripts emit when meta.json is absent
SAMPLE_TOKENS = 1 << 20  # ids checked per .bin file: a strided sample keeps huge corpora quick
HOLDING = ("either train.bin and val.bin (uint16 or uint32 tokens, nanoGPT format, optional meta.json "
           "with vocab_size and dtype: 'make data' writes them) or one or more *.txt files")


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


DTYPES = {"uint16": "<u2", "uint32": "<u4"}


def read_meta(directory: Path) -> tuple[int, str]:
    """(vocab_size, dtype) from meta.json (`make data` writes it; nanoGPT's has vocab_size only: uint16);
    GPT-2's vocabulary in uint16 without one."""
    path = directory / "meta.json"
    if not path.exists():
        return GPT2_VOCAB, "uint16"
    try:
        meta = json.loads(fileio.read_text(path))
        vocab, dtype = meta["vocab_size"], meta.get("dtype", "uint16")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise DataError(f"{path} is not JSON with a vocab_size entry ({e}): write "
                        f'{{"vocab_size": N}} or delete it to use {GPT2_VOCAB}') from e
    if dtype not in DTYPES:
        raise DataError(f"{path} gives dtype {json.dumps(dtype)}: token files are uint16 or uint32")
    top = 1 << (16 if dtype == "uint16" else 32)
    # bool is an int in Python: true would read as a vocabulary of 1
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 0 < vocab <= top:
        raise DataError(f"{path} gives vocab_size {json.dumps(vocab)}: {dtype} tokens need an integer "
                        f"in 1..{top}: write {{\"vocab_size\": N}}")
    return vocab, dtype


def read_bin(path: Path, vocab: int, dtype: str = "uint16") -> torch.Tensor:
    if not path.is_file():
        raise DataError(f"{path} not found: a nanoGPT corpus needs both train.bin and val.bin")
    size, width = path.stat().st_size, np.dtype(DTYPES[dtype]).itemsize
    if size == 0 or size % width:
        raise DataError(f"{path} is {size} bytes: {dtype} tokens need a non-zero size, "
                        f"{'even' if width == 2 else 'a multiple of 4'}; "
                        f"regenerate it ('make data', or the corpus's prepare script)")
    tokens = np.fromfile(path, dtype=DTYPES[dtype])
    top = int(tokens[:: max(1, len(tokens) // SAMPLE_TOKENS)].max())
    if top >= vocab:
        raise DataError(f"{path} holds token id {top}, not below vocab_size {vocab}: put the "
                        f"right vocab_size in {path.parent / 'meta.json'}")
    # torch has no general uint16 arithmetic; int32 keeps every id exact (int64 past int32's range).
    return torch.from_numpy(tokens.astype(np.int32 if vocab <= 1 << 31 else np.int64))


def read_txt(directory: Path, files: list[Path]) -> bytes:
    chunks = []
    for path in files:
        data = fileio.read_bytes(path)
        if not data:
            raise DataError(f"text file {path} is empty: add text to it or remove it from "
                            f"{directory}")
        chunks.append(data)
    return b"".join(chunks)


def corpus_text(data_dir: str) -> TokenStreams:
    directory = data_directory(data_dir, HOLDING)
    if (directory / "train.bin").exists() or (directory / "val.bin").exists():
        vocab, dtype = read_meta(directory)
        return TokenStreams(read_bin(directory / "train.bin", vocab, dtype),
                            read_bin(directory / "val.bin", vocab, dtype), vocab, str(directory),
                            f"token corpus {directory} (train.bin / val.bin, {dtype}, vocabulary {vocab:,})")
    files = sorted(p for p in directory.glob("*.txt") if p.is_file())
    if not files:
        raise DataError(f"data directory {directory} has no usable files: it needs {HOLDING}")
    train, val = split_tail(byte_tokens(read_txt(directory, files)))
    return TokenStreams(train, val, BYTE_VOCAB, str(directory),
                        f"text corpus {directory} ({len(files)} .txt files), byte-level")
