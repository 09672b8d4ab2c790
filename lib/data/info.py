"""Plain records passed between the data sources and the public loaders."""

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class DatasetInfo:
    """What the trainer and the logs need to know about a loaded data set."""

    name: str  # "digits", "mnist", "cifar10", "cifar100", "pydoc-topics", "text:<dir>"
    kind: str  # "image" | "text"
    num_classes: int  # image: classes; text: 0
    channels: int  # image: 1 or 3; text: 0
    image_size: int  # the size batches are delivered at (after resizing); text: 0
    vocab_size: int  # text: vocabulary size; image: 0
    block_size: int  # text: context length; image: 0
    train_samples: int
    eval_samples: int
    description: str  # one line for logs


class ImageArrays(NamedTuple):
    """An image source at native resolution: uint8 [N, C, H, H] images, int64 [N] labels."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    description: str  # where it came from, e.g. "MNIST from /data/mnist"


class TokenStreams(NamedTuple):
    """A text source as two 1-D integer token streams."""

    train: torch.Tensor
    val: torch.Tensor
    vocab_size: int
    origin: str  # the path named in error messages
    description: str
