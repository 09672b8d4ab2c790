"""CIFAR-10 and CIFAR-100 in their "python version" pickled batches."""

import pickle
from pathlib import Path

import numpy as np
import torch

from .files import data_directory
from .info import ImageArrays
from ..errors import DataError

PIXELS = 3 * 32 * 32
# classes -> (archive directory, train batches, test batches, label key)
LAYOUTS = {
    10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
         b"labels"),
    100: ("cifar-100-python", ["train"], ["test"], b"fine_labels"),
}


def holding(classes: int) -> str:
    subdir, train, test, _ = LAYOUTS[classes]
    return (f"the CIFAR-{classes} python version ({subdir}/ with {', '.join(train + test)}), "
            f"or its parent")


def locate(directory: Path, classes: int) -> Path:
    """Accept either the extracted archive directory or the directory holding it."""
    subdir, train, _, _ = LAYOUTS[classes]
    for candidate in (directory, directory / subdir):
        if (candidate / train[0]).is_file():
            return candidate
    raise DataError(f"{directory} holds no CIFAR-{classes} batches ({train[0]} is neither in it "
                    f"nor in {directory / subdir}): set CONFIG_DATA_DIR to {holding(classes)}")


def load_batch(path: Path, classes: int, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    fix = f"re-extract it from the CIFAR-{classes} python archive"
    if not path.is_file():
        raise DataError(f"{path} not found: the CIFAR-{classes} directory is incomplete; {fix}")
    try:
        with path.open("rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except Exception as e:  # a damaged pickle can fail in many ways; all mean the same to the user
        raise DataError(f"{path} is not a readable CIFAR pickle ({type(e).__name__}: {e}); "
                        f"{fix}") from e
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        raise DataError(f"{path} lacks the b'data' and {label_key!r} entries of a "
                        f"CIFAR-{classes} batch; {fix}")
    data, labels = np.asarray(batch[b"data"]), np.asarray(batch[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != PIXELS or len(data) == 0:
        raise DataError(f"{path} holds data of shape {data.shape} and dtype {data.dtype}, "
                        f"expected N x {PIXELS} uint8 with N > 0; {fix}")
    if labels.shape != (len(data),) or labels.dtype.kind not in "iu":
        raise DataError(f"{path} holds {labels.shape} labels of dtype {labels.dtype} for "
                        f"{len(data)} images, expected {len(data)} integers; {fix}")
    if labels.min() < 0 or labels.max() >= classes:
        raise DataError(f"{path} holds labels {labels.min()}..{labels.max()}, expected "
                        f"0..{classes - 1}; {fix}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def load_files(directory: Path, names: list[str], classes: int,
               label_key: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    batches = [load_batch(directory / name, classes, label_key) for name in names]
    return (torch.from_numpy(np.concatenate([x for x, _ in batches])),
            torch.from_numpy(np.concatenate([y for _, y in batches])))


def load_cifar(data_dir: str | None, classes: int) -> ImageArrays:
    directory = locate(data_directory(data_dir, holding(classes)), classes)
    _, train, test, label_key = LAYOUTS[classes]
    train_x, train_y = load_files(directory, train, classes, label_key)
    test_x, test_y = load_files(directory, test, classes, label_key)
    return ImageArrays(train_x, train_y, test_x, test_y, classes,
                       f"CIFAR-{classes} from {directory}")
