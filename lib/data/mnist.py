"""MNIST in its original idx format, parsed here rather than through a downloader library."""

import math
from pathlib import Path

import numpy as np
import torch

from .files import data_directory, read_bytes
from .info import ImageArrays
from ..errors import DataError

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
NUM_CLASSES = 10
SPLITS = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
HOLDING = ("MNIST idx files (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
           "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz])")
REFETCH = "re-download it from the MNIST distribution"


def find_idx(directory: Path, name: str) -> Path:
    """The plain file if present, else its .gz."""
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(f"{directory / name}[.gz] not found: put all four {HOLDING} in {directory}")


def parse_idx(path: Path, magic: int, ndim: int) -> np.ndarray:
    raw = read_bytes(path)
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated: {len(raw)} bytes, less than its {header}-byte "
                        f"idx header; {REFETCH}")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise DataError(f"{path} has magic number 0x{found:08x}, expected 0x{magic:08x}: it is "
                        f"not an idx{ndim}-ubyte file; check the file name or {REFETCH}")
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = header + math.prod(dims)
    if len(raw) != expected:
        raise DataError(f"{path} is {len(raw)} bytes but its header (dimensions {dims}) implies "
                        f"{expected}: it is truncated or corrupt; {REFETCH}")
    if dims[0] == 0:
        raise DataError(f"{path} holds no samples; {REFETCH}")
    if 0 in dims[1:]:  # 0x0 images: no pixel to resize or train on
        raise DataError(f"{path} holds {'x'.join(map(str, dims[1:]))}-pixel samples, which have no pixels: it is "
                        f"corrupt; {REFETCH}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def load_split(directory: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    images_path, labels_path = (find_idx(directory, name) for name in SPLITS[split])
    images = parse_idx(images_path, IMAGES_MAGIC, 3)
    labels = parse_idx(labels_path, LABELS_MAGIC, 1)
    if len(images) != len(labels):
        raise DataError(f"{images_path} holds {len(images)} images but {labels_path} holds "
                        f"{len(labels)} labels: the files are from different releases or one "
                        f"is corrupt; {REFETCH}")
    if images.shape[1] != images.shape[2]:
        raise DataError(f"{images_path} holds {images.shape[1]}x{images.shape[2]} images, "
                        f"expected square ones; {REFETCH}")
    if labels.max() >= NUM_CLASSES:
        raise DataError(f"{labels_path} holds label {labels.max()}, expected 0..9; {REFETCH}")
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def load_mnist(data_dir: str | None) -> ImageArrays:
    directory = data_directory(data_dir, HOLDING)
    train_x, train_y = load_split(directory, "train")
    test_x, test_y = load_split(directory, "test")
    if train_x.shape[-1] != test_x.shape[-1]:
        raise DataError(f"MNIST in {directory} has {train_x.shape[-1]}-pixel train images but "
                        f"{test_x.shape[-1]}-pixel test images: the files do not belong together")
    return ImageArrays(train_x, train_y, test_x, test_y, NUM_CLASSES, f"MNIST from {directory}")
