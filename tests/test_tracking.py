"""Experiment tracking (lib/tracking.py): each sink's own reader gets back what the run logged."""

from __future__ import annotations

import json
import time

import pytest

from lib.errors import KfitError
from lib.tracking import Tracking, check, params_of, scalars

LINES = [{"step": 1, "loss": 2.5, "lr": 0.001, "samples_per_s": 100.0, "epoch": 0.1},
         {"event": "oom", "step": 1, "micro_batch": 4},
         {"step": 2, "loss": 2.0, "lr": 0.002, "note": "text is left out", "nested": {"a": 1}},
         {"step": 2, "eval_loss": 1.9, "perplexity": 6.7, "nan": float("nan")}]
PARAMS = params_of('CONFIG_MODEL_GPT2=y\nCONFIG_LEARNING_RATE="0.001"\n# CONFIG_X is not set\n',
                   {"micro_batch": 8, "precision": "fp32", "reasons": {"a": "b"}})


def test_scalars_and_params_keep_what_a_tracker_can_chart():
    assert scalars(LINES[2]) == {"loss": 2.0, "lr": 0.002}
    assert scalars(LINES[3]) == {"eval_loss": 1.9, "perplexity": 6.7}
    assert PARAMS == {"CONFIG_MODEL_GPT2": "y", "CONFIG_LEARNING_RATE": "0.001", "plan.micro_batch": "8",
                      "plan.precision": "fp32"}


def run(tmp_path, sink):
    tracking = Tracking.open((sink,), run_dir=tmp_path / "run", run_name="gpt2-tiny-test", params=PARAMS,
                             project="kfit-test", output_dir=tmp_path)
    for line in LINES:
        tracking.log(line)
    tracking.close()


def test_tensorboard_event_files_read_back_with_tensorboards_reader(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(tmp_path, "tensorboard")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 2.5), (2, 2.0)]
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("eval_loss")] == [(2, 1.9)]
    assert "events" in " ".join(events.Tags()["tensors"])  # the oom event, as text


def wandb_records(path):
    """The protobuf records of an offline W&B run file: W&B's 7-byte header (":W&B", magic, version),
    then LevelDB's log format (32 KiB blocks; records of a 4-byte checksum, 2-byte length and 1-byte
    type, split over blocks as FIRST, MIDDLE..., LAST). wandb ships no reader of its own any more."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb_offline_run_reads_back(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run(tmp_path, "wandb")
    [path] = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))

    def read():
        history, config = [], {}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                history.append({".".join(i.nested_key) or i.key: json.loads(i.value_json)
                                for i in record.history.item})
            elif kind == "run":
                assert record.run.display_name == "gpt2-tiny-test" and record.run.project == "kfit-test"
                config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        return history, config

    # W&B's service process writes the file; on a loaded machine (the full suite on 2 cores) it was seen
    # still unwritten right after run.finish() returned once
    deadline = time.monotonic() + 30
    while len((found := read())[0]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    history, config = found
    assert [(h["_step"], h.get("loss"), h.get("eval_loss")) for h in history] == [(1, 2.5, None), (2, 2.0, 1.9)]
    assert config["CONFIG_LEARNING_RATE"] == "0.001" and config["plan.micro_batch"] == "8"


def test_mlflow_local_store_reads_back(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run(tmp_path, "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    [found] = client.search_runs([client.get_experiment_by_name("kfit-test").experiment_id])
    assert found.info.run_name == "gpt2-tiny-test" and found.info.status == "FINISHED"
    assert found.data.params["CONFIG_LEARNING_RATE"] == "0.001"
    history = client.get_metric_history(found.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 2.5), (2, 2.0)]


def test_a_missing_package_is_one_error_with_the_pip_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(KfitError, match=r"CONFIG_TRACK_WANDB=y needs the wandb package.*pip install wandb"):
        check(("wandb",))


def test_a_run_with_the_tensorboard_sink_writes_the_loss_curve_it_logs(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lib import config as kc
    from lib.hardware import resolve_hardware
    from lib.hyperparams import ModelDescription, resolve
    from lib.trainer import Trainer

    (tmp_path / "fragment").write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\n'
                                       "CONFIG_MAX_STEPS=4\nCONFIG_LOG_INTERVAL=1\nCONFIG_TRACK_TENSORBOARD=y\n")
    config = kc.make_defconfig("lenet5", [str(tmp_path / "fragment")], out=tmp_path / "config")
    assert config.tracking == ("tensorboard",)
    cpu = resolve_hardware(gpu="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = Trainer(config, resolve(config, cpu, ModelDescription.from_config(config)), cpu,
                         log=lambda line: None).fit()
    finally:
        torch.set_num_threads(threads)
    logged = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in logged if "loss" in r and "event" not in r]
    events = EventAccumulator(str(result.run_dir / "tensorboard"))
    events.Reload()
    curve = events.Scalars("loss")  # float32 in the event file
    assert len(losses) == 4 and [e.step for e in curve] == [step for step, _ in losses]
    assert [e.value for e in curve] == pytest.approx([loss for _, loss in losses], rel=1e-6)
    assert [e.step for e in events.Scalars("eval_loss")] == [4]


def test_a_missing_tracker_stops_training_before_its_run_directory_exists(tmp_path, monkeypatch):
    import importlib.util

    from lib import config as kc
    from lib.hardware import resolve_hardware
    from lib.hyperparams import ModelDescription, resolve
    from lib.trainer import Trainer

    (tmp_path / "fragment").write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\n'
                                       "CONFIG_TRACK_MLFLOW=y\n")
    config = kc.make_defconfig("lenet5", [str(tmp_path / "fragment")], out=tmp_path / "config")
    cpu = resolve_hardware(gpu="cpu")
    plan = resolve(config, cpu, ModelDescription.from_config(config))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(KfitError, match="CONFIG_TRACK_MLFLOW=y needs the mlflow package.*pip install mlflow-skinny"):
        Trainer(config, plan, cpu, log=lambda line: None)
    assert not (tmp_path / "runs").exists()


def test_a_tracker_that_cannot_start_leaves_no_empty_run_behind(tmp_path, monkeypatch):
    """The run directory exists by then (its config and plan are written first): a refused start removes it,
    so that 'the last run' is never an empty one; nothing else under OUTPUT_DIR is touched."""
    from lib import config as kc
    from lib.hardware import resolve_hardware
    from lib.hyperparams import ModelDescription, resolve
    from lib.trainer import Trainer

    (tmp_path / "fragment").write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\n'
                                       "CONFIG_TRACK_MLFLOW=y\nCONFIG_MAX_STEPS=1\n")
    config = kc.make_defconfig("lenet5", [str(tmp_path / "fragment")], out=tmp_path / "config")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "notes.txt").write_text("mine\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    cpu = resolve_hardware(gpu="cpu")
    plan = resolve(config, cpu, ModelDescription.from_config(config))
    with pytest.raises(KfitError, match="CONFIG_TRACK_MLFLOW=y: the mlflow run could not start"):
        Trainer(config, plan, cpu, log=lambda line: None).fit()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["notes.txt"]
