"""`make data`: a corpus -> a tokenized corpus directory kfit trains from (nanoGPT's format).

    <out>/train.bin, val.bin   token ids, uint16 (vocabularies up to 65,536) or uint32, little-endian
    <out>/meta.json            vocab_size, dtype, tokenizer, eot_id, documents, tokens, sources
    <out>/tokenizer.json       the Hugging Face tokenizer that made them (make sample decodes with it)
    <out>/fragment             the config lines that train on them (write_fragment; make data writes it)

The tokenizer is the user's (TOKENIZER=) or a byte-level BPE of VOCAB= tokens trained on the corpus
(its first TRAIN_BYTES). The corpus is read in pieces (lib/data/corpus.py) and each piece's tokens go
to a shard under <out>/.shards/ with a sidecar naming the offset after it; an interrupted run finds
the shards of the same corpus and tokenizer there and continues after the last one. The shards are
finally concatenated into train.bin (the first part) and val.bin (the last VAL_FRACTION, at most
VAL_MAX_TOKENS), meta.json is written last, and the shards are removed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .corpus import Source, find_sources, pieces, texts
from ..errors import DataError
from ..fileio import (UnsafeFileError, read_bytes, refuse_linked_components, refuse_linked_directory, write_atomic,
                      write_target)
from ..progress import Bar

EOT = "<|endoftext|>"
EOT_NAMES = (EOT, "<|end_of_text|>", "</s>", "<eos>", "[SEP]")  # a user tokenizer's document separator
MIN_VOCAB = 257  # 256 bytes and the end-of-text token
MAX_VOCAB = 1 << 32  # ids must fit uint32
DEFAULT_VOCAB = 4096
TRAIN_BYTES = 1 << 30  # the BPE is trained on at most this much of the corpus
VAL_FRACTION = 0.1
VAL_MAX_TOKENS = 10_000_000
FORMAT = 1


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id (0 .. vocab_size - 1) fits it, else uint32."""
    if vocab_size > MAX_VOCAB:
        raise DataError(f"a vocabulary of {vocab_size:,} tokens does not fit uint32 token ids (at most {MAX_VOCAB:,})")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def check_vocab(vocab: int) -> int:
    if vocab < MIN_VOCAB:
        raise DataError(f"VOCAB={vocab} is too small: a byte-level BPE needs the 256 bytes and an end-of-text "
                        f"token, so VOCAB >= {MIN_VOCAB}")
    token_dtype(vocab)
    return vocab


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise DataError("make data needs Hugging Face tokenizers: pip install tokenizers (it is in "
                        "requirements.txt; make env installs it)") from None
    return tokenizers


def load_tokenizer(path: str | Path):
    tk = _tokenizers()
    try:  # read here: a FIFO or device named as the tokenizer is refused, never read until it blocks
        text = read_bytes(path).decode("utf-8")
    except UnsafeFileError as err:
        raise DataError(f"TOKENIZER={path}: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"TOKENIZER={path} cannot be read ({getattr(err, 'strerror', None) or err}): name a "
                        "Hugging Face tokenizer.json") from None
    try:
        return tk.Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises plain Exception for a missing or malformed file
        raise DataError(f"TOKENIZER={path} is not a Hugging Face tokenizer.json ({str(e)[:200]})") from None


def train_bpe(sources: list[Source], vocab: int):
    """A byte-level BPE of `vocab` tokens (the end-of-text token included) trained on the corpus."""
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT], show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(sources, TRAIN_BYTES), trainer=trainer)
    return tok


def eot_id(tok) -> int | None:
    for name in EOT_NAMES:
        found = tok.token_to_id(name)
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class Result:
    out: Path
    meta: dict
    seconds: float
    tokens_now: int  # tokens this run encoded (a resumed run skips the shards it found)
    encode_seconds: float  # the time spent encoding them (tokens_now / encode_seconds: the throughput)
    resumed_shards: int
    fresh: bool  # False: the directory already held this corpus, nothing was done


def _encode(tok, batch: list[str]) -> list[list[int]]:
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # fast: no offsets (tokenizers >= 0.21)
    return [e.ids for e in encode(batch, add_special_tokens=False)]


def _shard_name(file_index: int, piece: int) -> str:
    return f"{file_index:06d}-{piece:07d}"


def _done_shards(shards: Path) -> dict[int, list[dict]] | None:
    """{file index: [sidecar, ...] in order} of the finished shards (a sidecar is written after its .bin);
    None where a sidecar is damaged (then none of them can be trusted)."""
    done: dict[int, list[dict]] = {}
    for side in sorted(shards.glob("[0-9]*.json")):
        info = _read_json(side)
        if not isinstance(info, dict) or not isinstance(info.get("file"), int):
            return None
        if (shards / f"{side.stem}.bin").is_file():
            done.setdefault(info["file"], []).append(info)
    return done


