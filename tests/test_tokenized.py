"""make data: a corpus -> train.bin / val.bin / meta.json / tokenizer.json (lib/data/tokenized.py, corpus.py)."""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from lib.data import corpus, load_text_data  # noqa: E402
from lib.data.text import read_meta  # noqa: E402
from lib.data.tokenized import (MIN_VOCAB, check_vocab, load_tokenizer, token_dtype,  # noqa: E402
                                tokenize_corpus)
from lib.errors import DataError  # noqa: E402


def topics(n: int, start: int = 0) -> str:
    import pydoc_data.topics as t

    keys = sorted(t.topics)
    return "".join(t.topics[k] for k in keys[start:start + n])


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    for i in range(3):
        (d / f"f{i}.txt").write_text(topics(6, 6 * i))
    (d / "sub" / "docs.jsonl").write_text("".join(json.dumps({"text": topics(1, 20 + i)}) + "\n" for i in range(4)))
    (d / "ignored.md").write_text("not a corpus file")
    return d


def quiet(line: str) -> None:
    pass


def test_uint16_up_to_65536_tokens_then_uint32():
    assert token_dtype(256) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32 and token_dtype(1 << 32) == np.uint32
    with pytest.raises(DataError, match="does not fit uint32"):
        token_dtype((1 << 32) + 1)


@pytest.mark.parametrize("vocab", [0, 200, MIN_VOCAB - 1])
def test_vocab_below_257_is_refused(vocab):
    with pytest.raises(DataError, match=f"VOCAB={vocab} is too small"):
        check_vocab(vocab)


def test_tokenized_corpus_format_and_meta(texts: Path, tmp_path: Path):
    out = tmp_path / "data"
    result = tokenize_corpus(str(texts), out, vocab=400, log=quiet)
    meta = json.loads((out / "meta.json").read_text())
    assert meta == result.meta and result.fresh
    assert meta["vocab_size"] == 400 and meta["dtype"] == "uint16" and meta["documents"] == 3 + 4
    assert meta["tokens"] == meta["train_tokens"] + meta["val_tokens"] and meta["val_tokens"] == meta["tokens"] // 10
    train = np.fromfile(out / "train.bin", dtype="<u2")
    val = np.fromfile(out / "val.bin", dtype="<u2")
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
    assert int(max(train.max(), val.max())) < 400
    assert int((np.concatenate([train, val]) == meta["eot_id"]).sum()) == 7  # one end-of-text per document
    assert not (out / ".shards").exists()
    # the tokens decode back to the corpus, documents in the order found (sorted, recursively)
    tok = load_tokenizer(out / "tokenizer.json")
    ids = np.concatenate([train, val]).tolist()
    first = ids[:ids.index(meta["eot_id"])]
    assert tok.decode(first) == (texts / "f0.txt").read_text()
    # kfit reads it back with its vocabulary
    assert read_meta(out) == (400, "uint16")
    _, _, info = load_text_data(str(out), 64)
    assert info.vocab_size == 400 and "uint16" in info.description
    # the same corpus again: nothing to do; another vocabulary there: refused
    assert not tokenize_corpus(str(texts), out, vocab=400, log=quiet).fresh
    with pytest.raises(DataError, match="another tokenized corpus"):
        tokenize_corpus(str(texts), out, vocab=500, log=quiet)


def test_uint32_corpus_reads_back(tmp_path: Path):
    ids = np.arange(0, 70_000 * 3, 3, dtype="<u4") % 70_000
    ids.tofile(tmp_path / "train.bin")
    ids[:5000].tofile(tmp_path / "val.bin")
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 70_000, "dtype": "uint32"}))
    train, _, info = load_text_data(str(tmp_path), 32)
    assert info.vocab_size == 70_000 and int(train[[0]][0].max()) < 70_000


