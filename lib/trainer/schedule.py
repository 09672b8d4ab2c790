"""The learning-rate schedule (CONFIG_LR_SCHEDULE_*): linear warm-up, then cosine or linear decay to
CONFIG_LR_MIN_RATIO of the peak, warm-up-stable-decay (WSD), constant, or a function of the user's."""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from typing import Callable

from ..redact import shown
from ..config import Config
from ..errors import ConfigError


def lr_at(config: Config, step: int, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based) of a run of `total_steps`."""
    peak = config.learning_rate
    if config.lr_schedule == "custom":
        return peak * _multiplier(config.lr_schedule_function or "", step, total_steps)
    if step < config.warmup_steps:
        return peak * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return peak
    floor = 0.1 if config.lr_min_ratio is None else config.lr_min_ratio
    span = max(1, total_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    if config.lr_schedule == "wsd":  # stable until the last LR_DECAY_FRACTION of the steps after warm-up
        fraction = config.lr_decay_fraction or 0.2
        progress = max(0.0, (progress - (1 - fraction)) / fraction)
        return peak * (1 - (1 - floor) * progress)
    if config.lr_schedule == "linear":
        return peak * (1 - (1 - floor) * progress)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _where(spec: str) -> str:
    return f'CONFIG_LR_SCHEDULE_FUNCTION="{spec}"'


@functools.lru_cache(maxsize=8)
def schedule_function(spec: str) -> tuple[Callable[..., float], int]:
    """CONFIG_LR_SCHEDULE_FUNCTION loaded once: (the function, how many arguments it takes: 1 or 2). Any
    failure is one ConfigError naming the setting (checked before a run starts: Trainer)."""
    module, _, name = spec.partition(":")
    try:
        found = functools.reduce(getattr, name.split("."), importlib.import_module(module))
    except (ImportError, AttributeError, SyntaxError) as err:
        raise ConfigError(f"{_where(spec)} cannot be loaded ({type(err).__name__}: {shown(' '.join(str(err).split()), 200)}"
                          "): put the module on Python's path (e.g. beside the config) and name a function in it") \
            from None
    if not callable(found):
        raise ConfigError(f"{_where(spec)} is a {type(found).__name__}, not a function of the step")
    try:
        positional = [p for p in inspect.signature(found).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        arguments = 2 if len(positional) >= 2 else 1
    except (TypeError, ValueError):  # a builtin without a signature: as LambdaLR calls it
        arguments = 1
    return found, arguments


def _multiplier(spec: str, step: int, total_steps: int) -> float:
    function, arguments = schedule_function(spec)
    try:
        value = function(step, total_steps) if arguments == 2 else function(step)
    except Exception as err:  # noqa: BLE001 - the user's code: one line, not a traceback from the loop
        raise ConfigError(f"{_where(spec)} raised {type(err).__name__} at step {step}: "
                          f"{shown(' '.join(str(err).split()), 200)}") from None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{_where(spec)} returned {type(value).__name__} at step {step}, not a number: return "
                          "the multiplier of the peak learning rate") from None
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{_where(spec)} returned {value} at step {step}: return a finite multiplier >= 0")
    return value


def check_schedule(config: Config) -> None:
    """Before a run: a schedule function of the user's loads and gives a rate at step 0."""
    if config.lr_schedule == "custom":
        _multiplier(config.lr_schedule_function or "", 0, max(1, config.max_steps or 1))
