"""Several processes: the torchrun command, the process count, and a real 2-process gloo run on the CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lib import distributed
from lib.checkpoint import FINAL, load_checkpoint
from lib.errors import KfitError
from lib.hardware import resolve_hardware
from tests.test_trainer import CPU, make_config, manual, one_thread, run  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "kfit.py"


def test_torchrun_command_for_one_and_several_machines():
    one = distributed.torchrun_command(4, SCRIPT, {})
    assert one[1:] == ["-m", "torch.distributed.run", "--nproc-per-node", "4", "--standalone", str(SCRIPT), "train"]
    many = distributed.torchrun_command(8, SCRIPT, {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"})
    assert many[5:-2] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"]
    with pytest.raises(KfitError, match="MASTER_ADDR"):
        distributed.torchrun_command(8, SCRIPT, {"NNODES": "2", "NODE_RANK": "0"})
    with pytest.raises(KfitError, match="NODE_RANK='2'"):
        distributed.torchrun_command(8, SCRIPT, {"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "x"})


def test_process_count(make_config):
    config = make_config("")
    four = resolve_hardware(gpu="h100", gpus=4)
    assert distributed.process_count(config, four, "cuda", {}) == (4, "AUTO: 4 identical GPUs")
    assert distributed.process_count(config, CPU, "cpu", {})[0] == 1
    assert distributed.process_count(config, CPU, "cpu", {"GPUS": "2"}) == (2, "GPUS=2")
    manual_config = make_config("CONFIG_NPROC_MANUAL=y\nCONFIG_NPROC=3\n")
    assert distributed.process_count(manual_config, four, "cuda", {})[0] == 3
    with pytest.raises(KfitError, match="GPUS=0"):
        distributed.process_count(config, CPU, "cpu", {"GPUS": "0"})


def test_each_rank_plans_for_its_own_gpu_and_mixed_models_for_the_smallest():
    h100s = resolve_hardware(gpu="h100", gpus=2)
    rank1 = distributed.Rank(rank=1, local_rank=1, world_size=2, local_world_size=2)
    assert distributed.hardware_for_rank(h100s, rank1, 2, print).primary_gpu.index == 1
    small = dataclasses.replace(resolve_hardware(gpu="a10g").primary_gpu, index=1)
    mixed = dataclasses.replace(h100s, gpus=(h100s.gpus[0], small))
    warnings = []
    rank0 = dataclasses.replace(rank1, rank=0, local_rank=0)
    planned = distributed.hardware_for_rank(mixed, rank0, 2, warnings.append)
    assert planned.primary_gpu.name == small.name and planned.primary_gpu.index == 0
    assert "differ" in warnings[0] and "smallest" in warnings[0]


@pytest.mark.slow
def test_two_processes_equal_one_with_twice_the_accumulation(make_config, tmp_path):
    """GPUS=2 through the real torchrun (gloo): the same final weights as one process with accumulation x2.
    Rank 1 alone runs out of memory at step 2: both ranks agree, halve and redo the step."""
    common = "CONFIG_MAX_STEPS=6\nCONFIG_OPTIMIZER_ADAMW=y\nCONFIG_LEARNING_RATE=\"1e-3\"\nCONFIG_LOG_INTERVAL=1\n"
    two = make_config(manual(16, 1, common))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RESUME")}
    env.update({"KCONFIG_CONFIG": str(two.source), "GPUS": "2", "KFIT_INJECT_OOM": "2",
                "KFIT_INJECT_OOM_RANK": "1"})
    result = subprocess.run([sys.executable, str(SCRIPT), "train"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Launching 2 training processes" in result.stdout and "over 2 processes" in result.stdout
    # rank 0 reports; it did not run out of memory itself but redid the step with rank 1
    assert "Out of memory at step 2 (another rank ran out of memory)" in result.stdout
    assert "Done: 6 steps" in result.stdout
    assert result.stdout.count("Done:") == 1  # only rank 0 reports
    [final] = (tmp_path / "runs").glob(f"*/{FINAL}")
    state = load_checkpoint(final)
    assert state["plan"]["world_size"] == 2 and state["progress"]["micro_batch"] == 8

    single, _ = run(make_config(manual(16, 2, common)))
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(state["model"][name], value, atol=1e-5, rtol=1e-4, msg=name)


def _kfit(cwd: Path, config: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RESUME", "GPUS",
                                                             "GPU", "HW", "FREE_GB", "FORMAT", "NNODES")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**base, "KCONFIG_CONFIG": str(config), "OMP_NUM_THREADS": "1", **env})


def test_gpus_means_processes_when_planning_a_simulated_machine(tmp_path):
    (tmp_path / "target").write_text("CONFIG_TARGET_EFFECTIVE_BATCH=1024\n")
    from lib import config as kc

    config = kc.make_defconfig("lenet5", [str(tmp_path / "target")], out=tmp_path / ".config")
    result = _kfit(tmp_path, Path(config.source), "plan", GPU="b200", GPUS="4", FORMAT="json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["world_size"] == 4 and plan["effective_batch"] == 1024
    assert plan["micro_batch"] * plan["grad_accum"] * 4 == 1024 and len(plan["hardware"]["gpus"]) == 4


@pytest.mark.slow
def test_the_plan_previewed_with_gpus_is_the_plan_that_trains(make_config, tmp_path):
    config = make_config("CONFIG_MAX_STEPS=2\nCONFIG_TARGET_EFFECTIVE_BATCH=64\n")
    previewed = _kfit(tmp_path, Path(config.source), "plan", GPUS="2", FORMAT="json")
    assert previewed.returncode == 0, previewed.stderr
    plan = json.loads(previewed.stdout)
    trained = _kfit(tmp_path, Path(config.source), "train", GPUS="2")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    [line] = [x for x in trained.stdout.splitlines() if x.startswith("Hyperparams:")]
    assert plan["world_size"] == 2
    assert (f"batch={plan['micro_batch']}, grad_acc={plan['grad_accum']} (effective={plan['effective_batch']}, "
            in line), (plan, line)
