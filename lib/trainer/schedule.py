"""The learning-rate schedule: linear warm-up, then cosine decay to 10% or constant."""

from __future__ import annotations

import math

from ..config import Config


def lr_at(config: Config, step: int, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then cosine to 10% or constant."""
    peak = config.learning_rate
    if step < config.warmup_steps:
        return peak * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return peak
    span = max(1, total_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
