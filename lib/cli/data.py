"""`make data` / `kfit data`: a corpus -> a tokenized corpus directory (lib/data/tokenized.py).

CORPUS= a file, a directory of .txt/.jsonl/.parquet files or a glob (default: the standard library's
pydoc topics, so the whole path runs offline); TOKENIZER= a tokenizer.json to use, else a byte-level
BPE of VOCAB= tokens (default 4096) is trained on the corpus; OUT= the directory (default data/<name>
under the current directory, beside the config). Running it again after an interruption resumes. It ends
with the line to train on what it wrote: <out>/fragment, a config fragment naming the directory.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from ..env import env_number
from ..errors import KfitError
from ..fileio import UnsafeFileError
from ..redact import shown
from .flags import command


def default_out(corpus: str | None) -> Path:
    """data/<name>: the corpus file's stem, its directory's name, or "pydoc" for the embedded text."""
    if not corpus:
        return Path("data") / "pydoc"
    head = corpus.split("*")[0].split("?")[0].split("[")[0].rstrip("/")
    path = Path(head).expanduser()
    name = path.stem if path.is_file() else path.name
    return Path("data") / (name or "corpus")


def cmd_data(args) -> int:
    from ..data.tokenized import DEFAULT_VOCAB, tokenize_corpus, write_fragment

    corpus = os.environ.get("CORPUS") or None
    tokenizer = os.environ.get("TOKENIZER") or None
    vocab = env_number("VOCAB", int, DEFAULT_VOCAB)
    out = Path(os.environ["OUT"]).expanduser() if os.environ.get("OUT") else default_out(corpus)
    print(f"Corpus: {shown(corpus) if corpus else 'pydoc_data.topics (standard library)'} -> {shown(out)}")
    try:
        result = tokenize_corpus(corpus, out, tokenizer=tokenizer, vocab=vocab,
                                 log=lambda line: print(line, file=sys.stderr, flush=True))
        fragment = write_fragment(out)
    except UnsafeFileError:
        raise  # names the link or special file as it is
    except OSError as err:  # OUT a file, unwritable, a full disk; or a corpus path the OS refuses to open
        where = Path(os.path.abspath(err.filename)) if isinstance(err.filename, str) else None
        if where is not None and not where.is_relative_to(os.path.abspath(out)):
            raise KfitError(f"CORPUS={shown(corpus)} cannot be read ({err.strerror or err} at {shown(where)}): "
                            "name files that exist and can be read") from None
        raise KfitError(f"OUT={shown(out)}: cannot write the tokenized corpus ({err.strerror or err} at "
                        f"{shown(err.filename or out)}): name a writable directory with room for it") from None
    meta = result.meta
    if not result.fresh:
        print(f"{shown(out)} already holds this corpus ({meta['tokens']:,} tokens): nothing to do")
    else:
        rate = result.tokens_now / result.encode_seconds if result.encode_seconds else 0.0
        resumed = f", resumed after {result.resumed_shards} shard(s)" if result.resumed_shards else ""
        print(f"Tokenized {meta['documents']:,} documents into {meta['tokens']:,} tokens "
              f"({meta['train_tokens']:,} train / {meta['val_tokens']:,} val, {meta['dtype']}) in "
              f"{result.seconds:.1f}s: {rate:,.0f} tokens/s{resumed}")
    print(f"Vocabulary: {meta['vocab_size']:,} tokens, {meta['tokenizer_kind']} ({shown(out / 'tokenizer.json')})")
    print(train_line(out, fragment))
    return 0


def train_line(out: Path, fragment: Path) -> str:
    """What to type to train on `out`: the fragment make data wrote there, merged onto a defconfig."""
    sets = f'CONFIG_DATASET_DIR=y and CONFIG_DATA_DIR="{shown(out)}"'  # escaped: a path never forges a line
    return (f"Train on it ({shown(fragment)} sets {sets}; merge it onto any GPT-2 or Llama defconfig):\n"
            f"  make llama-tiny-defconfig {shown(shlex.quote('FRAGMENTS=' + shlex.quote(str(fragment))))} "
            "&& make train")


def register(sub) -> None:
    command(sub, "data", "tokenize a corpus into train.bin / val.bin / meta.json (resumable)", "CORPUS",
            "TOKENIZER", "VOCAB", "OUT", func=cmd_data,
            help={"OUT": "the directory to write (default data/<corpus name>)"})