def test_user_tokenizer_is_used_and_copied(texts: Path, tmp_path: Path):
    first = tmp_path / "first"
    tokenize_corpus(str(texts / "f0.txt"), first, vocab=300, log=quiet)
    out = tmp_path / "second"
    meta = tokenize_corpus(str(texts / "f1.txt"), out, tokenizer=str(first / "tokenizer.json"), log=quiet).meta
    assert meta["vocab_size"] == 300 and meta["documents"] == 1
    assert (out / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(DataError, match="not a Hugging Face tokenizer.json"):
        tokenize_corpus(str(texts), tmp_path / "third", tokenizer=str(bad), log=quiet)


def test_resume_after_an_interruption_gives_the_same_files(texts: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(corpus, "PIECE_BYTES", 2000)  # many shards
    clean = tmp_path / "clean"
    tokenize_corpus(str(texts), clean, vocab=300, log=quiet)
    out = tmp_path / "resumed"
    real, calls = corpus.pieces, []

    def interrupted(source, start=0):
        for piece in real(source, start):
            calls.append(start)
            if len(calls) == 12:
                raise KeyboardInterrupt
            yield piece

    import lib.data.tokenized as tokenized

    monkeypatch.setattr(tokenized, "pieces", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(str(texts), out, vocab=300, log=quiet)
    assert not (out / "meta.json").exists() and len(list((out / ".shards").glob("*.bin"))) >= 11
    monkeypatch.setattr(tokenized, "pieces", real)
    lines = []
    result = tokenize_corpus(str(texts), out, vocab=300, log=lines.append)
    assert result.resumed_shards >= 11 and any(line.startswith("resuming") for line in lines)
    assert any("reusing the BPE" in line for line in lines)
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name
    assert result.tokens_now < result.meta["tokens"]


@pytest.mark.parametrize("case, needle", [
    ("missing", "does not exist"), ("empty", "is empty"), ("no files", "holds no .txt"),
    ("bad jsonl", "is not JSON"), ("no text field", 'no "text" string'), ("unsupported", "is not a .txt"),
])
def test_bad_corpus_is_one_error(tmp_path: Path, case, needle):
    d = tmp_path / "c"
    d.mkdir()
    target = str(d)
    if case == "missing":
        target = str(tmp_path / "nothing")
    elif case == "empty":
        (d / "a.txt").write_text("")
    elif case == "no files":
        (d / "a.md").write_text("text")
    elif case == "bad jsonl":
        (d / "a.jsonl").write_text('{"text": "fine"}\n{not json\n')
    elif case == "no text field":
        (d / "a.jsonl").write_text('{"body": "x"}\n')
    else:
        (d / "a.csv").write_text("x")
        target = str(d / "a.csv")
    with pytest.raises(DataError, match=needle):
        tokenize_corpus(target, tmp_path / "out", vocab=300, log=quiet)


def test_unreadable_file_is_one_error(texts: Path, tmp_path: Path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(corpus, "open", refuse, raising=False)
    with pytest.raises(DataError, match="cannot read corpus file .*Permission denied"):
        tokenize_corpus(str(texts / "f0.txt"), tmp_path / "out", vocab=300, log=quiet)


def test_glob_and_parquet_without_pyarrow(texts: Path, tmp_path: Path):
    found = corpus.find_sources(str(texts / "f*.txt"))
    assert [Path(s.name).name for s in found] == ["f0.txt", "f1.txt", "f2.txt"]
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        (texts / "x.parquet").write_bytes(b"PAR1")
        with pytest.raises(DataError, match="needs pyarrow"):
            corpus.find_sources(str(texts))


def test_default_corpus_is_the_pydoc_text(tmp_path: Path):
    meta = tokenize_corpus(None, tmp_path / "pydoc", vocab=300, log=quiet).meta
    assert meta["corpus"] == "pydoc_data.topics" and meta["tokens"] > 100_000


def test_damaged_meta_json_in_out_is_one_error_line(texts: Path, tmp_path: Path, monkeypatch, capsys):
    from lib.cli import main

    out = tmp_path / "out"
    out.mkdir()
    (out / "meta.json").write_text('{"vocab_size": 30')  # cut short
    with pytest.raises(DataError, match="is not the meta.json make data writes"):
        tokenize_corpus(str(texts), out, vocab=300, log=quiet)
    # make data's command (make runs `kfit data` with its variables as environment): one error line, exit 2
    monkeypatch.chdir(tmp_path)
    for name, value in (("CORPUS", str(texts)), ("OUT", "out"), ("VOCAB", "300")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TOKENIZER", raising=False)
    assert main(["data"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: out/meta.json is not the meta.json make data writes (not a JSON object): the directory holds "
        "something else; remove it, or write the corpus elsewhere with OUT="]


def test_damaged_shard_records_start_over(texts: Path, tmp_path: Path):
    clean = tmp_path / "clean"
    tokenize_corpus(str(texts / "f0.txt"), clean, vocab=300, log=quiet)
    out = tmp_path / "out"
    (out / ".shards").mkdir(parents=True)
    (out / ".shards" / "state.json").write_text("{")
    (out / ".shards" / "tokenizer-for.json").write_text("")
    (out / ".shards" / "000000-0000000.bin").write_bytes(b"\0\0")
    (out / ".shards" / "000000-0000000.json").write_text("[1")
    lines = []
    tokenize_corpus(str(texts / "f0.txt"), out, vocab=300, log=lines.append)
    assert any(line.endswith("starting over") for line in lines)
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name


def test_fragment_names_the_directory(tmp_path: Path):
    from lib import config as kc
    from lib.data.tokenized import write_fragment

    out = tmp_path / 'say "hi"'
    fragment = write_fragment(out)
    config = kc.make_defconfig("llama-tiny", [str(fragment)], out=tmp_path / ".config")
    assert config.dataset == "dir" and config.data_dir == str(out)