def _clear(shards: Path) -> None:
    for p in shards.glob("[0-9]*"):
        p.unlink()


def _read_json(path: Path):
    """A JSON file of make data's own (.shards/), or None where a crash or an edit left it unreadable."""
    try:  # never through a link, never blocking on a FIFO planted there
        return json.loads(read_bytes(path, follow_symlinks=False))
    except (OSError, ValueError, RecursionError, UnsafeFileError):
        return None


def _read_meta(path: Path) -> dict:
    meta = _read_json(path)
    if not isinstance(meta, dict):
        raise DataError(f"{path} is not the meta.json make data writes (not a JSON object): the directory holds "
                        "something else; remove it, or write the corpus elsewhere with OUT=")
    return meta


def _state(sources: list[Source], tokenizer_hash: str, dtype: np.dtype) -> dict:
    return {"format": FORMAT, "sources": [s.identity() for s in sources], "tokenizer": tokenizer_hash,
            "dtype": dtype.name}


def _prepare_tokenizer(out: Path, sources: list[Source], tokenizer: str | None, vocab: int, log) -> tuple:
    """(tokenizer, its description): the user's copied beside the data, or one trained (kept for a resume)."""
    path = out / "tokenizer.json"
    if tokenizer:
        tok = load_tokenizer(tokenizer)
        token_dtype(tok.get_vocab_size(with_added_tokens=True))
        write_atomic(path, read_bytes(tokenizer))
        return tok, f"from {tokenizer}"
    check_vocab(vocab)
    plan = {"vocab": vocab, "sources": [s.identity() for s in sources]}
    trained = out / ".shards" / "tokenizer-for.json"
    if path.is_file() and _read_json(trained) == plan:
        log(f"reusing the BPE trained before the interruption ({path})")
        return load_tokenizer(path), f"byte-level BPE trained on the corpus (VOCAB={vocab})"
    log(f"training a byte-level BPE of {vocab} tokens on the corpus (at most its first {TRAIN_BYTES >> 20} MiB)")
    start = time.monotonic()
    tok = train_bpe(sources, vocab)
    write_atomic(path, tok.to_str().encode())
    write_atomic(trained, json.dumps(plan).encode())
    log(f"trained in {time.monotonic() - start:.1f}s: {tok.get_vocab_size()} tokens")
    return tok, f"byte-level BPE trained on the corpus (VOCAB={vocab})"


def _concatenate(shards: Path, out: Path, dtype: np.dtype, total: int) -> tuple[int, int]:
    """train.bin (the first tokens) and val.bin (the last), streamed shard by shard."""
    val = min(int(total * VAL_FRACTION), VAL_MAX_TOKENS)
    cut = total - val
    files = sorted(p for p in shards.glob("*.bin"))

    def write(lo: int, hi: int) -> Callable[[str], None]:
        def run(tmp: str) -> None:
            at = 0
            with open(tmp, "wb") as f:
                for path in files:
                    n = path.stat().st_size // dtype.itemsize
                    if at + n > lo and at < hi:
                        ids = np.fromfile(path, dtype=dtype)
                        f.write(ids[max(0, lo - at):min(n, hi - at)].tobytes())
                    at += n
        return run

    write_atomic(out / "train.bin", write(0, cut))
    write_atomic(out / "val.bin", write(cut, total))
    return cut, val


FRAGMENT = "fragment"


def write_fragment(out: Path) -> Path:
    """<out>/fragment: the config lines that train on the corpus in `out` (FRAGMENTS="<out>/fragment"), its
    directory named as `out` is (relative paths: to where make runs)."""
    quoted = str(out).replace("\\", "\\\\").replace('"', '\\"')
    path = Path(out) / FRAGMENT
    write_atomic(path, ("# Written by make data: train on the tokenized corpus beside this file\n"
                        f'CONFIG_DATASET_DIR=y\nCONFIG_DATA_DIR="{quoted}"\n').encode())
    return path


