"""Checkpoint control: RESUME_FROM a chosen run or checkpoint, INIT_FROM trained weights into a new run, the
best k checkpoints by a metric, and early stopping. Tiny LeNet-5 runs on the CPU, a few steps each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lib.api as kfit
from lib import checkpoint, resumable
from lib.errors import ConfigError, KfitError
from lib.export import export, save_weights
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.models import build_model
from lib.trainer import Trainer
from lib.trainer.resume import resume_command, resume_point

CPU = resolve_hardware(gpu="cpu")
# Checkpoints every 2 steps, none rotated away; an evaluation every 2 steps; every step's loss logged.
BASE = dict(DEVICE_CPU=True, MAX_STEPS=8, TARGET_EFFECTIVE_BATCH=16, LOG_INTERVAL=1, EVAL_INTERVAL=2,
            CHECKPOINT_INTERVAL_STEPS=True, CHECKPOINT_EVERY_STEPS=2, CHECKPOINT_KEEP=5, MONITOR=False)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def config(**overrides):
    return kfit.load_config("lenet5", {**BASE, **overrides})


def train(cfg, out: Path, **kwargs):
    return kfit.train(cfg, output_dir=out, log=lambda line: None, **kwargs)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in rows(run_dir) if "loss" in r}  # a step logged twice: the later wins


def interrupted(cfg, out: Path, at: int) -> Path:
    """A run that stopped (an exception from its evaluation callback) at step `at`, before that step's
    checkpoint: it holds checkpoint-2 ... checkpoint-<at - 2>."""
    def stop(step, epoch, metrics):
        if step == at:
            raise RuntimeError("stopped by the test")

    plan = resolve(cfg, CPU, ModelDescription.from_config(cfg))
    trainer = Trainer(kfit.load_config(cfg, {"OUTPUT_DIR": str(out)}), plan, CPU, log=lambda line: None,
                      on_eval=stop)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        trainer.fit()
    return trainer.run_dir


def steps_of(run_dir: Path, prefix: str) -> list[int]:
    return sorted(int(p.stem.removeprefix(prefix + "-")) for p in run_dir.glob(prefix + "-*.pt"))


# --------------------------------------------------------------------------
# RESUME_FROM


def test_resume_from_an_older_checkpoint_continues_it_exactly_and_drops_the_later_ones(tmp_path):
    cfg = config(CHECKPOINT_BEST_KEEP=2)
    ref = train(cfg, tmp_path / "ref").run_dir
    run = interrupted(cfg, tmp_path / "runs", at=6)
    assert steps_of(run, "checkpoint") == [2, 4] and steps_of(run, "best") == [2, 4]
    lines = []
    result = kfit.train(cfg, output_dir=tmp_path / "runs", resume_from=run / "checkpoint-2.pt", log=lines.append)
    assert result.run_dir == run and result.steps == 8
    assert any("removed best-4.pt, checkpoint-4.pt, saved after it" in line for line in lines), lines
    assert losses(run) == losses(ref)  # steps 3..8 recomputed from step 2 equal the uninterrupted run's
    assert steps_of(run, "best") == steps_of(ref, "best")  # the ranking went on from the checkpoint's
    resumed = [r for r in rows(run) if r.get("event") == "resume"]
    assert resumed and resumed[-1]["path"].endswith("checkpoint-2.pt")


def test_resume_from_a_run_directory_takes_its_newest_readable_checkpoint(tmp_path):
    cfg = config()
    run = interrupted(cfg, tmp_path / "runs", at=6)
    (run / "checkpoint-4.pt").write_bytes(b"cut short")
    warnings = []
    path, effective = resume_point(run, cfg, warnings.append)
    assert path == run / "checkpoint-2.pt" and effective == 16
    assert warnings == []  # said once, by the restore that sets it aside (tests/test_checkpoint_validation.py)


def test_resume_from_refuses_with_the_fix_and_changes_nothing(tmp_path):
    cfg = config()
    run = interrupted(cfg, tmp_path / "runs", at=6)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    for path, needle in [(tmp_path / "nowhere", "no such run directory or checkpoint"),
                         (tmp_path / "junk.pt", "cannot be read")]:
        with pytest.raises(KfitError, match=needle):
            train(cfg, tmp_path / "runs", resume_from=path)
    other = config(LEARNING_RATE="0.5")
    with pytest.raises(KfitError) as err:
        train(other, tmp_path / "runs", resume_from=run)
    assert 'CONFIG_LEARNING_RATE: "3e-3" there, "0.5" here' in str(err.value)
    assert "KCONFIG_CONFIG=" in str(err.value) and "INIT_FROM=" in str(err.value)
    with pytest.raises(KfitError, match="exclude each other"):
        train(cfg, tmp_path / "runs", resume_from=run, init_from=run)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run.name]
    finished = train(cfg, tmp_path / "done").run_dir
    with pytest.raises(KfitError, match="has finished .*INIT_FROM="):
        resume_point(finished, cfg)


def test_a_changed_patience_or_best_k_still_resumes(tmp_path):
    """Neither changes what a step computes (resumable.NOT_TRAINING_MATH)."""
    cfg = config()
    run = interrupted(cfg, tmp_path / "runs", at=4)
    changed = config(EARLY_STOP_PATIENCE=5, EARLY_STOP_MIN_DELTA="0.1", CHECKPOINT_BEST_KEEP=3,
                     CHECKPOINT_BEST_METRIC="accuracy")
    assert resume_point(run, changed)[0] == run / "checkpoint-2.pt"


# --------------------------------------------------------------------------
# INIT_FROM


def test_init_from_starts_a_new_run_from_the_weights(tmp_path):
    source = train(config(), tmp_path / "runs").run_dir
    trained = torch.load(source / "checkpoint.pt", weights_only=True)["model"]
    # a learning rate too small to move the weights: the new run ends where the source did
    tune = config(LEARNING_RATE="1e-12", MAX_STEPS=2)
    lines = []
    result = kfit.train(tune, output_dir=tmp_path / "runs", init_from=source, log=lines.append)
    assert result.run_dir != source and result.steps == 2 and min(losses(result.run_dir)) == 1
    assert any(line.startswith(f"Initialised from {source / 'checkpoint.pt'} (step 8)") for line in lines)
    record = json.loads((result.run_dir / checkpoint.INIT_RECORD).read_text())
    assert record["source_step"] == 8 and record["path"] == str((source / "checkpoint.pt").resolve())
    assert [r for r in rows(result.run_dir) if r.get("event") == "init_from"][0]["step"] == 0
    tuned = torch.load(result.run_dir / "checkpoint.pt", weights_only=True)
    for name, tensor in trained.items():
        torch.testing.assert_close(tuned["model"][name], tensor, msg=name)
    assert tuned["optimizer"]["state"]  # its own optimizer, built from step 0


def test_init_from_an_export_and_the_search_passes_an_initialised_run_by(tmp_path):
    source = train(config(), tmp_path / "runs").run_dir
    exported = export(source)
    run = interrupted(config(), tmp_path / "tuned", at=4)  # an unfinished run ...
    (run / checkpoint.INIT_RECORD).write_text("{}")  # ... that started from other weights
    notes = []
    assert resumable.find_resumable(tmp_path / "tuned", config().text, 16, log=notes.append) is None
    assert f"RESUME_FROM={run}" in notes[0] and resume_command(config(), run).endswith(f" RESUME_FROM={run}")
    lines = []
    result = kfit.train(config(MAX_STEPS=2), output_dir=tmp_path / "tuned", init_from=exported, resume=True,
                        log=lines.append)
    assert result.run_dir not in (run, source) and any("Initialised from" in line for line in lines)


def test_init_from_weights_of_another_shape_names_the_tensor_and_writes_nothing(tmp_path):
    weights = build_model("lenet5", num_classes=10, in_channels=1, image_size=32).state_dict()
    name = next(iter(weights))
    wrong = dict(weights, **{name: torch.zeros(3, *weights[name].shape[1:])})
    save_weights(tmp_path / "model.safetensors", wrong, {})
    with pytest.raises(KfitError) as err:
        train(config(), tmp_path / "runs", init_from=tmp_path / "model.safetensors")
    assert f"{name}: checkpoint [3, {', '.join(map(str, weights[name].shape[1:]))}], this model " \
           f"{list(weights[name].shape)}" in str(err.value)
    del wrong[name]
    save_weights(tmp_path / "model.safetensors", {**wrong, "extra.weight": torch.zeros(1)}, {})
    with pytest.raises(KfitError, match=rf"{name}: in this model, not in the checkpoint \(and 1 more\)"):
        train(config(), tmp_path / "runs", init_from=tmp_path / "model.safetensors")
    with pytest.raises(KfitError, match="INIT_FROM=.*nowhere: no such"):
        train(config(), tmp_path / "runs", init_from=tmp_path / "nowhere")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# --------------------------------------------------------------------------
# Best k and early stopping


def test_the_best_k_checkpoints_survive_rotation_and_hold_the_best_evaluations(tmp_path):
    cfg = config(CHECKPOINT_KEEP=1, EVAL_INTERVAL=1, CHECKPOINT_EVERY_STEPS=1, CHECKPOINT_BEST_KEEP=2)
    result = train(cfg, tmp_path / "runs")
    evals = {r["step"]: r["eval_loss"] for r in rows(result.run_dir) if "eval_loss" in r}
    best = sorted(evals, key=lambda step: (evals[step], step))[:2]
    assert steps_of(result.run_dir, "best") == sorted(best)
    assert steps_of(result.run_dir, "checkpoint") == []  # the finished run's checkpoint.pt replaced them
    state = torch.load(result.run_dir / f"best-{best[0]}.pt", weights_only=True)
    assert state["step"] == best[0] and state["eval"]["eval_loss"] == evals[best[0]]
    assert state["progress"]["best"][0] == [best[0], evals[best[0]]]


@pytest.mark.parametrize("every", [dict(MAX_STEPS=20), dict(EVAL_INTERVAL=0, TARGET_EFFECTIVE_BATCH=512, EPOCHS=5)],
                         ids=["eval interval", "each epoch"])
def test_early_stopping_finishes_the_run_normally(tmp_path, every):
    # accuracy cannot improve by more than 1: the second evaluation (step 4; epoch 2, step 6) ends the run
    cfg = config(**every, EARLY_STOP_PATIENCE=1, EARLY_STOP_MIN_DELTA="1", CHECKPOINT_BEST_METRIC="accuracy")
    result = train(cfg, tmp_path / "runs")
    assert result.stop_reason == "early_stop" and result.steps == (6 if "EPOCHS" in every else 4)
    assert (result.run_dir / "checkpoint.pt").is_file() and "accuracy" in result.final_eval
    events = {r["event"]: r for r in rows(result.run_dir) if "event" in r}
    assert events["early_stop"]["best_step"] == result.steps // 2 and "CONFIG_EARLY_STOP_PATIENCE=1" in events["early_stop"]["message"]
    assert events["finished"]["stop_reason"] == "early_stop"


def test_a_metric_the_evaluation_does_not_report_is_refused_before_training(tmp_path):
    with pytest.raises(ConfigError, match='"perplexity": the evaluation of lenet5 reports eval_loss, accuracy'):
        train(config(CHECKPOINT_BEST_KEEP=1, CHECKPOINT_BEST_METRIC="perplexity"), tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
