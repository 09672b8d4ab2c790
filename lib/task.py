"""What is trained: the data, a model builder and the loss, from the config. One place for all models.

The trainer, the memory planner, the LR finder and HPO all start from a Task,
so a custom model (CONFIG_MODEL_CUSTOM) goes through exactly the same code as
the built-in ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .config import Config
from .data import BatchSplit, DatasetInfo, load_image_data, load_text_data
from .data.splits import DatasetSplit, TensorSplit
from .data.stream import StreamSplit, is_stream
from .errors import ConfigError
from .metrics import Metrics, builtin, custom as custom_metrics
from .models import build_model
from .models.freeze import freeze
from .models.registry import checkpointing_for, spec_for, vocabulary

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per sample (images) or per token (text), computed in float32."""
    if logits.dim() == 3:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return F.cross_entropy(logits.float(), targets)


@dataclass(frozen=True)
class Task:
    info: DatasetInfo
    train: BatchSplit
    eval: BatchSplit
    # build(gradient_checkpointing) -> a fresh model, CONFIG_FREEZE's parameters frozen, checkpointing on where
    # asked (a custom model's way: lib/models/registry.py's checkpointing_for)
    build: Callable[[bool], torch.nn.Module]
    loss: LossFn
    metrics: Metrics  # what its evaluation reports besides the loss (lib/metrics.py)

    def example_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A real batch of `batch_size` training samples (indices wrap around a small split)."""
        return self.train[[i % len(self.train) for i in range(batch_size)]]


def _custom_task(config: Config) -> Task:
    from .models.checkpointing import switch
    from .models.custom import build_custom, check, draw, first_batch

    spec = config.custom_model_factory
    custom = build_custom(spec)
    freeze(custom.model, config.freeze)  # before the check: the patterns are checked against the model's names
    how = checkpointing_for(config, custom.model)  # CONFIG_CHECKPOINT_MODULES's names checked too
    if config.gradient_checkpointing and how is None:
        raise ConfigError(f"CONFIG_GRADIENT_CHECKPOINTING=y: the model ({type(custom.model).__name__}) from {spec} "
                          "has no way to checkpoint (no Hugging Face gradient checkpointing, no grad_checkpointing "
                          "attribute, no layers that a ModuleList or Sequential holds two or more of): name the "
                          "classes to recompute in CONFIG_CHECKPOINT_MODULES, or say n")
    if custom.datasets is not None and any(is_stream(d) for d in custom.datasets):
        train, test = stream_splits(config, *custom.datasets)
        check(custom, *first_batch(train, spec), spec)
        origin = f"{type(custom.datasets[0]).__name__} stream"
    elif custom.datasets is not None:
        train, test = (DatasetSplit(*d) if isinstance(d, tuple) else DatasetSplit(d) for d in custom.datasets)
        check(custom, *first_batch(train, spec), spec)
        first = custom.datasets[0]
        origin = type(first[0] if isinstance(first, tuple) else first).__name__
    else:
        # Disjoint generator seeds for the two splits; the model itself is rebuilt by the factory each time.
        train = TensorSplit(*draw(custom.make_batch, config.custom_train_samples, config.seed * 2 + 1, spec))
        test = TensorSplit(*draw(custom.make_batch, config.custom_eval_samples, config.seed * 2 + 2, spec))
        check(custom, train.inputs, train.targets, spec)
        origin = "make_batch"
    info = DatasetInfo(name=f"custom:{spec}", kind="custom", num_classes=0, channels=0, image_size=0,
                       vocab_size=0, block_size=0, train_samples=len(train), eval_samples=len(test),
                       description=f"a {origin} from {spec}, read in order, and {len(test)} eval samples"
                       if isinstance(train, StreamSplit) else
                       f"{len(train)} train / {len(test)} eval samples from {spec} {origin}")
    first = [custom.model]  # the factory built one model already: hand it out once, then build afresh

    def build(gradient_checkpointing: bool) -> torch.nn.Module:
        model = first.pop() if first else build_custom(spec).model
        freeze(model, config.freeze)
        if gradient_checkpointing and how is not None:
            switch(model, how, True)
        return model

    return Task(info=info, train=train, eval=test, build=build, loss=custom.loss_fn,
                metrics=custom_metrics(info.kind, custom.metrics))


def stream_splits(config: Config, train, evaluation) -> tuple[BatchSplit, BatchSplit]:
    """A custom model's splits where its data is a stream (lib/data/stream.py): the training one read in order,
    CONFIG_MAX_STEPS steps at most; the evaluation set the first CONFIG_CUSTOM_EVAL_SAMPLES items of an
    evaluation stream, or of the one stream (held out from training in every pass), read once and kept."""
    spec, n = config.custom_model_factory, config.custom_eval_samples or 512
    if not is_stream(train):
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": the training data is a map-style dataset and the '
                          "evaluation data a stream: return both as streams, or a stream for training")
    if not config.max_steps:
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": the training data is a stream '
                          f"({type(train).__name__}), whose length kfit cannot know in advance: set CONFIG_MAX_STEPS "
                          "to the run's budget of optimizer steps (the LR schedule runs over it; a pass over the "
                          "stream is an epoch, CONFIG_EPOCHS of them at most)")
    split = StreamSplit(train, skip=0 if evaluation is not None else n, nominal=config.custom_train_samples or 4096)
    if evaluation is None:
        held = split.head(n)
    elif is_stream(evaluation):
        held = StreamSplit(evaluation).head(n)
    elif len(evaluation) < 1:
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": the evaluation dataset is empty: return one with '
                          "samples")
    else:
        return split, DatasetSplit(evaluation)
    if not held:
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": the evaluation stream yielded no items: return '
                          "one with items")
    return split, DatasetSplit(held)


def load_task(config: Config) -> Task:
    """Load the configured data and say how to build the model and compute the loss: what data a model
    trains on and how its config and data make its build arguments are the model registry's answers."""
    spec = spec_for(config.model)
    if spec.builder is None:
        return _custom_task(config)
    if spec.text:
        train, test, info = load_text_data(config.data_dir if config.dataset == "dir" else None,
                                           spec.block_size(config))
        vocabulary(config, info)  # data whose ids reach CONFIG_VOCAB_SIZE is refused now, not in a trace
    else:
        source = config.dataset_format if config.dataset == "dir" else "digits"
        train, test, info = load_image_data(source, config.data_dir, config.image_size)

    def build(gradient_checkpointing: bool) -> torch.nn.Module:
        model = build_model(config.model, grad_checkpointing=gradient_checkpointing, **spec.build_args(config, info))
        freeze(model, config.freeze)
        return model

    if config.freeze:  # a pattern that matches nothing is an error now, not when a trace or the trainer builds
        with torch.device("meta"):
            build(False)
    return Task(info=info, train=train, eval=test, build=build, loss=cross_entropy,
                metrics=builtin(info))


_LAST: dict[str, Task] = {}  # one slot: planning traces one model at a time, and its data is loaded once


def task_once(config: Config, key: str) -> Task:
    """load_task(config), kept for the next call with the same `key` (the model's fingerprint): the memory
    tracer, the sharded tracer's child and the step-time counter all plan from one loaded task."""
    if key not in _LAST:
        _LAST.clear()
        _LAST[key] = load_task(config)
    return _LAST[key]
