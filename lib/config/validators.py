"""The rules a Kconfig option has that Kconfig cannot state, each registered under its option's name
(lib/config/rules.py's `validator`) and run by lib/config/options.py whenever a config is read: each a
ConfigError naming the option and the fix. An option whose only rules are its type, its range and its
dependencies needs none. `options` is the config's lib.config.options.Options."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .rules import validator


@validator("data_prefetch_factor")
def prefetch_needs_workers(factor: Any, options: Any) -> None:
    """CONFIG_DATA_PREFETCH_FACTOR, which only loader worker processes use: refused with MANUAL 0 workers."""
    if factor and options.dataloader_workers_mode == "manual" and not options.dataloader_workers:
        raise ConfigError(f"CONFIG_DATA_PREFETCH_FACTOR={factor} needs data loader worker processes: set "
                          "CONFIG_DATALOADER_WORKERS above 0, or CONFIG_DATA_PREFETCH_FACTOR=0")


@validator("gpt2_width")
def gpt2_width_splits_into_heads(width: Any, options: Any) -> None:
    """CONFIG_GPT2_WIDTH, which the attention splits into CONFIG_GPT2_HEADS heads of equal width."""
    if width is not None and width % options.gpt2_heads:
        raise ConfigError(f"CONFIG_GPT2_WIDTH={width} is not a multiple of CONFIG_GPT2_HEADS={options.gpt2_heads}: "
                          f"choose a width that is (e.g. {max(1, width // options.gpt2_heads) * options.gpt2_heads}) "
                          "or another head count")
