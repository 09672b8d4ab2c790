"""make train EXTEND_EPOCHS=N / EXTEND_STEPS=N (lib/extension.py): a finished run continued from its last
checkpoint, its history appended to and its finished checkpoint kept; with a constant schedule the extended
run is the uninterrupted longer one, weight for weight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lib import config as kc
from lib.checkpoint import FINAL, load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = ('CONFIG_DEVICE_CPU=y\nCONFIG_HYPER_PARAM_MANUAL=y\nCONFIG_BATCH_SIZE=256\nCONFIG_GRADIENT_ACCUMULATION=1\n'
        'CONFIG_LR_SCHEDULE_CONSTANT=y\nCONFIG_LOG_INTERVAL=2\nCONFIG_CPU_THREADS=1\n')


def write_config(tmp_path: Path, name: str, epochs: int, more: str = "") -> Path:
    fragment = tmp_path / f"{name}.fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/{name}"\n{BASE}CONFIG_EPOCHS={epochs}\n{more}')
    path = tmp_path / f"{name}.config"
    kc.make_defconfig("lenet5", [str(fragment)], out=path)
    return path


def train(kfit_here, tmp_path: Path, config: Path, **env):
    done = kfit_here(tmp_path, "train", KCONFIG_CONFIG=str(config), **env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def the_run(tmp_path: Path, name: str) -> Path:
    [run] = [p for p in (tmp_path / name).iterdir() if p.is_dir()]
    return run


def test_extend_epochs_continues_a_finished_run_as_the_longer_run_would_have(tmp_path, kfit_here):
    short = write_config(tmp_path, "short", 1)
    train(kfit_here, tmp_path, short)
    run = the_run(tmp_path, "short")
    before_metrics = (run / "metrics.jsonl").read_bytes()
    before_final = (run / FINAL).read_bytes()
    steps = load_checkpoint(run / FINAL)["progress"]["step"]

    done = train(kfit_here, tmp_path, short, EXTEND_EPOCHS="1")
    assert f"Extending {run} from step {steps} by 1 more epoch(s): CONFIG_EPOCHS 1 -> 2" in done.stdout
    assert f"train EXTEND_EPOCHS=1: the last run, {run}" in done.stderr  # the run it took, said
    # history appended to, the finished checkpoint kept byte for byte, a new one at the end
    after = (run / "metrics.jsonl").read_bytes()
    assert after.startswith(before_metrics)
    rows = [json.loads(line) for line in after[len(before_metrics):].decode().splitlines()]
    assert rows[0]["event"] == "extended" and rows[0]["epochs"] == [1, 2] and rows[0]["step"] == steps
    assert max(r["step"] for r in rows if "loss" in r) == 2 * steps
    assert (run / f"final-{steps}.pt").read_bytes() == before_final
    assert load_checkpoint(run / FINAL)["progress"]["step"] == 2 * steps
    assert kc.read_config(run / "config").epochs == 2
    assert not list(run.glob("checkpoint-*.pt"))  # the finished run's periodic ones are dropped as always

    # a constant schedule: exactly the two-epoch run trained at once
    straight = write_config(tmp_path, "straight", 2)
    train(kfit_here, tmp_path, straight)
    ours, theirs = load_checkpoint(run / FINAL)["model"], load_checkpoint(the_run(tmp_path, "straight") / FINAL)["model"]
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name


def test_extend_steps_trains_that_many_more_and_a_refusal_changes_nothing(tmp_path, kfit_here):
    config = write_config(tmp_path, "run", 1, "CONFIG_MAX_STEPS=3\n")
    train(kfit_here, tmp_path, config)
    run = the_run(tmp_path, "run")
    done = train(kfit_here, tmp_path, config, EXTEND_STEPS="4", RUN=str(run))
    assert "the last run" not in done.stderr
    assert load_checkpoint(run / FINAL)["progress"]["step"] == 7 and (run / "final-3.pt").is_file()
    extended = kc.read_config(run / "config")
    assert extended.max_steps == 7 and extended.epochs >= 1

    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    for args, env, words in (((), {"EXTEND_STEPS": "2", "EXTEND_EPOCHS": "1"}, "drop EXTEND_STEPS="),
                             (("--set", "LEARNING_RATE=0.5"), {"EXTEND_EPOCHS": "1"},
                              "drop the override LEARNING_RATE=0.5"),
                             ((), {"EXTEND_EPOCHS": "1", "INIT_FROM": str(run)}, "drop INIT_FROM="),
                             ((), {"EXTEND_EPOCHS": "0"}, "EXTEND_EPOCHS"),
                             ((), {"EXTEND_EPOCHS": "1", "RUN": str(tmp_path / "nowhere")}, "is not a run directory")):
        refused = kfit_here(tmp_path, "train", *args, KCONFIG_CONFIG=str(config), **env)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert words in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == files
    # a file planted as a hard link at metrics.jsonl (a shared OUTPUT_DIR): refused before the run changes
    # (the extension's record line went into the other file, and the run was half extended; an audit)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (run / "metrics.jsonl").rename(tmp_path / "metrics.kept")
    (run / "metrics.jsonl").hardlink_to(victim)
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    names = sorted(p.name for p in run.iterdir())
    refused = kfit_here(tmp_path, "train", KCONFIG_CONFIG=str(config), EXTEND_STEPS="1", RUN=str(run))
    assert refused.returncode == 2 and "hard links" in refused.stderr, refused.stdout + refused.stderr
    assert victim.read_text() == "keep\n" and sorted(p.name for p in run.iterdir()) == names
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == files


def test_an_unfinished_run_is_resumed_not_extended(tmp_path, kfit_here):
    config = write_config(tmp_path, "run", 1, "CONFIG_MAX_STEPS=3\n")
    train(kfit_here, tmp_path, config)
    run = the_run(tmp_path, "run")
    (run / FINAL).rename(run / "checkpoint-3.pt")  # as a run interrupted at step 3 leaves it
    refused = kfit_here(tmp_path, "train", KCONFIG_CONFIG=str(config), EXTEND_EPOCHS="1")
    assert refused.returncode == 2 and "has not finished (no checkpoint.pt): 'make train' resumes" in refused.stderr