def tokenize_corpus(corpus: str | None, out: Path, *, tokenizer: str | None = None, vocab: int = DEFAULT_VOCAB,
                    log: Callable[[str], None] = print, stream=None) -> Result:
    """Tokenize `corpus` (None: the pydoc topics) into `out`, resuming an interrupted run there."""
    started = time.monotonic()
    sources = find_sources(corpus)
    if not tokenizer:
        check_vocab(vocab)  # before anything is written
    shards = out / ".shards"
    refuse_linked_directory(out)  # its files are never written through a link (write_atomic): refused first
    refuse_linked_components(shards, out)  # the shards are removed at the end: never a link's target's files
    # every file it writes in OUT checked before the first is written: a refusal leaves OUT as it was
    for name in ("tokenizer.json", "train.bin", "val.bin", "meta.json", FRAGMENT):
        write_target(out / name)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    if meta_path.is_file() and not shards.exists():
        meta = _read_meta(meta_path)
        if meta.get("sources") == [s.identity() for s in sources] and meta.get("tokenizer_source") == (
                str(tokenizer) if tokenizer else None) and (tokenizer or meta.get("requested_vocab") == vocab):
            return Result(out, meta, 0.0, 0, 0.0, 0, False)
        raise DataError(f"{out} already holds another tokenized corpus, tokenizer or VOCAB (its meta.json): "
                        "remove it, or write this one elsewhere with OUT=")
    shards.mkdir(exist_ok=True)
    tok, described = _prepare_tokenizer(out, sources, tokenizer, vocab, log)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(vocab_size)
    state = _state(sources, hashlib.sha256(read_bytes(out / "tokenizer.json")).hexdigest()[:16], dtype)
    state_path = shards / "state.json"
    if state_path.is_file() and _read_json(state_path) != state:
        log("the shards there are of another corpus or tokenizer: starting over")
        _clear(shards)
    write_atomic(state_path, json.dumps(state).encode())
    done = _done_shards(shards)
    if done is None:
        log(f"a shard's record in {shards} is damaged: starting over")
        _clear(shards)
        done = {}
    eot = eot_id(tok)
    resumed = sum(len(v) for v in done.values())
    total_bytes = sum(s.size for s in sources)
    skip = sum(side["bytes"] for v in done.values() for side in v)
    if resumed:
        log(f"resuming: {resumed} shard(s) of a previous run cover {skip / max(1, total_bytes):.0%} of the corpus")
    encoded, t0 = 0, time.monotonic()
    with Bar(total_bytes, "tokenizing", unit="byte", stream=stream) as bar:
        bar.update(skip)
        for index, source in enumerate(sources):
            previous = done.get(index, [])
            if previous and previous[-1]["last"]:
                continue
            start = previous[-1]["end"] if previous else 0
            number = len(previous)
            for piece in pieces(source, start):
                ids_lists = _encode(tok, piece.texts)
                parts = []
                for ids, ends in zip(ids_lists, piece.ends):
                    parts.append(np.asarray(ids, dtype=dtype))
                    if ends and eot is not None:
                        parts.append(np.asarray([eot], dtype=dtype))
                ids = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
                name = _shard_name(index, number)
                write_atomic(shards / f"{name}.bin", ids.tobytes())
                side = {"file": index, "end": piece.end, "tokens": int(ids.size), "docs": sum(piece.ends),
                        "bytes": piece.bytes_read, "last": False}
                write_atomic(shards / f"{name}.json", json.dumps(side).encode())
                number += 1
                encoded += int(ids.size)
                rate = encoded / max(1e-9, time.monotonic() - t0)
                bar.update(piece.bytes_read, postfix=f"{encoded:,} tokens, {rate:,.0f} tokens/s")
            # the file is finished: mark its last shard (or an empty one) so a resume skips it
            name = _shard_name(index, number)
            write_atomic(shards / f"{name}.bin", b"")
            write_atomic(shards / f"{name}.json", json.dumps({"file": index, "end": -1, "tokens": 0, "docs": 0,
                                                              "bytes": 0, "last": True}).encode())
    encode_seconds = time.monotonic() - t0
    done = _done_shards(shards) or {}
    total = sum(side["tokens"] for v in done.values() for side in v)
    documents = sum(side["docs"] for v in done.values() for side in v)
    if total == 0:
        raise DataError(f"CORPUS={corpus} holds no text to tokenize")
    train, val = _concatenate(shards, out, dtype, total)
    meta = {"vocab_size": vocab_size, "dtype": dtype.name, "tokenizer": "tokenizer.json", "tokenizer_kind": described,
            "tokenizer_source": str(tokenizer) if tokenizer else None, "requested_vocab": None if tokenizer else vocab,
            "eot_id": eot, "documents": documents,
            "tokens": total, "train_tokens": train, "val_tokens": val, "corpus": corpus or "pydoc_data.topics",
            "sources": [s.identity() for s in sources], "format": FORMAT}
    write_atomic(meta_path, (json.dumps(meta, indent=1) + "\n").encode())
    shutil.rmtree(shards)
    return Result(out, meta, time.monotonic() - started, encoded, encode_seconds, resumed, True)
