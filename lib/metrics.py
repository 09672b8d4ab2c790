"""Evaluation metrics through torchmetrics: the built-in models' usual ones and a custom model's own.

An image classifier reports accuracy, top-5 accuracy (more than five classes) and macro-F1 (the mean over the
classes that occur among the labels or the predictions of each class's F1); a text model its perplexity, from
the evaluation loss. A custom model's factory may return torchmetrics `Metric` objects as a fourth value (one,
a mapping of names to them, or a MetricCollection): each is updated with (outputs, targets) on every
evaluation batch, computed across the ranks that evaluated, logged under its name, and may be ranked by
CONFIG_CHECKPOINT_BEST_METRIC, early stopping and an HPO objective, in the direction its `higher_is_better` says.
"""

from __future__ import annotations

import copy
import math
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable

import torch

from .data import DatasetInfo
from .errors import ConfigError

if TYPE_CHECKING:
    from torchmetrics import Metric

DERIVED = ("eval_loss", "perplexity")  # names kfit computes from the loss itself
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Metrics:
    """The metrics one task's evaluation reports. `directions`: each metric's name and whether higher is
    better (None: not known); `build()`: the Metric objects, not updated yet, called at the first evaluation
    (importing torchmetrics costs a second or more: planning never does). Each evaluation updates copies, on its
    device, and computes them (across the ranks, by torchmetrics' own sync, where several evaluated)."""

    def __init__(self, kind: str, directions: Mapping[str, bool | None],
                 build: Callable[[], Mapping[str, Metric]] = dict) -> None:
        self.kind, self.directions, self.build = kind, dict(directions), build
        self._templates: dict | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """Every name an evaluation reports: eval_loss, the metrics, perplexity for text models."""
        return ("eval_loss", *self.directions, *(("perplexity",) if self.kind == "text" else ()))

    def lower_is_better(self, name: str) -> bool | None:
        higher = self.directions[name] if name in self.directions else higher_is_better(name, None)
        return None if higher is None else not higher

    def fresh(self, device: torch.device) -> dict[str, Metric]:
        if self._templates is None:
            self._templates = dict(self.build())
        return {name: copy.deepcopy(m).to(device) for name, m in self._templates.items()}

    def finish(self, running: Mapping[str, Metric], loss: float) -> dict[str, float]:
        """The evaluation's figures: the mean loss (summed across ranks already), each metric as one number."""
        result = {"eval_loss": loss}
        for name, metric in running.items():
            value = metric.compute()
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if not isinstance(value, (int, float)):
                raise ConfigError(f"the metric {name} ({type(metric).__name__}) computed "
                                  f"{type(value).__name__}{_shape(value)}, not one number: give it an average= "
                                  "that reduces to a scalar, or drop it")
            result[name] = float(value)
        if self.kind == "text":
            result["perplexity"] = math.exp(min(loss, 50.0))
        return result


def builtin(info: DatasetInfo) -> Metrics:
    """A built-in model's usual metrics: an image classifier's accuracy, top-5 accuracy (more than five
    classes) and macro-F1; a text model's perplexity (from the loss)."""
    k = info.num_classes
    if info.kind != "image":
        return Metrics(info.kind, {})
    names = ("accuracy", *(("top5_accuracy",) if k > 5 else ()), "macro_f1")

    def build() -> dict[str, Metric]:
        from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

        made = {"accuracy": lambda: MulticlassAccuracy(k, average="micro"),
                "top5_accuracy": lambda: MulticlassAccuracy(k, top_k=5, average="micro"),
                "macro_f1": lambda: MulticlassF1Score(k, average="macro")}
        return {name: made[name]() for name in names}
    return Metrics(info.kind, dict.fromkeys(names, True), build)


def custom(kind: str, metrics: Mapping[str, Metric] | None) -> Metrics:
    """A custom model's metrics, as its factory returned them (named())."""
    metrics = dict(metrics or {})
    return Metrics(kind, {name: higher_is_better(name, m) for name, m in metrics.items()}, lambda: metrics)


def snake_name(metric) -> str:
    """A metric's default name, from its class: MulticlassAccuracy -> accuracy, BinaryF1Score -> f1_score,
    MeanSquaredError -> mean_squared_error, AUROC -> auroc."""
    name = re.sub(r"^(Multiclass|Multilabel|Binary)(?=[A-Z])", "", type(metric).__name__)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name))
    return name.lower()


def named(value, where: str) -> dict[str, Metric]:
    """A factory's fourth value as {name: Metric}: a Metric (named after its class), a mapping of names to
    Metrics, or a MetricCollection; anything else is a ConfigError starting with `where`. (A value that is a
    Metric was made by torchmetrics, imported already: nothing is imported here for the check.)"""
    loaded = sys.modules.get("torchmetrics")
    metric_type = loaded.Metric if loaded is not None else ()
    if loaded is not None and isinstance(value, loaded.MetricCollection):
        value = dict(value.items(keep_base=True))
    elif isinstance(value, metric_type):
        value = {snake_name(value): value}
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(f"{where}: the fourth value returned must be a torchmetrics Metric, a mapping of names "
                          f"to Metrics or a MetricCollection, not {type(value).__name__}")
    found = {}
    for name, metric in value.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in DERIVED:
            raise ConfigError(f"{where}: the metric name {name!r} is not usable: name each metric with a Python "
                              f"identifier other than {' and '.join(DERIVED)} (e.g. accuracy)")
        if not isinstance(metric, metric_type):
            raise ConfigError(f"{where}: the metric {name} is a {type(metric).__name__}, not a torchmetrics "
                              "Metric (e.g. torchmetrics.Accuracy(task='multiclass', num_classes=10))")
        found[name] = metric
    return found


def higher_is_better(name: str, metric) -> bool | None:
    """Which way a metric improves: as a torchmetrics Metric says, else by its name (losses, errors and
    perplexities are lower-better, accuracies and F1 scores higher-better); None where neither says."""
    said = getattr(metric, "higher_is_better", None)
    if isinstance(said, bool):
        return said
    lowered = name.lower()
    if "loss" in lowered or "perplexity" in lowered or "error" in lowered:
        return False
    if "accuracy" in lowered or "f1" in lowered:
        return True
    return None


def _shape(value) -> str:
    return f" of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else ""
