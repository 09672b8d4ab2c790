"""The UCI 8x8 handwritten digits, shipped with kfit (digits.csv.gz beside this file).

The file is scikit-learn's copy of the test set of the UCI Optical Recognition of Handwritten Digits data
(E. Alpaydin, C. Kaynak, 1998; CC BY 4.0): sklearn/datasets/data/digits.csv.gz, byte for byte (57 KB,
sha256 09f66e6d...). kfit used to read it from an installed scikit-learn, which with scipy is about 200 MB
of environment for one small file; tests/test_digits_data.py checks it against sklearn's load_digits.
"""

from pathlib import Path

import numpy as np
import torch

from .info import ImageArrays
from ..errors import DataError

TEST_SAMPLES = 360
# Fixed and separate from the training seed, so every run evaluates on the same 360 images.
SPLIT_SEED = 1797


DIGITS_FILE = Path(__file__).resolve().with_name("digits.csv.gz")


def digits_file() -> Path:
    if not DIGITS_FILE.is_file():
        raise DataError(f"the embedded digits data set {DIGITS_FILE} is missing: reinstall kfit (or restore the "
                        "file in the checkout), or set CONFIG_DATA_DIR to a local MNIST or CIFAR directory and "
                        "pick that data set")
    return DIGITS_FILE


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
    fix = "reinstall kfit (or restore the file in the checkout)"
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
