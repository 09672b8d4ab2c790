"""The text a corpus is made of, read piece by piece so that memory never depends on its size.

A corpus (`make data CORPUS=...`) is a file, a directory (searched recursively) or a glob of
.txt, .jsonl and .parquet files; without one, the standard library's pydoc topics. A .txt file
is one document; a .jsonl file holds one document per line (its "text" field); a .parquet file
one per row of its "text" column (needs pyarrow). Every source is read from an offset (bytes for
.txt and .jsonl, rows for .parquet, topics for pydoc) in pieces of about PIECE_BYTES, so a
tokenization interrupted after a piece resumes at the next one.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import DataError
from ..redact import shown
from ..fileio import MISSING, what_is

SUFFIXES = (".txt", ".jsonl", ".parquet")
PIECE_BYTES = 4 << 20  # text per piece: one shard of tokens, the unit a resume repeats at most
TEXT_BYTES = 64 << 10  # text per string handed to the tokenizer: its batch encode runs them on every core
PYDOC = "pydoc"


@dataclass(frozen=True)
class Source:
    """One file of the corpus (or the embedded pydoc text): where it is, its kind, its size in bytes."""

    name: str  # the path as found, or "pydoc"
    kind: str  # txt | jsonl | parquet | pydoc
    size: int
    mtime_ns: int = 0

    def identity(self) -> list:
        return [self.name, self.size, self.mtime_ns]


@dataclass(frozen=True)
class Piece:
    """A run of texts from one source; `ends[i]`: text i ends a document. `end` is the offset to resume
    from, `bytes_read` the source bytes it covers (for the progress line)."""

    texts: list[str]
    ends: list[bool]
    end: int
    bytes_read: int


def _pydoc_text() -> list[str]:
    import pydoc_data.topics as module

    return [module.topics[key] for key in sorted(module.topics)]


def _kind(path: Path) -> str | None:
    return path.suffix[1:].lower() if path.suffix.lower() in SUFFIXES else None


def _source(path: Path) -> Source:
    try:
        st = path.stat()
    except OSError as e:
        raise DataError(f"cannot read corpus file {path} ({e.strerror or e})") from e
    if _kind(path) == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise DataError(f"{path} is a .parquet file: reading it needs pyarrow (pip install pyarrow), "
                            "which kfit does not install; convert it to .jsonl or install pyarrow") from None
    return Source(str(path), _kind(path), st.st_size, st.st_mtime_ns)


def find_sources(corpus: str | None) -> list[Source]:
    """The corpus's files in a fixed (sorted) order; the pydoc topics without one."""
    if not corpus:
        return [Source(PYDOC, "pydoc", sum(len(t.encode()) for t in _pydoc_text()))]
    what = "a .txt, .jsonl or .parquet file, a directory holding them, or a glob"
    path = Path(corpus).expanduser()
    if any(c in corpus for c in "*?["):
        paths = sorted(Path(p) for p in glob.glob(os.path.expanduser(corpus), recursive=True))
        paths = [p for p in paths if p.is_file()]
        other = [p for p in paths if _kind(p) is None]
        if other:
            raise DataError(f"CORPUS={shown(corpus)} matches {shown(other[0])}, which is not a .txt, .jsonl or "
                            ".parquet file: narrow the glob")
    elif path.is_dir():
        paths = sorted(p for p in path.rglob("*") if p.is_file() and _kind(p) is not None)
    elif path.is_file():
        if _kind(path) is None:
            raise DataError(f"CORPUS={corpus} is not {what}")
        paths = [path]
    elif (kind := what_is(path)) not in (None, MISSING):  # a FIFO, a looping link: not "does not exist"
        reads = "" if kind.startswith("a symbolic link") else ": kfit reads only regular files"
        raise DataError(f"CORPUS={corpus} is {kind}{reads}; name {what}")
    else:
        raise DataError(f"CORPUS={corpus} does not exist: name {what}")
    if not paths:
        raise DataError(f"CORPUS={corpus} holds no .txt, .jsonl or .parquet files: name {what}")
    sources = [_source(p) for p in paths]
    for source in sources:
        if source.kind in ("txt", "jsonl"):
            _require_text(source.name)
    if not any(s.size for s in sources):
        raise DataError(f"CORPUS={corpus} is empty: its {len(sources)} file(s) hold no text")
    return sources


TEXT_SAMPLE = 1 << 16  # bytes of each .txt/.jsonl file read to tell text from binary data
NOT_TEXT_SHARE = 0.02  # of the sample's bytes that are not UTF-8, beyond which the file is not text


