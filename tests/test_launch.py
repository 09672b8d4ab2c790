"""A launch hands its ranks everything in one file: `make train GPUS=2 EPOCHS=1` and `kfit train --gpus 2 --set
EPOCHS=1` train one epoch, the override applied once by the launcher, and no rank reads a setting from its
environment (kfit's variables are kept from it; tests/hooks/sitecustomize.py records what each rank asks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow

# What torchrun gives each rank, and the variables of the machine and libraries (threads, caches, allocators):
# a rank may read these; every other variable kfit has (a flag's, an override, a Kconfig symbol) it may not.
TORCHRUN = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS"}


def kfit_variables() -> set[str]:
    from lib.cli.flags import FLAGS, MAKE_LIST, SET_VARIABLE
    from lib.config.kconfig import new_kconfig

    return ({*FLAGS, MAKE_LIST, SET_VARIABLE} | set(new_kconfig().syms)) - TORCHRUN


def _environment(tmp_path: Path, log: Path) -> dict[str, str]:
    hooks = str(ROOT / "tests" / "hooks")
    env = {k: v for k, v in os.environ.items() if k not in kfit_variables() and not k.startswith("MAKE")}
    return {**env, "KFIT_TEST_ENV_LOG": str(log), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (hooks, os.environ.get("PYTHONPATH")) if p)}


@pytest.mark.parametrize("how", ["make", "kfit"])
def test_an_override_reaches_every_rank_through_the_launch_file_only(how, make_config, tmp_path):
    config = make_config("CONFIG_TARGET_EFFECTIVE_BATCH=256\n")
    log = tmp_path / "env.log"
    env = _environment(tmp_path, log)
    if how == "make":
        command = ["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "train", "GPUS=2", "EPOCHS=1",
                   f"KCONFIG_CONFIG={config.source}"]
    else:
        command = [sys.executable, str(ROOT / "scripts" / "kfit.py"), "train", "--gpus", "2", "--set", "EPOCHS=1",
                   "--config", config.source]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    [done] = [line for line in result.stdout.splitlines() if line.startswith("Done:")]
    assert " 1.0 epochs" in done, done
    assert "Launching 2 training processes" in result.stdout
    ranks = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(ranks) == 2, ranks
    forbidden = kfit_variables()
    for rank in ranks:
        assert not forbidden & set(rank["environment"]), sorted(forbidden & set(rank["environment"]))
        assert not forbidden & set(rank["read"]), sorted(forbidden & set(rank["read"]))
        assert "EPOCHS" not in rank["environment"] and "KFIT_SET" not in rank["read"]
