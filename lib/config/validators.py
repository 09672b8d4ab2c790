"""The rules a Kconfig option has that Kconfig cannot state, each registered under its option's name
(lib/config/rules.py's `validator`) and run by lib/config/options.py whenever a config is read: each a
ConfigError naming the option and the fix. An option whose only rules are its type, its range and its
dependencies needs none. `options` is the config's lib.config.options.Options."""

from __future__ import annotations

import re
from typing import Any

from ..errors import ConfigError
from .rules import number, validator

# Numbers held in string symbols (Kconfig has no float type), read as floats within their bounds
number("gpt2_dropout", low=0, high=1, high_open=True)
number("dropout", low=0, high=1, high_open=True)
number("llama_rope_theta", low=1)
number("sgd_momentum", low=0, high=1, high_open=True)
number("learning_rate", low=0, low_open=True)
number("weight_decay", low=0)
number("lr_min_ratio", low=0, high=1)
number("lr_decay_fraction", low=0, low_open=True, high=1)
number("grad_clip", low=0)
number("early_stop_min_delta", low=0)
number("lr_finder_min_lr", low=0, low_open=True)
number("lr_finder_max_lr", low=0, low_open=True)
number("lr_finder_smoothing", low=0, high=1, low_open=True)
number("lr_finder_diverge", low=1, low_open=True)
number("hpo_lr_min", low=0, low_open=True)
number("hpo_lr_max", low=0, low_open=True)
number("hpo_wd_min", low=0, low_open=True)
number("hpo_wd_max", low=0, low_open=True)


def _ordered(low_name: str, low: float | None, high_name: str, high: float | None) -> None:
    if low is not None and high is not None and low >= high:
        raise ConfigError(f"CONFIG_{low_name}={low:g} must be below CONFIG_{high_name}={high:g}")


@validator("lr_finder_max_lr")
def lr_finder_range(high: Any, options: Any) -> None:
    _ordered("LR_FINDER_MIN_LR", options.lr_finder_min_lr, "LR_FINDER_MAX_LR", high)


@validator("hpo_lr_max")
def hpo_lr_range(high: Any, options: Any) -> None:
    _ordered("HPO_LR_MIN", options.hpo_lr_min, "HPO_LR_MAX", high)


@validator("hpo_wd_max")
def hpo_wd_range(high: Any, options: Any) -> None:
    _ordered("HPO_WD_MIN", options.hpo_wd_min, "HPO_WD_MAX", high)


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


@validator("thermal_pause_at_c")
def thermal_range(pause_at: Any, options: Any) -> None:
    """THERMAL_PAUSE: training resumes below CONFIG_THERMAL_RESUME_BELOW_C, which must be below the pause."""
    if options.thermal == "pause":
        _ordered("THERMAL_RESUME_BELOW_C", options.thermal_resume_below_c, "THERMAL_PAUSE_AT_C", pause_at)


_FUNCTION = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def _function(name: str):
    def check(value: Any, options: Any) -> None:
        if value is not None and not _FUNCTION.fullmatch(value):
            raise ConfigError(f'CONFIG_{name}="{value}" must look like package.module:function')
    return check


validator("custom_model_factory")(_function("CUSTOM_MODEL_FACTORY"))
validator("lr_schedule_function")(_function("LR_SCHEDULE_FUNCTION"))


@validator("optimizer_name")
def optimizer_name(name: Any, options: Any) -> None:
    """CONFIG_OPTIMIZER_NAME: a torch.optim class (Adagrad) or a package.module:function of the user's."""
    if name is not None and not re.fullmatch(r"[A-Za-z_]\w*|[A-Za-z_][\w.]*:[A-Za-z_]\w*", name):
        raise ConfigError(f'CONFIG_OPTIMIZER_NAME="{name}" must be a torch.optim class name such as Adagrad, or '
                          'package.module:function')


@validator("checkpoint_best_metric")
def metric_name(metric: Any, options: Any) -> None:
    """The metric best-k checkpoints and early stopping follow: a name (whether this model's evaluation reports
    it is checked when training starts: lib/trainer/best.py)."""
    if metric is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", metric):
        raise ConfigError(f'CONFIG_CHECKPOINT_BEST_METRIC="{metric}" is not a metric name: use eval_loss (every '
                          "model), accuracy (image models), perplexity (text models) or a custom model's own")


@validator("hpo_max_resource")
def hpo_resources(high: Any, options: Any) -> None:
    low = options.hpo_min_resource
    if low is not None and high is not None and low > high:
        raise ConfigError(f"CONFIG_HPO_MIN_RESOURCE={low} must not exceed CONFIG_HPO_MAX_RESOURCE={high}")
