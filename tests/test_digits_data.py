"""The embedded digits ship with kfit (lib/data/digits.csv.gz): the same 1,797 images and labels, in the
same train/test split, that kfit read from scikit-learn's copy before, without scikit-learn installed."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from lib.data import digits
from lib.errors import DataError

# digits.load_digits() as it was when it read sklearn/datasets/data/digits.csv.gz (scikit-learn 1.9.1):
# sha256 of the train then test images (uint8), and of the train then test labels (int64).
IMAGES_SHA256 = "169e820ec1c3c0b28488050a2d57d812932d9295af15e18a55ba6e4271e07154"
LABELS_SHA256 = "1c4abdf973da2fdef71fc2841801d82cbd030c82c014017c66065a4099ab537e"


def _sha256(*tensors) -> str:
    return hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in tensors)).hexdigest()


def test_the_shipped_digits_are_the_ones_kfit_read_from_scikit_learn():
    data = digits.load_digits()
    assert (len(data.train_x), len(data.test_x), data.num_classes) == (1437, 360, 10)
    assert _sha256(data.train_x, data.test_x) == IMAGES_SHA256
    assert _sha256(data.train_y, data.test_y) == LABELS_SHA256
    sklearn = pytest.importorskip("sklearn.datasets")  # where it is installed, compare with it directly
    reference = sklearn.load_digits()
    test = digits.stratified_test_indices(reference.target, digits.TEST_SAMPLES, digits.SPLIT_SEED)
    train = np.setdiff1d(np.arange(len(reference.target)), test)
    images = reference.data.astype(np.uint8).reshape(-1, 1, 8, 8)
    np.testing.assert_array_equal(data.train_x.numpy(), images[train])
    np.testing.assert_array_equal(data.test_x.numpy(), images[test])
    np.testing.assert_array_equal(data.train_y.numpy(), reference.target[train])
    np.testing.assert_array_equal(data.test_y.numpy(), reference.target[test])


def test_a_missing_file_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(digits, "DIGITS_FILE", tmp_path / "digits.csv.gz")
    with pytest.raises(DataError, match="embedded digits data set .* is missing: reinstall kfit"):
        digits.load_digits()
