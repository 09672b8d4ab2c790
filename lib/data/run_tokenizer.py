"""The tokenizer a run keeps: its tokenized corpus's tokenizer.json, copied into the run directory when
training starts, with its sha256 beside it in tokenizer.sha256 (`sha256sum -c tokenizer.sha256` reads it).

A model's token ids mean what the tokenizer that made its corpus says they mean. The corpus directory may
move, or be tokenized again (another corpus, the same VOCAB), after the run; make sample and make export
decode with the run's own copy, and where a run has none (the copy deleted, or a run from before kfit kept
one) they fall back to the corpus directory's: refused when the run recorded another sha256, with a
warning when it recorded none.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from .. import fileio
from ..errors import KfitError

TOKENIZER_FILE = "tokenizer.json"
HASH_FILE = "tokenizer.sha256"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hash_record(digest: str) -> bytes:
    """tokenizer.sha256's contents, in sha256sum's format."""
    return f"{digest}  {TOKENIZER_FILE}\n".encode()


def recorded_hash(directory: Path) -> str | None:
    """The sha256 a run directory (or an export) recorded for its tokenizer, or None."""
    try:
        text = fileio.read_text(Path(directory) / HASH_FILE, errors="replace")
    except OSError:
        return None
    found = re.match(r"\s*([0-9a-fA-F]{64})\b", text)
    return found.group(1).lower() if found else None


def corpus_tokenizer(data_dir: Path) -> Path | None:
    """The tokenizer.json of a tokenized corpus directory (one holding train.bin or val.bin), or None."""
    data_dir = Path(data_dir)
    if not ((data_dir / "train.bin").is_file() or (data_dir / "val.bin").is_file()):
        return None
    path = data_dir / TOKENIZER_FILE
    return path if path.is_file() else None


def _read(path: Path) -> bytes:
    try:
        return fileio.read_bytes(path)
    except OSError as err:
        raise KfitError(f"{path} cannot be read ({err.strerror or err})") from None


@dataclass(frozen=True)
class Chosen:
    """The tokenizer.json a run decodes with: where, its bytes, whether it is the run's own copy, and a warning
    line to show (None when nothing needs saying)."""

    path: Path
    data: bytes
    own: bool
    warning: str | None = None


def choose_tokenizer(own: list[Path], data_dir: Path | None) -> Chosen | None:
    """The tokenizer.json to decode a run with, or None where neither the run nor its corpus has one.

    `own`: the directories of the run itself (the run directory, an export's), first match wins; a copy
    that no longer matches the sha256 recorded beside it is refused. `data_dir`: the corpus directory the
    run's config names, the fallback: refused when the run recorded another sha256, with a warning when it
    recorded none."""
    recorded = None
    for directory in own:
        path = Path(directory) / TOKENIZER_FILE
        kept = recorded_hash(directory)
        if path.is_file():
            data = _read(path)
            digest = sha256_hex(data)
            if kept is not None and digest != kept:
                raise KfitError(f"{path} was changed after training (sha256 {digest[:12]}, the run recorded "
                                f"{kept[:12]} in {path.parent / HASH_FILE}): put back the tokenizer the run "
                                "trained with")
            return Chosen(path, data, True)
        recorded = recorded or kept
    path = corpus_tokenizer(data_dir) if data_dir is not None else None
    if path is None:
        return None
    data = _read(path)
    digest = sha256_hex(data)
    if recorded is not None and digest != recorded:
        raise KfitError(f"{path} is not the tokenizer this run trained with (sha256 {digest[:12]}, the run "
                        f"recorded {recorded[:12]}): the corpus was tokenized again since; put the run's "
                        f"tokenizer.json back into the run directory")
    if recorded is None:
        return Chosen(path, data, False, f"warning: decoding with {path}, the corpus directory's tokenizer: the "
                      "run kept no copy to check it against, so a corpus tokenized again since would decode wrong")
    return Chosen(path, data, False)
