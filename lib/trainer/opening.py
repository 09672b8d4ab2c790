"""The start of a run, before its first step: the run's files, its first lines (the data, the model with its
trainable and total parameters, the steps) and the monitor and trackers, opened in that order so that a file
kfit refuses (a link planted in the run directory, say) leaves nothing open and the directory let go.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from .. import tracking
from ..data.stream import StreamSplit, resume_note
from ..monitor import Monitor
from ..redact import shown
from .ending import quietly
from ..models.registry import label as model_label

if TYPE_CHECKING:
    import torch

    from .. import distributed
    from ..config import Config
    from ..data import DatasetInfo
    from ..hardware import HardwareProfile
    from ..plan import Plan
    from .conditions import Sensors
    from .engine import Engine
    from .rundir import RunDirectory
    from .windows import Progress


class Opening(Protocol):
    """What the start of a run reads of the run (the Trainer has it), and the monitor it sets."""

    config: "Config"
    plan: "Plan"
    hardware: "HardwareProfile"
    rank: "distributed.Rank"
    device: "torch.device"
    directory: "RunDirectory"
    info: "DatasetInfo"
    train_split: object
    progress: "Progress"
    resumed_from: Path | None
    total_steps: int
    engine: "Engine"
    sensors: "Sensors"
    monitor: Monitor | None
    log: Callable[[str], None]

    @property
    def run_dir(self) -> Path: ...


def model_line(trainer: Opening) -> str:
    config, plan, p = trainer.config, trainer.plan, trainer.progress
    return (f"Model: {model_label(config)}, "
            f"{trainer.engine.trainable_parameters:,} trainable / {trainer.engine.parameters:,} parameters"
            + (f" (CONFIG_FREEZE: {', '.join(config.freeze)})" if config.freeze else "")
            + f", on {plan.device_type} ({plan.precision}); "
            f"{trainer.total_steps} optimizer steps of {p.window_size} samples"
            + (f" over {trainer.rank.world_size} processes" if trainer.rank.active else ""))


def open_run(trainer: Opening) -> None:
    """Write the run's files, say what trains, and open trainer.monitor (and its trackers on rank 0)."""
    config, plan, log = trainer.config, trainer.plan, trainer.log
    main = trainer.rank.is_main
    try:
        trainer.directory.write_files(config, plan, trainer.hardware)
        log(f"Data: {trainer.info.description}")
        if isinstance(trainer.train_split, StreamSplit) and not trainer.train_split.stateful:
            p = trainer.progress  # a stream without state: what a resume does (lib/data/stream.py)
            log(resume_note(trainer.train_split, p.window * p.window_size if trainer.resumed_from else 0))
        log(model_line(trainer))
        events = ("; TensorBoard events in tensorboard/ (tensorboard --logdir "
                  f"{trainer.run_dir / 'tensorboard'})" if "tensorboard" in config.tracking else "")
        log(f"Run directory: {shown(trainer.run_dir, 1000)} ('make report' draws its curves into report.html there{events})")
        trainer.monitor = Monitor(
            trainer.run_dir, trainer.total_steps, trainer.device, trainer.hardware,
            interval_s=(config.monitor_interval_ms or 1000) / 1000, telemetry=config.monitor,
            tokens_per_sample=trainer.info.block_size or 0, log=log, enabled=config.monitor,
            append=trainer.resumed_from is not None, write_metrics=main, gpu=trainer.sensors.gpu, plan=plan)
        if main and config.tracking:  # opened once metrics.jsonl is, so that a refused one leaves none open
            trainer.monitor.tracking = tracking.Tracking.open(
                config.tracking, run_dir=trainer.run_dir, run_name=trainer.run_dir.name,
                params=tracking.params_of(config.text, plan.to_dict()),
                project=config.tracking_project or "kfit", output_dir=Path(config.output_dir))
    except BaseException:
        if trainer.monitor is not None:
            quietly(log, "closing the monitor", trainer.monitor.close)
        if trainer.resumed_from is None:  # a new run that never started leaves no empty run behind
            quietly(log, "removing the unstarted run directory", trainer.directory.discard_unstarted)
        trainer.directory.release()
        raise
