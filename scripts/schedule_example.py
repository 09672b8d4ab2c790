"""An example learning-rate schedule for CONFIG_LR_SCHEDULE_CUSTOM (the default CONFIG_LR_SCHEDULE_FUNCTION).

A schedule function takes the optimizer step (from 0), and optionally the run's total steps, and returns the
multiplier of CONFIG_LEARNING_RATE, as torch.optim.lr_scheduler.LambdaLR's lr_lambda does. Copy this file
beside your config, change it, and name it: CONFIG_LR_SCHEDULE_FUNCTION="my_schedule:inverse_sqrt".
"""

import math

WARMUP_STEPS = 100


def inverse_sqrt(step: int) -> float:
    """Linear warm-up over WARMUP_STEPS, then decay as 1/sqrt(step): the original Transformer's schedule."""
    step += 1
    return min(step / WARMUP_STEPS, math.sqrt(WARMUP_STEPS / step))


def linear_to_zero(step: int, total_steps: int) -> float:
    """A two-argument schedule: straight down from the peak to zero at the run's last step."""
    return max(0.0, 1.0 - step / max(1, total_steps))
