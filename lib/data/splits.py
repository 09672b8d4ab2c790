"""In-memory splits whose items are whole batches, so a DataLoader does no per-sample collation."""

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

Indices = Sequence[int] | torch.Tensor


class BatchSplit(Dataset, ABC):
    """len() counts samples; indexing takes a list (or tensor) of indices and returns (x, y)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __getitem__(self, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]: ...


def channel_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std of uint8 [N, C, H, W] images, exact and in O(1) extra memory.

    A histogram of the 256 possible values avoids converting the whole split to float.
    """
    values = torch.arange(256, dtype=torch.float64)
    means, stds = [], []
    for c in range(images.shape[1]):
        counts = torch.bincount(images[:, c].reshape(-1), minlength=256).double()
        mean = (counts * values).sum() / counts.sum()
        var = (counts * (values - mean) ** 2).sum() / counts.sum()
        means.append(mean)
        # A constant channel carries no signal; dividing by 1 keeps it finite.
        stds.append(var.sqrt() if var > 0 else torch.tensor(1.0, dtype=torch.float64))
    return torch.stack(means).float(), torch.stack(stds).float()


class ImageSplit(BatchSplit):
    """uint8 images at native resolution, normalised and resized per batch."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: torch.Tensor,
                 std: torch.Tensor, image_size: int) -> None:
        self.images = images
        self.labels = labels
        self.mean = mean.view(1, -1, 1, 1)
        self.std = std.view(1, -1, 1, 1)
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        # Normalise before resizing: fewer pixels, and an affine map commutes with bilinear.
        x = (self.images[idx].float() - self.mean) / self.std
        if x.shape[-1] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear",
                              align_corners=False, antialias=False)
        return x, self.labels[idx]


class TextSplit(BatchSplit):
    """Non-overlapping windows of block_size + 1 tokens taken with stride block_size."""

    def __init__(self, tokens: torch.Tensor, block_size: int) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.offsets = torch.arange(block_size + 1)

    def __len__(self) -> int:
        return max(len(self.tokens) - 1, 0) // self.block_size

    def __getitem__(self, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.as_tensor(indices, dtype=torch.long) * self.block_size
        windows = self.tokens[starts[:, None] + self.offsets].long()
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class TensorSplit(BatchSplit):
    """Ready-made (inputs, targets) tensors with the sample in dimension 0 (custom models)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        if len(inputs) != len(targets):
            raise ValueError(f"inputs hold {len(inputs)} samples but targets {len(targets)}")
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.inputs[idx], self.targets[idx]


TARGET_KEYS = ("labels", "label", "targets", "target", "y")  # Hugging Face's names first


def as_pair(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """A collated batch as (inputs, targets): a pair as it is; a dict (a Hugging Face dataset's rows) by its
    one target key (TARGET_KEYS) and its one other key."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, dict):
        targets = [k for k in TARGET_KEYS if k in batch]
        inputs = [k for k in batch if k not in TARGET_KEYS]
        if len(targets) == 1 and len(inputs) == 1:
            return batch[inputs[0]], batch[targets[0]]
        raise ValueError(f"items with the keys {sorted(batch)}: kfit needs one input and one target key "
                         f"(the target named one of {', '.join(TARGET_KEYS)}); select those columns")
    raise ValueError(f"items that collate to {type(batch).__name__}: return (input, target) pairs, or dicts "
                     "with one input and one target key")


class DatasetSplit(BatchSplit):
    """A user's map-style dataset (custom models), or the `indices` of one: anything with __len__ and
    __getitem__(int), a torch Dataset or a Hugging Face one. A batch collates its items
    (torch's default_collate), in the data loader's worker processes when the plan has them, so a dataset
    that reads each item from disk is never held in memory whole."""

    def __init__(self, dataset, indices: Sequence[int] | None = None) -> None:
        self.dataset = dataset
        self.indices = range(len(dataset)) if indices is None else indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, indices: Indices) -> tuple[torch.Tensor, torch.Tensor]:
        from torch.utils.data import default_collate

        rows = [self.dataset[self.indices[int(i)]] for i in indices]
        return as_pair(default_collate(rows))
