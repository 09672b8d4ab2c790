"""Bring your own model: CONFIG_CUSTOM_MODEL_FACTORY="package.module:function".

The factory takes no arguments and returns (model, make_batch, loss_fn):

    model       a torch.nn.Module; model(inputs) -> outputs
    make_batch  make_batch(batch_size, generator) -> (inputs, targets), CPU tensors
                with the sample in dimension 0, drawn with the given torch.Generator
    loss_fn     loss_fn(outputs, targets) -> scalar mean loss over the batch

kfit draws the training and evaluation sets from make_batch once (seeded), so
batches, accumulation, out-of-memory recovery and resume treat them exactly
like a built-in data set; the memory planner traces model + loss_fn on an
example batch of any size.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent.parent

MakeBatch = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class CustomModel:
    model: torch.nn.Module
    make_batch: MakeBatch
    loss_fn: LossFn


def load_factory(spec: str) -> Callable[[], object]:
    """Import `package.module:function`, with the current directory and the kfit checkout importable."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}" must look like package.module:function')
    for path in (os.getcwd(), str(ROOT)):
        if path not in sys.path:
            sys.path.append(path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": cannot import {module_name}: {err}. '
                          "Put the module in the directory you run make from, or on PYTHONPATH") from None
    target = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": {module_name} has no {attr}')
    if not callable(target):
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": {attr} is not callable')
    return target


def build_custom(spec: str) -> CustomModel:
    """Call the factory and check what it returned."""
    result = load_factory(spec)()
    if isinstance(result, CustomModel):
        return result
    if not (isinstance(result, (tuple, list)) and len(result) == 3):
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}" must return (model, make_batch, loss_fn); '
                          f"it returned {type(result).__name__}")
    model, make_batch, loss_fn = result
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": the first value returned must be a '
                          f"torch.nn.Module, not {type(model).__name__}")
    for name, fn in (("make_batch", make_batch), ("loss_fn", loss_fn)):
        if not callable(fn):
            raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": {name} is not callable')
    return CustomModel(model, make_batch, loss_fn)


def draw(make_batch: MakeBatch, samples: int, seed: int, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`samples` examples from make_batch with a generator seeded by `seed`, checked for shape."""
    batch = make_batch(samples, torch.Generator().manual_seed(seed))
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2
            and all(isinstance(t, torch.Tensor) for t in batch)):
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": make_batch must return '
                          "(inputs, targets) tensors")
    inputs, targets = batch
    if len(inputs) != samples or len(targets) != samples:
        raise ConfigError(f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}": make_batch({samples}, generator) returned '
                          f"{len(inputs)} inputs and {len(targets)} targets; both need {samples} in dimension 0")
    return inputs.cpu(), targets.cpu()
