"""The data layer: every data set is loaded into memory once and served as whole batches.

A split's __getitem__ takes a list of indices, so the trainer wraps it as
DataLoader(split, sampler=BatchSampler(...), batch_size=None) with no per-sample collation.
"""

from .cifar import load_cifar
from .digits import load_digits
from .info import DatasetInfo, ImageArrays
from .mnist import load_mnist
from .splits import BatchSplit, ImageSplit, TextSplit, channel_stats
from .text import corpus_text, embedded_text
from ..errors import DataError

__all__ = ["BatchSplit", "DatasetInfo", "load_image_data", "load_text_data"]

IMAGE_SOURCES = ("digits", "mnist", "cifar10", "cifar100")


def read_images(source: str, data_dir: str | None) -> ImageArrays:
    if source == "digits":
        return load_digits()
    if source == "mnist":
        return load_mnist(data_dir)
    if source == "cifar10":
        return load_cifar(data_dir, 10)
    if source == "cifar100":
        return load_cifar(data_dir, 100)
    raise DataError(f"unknown image data set {source!r}: choose one of {', '.join(IMAGE_SOURCES)}")


def load_image_data(source: str, data_dir: str | None,
                    image_size: int) -> tuple[BatchSplit, BatchSplit, DatasetInfo]:
    """Train and test splits of x float32 [B, C, image_size, image_size], y int64 [B].

    "digits" is embedded (data_dir is ignored); the others read data_dir. Normalisation
    uses the train split's per-channel mean and std.
    """
    arrays = read_images(source, data_dir)
    mean, std = channel_stats(arrays.train_x)
    train = ImageSplit(arrays.train_x, arrays.train_y, mean, std, image_size)
    test = ImageSplit(arrays.test_x, arrays.test_y, mean, std, image_size)
    native = arrays.train_x.shape[-1]
    size = (f"resized to {image_size}x{image_size}" if image_size != native
            else f"at native {native}x{native}")
    info = DatasetInfo(name=source, kind="image", num_classes=arrays.num_classes,
                       channels=arrays.train_x.shape[1], image_size=image_size, vocab_size=0,
                       block_size=0, train_samples=len(train), eval_samples=len(test),
                       description=f"{arrays.description}, {len(train)} train / {len(test)} "
                                   f"test, {size}")
    return train, test, info


def load_text_data(data_dir: str | None,
                   block_size: int) -> tuple[BatchSplit, BatchSplit, DatasetInfo]:
    """Train and validation splits of x int64 [B, block_size] and y = x shifted by one.

    No data_dir (None or "", Kconfig's unset string) means the embedded pydoc topics.
    """
    streams = embedded_text() if not data_dir else corpus_text(data_dir)
    for split, tokens in (("training", streams.train), ("validation", streams.val)):
        if len(tokens) < block_size + 1:
            raise DataError(f"{streams.origin} has too little text for block size {block_size}: "
                            f"its {split} split is {len(tokens)} tokens but one window needs "
                            f"{block_size + 1}; add text or lower the block size")
    train = TextSplit(streams.train, block_size)
    val = TextSplit(streams.val, block_size)
    info = DatasetInfo(name="pydoc-topics" if not data_dir else f"text:{data_dir}", kind="text",
                       num_classes=0, channels=0, image_size=0, vocab_size=streams.vocab_size,
                       block_size=block_size, train_samples=len(train), eval_samples=len(val),
                       description=f"{streams.description}, {len(streams.train)} train / "
                                   f"{len(streams.val)} val tokens, {len(train)} / {len(val)} "
                                   f"windows of {block_size}")
    return train, val, info
