"""Tests for lib.data: tiny synthetic data sets in tmp_path plus the two embedded ones."""

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

import lib.data.digits
from lib.data import BatchSplit, DatasetInfo, load_image_data, load_text_data
from lib.errors import DataError
from tests.helpers import idx_bytes, make_cifar, make_mnist, write

def assert_data_error(path: Path, call, *args) -> str:
    with pytest.raises(DataError) as info:
        call(*args)
    assert str(path) in str(info.value), str(info.value)
    return str(info.value)


# --- embedded digits -------------------------------------------------------------------------

def test_digits_counts_and_shapes() -> None:
    train, test, info = load_image_data("digits", "/ignored", 8)
    assert isinstance(train, BatchSplit) and isinstance(info, DatasetInfo)
    assert (len(train), len(test)) == (1437, 360)
    assert (info.kind, info.num_classes, info.channels, info.image_size) == ("image", 10, 1, 8)
    assert (info.train_samples, info.eval_samples) == (1437, 360)
    x, y = train[list(range(len(train)))]
    assert x.shape == (1437, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert abs(x.mean().item()) < 1e-4 and abs(x.std().item() - 1) < 1e-3
    # Stratified: every class appears in the test split in about its share.
    counts = torch.bincount(test[list(range(360))][1], minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38


def test_digits_split_is_deterministic_and_disjoint() -> None:
    a_train, a_test, _ = load_image_data("digits", None, 8)
    b_train, b_test, _ = load_image_data("digits", None, 8)
    assert torch.equal(a_test.images, b_test.images) and torch.equal(a_train.labels,
                                                                      b_train.labels)
    train_rows = {bytes(r) for r in a_train.images.reshape(len(a_train), -1).numpy()}
    test_rows = [bytes(r) for r in a_test.images.reshape(len(a_test), -1).numpy()]
    # The raw set has a few duplicate images, so allow a handful of coincidences.
    assert sum(r in train_rows for r in test_rows) < 10


@pytest.mark.parametrize("size", [32, 224])
def test_digits_resize(size: int) -> None:
    train, _, info = load_image_data("digits", None, size)
    x, y = train[[0, 1, 2]]
    assert x.shape == (3, 1, size, size) and y.shape == (3,)
    assert info.image_size == size and f"resized to {size}x{size}" in info.description
    assert train.images.shape[-1] == 8  # stored at native resolution


# --- MNIST -----------------------------------------------------------------------------------

@pytest.mark.parametrize("gz", [False, True])
def test_mnist(tmp_path: Path, gz: bool) -> None:
    train, test, info = load_image_data("mnist", str(make_mnist(tmp_path, gz)), 28)
    assert (len(train), len(test), info.num_classes, info.channels) == (50, 20, 10, 1)
    x, y = train[torch.arange(50)]
    assert x.shape == (50, 1, 28, 28) and x.dtype == torch.float32
    assert torch.equal(y, torch.arange(50) % 10) and y.dtype == torch.int64
    assert abs(x.mean().item()) < 1e-4 and abs(x.std().item() - 1) < 1e-2
    assert test[[0, 5]][0].shape == (2, 1, 28, 28)
    _, test224, _ = load_image_data("mnist", str(tmp_path), 224)
    assert test224[[0, 5]][0].shape == (2, 1, 224, 224)


def test_mnist_missing_and_empty_dir(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    message = assert_data_error(missing, load_image_data, "mnist", str(missing), 28)
    assert "does not exist" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "empty" in assert_data_error(empty, load_image_data, "mnist", str(empty), 28)
    with pytest.raises(DataError, match="CONFIG_DATA_DIR"):
        load_image_data("mnist", None, 28)


def test_mnist_missing_file(tmp_path: Path) -> None:
    make_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    assert_data_error(tmp_path / "t10k-labels-idx1-ubyte", load_image_data, "mnist",
                      str(tmp_path), 28)


def test_mnist_wrong_magic(tmp_path: Path) -> None:
    make_mnist(tmp_path)
    bad = write(tmp_path / "train-images-idx3-ubyte", idx_bytes(np.zeros((5, 28, 28)), 0x801))
    assert "magic" in assert_data_error(bad, load_image_data, "mnist", str(tmp_path), 28)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_truncated(tmp_path: Path, gz: bool) -> None:
    make_mnist(tmp_path, gz)
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    path = tmp_path / name
    path.write_bytes(path.read_bytes()[:-100])
    assert_data_error(path, load_image_data, "mnist", str(tmp_path), 28)
    path.write_bytes(b"\x00\x00\x08")
    assert_data_error(path, load_image_data, "mnist", str(tmp_path), 28)


def test_mnist_count_mismatch(tmp_path: Path) -> None:
    make_mnist(tmp_path)
    labels = write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(np.zeros(49), 0x801))
    message = assert_data_error(labels, load_image_data, "mnist", str(tmp_path), 28)
    assert "50 images" in message and "49 labels" in message


# --- CIFAR -----------------------------------------------------------------------------------

@pytest.mark.parametrize("classes", [10, 100])
def test_cifar(tmp_path: Path, classes: int) -> None:
    folder = make_cifar(tmp_path, classes)
    for where in (tmp_path, folder):  # the parent and the directory itself both work
        train, test, info = load_image_data(f"cifar{classes}", str(where), 32)
        assert (info.num_classes, info.channels, info.name) == (classes, 3, f"cifar{classes}")
        n_train = 60 if classes == 10 else 12
        assert (len(train), len(test)) == (n_train, 12)
        x, y = train[list(range(n_train))]
        assert x.shape == (n_train, 3, 32, 32) and x.dtype == torch.float32
        assert torch.equal(y, torch.arange(n_train) % 12 % classes)
        channel_mean = x.mean(dim=(0, 2, 3))
        assert channel_mean.abs().max() < 1e-4
        assert (x.std(dim=(0, 2, 3)) - 1).abs().max() < 1e-2
    _, test224, _ = load_image_data(f"cifar{classes}", str(tmp_path), 224)
    assert test224[[1, 2, 3]][0].shape == (3, 3, 224, 224)


def test_cifar_not_found(tmp_path: Path) -> None:
    (tmp_path / "readme").write_text("x")
    assert_data_error(tmp_path, load_image_data, "cifar10", str(tmp_path), 32)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_cifar_corrupt_pickle(tmp_path: Path, damage: str) -> None:
    folder = make_cifar(tmp_path, 10)
    path = folder / "data_batch_3"
    path.write_bytes(path.read_bytes()[:500] if damage == "truncate" else b"not a pickle")
    assert_data_error(path, load_image_data, "cifar10", str(tmp_path), 32)


def test_cifar_bad_contents(tmp_path: Path) -> None:
    folder = make_cifar(tmp_path, 100)
    path = folder / "test"
    path.write_bytes(pickle.dumps({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0] * 4}))
    assert "fine_labels" in assert_data_error(path, load_image_data, "cifar100", str(folder), 32)
    path.write_bytes(pickle.dumps({b"data": np.zeros((4, 100), np.uint8),
                                   b"fine_labels": [0] * 4}))
    assert_data_error(path, load_image_data, "cifar100", str(folder), 32)
    (folder / "train").unlink()
    assert_data_error(folder, load_image_data, "cifar100", str(folder), 32)


# --- text ------------------------------------------------------------------------------------

def test_embedded_text() -> None:
    train, val, info = load_text_data(None, 64)
    assert (info.name, info.kind, info.vocab_size, info.block_size) == ("pydoc-topics", "text",
                                                                        256, 64)
    assert len(train) > 5000 and len(val) > 500
    assert (info.train_samples, info.eval_samples) == (len(train), len(val))
    x, y = train[[0, 1, len(train) - 1]]
    assert x.shape == y.shape == (3, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x[1, 0:1], y[0, -1:])  # stride block_size: window 1 starts at y0's end


def test_txt_corpus(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_bytes(bytes(range(100, 200)))
    (tmp_path / "a.txt").write_bytes(bytes(range(0, 100)))
    (tmp_path / "notes.md").write_text("ignored")
    train, val, info = load_text_data(str(tmp_path), 8)
    assert info.vocab_size == 256 and info.name == f"text:{tmp_path}"
    # 200 bytes: 180 train -> 22 windows of 9 with stride 8; 20 val -> 2 windows.
    assert (len(train), len(val)) == (22, 2)
    x, y = train[[0, 21]]
    assert x[0].tolist() == list(range(8)) and y[0].tolist() == list(range(1, 9))
    assert x[1].tolist() == list(range(168, 176))
    vx, vy = val[[0, 1]]
    assert vx[0].tolist() == list(range(180, 188)) and vy[1].tolist() == list(range(189, 197))


def test_bin_corpus(tmp_path: Path) -> None:
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.arange(1000, 1300, dtype=np.uint16).tofile(tmp_path / "val.bin")
    train, val, info = load_text_data(str(tmp_path), 16)
    assert info.vocab_size == 50257 and (len(train), len(val)) == (62, 18)
    x, y = val[[2]]
    assert x.dtype == torch.int64 and x[0].tolist() == list(range(1032, 1048))
    assert torch.equal(x[:, 1:], y[:, :-1])
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 1300}))
    assert load_text_data(str(tmp_path), 16)[2].vocab_size == 1300


