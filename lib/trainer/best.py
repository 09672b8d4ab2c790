"""Best-k checkpoints and early stopping, both judged by CONFIG_CHECKPOINT_BEST_METRIC after each evaluation.

Their state lives in `Progress` (windows.py): `best`, the best evaluations as [step, value], best first
(the best-<step> checkpoints the run keeps), and `early_best` / `stale_evals` for early stopping. A
checkpoint carries it, so a resumed run ranks and counts exactly as an uninterrupted one; best-<step> files
that a resume from an older checkpoint left out of `best` are deleted at the next prune.
"""

from __future__ import annotations

from ..config import Config
from ..errors import ConfigError
from ..metrics import Metrics
from .windows import Progress


def check_metric(config: Config, metrics: Metrics, model: str) -> bool:
    """Before training: the configured metric must be one this task's evaluation reports, in a direction
    known (its Metric's higher_is_better, or its name). Returns whether lower values are better."""
    metric = config.checkpoint_best_metric
    if not (config.checkpoint_best_keep or config.early_stop_patience) or metric is None:
        return True
    if metric not in metrics.names:
        raise ConfigError(f'CONFIG_CHECKPOINT_BEST_METRIC="{metric}": the evaluation of {model} reports '
                          f"{', '.join(metrics.names)}, not {metric}: set it to one of those")
    lower = metrics.lower_is_better(metric)
    if lower is None:
        raise ConfigError(f'CONFIG_CHECKPOINT_BEST_METRIC="{metric}": its Metric does not say whether higher '
                          "is better: set higher_is_better on its class, or rank by another metric")
    return lower


def improved(value: float, best: float, lower: bool, delta: float = 0.0) -> bool:
    return value < best - delta if lower else value > best + delta


def judge(config: Config, progress: Progress, step: int, metrics: dict, lower: bool) -> tuple[bool, str | None]:
    """Update the progress's best-k list and early-stopping count with an evaluation at `step` (`lower`: whether
    lower values of the metric are better). Returns (whether it is among the best k: save best-<step>, why to
    stop early or None)."""
    metric = config.checkpoint_best_metric
    value = float(metrics[metric])
    entered = False
    keep = config.checkpoint_best_keep
    if keep and value == value and all(s != step for s, _ in progress.best):  # NaN never ranks; a step once
        ranked = sorted([*progress.best, [step, value]], key=lambda e: e[1] if lower else -e[1])  # stable: ties
        progress.best = ranked[:keep]                                                       # keep the earlier
        entered = any(s == step for s, _ in progress.best)
    patience = config.early_stop_patience
    if not patience:
        return entered, None
    delta = config.early_stop_min_delta or 0.0
    if progress.early_best is None or improved(value, progress.early_best[1], lower, delta):
        progress.early_best, progress.stale_evals = [step, value], 0
        return entered, None
    progress.stale_evals += 1
    if progress.stale_evals < patience:
        return entered, None
    best_step, best_value = progress.early_best
    return entered, (f"Early stop at step {step}: {metric} has not improved on {best_value:.4g} (step {best_step})"
                     f"{f' by more than {delta:g}' if delta else ''} for {progress.stale_evals} evaluations "
                     f"(CONFIG_EARLY_STOP_PATIENCE={patience})")
