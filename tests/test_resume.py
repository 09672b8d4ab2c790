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
from hypothesis import given, settings, strategies as st

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


def test_one_off_settings_turn_the_config_file_into_the_runs_config(tmp_path):
    """Drawn command-line overrides of the training math (numbers, strings, bools, choices): the settings
    one_off_settings gives back, applied to the file's config, give the run's training math again."""
    import random

    from lib import config as kc

    base = kc.make_defconfig("gpt2-tiny", out=tmp_path / ".config")
    pool = [("EPOCHS", lambda r: r.randint(1, 90)), ("LEARNING_RATE", lambda r: f"{r.choice([1, 3, 6])}e-4"),
            ("WEIGHT_DECAY", lambda r: r.choice(["0.0", "0.1"])), ("GRADIENT_CHECKPOINTING", lambda r: r.choice("yn")),
            ("SEED", lambda r: r.randint(0, 9)),
            ("MAX_STEPS", lambda r: r.randint(0, 500))]
    members = [("PRECISION_BF16", "y"), ("PRECISION_FP32", "y"), ("OPTIMIZER_SGD", "y"), ("OPTIMIZER_ADAMW", "y")]
    rng = random.Random(7)
    for _ in range(25):
        overrides = {name: value(rng) for name, value in rng.sample(pool, rng.randint(1, 4))}
        overrides.update(rng.sample(members, rng.randint(0, 1)))  # a choice, as its member
        run = kc.derive(base, overrides)
        settings = resumable.one_off_settings(run.text, base.text)
        # each with its CONFIG_ prefix: 'make train SEED=3' is refused (SEED= is make sample's; an audit)
        assert settings is not None and all("=" in s and s.startswith("CONFIG_") for s in settings)
        again = kc.derive(base, dict(s.split("=", 1) for s in settings))
        assert resumable.training_identity(again.text) == resumable.training_identity(run.text), (overrides, settings)
    assert resumable.one_off_settings(base.text, base.text) == []


@pytest.fixture(scope="module")
def llama_text(tmp_path_factory) -> str:
    from lib import config as kc

    return kc.make_defconfig("llama-tiny", out=tmp_path_factory.mktemp("cfg") / ".config").text


@settings(max_examples=150, deadline=None)
@given(cut=st.integers(0, 20000), junk=st.sampled_from(["", "CONFIG_P", "CONFIG_", "# CONFIG_X", "CONFIG_=1"]))
def test_a_run_config_cut_short_anywhere_reads_as_other_settings_never_as_a_crash(llama_text, cut, junk):
    """A run's config damaged at any byte (with a stray fragment of a line at the end): its training math reads as
    the lines that are whole, and the settings that would turn the file's config into it are some, or none."""
    damaged = llama_text[:cut] + junk
    lines = resumable.training_identity(damaged)
    assert all(line.startswith("# CONFIG_") or "=" in line for line in lines)
    settings = resumable.one_off_settings(damaged, llama_text)
    assert settings is None or all("=" in s for s in settings)
    # the layout's degrees are not training math: a run resumes under another split
    assert not any(line.split("=")[0] in ("CONFIG_TP", "CONFIG_PP", "CONFIG_CP") for line in lines)


def test_the_resume_command_repeats_the_runs_one_off_settings(tmp_path):
    from lib import config as kc
    from lib.trainer.resume import resume_command

    path = tmp_path / "my.config"
    kc.make_defconfig("lenet5", out=path)
    overridden = kc.derive(kc.read_config(path), {"EPOCHS": 60, "LOG_INTERVAL": 7})  # LOG_INTERVAL: not the math
    assert resume_command(overridden) == f"make train KCONFIG_CONFIG={path} CONFIG_EPOCHS=60"
    assert resume_command(kc.read_config(path)) == f"make train KCONFIG_CONFIG={path}"


def test_a_run_started_with_an_override_is_named_with_the_command_that_continues_it(tmp_path):
    """`make train EPOCHS=60` interrupted, then a plain `make train`: the note names `make train CONFIG_EPOCHS=60`."""
    from lib import config as kc

    base = kc.make_defconfig("lenet5", out=tmp_path / ".config")
    run = tmp_path / "runs" / "lenet5-1"
    run.mkdir(parents=True)
    (run / "config").write_text(kc.derive(base, {"EPOCHS": 60}).text)
    (run / "checkpoint-5.pt").write_bytes(b"")
    notes = []
    resumable.note_other_config([run], base.text, notes.append)
    assert len(notes) == 1 and "(CONFIG_EPOCHS: 60 there, 40 here)" in notes[0] and \
        "'make train CONFIG_EPOCHS=60' continues it" in notes[0], notes