def test_bin_errors(tmp_path: Path) -> None:
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    assert_data_error(tmp_path / "val.bin", load_text_data, str(tmp_path), 16)
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "val.bin")
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"vocab_size": 500}))
    assert "token id" in assert_data_error(tmp_path / "train.bin", load_text_data,
                                           str(tmp_path), 16)
    meta.write_text("{")
    assert_data_error(meta, load_text_data, str(tmp_path), 16)
    meta.unlink()
    (tmp_path / "val.bin").write_bytes(b"\x01\x00\x02")
    assert "even" in assert_data_error(tmp_path / "val.bin", load_text_data, str(tmp_path), 16)


def test_text_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert_data_error(missing, load_text_data, str(missing), 8)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    assert "empty" in assert_data_error(corpus, load_text_data, str(corpus), 8)
    (corpus / "data.csv").write_text("1,2,3")
    assert "no usable files" in assert_data_error(corpus, load_text_data, str(corpus), 8)
    (corpus / "empty.txt").write_bytes(b"")
    assert "empty" in assert_data_error(corpus / "empty.txt", load_text_data, str(corpus), 8)
    (corpus / "empty.txt").write_text("x" * 50)
    message = assert_data_error(corpus, load_text_data, str(corpus), 8)
    assert "5 tokens" in message and "needs 9" in message


