"""Experiment tracking: what metrics.jsonl records, also sent to TensorBoard, Weights & Biases and/or MLflow.

metrics.jsonl stays the run's own record (lib/monitor.py writes it, always);
each sink selected in Kconfig (CONFIG_TRACK_TENSORBOARD, _WANDB, _MLFLOW, any
combination) gets the same lines as they are written, through the monitor:

  numbers of a line with a "step"   scalars at that step (loss, lr, eval_loss, accuracy,
                                    samples_per_s, ...); nested and text values are left out
  a line with an "event"            TensorBoard: text under "events"; W&B and MLflow: left
                                    to metrics.jsonl (they chart numbers)

At the start each sink gets the run's name, and the config's symbols and the
plan's fields as hyperparameters (`params`). Where they go:

  TensorBoard  <run dir>/tensorboard (torch.utils.tensorboard; `tensorboard --logdir runs`)
  W&B          project CONFIG_TRACKING_PROJECT, files under <run dir>/wandb; WANDB_MODE,
               WANDB_API_KEY and the rest of W&B's own variables apply (WANDB_MODE=offline: no network)
  MLflow       experiment CONFIG_TRACKING_PROJECT at MLFLOW_TRACKING_URI (MLflow's variable), else
               sqlite:///<output dir>/mlflow.db, a local store (`mlflow ui --backend-store-uri <it>`)

Each package is optional (pip extras kfit[tensorboard], kfit[wandb],
kfit[mlflow]) and imported only when its sink is selected; a missing one is
one error naming the pip command, before training starts (`check`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path
from urllib.parse import urlsplit

from .errors import KfitError
from .env import environ
from .redact import shown

SINKS = {  # sink -> (the module it needs, the pip command)
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "pip install wandb"),
    "mlflow": ("mlflow", "pip install mlflow-skinny  (or mlflow)"),
}
FIXES = {  # what to do when a sink cannot start
    "tensorboard": "check that the run directory is writable",
    "wandb": "run 'wandb login', or set WANDB_MODE=offline to log locally and 'wandb sync' later",
    "mlflow": "check MLFLOW_TRACKING_URI (unset: a local sqlite store under CONFIG_OUTPUT_DIR)",
}
PARAM_VALUE_CHARS = 500  # MLflow refuses longer parameter values than its limit; long ones are cut


def check(sinks: tuple[str, ...]) -> None:
    """Every selected sink's package is installed, else one error naming the pip command."""
    for sink in sinks:
        module, pip = SINKS[sink]
        if importlib.util.find_spec(module) is None:
            raise KfitError(f"CONFIG_TRACK_{sink.upper()}=y needs the {module} package, which is not installed: "
                            f"{pip} (or set CONFIG_TRACK_{sink.upper()}=n)")


def scalars(record: dict) -> dict[str, float]:
    """The finite numbers of a metrics line, by name (bools and the step itself left out)."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def params_of(config_text: str, plan: dict) -> dict[str, str]:
    """Hyperparameters: every CONFIG_ symbol the config sets, and the plan's scalar fields as plan.<name>."""
    out = {}
    for line in config_text.splitlines():
        if line.startswith("CONFIG_") and "=" in line:
            key, value = line.split("=", 1)
            out[key] = value.strip('"')
    for key, value in plan.items():
        if value is None or isinstance(value, (str, int, float, bool)):
            out[f"plan.{key}"] = str(value)
    return {k: v[:PARAM_VALUE_CHARS] for k, v in out.items()}


class TensorBoardSink:
    def __init__(self, run_dir: Path, run_name: str, params: dict[str, str]) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        # add_hparams would open a second run directory; its summaries go into this one instead
        for summary in hparams(params, {}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("run", run_name, 0)

    def log(self, record: dict) -> None:
        step = record.get("step")
        if "event" in record:
            self.writer.add_text("events", json.dumps(record, default=str), int(step or 0))
        elif step is not None:
            for name, value in scalars(record).items():
                self.writer.add_scalar(name, value, int(step))

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, run_name: str, params: dict[str, str], project: str) -> None:
        import wandb

        self.run = wandb.init(project=project, name=run_name, config=params, dir=str(run_dir), reinit="finish_previous")

    def log(self, record: dict) -> None:
        if "event" not in record and record.get("step") is not None and (values := scalars(record)):
            self.run.log(values, step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


# MLflow retries an unreachable server for minutes with its defaults (5 tries, 120 s each): a run that cannot
# start its tracker hung before its first step. The user's own settings win.
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}


class MlflowSink:
    def __init__(self, run_name: str, params: dict[str, str], project: str, uri: str) -> None:
        for name, value in MLFLOW_HTTP_DEFAULTS.items():
            environ().setdefault(name, value)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)  # no global state: a user's own mlflow runs are untouched
        found = self.client.get_experiment_by_name(project)
        experiment = found.experiment_id if found else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment, run_name=run_name).info.run_id
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log(self, record: dict) -> None:
        from mlflow.entities import Metric

        if "event" in record or record.get("step") is None:
            return
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(record["step"])) for k, v in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Tracking:
    """The selected sinks as one: `log(record)` for each metrics.jsonl line, `close()` at the end."""

    def __init__(self, sinks: list) -> None:
        self.sinks = sinks

    @classmethod
    def open(cls, selected: tuple[str, ...], *, run_dir: Path, run_name: str, params: dict[str, str],
             project: str, output_dir: Path) -> Tracking:
        check(selected)
        sinks = []
        for sink in selected:
            try:
                if sink == "tensorboard":
                    sinks.append(TensorBoardSink(run_dir, run_name, params))
                elif sink == "wandb":
                    sinks.append(WandbSink(run_dir, run_name, params, project))
                elif sink == "mlflow":
                    uri = (environ().get("MLFLOW_TRACKING_URI")
                           or f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}")
                    sinks.append(MlflowSink(run_name, params, project, uri))
            except Exception as err:  # noqa: BLE001 - a tracker's own failure (login, server, store) is one line
                for started in sinks:
                    started.close()
                text = " ".join(str(err).split())
                # the tracking URI's user-info, a password or a token alone (https://TOKEN@host), wherever it
                # appears; then every other credential (shown), redacted before the message is cut
                userinfo = urlsplit(environ().get("MLFLOW_TRACKING_URI") or "").netloc.rpartition("@")[0]
                if len(userinfo) >= 4:
                    text = text.replace(userinfo, "***")
                raise KfitError(f"CONFIG_TRACK_{sink.upper()}=y: the {sink} run could not start "
                                f"({type(err).__name__}: {shown(text, 200)}); {FIXES[sink]}") from None
        return cls(sinks)

    def log(self, record: dict) -> None:
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []
