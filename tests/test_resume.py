"""Checkpoint and resume: a run killed with SIGTERM and resumed computes exactly the uninterrupted losses."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import time
import types
from pathlib import Path

import pytest
import torch

from lib import checkpoint, resumable

from tests.helpers import KFIT, fake_plan, kfit_env, write_config

# LeNet at effective batch 16: long enough (300 steps) to be signalled mid-run, a few seconds in all.
RUN = ("CONFIG_DEVICE_CPU=y\nCONFIG_EPOCHS=10\nCONFIG_MAX_STEPS=300\nCONFIG_TARGET_EFFECTIVE_BATCH=16\n"
       "CONFIG_LOG_INTERVAL=1\nCONFIG_EVAL_INTERVAL=100\nCONFIG_OUTPUT_DIR=\"runs\"\n"
       "CONFIG_CHECKPOINT_INTERVAL_STEPS=y\nCONFIG_CHECKPOINT_EVERY_STEPS=4\nCONFIG_CHECKPOINT_KEEP=3\n")
def losses_by_step(run_dir: Path) -> dict[int, float]:
    """Step -> loss; a step logged twice (recomputed after resuming from an older checkpoint) keeps the last."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["loss"] for line in lines if "loss" in line}


def logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count('"loss"') if path.exists() else 0


@pytest.mark.slow
def test_sigterm_then_resume_gives_the_uninterrupted_losses(tmp_path):
    config = write_config(tmp_path, RUN)
    proc = subprocess.Popen(KFIT + ["train"], cwd=tmp_path, env=kfit_env(config), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        runs = list((tmp_path / "runs").glob("*/metrics.jsonl"))
        if runs and logged_steps(runs[0].parent) >= 12:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out  # 128 + SIGTERM, after saving a checkpoint
    [run_dir] = (tmp_path / "runs").iterdir()
    stopped = int(out.split("checkpoint saved at step ")[1].split()[0])
    assert 12 <= stopped < 300 and not (run_dir / "checkpoint.pt").exists()
    kept = [step for step, _ in checkpoint.periodic_checkpoints(run_dir)]
    assert kept[0] == stopped and len(kept) == 3  # CONFIG_CHECKPOINT_KEEP

    # Damage the newest checkpoint (a crash mid-write on a filesystem without atomic rename, say):
    # resuming reports it and continues from the previous one, recomputing the steps in between.
    newest = checkpoint.periodic_path(run_dir, stopped)
    newest.write_bytes(newest.read_bytes()[:1000])
    log_config = write_config(tmp_path, RUN + "CONFIG_LOG_INTERVAL=1\n# CONFIG_MONITOR is not set\n", "other")
    resumed = subprocess.run(KFIT + ["train"], cwd=tmp_path, env=kfit_env(log_config), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"Resuming {run_dir.relative_to(tmp_path)} from step {kept[1]}" in resumed.stdout
    assert f"{newest.relative_to(tmp_path)} is unreadable" in resumed.stdout
    assert (run_dir / "checkpoint.pt").exists() and not checkpoint.periodic_checkpoints(run_dir)

    fresh = subprocess.run(KFIT + ["train"], cwd=tmp_path, env=kfit_env(config, RESUME="0"), capture_output=True,
                           text=True, timeout=300)
    assert fresh.returncode == 0 and "Resuming" not in fresh.stdout, fresh.stdout + fresh.stderr
    [fresh_dir] = [p for p in (tmp_path / "runs").iterdir() if p != run_dir]
    interrupted, uninterrupted = losses_by_step(run_dir), losses_by_step(fresh_dir)
    assert list(interrupted) == list(range(1, 301))
    assert interrupted == uninterrupted  # exactly: model, optimizer, RNG and data position restored
    a = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(fresh_dir / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_latest_valid_skips_a_truncated_checkpoint(tmp_path):
    checkpoint.save_checkpoint(checkpoint.periodic_path(tmp_path, 10), {"step": 10})
    checkpoint.save_checkpoint(checkpoint.periodic_path(tmp_path, 20), {"step": 20})
    bad = checkpoint.periodic_path(tmp_path, 30)
    checkpoint.save_checkpoint(bad, {"step": 30, "weights": torch.zeros(1000)})
    bad.write_bytes(bad.read_bytes()[:500])
    messages = []
    path, state = checkpoint.latest_valid(tmp_path, messages.append)
    assert state == {"step": 20} and path.name == "checkpoint-20.pt"
    assert len(messages) == 1 and str(bad) in messages[0] and "previous checkpoint" in messages[0]
    checkpoint.prune(tmp_path, 1)
    assert [s for s, _ in checkpoint.periodic_checkpoints(tmp_path)] == [30]


# A plan.json is read as a plan (a file of another shape falls back to the checkpoint's effective batch).
PLAN = fake_plan()(types.SimpleNamespace(gpt2_preset=None))


def _fake_run(base: Path, name: str, config_text: str, effective: int, finished: bool = False) -> Path:
    run_dir = base / name
    run_dir.mkdir(parents=True)
    (run_dir / "config").write_text(config_text)
    (run_dir / "plan.json").write_text(json.dumps(dataclasses.replace(PLAN, effective_batch=effective).to_dict()))
    checkpoint.save_checkpoint(checkpoint.periodic_path(run_dir, 5), {"step": 5})
    if finished:
        checkpoint.save_checkpoint(run_dir / checkpoint.FINAL, {"step": 9})
    return run_dir


def test_resume_matches_training_math_and_effective_batch_only(tmp_path):
    base = "CONFIG_MODEL_LENET5=y\nCONFIG_LEARNING_RATE=\"3e-3\"\nCONFIG_LOG_INTERVAL=10\n# CONFIG_MONITOR is not set\n"
    runs = tmp_path / "runs"
    _fake_run(runs, "a-finished", base, 64, finished=True)
    _fake_run(runs, "b-other-lr", base.replace("3e-3", "1e-3"), 64)
    _fake_run(runs, "c-other-batch", base, 128)
    match = _fake_run(runs, "d-match", base.replace("LOG_INTERVAL=10", "LOG_INTERVAL=1"), 64)
    notes = []
    assert resumable.find_resumable(runs, base, 64, log=notes.append) == match
    assert any("c-other-batch" in n and "128" in n for n in notes)
    assert resumable.find_resumable(runs, base, 64, run_name="b-other-lr", log=notes.append) is None
    assert resumable.find_resumable(tmp_path / "nowhere", base, 64) is None