# --- DataLoader integration ------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader(tmp_path: Path, workers: int) -> None:
    image_split, _, _ = load_image_data("mnist", str(make_mnist(tmp_path, n_train=70)), 32)
    text_split, _, _ = load_text_data(None, 32)
    for split, count in ((image_split, 70), (text_split, len(text_split))):
        loader = DataLoader(split, sampler=BatchSampler(SequentialSampler(split), 32, False),
                            batch_size=None, num_workers=workers)
        batches = list(loader)
        assert len(batches) == -(-count // 32)
        assert sum(len(y) for _, y in batches) == count
        first_x, first_y = batches[0]
        expect_x, expect_y = split[list(range(32))]
        assert torch.equal(first_x, expect_x) and torch.equal(first_y, expect_y)


def test_mnist_images_without_pixels_are_refused(tmp_path: Path) -> None:
    make_mnist(tmp_path)
    bad = write(tmp_path / "train-images-idx3-ubyte", idx_bytes(np.zeros((50, 0, 0)), 0x803))
    message = assert_data_error(bad, load_image_data, "mnist", str(tmp_path), 28)
    assert "0x0-pixel samples, which have no pixels" in message


@pytest.mark.parametrize("value", [True, False, 1.0, "256", None])
def test_meta_vocab_size_must_be_an_integer_not_a_bool(tmp_path: Path, value) -> None:
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "val.bin")
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": value}))
    message = assert_data_error(tmp_path / "meta.json", load_text_data, str(tmp_path), 16)
    assert f"vocab_size {json.dumps(value)}" in message and "integer in 1..65536" in message
