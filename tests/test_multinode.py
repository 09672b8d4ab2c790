"""Two machines on one: two torchrun agents on the loopback interface (NNODES=2, NODE_RANK=0|1,
MASTER_ADDR=127.0.0.1), each launched by `kfit train` as it would be on its own node."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

from lib.checkpoint import FINAL, load_checkpoint
from tests.helpers import KFIT, manual, run

COMMON = "CONFIG_MAX_STEPS=4\nCONFIG_OPTIMIZER_ADAMW=y\nCONFIG_LEARNING_RATE=\"1e-3\"\nCONFIG_LOG_INTERVAL=1\n"
NOISE = ("Traceback", "frame #", "recvValueWithTimeout")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(cwd: Path, config: Path, rank: int, port: int, nnodes: str = "2", **extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RESUME", "GPUS")}
    env.update(KCONFIG_CONFIG=str(config), OMP_NUM_THREADS="1", GPUS="1", NNODES=nnodes, NODE_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra)
    return subprocess.Popen(KFIT + ["train"], cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def finish(node: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    out, err = node.communicate(timeout=timeout)
    return node.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize("nnodes", ["2", "2:2"], ids=["static", "c10d"])  # 2:2, elastic: torchrun's c10d rendezvous
def test_two_nodes_train_as_one_process_with_the_same_effective_batch_and_finish_cleanly(make_config, tmp_path, nnodes):
    two = make_config(manual(16, 1, COMMON))
    port = free_port()
    nodes = [start_node(tmp_path, Path(two.source), rank, port, nnodes) for rank in (0, 1)]
    results = [finish(node) for node in nodes]
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"node {rank}: {out}{err}"
        assert not any(word in err for word in NOISE), f"node {rank} printed a stack dump:\n{err}"
    out = results[0][1]
    assert "Launching 1 training processes per machine on 2 machine(s)" in out and "Done: 4 steps" in out
    assert "Done:" not in results[1][1]  # only global rank 0 reports
    [final] = (tmp_path / "runs").glob(f"*/{FINAL}")
    state = load_checkpoint(final)
    assert state["plan"]["world_size"] == 2 and state["plan"]["nodes"] == 2
    single, _ = run(make_config(manual(16, 2, COMMON)))  # one process, twice the accumulation
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(state["model"][name], value, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_a_killed_node_stops_the_other_within_a_bounded_time_in_one_line(make_config, tmp_path):
    config = make_config(manual(16, 1, "CONFIG_MAX_STEPS=100000\nCONFIG_LOG_INTERVAL=1\n"))
    port = free_port()
    nodes = [start_node(tmp_path, Path(config.source), rank, port) for rank in (0, 1)]
    deadline = time.monotonic() + 180
    lines = []
    while time.monotonic() < deadline:  # until both ranks train: node 0 logs steps
        line = nodes[0].stdout.readline()
        lines.append(line)
        if line.startswith("step ") and "/" in line.split()[1] and int(line.split()[1].split("/")[0]) >= 3:
            break
    else:
        pytest.fail("no training step logged:\n" + "".join(lines))
    os.killpg(nodes[1].pid, signal.SIGKILL)  # the whole machine: launcher, torchrun agent and rank
    killed_at = time.monotonic()
    code, _, err = finish(nodes[0], timeout=180)
    stopped_in = time.monotonic() - killed_at
    assert code != 0 and stopped_in < 120, (code, stopped_in)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert not any(word in err for word in NOISE), err
    # whichever saw it first (the rank's collective, or torchrun's rendezvous), the run can resume
    assert code in (3, 143), (code, err)


def test_a_two_machine_plan_shows_its_layout_and_the_network_it_assumes():
    """`make plan NNODES=2 GPU=h100 GPUS=8`: 8 processes on each of 2 machines, the strategy, and the step's
    collectives over the network between the machines."""
    from lib import api
    from lib.planning import make_plan
    from lib.planning.render import format_plan

    config = api.load_config("gpt2-tiny")
    h100s = api.machine(gpu="h100", gpus=8)
    model, plan = make_plan(config, h100s, gpus=8, nodes=2)
    assert (plan.world_size, plan.nodes) == (16, 2) and not any("share GPUs" in n for n in plan.notes)
    text = format_plan(plan, config, h100s, model)
    assert "8 per machine on each of 2 machines = 16" in text
    [line] = [row for row in text.splitlines() if row.strip().startswith("communication")]
    assert "crosses the network between machines (25 GB/s" in line or "across machines at" in line, line
    one = make_plan(config, h100s, gpus=8).plan
    assert one.predicted_step_seconds < plan.predicted_step_seconds  # the network costs time per step
    # each machine's cores are shared by its own 8 processes, not by all 16 (AWS p5: 24 vCPUs per H100)
    assert (plan.cpu_threads, plan.num_workers) == (one.cpu_threads, one.num_workers) and plan.num_workers == 4
