"""A run's history is append-only: nothing kfit does truncates or replaces a run's metrics, config or trained
checkpoint, except continuing that same run (resume, extend), which appends. A new run never starts in a
directory that holds another run's history (RUN_NAME naming one is refused); generated sequences of commands
keep every run's metrics a prefix of what they become and its finished checkpoint (or the kept copy of it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lib.checkpoint import FINAL

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = ('CONFIG_DEVICE_CPU=y\nCONFIG_HYPER_PARAM_MANUAL=y\nCONFIG_BATCH_SIZE=64\nCONFIG_GRADIENT_ACCUMULATION=1\n'
        'CONFIG_MAX_STEPS=2\nCONFIG_LOG_INTERVAL=1\nCONFIG_CPU_THREADS=1\n')


def config_file(directory: Path, more: str = "") -> Path:
    from lib import config as kc

    n = len(list(directory.glob("c*.fragment")))
    fragment = directory / f"c{n}.fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{directory}/runs"\n{BASE}{more}')
    kc.make_defconfig("lenet5", [str(fragment)], out=directory / f"c{n}.config")
    return directory / f"c{n}.config"


def files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != ".lock"}


@pytest.mark.parametrize("setting", ['CONFIG_LEARNING_RATE="0.05"\n', ""])
def test_a_run_name_of_a_finished_run_is_refused_and_the_run_kept(tmp_path, kfit_here, setting):
    first = config_file(tmp_path, 'CONFIG_RUN_NAME="mine"\n')
    done = kfit_here(tmp_path, "train", KCONFIG_CONFIG=str(first))
    assert done.returncode == 0, done.stdout + done.stderr
    before = files(tmp_path / "runs")
    again = config_file(tmp_path, f'CONFIG_RUN_NAME="mine"\n{setting}')
    refused = kfit_here(tmp_path, "train", KCONFIG_CONFIG=str(again))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    [line] = [l for l in refused.stderr.splitlines() if l.startswith("error: ")]
    assert "holds another run (finished: checkpoint.pt)" in line and "EXTEND_EPOCHS=N RUN=" in line
    assert files(tmp_path / "runs") == before


def run_names(root: Path) -> list[Path]:
    return sorted(p for p in (root / "runs").iterdir() if p.is_dir()) if (root / "runs").is_dir() else []


ACTIONS = st.sampled_from(["train", "train-other", "train-named", "train-named-other", "extend", "resume-after-kill"])


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ACTIONS, min_size=2, max_size=4))
def test_any_sequence_of_commands_only_appends_to_a_runs_history(tmp_path_factory, kfit_here, actions):
    root = tmp_path_factory.mktemp("history")
    plain, other = config_file(root), config_file(root, 'CONFIG_LEARNING_RATE="0.05"\n')
    named, named_other = (config_file(root, 'CONFIG_RUN_NAME="mine"\n'),
                          config_file(root, 'CONFIG_RUN_NAME="mine"\nCONFIG_LEARNING_RATE="0.05"\n'))
    configs = {"train": plain, "train-other": other, "train-named": named, "train-named-other": named_other}
    for action in actions:
        runs = {p: files(p) for p in run_names(root)}
        if action == "extend":
            if not runs:
                continue
            done = kfit_here(root, "train", KCONFIG_CONFIG=str(plain), EXTEND_STEPS="1")
        elif action == "resume-after-kill":  # a run cut before its end: its final checkpoint made a periodic one
            finished = [p for p in runs if (p / FINAL).is_file()]
            if not finished:
                continue
            step = __import__("torch").load(finished[0] / FINAL, weights_only=True)["progress"]["step"]
            os.replace(finished[0] / FINAL, finished[0] / f"checkpoint-{step}.pt")
            runs = {p: files(p) for p in run_names(root)}
            done = kfit_here(root, "train", KCONFIG_CONFIG=str(plain))
        else:
            done = kfit_here(root, "train", KCONFIG_CONFIG=str(configs[action]))
        assert done.returncode in (0, 2), done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        for path, before in runs.items():
            after = files(path)
            assert after.get("metrics.jsonl", b"").startswith(before.get("metrics.jsonl", b"")), (action, path)
            if FINAL in before:  # a finished checkpoint stays, or is kept as final-<step>.pt by an extension
                kept = [name for name in after if name.startswith("final-")]
                assert after.get(FINAL) == before[FINAL] or any(after[k] == before[FINAL] for k in kept), \
                    (action, path)
            if done.returncode == 2:
                assert after == before, (action, path)  # a refused command changes nothing
