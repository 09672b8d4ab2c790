"""Llama under FSDP2: a real 2-process gloo run of llama-tiny with tied embeddings, and the memory planner's
sharded per-rank prediction at world size 2 against one process's.

Kept small: the torchrun run trains 2 steps of 2 x 32-token samples per process on an 8,000-byte corpus
(its final evaluation over 25 windows, not the embedded text's hundreds); most of its time is the interpreters'
imports (torch, FSDP) in torchrun and the two ranks. The memory check's traces go to the suite's trace cache,
paid once per change of the code they depend on."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from lib import config as kc
from tests.helpers import ROOT, kfit_env

STEPS = 2
FRAGMENT = ("CONFIG_DEVICE_CPU=y\nCONFIG_LLAMA_BLOCK_SIZE=32\nCONFIG_LLAMA_TIE_EMBEDDINGS=y\n"
            "CONFIG_HYPER_PARAM_MANUAL=y\nCONFIG_BATCH_SIZE=2\nCONFIG_GRADIENT_ACCUMULATION=1\n"
            "CONFIG_EVAL_BATCH_SIZE=32\n"  # the final evaluation in one batch per rank
            f"CONFIG_MAX_STEPS={STEPS}\nCONFIG_LOG_INTERVAL=1\nCONFIG_EVAL_INTERVAL=1000\n"
            "CONFIG_OUTPUT_DIR=\"runs\"\n")


def llama_config(directory: Path) -> Path:
    """llama-tiny on a small byte-level corpus in `directory`, sharded with FSDP."""
    from lib.data.text import embedded_text

    streams = embedded_text()
    (directory / "corpus").mkdir(parents=True, exist_ok=True)
    (directory / "corpus" / "text.txt").write_bytes(bytes(streams.train[:8_000].tolist()))
    data = f'CONFIG_DATASET_DIR=y\nCONFIG_DATA_DIR="{directory / "corpus"}"\n'
    (directory / "fragment").write_text(FRAGMENT + data)
    kc.make_defconfig("llama-tiny", ["fsdp", str(directory / "fragment")], out=directory / ".config")
    return directory / ".config"


class InProcessTracer:
    """sharded_process.ShardedTracer's interface, tracing in this process (torch's fake process group) instead
    of a child: no torchrun, no second interpreter to start."""

    def trace(self, config, **step):
        from lib.memory.cache import model_fingerprint
        from lib.memory.sharded import trace_sharded_step
        from lib.task import task_once

        return trace_sharded_step(task_once(config, json.dumps(model_fingerprint(config), sort_keys=True)), config,
                                  **step)

    def close(self, abort: bool = False) -> None:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_backend() == "fake":
            dist.destroy_process_group()


@pytest.mark.slow
def test_llama_trains_under_fsdp_on_two_processes(tmp_path: Path):
    """torchrun as kfit starts it (lib.distributed.torchrun_command), run directly: each rank plans for
    itself, which spares the launcher's own interpreter and plan."""
    from lib.distributed import torchrun_command

    config = llama_config(tmp_path)
    env = {k: v for k, v in kfit_env(config).items() if k not in ("RANK", "LOCAL_RANK", "NNODES", "MASTER_ADDR",
                                                                  "MASTER_PORT", "NODE_RANK")}
    command = torchrun_command(2, ROOT / "scripts" / "kfit.py", env)
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "over 2 processes" in result.stdout and f"Done: {STEPS} steps" in result.stdout, result.stdout
    [run_dir] = (tmp_path / "runs").iterdir()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["model"], plan["strategy"], plan["world_size"]) == ("llama", "fsdp", 2)
    assert "CONFIG_LLAMA_TIE_EMBEDDINGS=y" in (run_dir / "config").read_text().splitlines()
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [line["loss"] for line in lines if "loss" in line]
    assert len(losses) == STEPS and all(math.isfinite(loss) for loss in losses), losses


def test_sharding_llama_over_two_processes_lowers_the_predicted_peak(tmp_path: Path, monkeypatch):
    """The planner's per-rank prediction from the fake-tensor trace of one rank's FSDP2 step (traced in this
    process) is below one process's whole step."""
    from lib.memory import MemoryPredictor, sharded_process

    monkeypatch.setattr(sharded_process, "ShardedTracer", InProcessTracer)
    config = kc.read_config(llama_config(tmp_path))
    predictor = MemoryPredictor()  # the suite's trace cache (conftest.py)
    try:
        whole = predictor.predict(config, batch=2, device_type="cpu", precision="fp32")
        sharded = predictor.predict(config, batch=2, device_type="cpu", precision="fp32", strategy="fsdp",
                                    world_size=2)
    finally:
        predictor.close()
    assert sharded.trace.parameters == whole.trace.parameters  # the whole model's count, not a shard's
    assert sharded.trace.breakdown["parameters"] < whole.trace.breakdown["parameters"]
    assert sharded.peak_bytes < whole.peak_bytes, (sharded.peak_bytes, whole.peak_bytes)
