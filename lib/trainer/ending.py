"""The end of a run, after its last step: the final evaluation and the final checkpoint first, then the
bookkeeping that cannot lose what was trained (the step-time report and calibration, the last metrics line,
closing the monitor and the trackers): each of those that fails is one warning line, and the run still ends
with its checkpoint saved and its result returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

from ..redact import shown

if TYPE_CHECKING:
    from ..config import Config
    from ..monitor import Monitor
    from .checkpoints import Checkpoints
    from .timing import StepTimer
    from .windows import Progress


class Ending(Protocol):
    """What the end of a run reads of the run and asks it to do (the Trainer has it)."""

    config: "Config"
    progress: "Progress"
    checkpoints: "Checkpoints"
    timer: "StepTimer"
    monitor: "Monitor"
    log: Callable[[str], None]

    def log_eval(self, step: int, epoch: int, final: bool = False, result: dict | None = None) -> dict: ...

# Why training stopped, as the "Saved ..." line says it.
STOP_REASONS = {"epochs": "{epochs} epoch(s) done", "max_steps": "CONFIG_MAX_STEPS reached",
                "time_limit": "CONFIG_TIME_LIMIT reached", "early_stop": "CONFIG_EARLY_STOP_PATIENCE reached"}


def quietly(log: Callable[[str], None], what: str, action: Callable[[], None], said: str | None = None) -> None:
    """`action`, once nothing it does can change a checkpoint: its failure is one warning line (after `said`,
    the line `action` would have shown), never an exception."""
    try:
        action()
    except Exception as err:  # noqa: BLE001 - the run's result is on disk already
        if said is not None:
            log(said)
        log(f"warning: {what} failed ({type(err).__name__}: {shown(' '.join(str(err).split()), 200)}); "
            "the checkpoints are unaffected")


def finish(trainer: Ending, history: list[dict], stop_reason: str, seconds: float) -> dict:
    """The final evaluation (every rank) and checkpoint (on the ranks that save), then the step-time report and the "Saved"
    line; returns the final metrics. What fails after the checkpoint is a warning."""
    t, p, final, path = trainer, trainer.progress, {}, None
    # early stopping has just evaluated this very step: its metrics are the final ones; else every rank
    # evaluates its share
    last = history[-1] if stop_reason == "early_stop" else {}
    measured = {k: v for k, v in last.items() if k not in ("step", "epoch")} or None
    entry = t.log_eval(p.step, t.checkpoints.epochs_begun(), final=True, result=measured)
    if t.checkpoints.saves:
        history.append(entry)
        t.checkpoints.judge(entry, final=True)
        final = {k: v for k, v in entry.items() if k not in ("step", "epoch", "final")}
        path = t.checkpoints.save_final(final)
    quietly(t.log, "the step-time report", t.timer.finish)
    if path is not None:
        why = STOP_REASONS.get(stop_reason, stop_reason).format(epochs=t.config.epochs)
        saved = f"Saved {shown(path, 1000)} ({why}: {p.step} steps, {p.samples:,} samples in {seconds:.1f}s)"
        # through the monitor: on a terminal it clears the progress bar first instead of joining it
        quietly(t.log, "writing metrics.jsonl's last line", lambda: t.monitor.event(
            "finished", saved, path=str(path), stop_reason=stop_reason), said=saved)
    return final
