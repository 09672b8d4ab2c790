"""The UCI 8x8 handwritten digits that scikit-learn ships, read without importing sklearn (slow)."""

import importlib.util
from pathlib import Path

import numpy as np
import torch

from .info import ImageArrays
from ..errors import DataError

TEST_SAMPLES = 360
# Fixed and separate from the training seed, so every run evaluates on the same 360 images.
SPLIT_SEED = 1797


def digits_file() -> Path:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("scikit-learn is not installed, so the embedded digits data set is "
                        "unavailable: run `make` (the Makefile installs it) or set CONFIG_DATA_DIR "
                        "to a local MNIST or CIFAR directory and pick that data set")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def stratified_test_indices(labels: np.ndarray, n_test: int, seed: int) -> np.ndarray:
    """Sorted test indices holding each class in proportion (largest-remainder rounding)."""
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts * n_test / counts.sum()
    take = np.floor(quota).astype(np.int64)
    take[np.argsort(-(quota - take), kind="stable")[: n_test - take.sum()]] += 1
    rng = np.random.default_rng(seed)
    picks = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take)]
    return np.sort(np.concatenate(picks))


def load_digits() -> ImageArrays:
    path = digits_file()
    fix = "reinstall scikit-learn by running `make`"
    try:
        table = np.loadtxt(path, delimiter=",", ndmin=2)
    except (OSError, EOFError, ValueError) as e:
        raise DataError(f"cannot read the embedded digits {path} ({e}): {fix}") from e
    if table.shape[1] != 65 or len(table) <= TEST_SAMPLES or table.min() < 0 or table.max() > 16:
        raise DataError(f"embedded digits {path} is not 64 pixels in 0..16 plus a label per row "
                        f"of more than {TEST_SAMPLES} rows: {fix}")
    images = torch.from_numpy(table[:, :64].astype(np.uint8).reshape(-1, 1, 8, 8))
    labels = torch.from_numpy(table[:, 64].astype(np.int64))
    test = torch.from_numpy(stratified_test_indices(labels.numpy(), TEST_SAMPLES, SPLIT_SEED))
    train = torch.ones(len(labels), dtype=torch.bool)
    train[test] = False
    return ImageArrays(images[train].contiguous(), labels[train], images[test].contiguous(),
                       labels[test], int(labels.max()) + 1,
                       "UCI 8x8 handwritten digits (scikit-learn copy)")