def _require_text(path) -> None:
    """A DataError unless the file reads as text where it is sampled, its start, middle and end (UTF-8, no NUL
    bytes, at most NOT_TEXT_SHARE of a sample's bytes undecodable): random bytes named .txt would otherwise be
    tokenized as garbage without a word, and so would text with binary data appended."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            offsets = sorted({0, max(0, size // 2 - TEXT_SAMPLE // 2), max(0, size - TEXT_SAMPLE)})
            samples = []
            for offset in offsets:
                f.seek(offset)
                samples.append((offset, f.read(TEXT_SAMPLE)))
    except OSError as e:
        raise DataError(f"cannot read corpus file {path} ({e.strerror or e})") from e
    for offset, sample in samples:
        if not sample:
            continue
        # a window that starts or ends inside a character loses at most 3 bytes at each end: not counted
        bad = len(sample) - len(sample.decode("utf-8", errors="ignore").encode("utf-8"))
        bad = max(0, bad - (6 if offset else 3))
        if b"\0" in sample or bad > NOT_TEXT_SHARE * len(sample):
            what = "NUL bytes" if b"\0" in sample else f"{bad / len(sample):.0%} of its bytes not UTF-8"
            where = f"its first {len(sample):,} bytes" if offset == 0 else \
                f"its {len(sample):,} bytes from offset {offset:,}"
            raise DataError(f"{path} is not text ({where} hold {what}): remove it from the corpus, or convert it to "
                            "UTF-8 text")


def _group(lines: list[str]) -> list[str]:
    """Lines joined into strings of about TEXT_BYTES (kept whole: a line is never split)."""
    out, current, size = [], [], 0
    for line in lines:
        current.append(line)
        size += len(line)
        if size >= TEXT_BYTES:
            out.append("".join(current))
            current, size = [], 0
    if current:
        out.append("".join(current))
    return out


def _lines(source: Source, start: int) -> Iterator[tuple[list[bytes], int, bool]]:
    """(lines, offset after them, at end of file) in runs of about PIECE_BYTES."""
    try:
        with open(source.name, "rb") as f:
            f.seek(start)
            while True:
                lines = f.readlines(PIECE_BYTES)
                offset = f.tell()
                at_end = not lines or offset >= source.size
                yield lines, offset, at_end
                if at_end:
                    return
    except OSError as e:
        raise DataError(f"cannot read corpus file {source.name} ({e.strerror or e})") from e


def _jsonl_text(source: Source, line: bytes, offset: int) -> str:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as e:  # RecursionError: a line nested thousands deep
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise DataError(f"{source.name}: the line at byte {offset} is not JSON ({why}): a .jsonl corpus holds one "
                        'JSON object with a "text" field per line') from None
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str):
        keys = ", ".join(list(record)[:5]) if isinstance(record, dict) else type(record).__name__
        raise DataError(f'{source.name}: the line at byte {offset} has no "text" string (it has: {keys})')
    return text


def _parquet_pieces(source: Source, start: int) -> Iterator[Piece]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(source.name)
        if "text" not in table.schema_arrow.names:
            raise DataError(f'{source.name} has no "text" column (it has: {", ".join(table.schema_arrow.names[:8])})')
        rows = max(1, table.metadata.num_rows)
        row = 0
        for batch in table.iter_batches(batch_size=4096, columns=["text"]):
            texts = batch.column(0).to_pylist()
            first, row = row, row + len(texts)
            if row <= start:
                continue
            texts = [t or "" for t in texts[max(0, start - first):]]
            yield Piece(texts, [True] * len(texts), row, source.size * len(texts) // rows)
    except DataError:
        raise
    except Exception as e:  # pyarrow's errors (ArrowInvalid, OSError) for a damaged file
        raise DataError(f"cannot read corpus file {source.name} ({e})") from e


def pieces(source: Source, start: int = 0) -> Iterator[Piece]:
    """The source's text from offset `start`, piece by piece."""
    if source.kind == "pydoc":
        topics = _pydoc_text()
        for i in range(start, len(topics), 64):
            texts = topics[i:i + 64]
            yield Piece(texts, [True] * len(texts), i + len(texts), sum(len(t.encode()) for t in texts))
        return
    if source.kind == "parquet":
        yield from _parquet_pieces(source, start)
        return
    position = start
    for lines, offset, at_end in _lines(source, start):
        if source.kind == "txt":
            texts = _group([line.decode("utf-8", errors="replace") for line in lines])
            ends = [False] * len(texts)
            if at_end and texts:
                ends[-1] = True  # a .txt file is one document
        else:
            texts, at = [], position
            for line in lines:
                if line.strip():
                    texts.append(_jsonl_text(source, line, at))
                at += len(line)
            ends = [True] * len(texts)
        yield Piece(texts, ends, offset, offset - position)
        position = offset


def texts(sources: list[Source], limit_bytes: int) -> Iterator[str]:
    """Every text of the corpus in order, up to about `limit_bytes` (what the tokenizer is trained on)."""
    seen = 0
    for source in sources:
        for piece in pieces(source):
            for text in piece.texts:
                yield text
                seen += len(text)
                if seen >= limit_bytes:
                    return
