"""Sharded training (FSDP2): strategies, the even micro-batch count, sharded checkpoints, and real
2-process gloo runs on the CPU: equal to one process, resumed exactly, resumed onto 1 and from 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lib import checkpoint, parallel
from lib import config as kc
from lib.errors import PlanError
from lib.export import export, load_exported
from lib.hyperparams import ModelDescription, resolve
from lib.models import build_model
from lib.steptime.comm import BUS_EFFICIENCY, Communication
from lib.planning import ChooseArgs
from lib.planning.strategy import candidates, pick
from lib.trainer import Trainer
from lib.trainer.windows import rank_batches
from tests.helpers import CPU, counting_resolves

ROOT = Path(__file__).resolve().parent.parent
KFIT = [sys.executable, str(ROOT / "scripts" / "kfit.py")]

# gpt2-tiny, 16 samples per optimizer step however many processes share them (AUTO plans the split).
COMMON = ("CONFIG_DEVICE_CPU=y\nCONFIG_TARGET_EFFECTIVE_BATCH=16\nCONFIG_OPTIMIZER_ADAMW=y\n"
          "CONFIG_LEARNING_RATE=\"1e-3\"\nCONFIG_LOG_INTERVAL=1\nCONFIG_CHECKPOINT_INTERVAL_STEPS=y\n"
          "CONFIG_CHECKPOINT_EVERY_STEPS=2\nCONFIG_CHECKPOINT_KEEP=2\nCONFIG_EVAL_INTERVAL=1000\n"
          "CONFIG_OUTPUT_DIR=\"runs\"\nCONFIG_GRAD_CLIP=\"1.0\"\n")
STEPS = 8


def corpus(directory: Path) -> Path:
    """The first 40,000 characters of the embedded text: 281 training windows, more than the 8 x 16 samples
    trained, and 31 validation windows, so that each run's final evaluation (which every test here pays, and
    none asserts beyond running) takes a tenth of a second instead of 3 s over the embedded text's 364."""
    from lib.data.text import embedded_text

    text = bytes(torch.cat([embedded_text().train, embedded_text().val])[:40_000].tolist())
    (directory / "corpus").mkdir(exist_ok=True)
    (directory / "corpus" / "text.txt").write_bytes(text)
    return directory / "corpus"


def write_config(directory: Path, extra: str = "", steps: int = STEPS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = f'CONFIG_DATASET_DIR=y\nCONFIG_DATA_DIR="{corpus(directory)}"\n'
    (directory / "fragment").write_text(COMMON + data + f"CONFIG_MAX_STEPS={steps}\n" + extra)
    kc.make_defconfig("gpt2-tiny", ["fsdp", str(directory / "fragment")], out=directory / ".config")
    return directory / ".config"


def env_for(config: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUS", "WORLD_SIZE", "RANK", "LOCAL_RANK", "RESUME",
                                                             "KFIT_INJECT_OOM", "NNODES", "TP")}
    return {**env, "KCONFIG_CONFIG": str(config), "OMP_NUM_THREADS": "1", **extra}


def losses(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {line["step"]: line["loss"] for line in lines if "loss" in line}


def train(directory: Path, config: Path, gpus: int, stop_after: int | None = None,
          args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`kfit train` (and `args`) with GPUS=gpus in `directory`; with stop_after, SIGTERM once that many steps
    are logged."""
    env = env_for(config, GPUS=str(gpus))
    if stop_after is None:
        return subprocess.run(KFIT + ["train", *args], cwd=directory, env=env, capture_output=True, text=True,
                              timeout=300)
    proc = subprocess.Popen(KFIT + ["train", *args], cwd=directory, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = list((directory / "runs").glob("*/metrics.jsonl"))
        if metrics and metrics[0].read_text().count('"loss"') >= stop_after:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def interrupted_run(directory: Path, gpus: int) -> tuple[Path, subprocess.CompletedProcess, Path]:
    """(config, output, run directory) of a run on `gpus` processes stopped by SIGTERM after 3 steps."""
    config = write_config(directory)
    stopped = train(directory, config, gpus=gpus, stop_after=3)
    assert stopped.returncode == 143, stopped.stdout  # 128 + SIGTERM, after a checkpoint
    [run_dir] = (directory / "runs").iterdir()
    return config, stopped, run_dir


def single_process_reference(directory: Path) -> tuple[dict, dict]:
    """(final weights, losses by step) of one process taking the same 16 samples per step."""
    config = kc.read_config(write_config(directory))
    plan = resolve(config, CPU, ModelDescription.from_config(config))
    trainer = Trainer(config, plan, CPU, run_dir=directory / "runs" / "one", log=lambda line: None)
    trainer.fit()
    return trainer.model.state_dict(), losses(directory / "runs" / "one")


def assert_close_weights(state: dict, reference: dict) -> None:
    for name, value in reference.items():
        torch.testing.assert_close(state[name], value, atol=2e-5, rtol=1e-4, msg=name)


# --------------------------------------------------------------------------
# Pieces


def test_every_rank_runs_as_many_micro_batches_under_fsdp():
    window = list(range(9))  # an epoch's short last window: 4 and 5 samples
    plain = [rank_batches(window, r, 2, 4) for r in range(2)]
    assert [[len(i) for i, _ in b] for b in plain] == [[4], [3, 2]]  # 5: 4 + a lone one, the two halved
    even = [rank_batches(window, r, 2, 4, equal_counts=True) for r in range(2)]
    assert [len(b) for b in even] == [2, 2]
    assert even[0][-1][1] == 0.0  # the filler weighs nothing
    assert sum(w for b in even for _, w in b) == pytest.approx(1.0)


def test_shard_units_are_blocks_or_stages():
    gpt2 = build_model("gpt2", gpt2_preset="tiny", block_size=32, vocab_size=64)
    assert parallel.shard_units(gpt2) == list(gpt2.transformer.h)
    resnet = build_model("resnet18", num_classes=10, in_channels=3, image_size=32)
    assert [type(u).__name__ for u in parallel.shard_units(resnet)] == ["Sequential"] * 4
    assert parallel.mesh_shape("hsdp", 8, 4) == (2, 4) and parallel.mesh_shape("fsdp", 8, 4) == (8,)


def test_strategy_candidates(tmp_path):
    auto = kc.make_defconfig("gpt2-tiny", out=tmp_path / "a")
    assert candidates(auto, 1, 1)[0] == ("none",)
    assert candidates(auto, 4, 1)[0] == ("ddp", "fsdp_grad_op", "fsdp")
    assert candidates(auto, 8, 2)[0][-1] == "hsdp"
    forced = kc.read_config(write_config(tmp_path / "f"))
    assert candidates(forced, 2, 1) == (("fsdp",), "CONFIG_PARALLEL_FSDP as configured")
    assert "resume" in candidates(forced, 1, 1)[1]


class _Policy:
    """A batch policy whose DDP cap is given and whose sharded strategies fit larger micro-batches."""

    name = "fake"

    def __init__(self, caps):
        self.caps = caps

    def choose(self, *, strategy="none", **_):
        from lib.plan import BatchChoice

        cap = self.caps[strategy]
        if cap == 0:
            raise PlanError(f"{strategy} does not fit even at micro-batch 1: the predicted peak is 9GB. "
                            "What would help: ...")
        return BatchChoice(max_micro=cap, reason=f"{strategy} cap {cap}", eval_batch=cap, eval_reason="")


def test_auto_keeps_ddp_while_a_replica_fits_and_shards_when_it_does_not(tmp_path):
    config = kc.make_defconfig("gpt2-tiny", out=tmp_path / "a")
    choose = ChooseArgs(hardware=None, model=None, device_type="cpu", compile=False, compile_mode=None,
                        precision="fp32", world_size=4, target=256, local_world_size=4)
    no_speed = lambda strategy, choice: None  # noqa: E731
    policy = _Policy({"ddp": 16, "fsdp_grad_op": 24, "fsdp": 32})
    assert pick(config, policy, choose, world_size=4, nodes=1, target=256, speed=no_speed)[0] == "ddp"
    policy = _Policy({"ddp": 0, "fsdp_grad_op": 0, "fsdp": 4})
    strategy, choice, _, why = pick(config, policy, choose, world_size=4, nodes=1, target=256, speed=no_speed)
    assert (strategy, choice.max_micro) == ("fsdp", 4) and "ddp: " in why and "does not fit" in why
    speeds = {"ddp": 300.0, "fsdp_grad_op": 900.0, "fsdp": 1000.0}  # a starved DDP stays a candidate
    policy = _Policy({"ddp": 2, "fsdp_grad_op": 8, "fsdp": 16})
    strategy, _, _, why = pick(config, policy, choose, world_size=4, nodes=1, target=256,
                               speed=lambda s, c: (speeds[s], None))
    assert strategy == "fsdp" and "fastest predicted" in why and "micro-batch 2 (< 8)" in why
    with pytest.raises(PlanError, match="no data-parallel strategy fits"):
        pick(config, _Policy({"ddp": 0, "fsdp_grad_op": 0, "fsdp": 0}), choose, world_size=4, nodes=1,
             target=256, speed=no_speed)


def test_forced_ddp_that_does_not_fit_names_fsdp(tmp_path):
    (tmp_path / "ddp").write_text("CONFIG_PARALLEL_DDP=y\n")
    config = kc.make_defconfig("gpt2-tiny", [str(tmp_path / "ddp")], out=tmp_path / "c")
    with pytest.raises(PlanError, match="FSDP would fit.*CONFIG_PARALLEL_FSDP"):
        pick(config, _Policy({"ddp": 0, "fsdp": 4}), ChooseArgs(hardware=None, model=None, device_type="cpu",
             compile=False, compile_mode=None, precision="fp32", world_size=4, target=64, local_world_size=4),
             world_size=4, nodes=1, target=64,
             speed=lambda s, c: None)


def test_communication_by_strategy():
    comm = dict(world_size=4, shard_size=4, parameter_bytes=2_000_000_000, gradient_bytes=4_000_000_000,
                link_bytes_per_s=100e9)
    rate = 100e9 * BUS_EFFICIENCY
    full, grad_op = Communication("fsdp", **comm), Communication("fsdp_grad_op", **comm)
    ddp = Communication("ddp", **comm)
    assert full.gather_seconds() == pytest.approx(2 * 0.75 * 2e9 / rate)
    assert grad_op.gather_seconds() == pytest.approx(full.gather_seconds() / 2)
    assert ddp.reduce_seconds() == pytest.approx(2 * 0.75 * 4e9 / rate)
    assert full.reduce_seconds() == pytest.approx(0.75 * 4e9 / rate)
    # compute hides what it outlasts: long micro-batches expose nothing, short ones the rest
    assert full.exposed_seconds([10.0, 10.0]) == 0.0
    assert full.exposed_seconds([0.0, 0.0]) == pytest.approx(2 * full.gather_seconds() + full.reduce_seconds())
    assert ddp.exposed_seconds([10.0]) == pytest.approx(ddp.reduce_seconds())  # after the step: not hidden
    hsdp = Communication("hsdp", world_size=8, shard_size=4, parameter_bytes=2_000_000_000,
                         gradient_bytes=4_000_000_000, link_bytes_per_s=100e9, network_bytes_per_s=25e9)
    across = 2 * 0.5 * (4e9 / 4) / (25e9 * BUS_EFFICIENCY)
    assert hsdp.reduce_seconds() == pytest.approx(0.75 * 4e9 / rate + across)


def test_sharded_checkpoints_are_listed_pruned_and_resume_candidates(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4):
        (run / f"checkpoint-{step}.dcp").mkdir(parents=True)
    (run / ".checkpoint-6.dcp.tmp").mkdir()  # an interrupted save: not a checkpoint
    checkpoint.save_checkpoint(run / "checkpoint-3.pt", {"x": 1})
    assert [s for s, _ in checkpoint.periodic_checkpoints(run)] == [4, 3, 2]
    checkpoint.prune(run, 1)
    assert [s for s, _ in checkpoint.periodic_checkpoints(run)] == [4]
    with pytest.raises(FileNotFoundError, match="metadata"):  # no .metadata: the save never finished
        checkpoint.load_checkpoint(run / "checkpoint-4.dcp")
    assert checkpoint.finished_checkpoint(run) is None
    (run / checkpoint.FINAL_SHARDED).mkdir()
    assert checkpoint.finished_checkpoint(run) == run / checkpoint.FINAL_SHARDED


# --------------------------------------------------------------------------
# Real runs: torchrun, gloo, 2 processes on this CPU


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return single_process_reference(tmp_path_factory.mktemp("one"))


@pytest.mark.slow
def test_fsdp_resumes_exactly_then_onto_one_process_and_from_one(tmp_path, reference):
    weights, reference_losses = reference
    # 2 processes, SIGTERM: every rank writes its shard of the checkpoint, exit 143
    config, stopped, run_dir = interrupted_run(tmp_path, gpus=2)
    assert "over 2 processes" in stopped.stdout
    assert json.loads((run_dir / "plan.json").read_text())["strategy"] == "fsdp"
    at = int(stopped.stdout.split("checkpoint saved at step ")[1].split()[0])
    sharded = checkpoint.periodic_path(run_dir, at, sharded=True)
    assert (sharded / "__0_0.distcp").is_file() and (sharded / "__1_0.distcp").is_file() and at < STEPS
    # ... resumed on 2 processes: the uninterrupted losses (the 2-process run is the 1-process run to 1e-4)
    again = train(tmp_path, config, gpus=2, stop_after=at + 2)
    assert again.returncode in (0, 143), again.stdout
    assert f"from step {at}" in again.stdout
    # ... and finished on 1 process: DCP loads the shards into a whole model
    finished = train(tmp_path, config, gpus=1)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "Resuming" in finished.stdout or again.returncode == 0
    got = losses(run_dir)
    for step, loss in reference_losses.items():
        assert got[step] == pytest.approx(loss, abs=1e-4), step
    final = checkpoint.finished_checkpoint(run_dir)
    assert final is not None
    assert_close_weights(load_exported(export(run_dir, tmp_path / "e")), weights)


@pytest.mark.slow
def test_one_process_run_resumes_onto_two_fsdp_processes(tmp_path, reference):
    weights, _ = reference
    config, _, run_dir = interrupted_run(tmp_path, gpus=1)
    assert any(p.suffix == ".pt" for _, p in checkpoint.periodic_checkpoints(run_dir))
    resumed = train(tmp_path, config, gpus=2)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Resuming" in resumed.stdout and "over 2 processes" in resumed.stdout
    assert resumed.stdout.count("Done:") == 1  # rank 0 reports
    assert (run_dir / checkpoint.FINAL_SHARDED / "__1_0.distcp").is_file()  # each rank wrote its shard
    # 1 process then 2 FSDP processes = 1 process throughout; export consolidates the shards
    assert_close_weights(load_exported(export(run_dir, tmp_path / "e")), weights)


def test_elastic_nnodes_uses_the_c10d_rendezvous():
    from lib import distributed
    from lib.errors import KfitError

    script = ROOT / "scripts" / "kfit.py"
    elastic = distributed.torchrun_command(8, script, {"NNODES": "2:4", "MASTER_ADDR": "10.0.0.1"})
    assert elastic[5:-2] == ["--nnodes", "2:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29500",
                             "--rdzv-id", "kfit", "--max-restarts", "3"]
    assert distributed.nodes_range({"NNODES": "2:4"}) == (2, 4)
    for bad in ("0", "4:2", "x"):
        with pytest.raises(KfitError, match="NNODES"):
            distributed.nodes_range({"NNODES": bad})
    with pytest.raises(KfitError, match="MASTER_ADDR"):
        distributed.torchrun_command(8, script, {"NNODES": "1:2"})


@pytest.mark.slow
def test_a_dead_fsdp_rank_stops_the_other_within_seconds(tmp_path):
    """SIGKILL one rank mid-run: torchrun stops the survivor (blocked in a collective with the dead one)
    and the run ends with an error instead of hanging; the last checkpoint stays resumable."""
    import psutil

    config = write_config(tmp_path, steps=400)
    proc = subprocess.Popen(KFIT + ["train"], cwd=tmp_path, env=env_for(config, GPUS="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = list((tmp_path / "runs").glob("*/metrics.jsonl"))
        if metrics and metrics[0].read_text().count('"loss"') >= 3:
            break
        time.sleep(0.05)
    def command(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # a finished child (the planner's trace) not reaped yet
            return ""

    ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
             if "kfit.py train" in command(p) and "torch.distributed.run" not in command(p)]
    assert len(ranks) == 2, [p.cmdline() for p in ranks]
    killed = time.monotonic()
    ranks[1].kill()
    out, _ = proc.communicate(timeout=120)
    print(f"the run ended {time.monotonic() - killed:.1f}s after the kill, exit {proc.returncode}")
    assert time.monotonic() - killed < 60 and proc.returncode not in (0, None), out
    assert "exitcode" in out or "Signals.SIGKILL" in out or "SIGKILL" in out, out[-2000:]
    [run_dir] = (tmp_path / "runs").iterdir()
    assert checkpoint.periodic_checkpoints(run_dir), "the checkpoints written before the kill are kept"


def test_gradients_sync_once_per_step_only_where_whole_gradients_fit():
    from types import SimpleNamespace

    from lib.hyperparams import decide_gradient_sync

    at = SimpleNamespace(trace=SimpleNamespace(parameters=1_000_000))  # 4 MB of whole fp32 gradients
    memory = dict(predicted_peak_bytes=10_000_000, budget_bytes=20_000_000, memory_breakdown={"activations": 1})
    sync, why, after = decide_gradient_sync(at, memory)
    assert sync == "step" and after["predicted_peak_bytes"] == 14_000_000
    assert after["memory_breakdown"]["accumulated_gradients"] == 4_000_000 and "once per step" in why
    sync, why, after = decide_gradient_sync(at, {**memory, "budget_bytes": 12_000_000})
    assert sync == "micro_batch" and after["predicted_peak_bytes"] == 10_000_000 and "every micro-batch" in why
    comm = Communication("fsdp", world_size=2, shard_size=2, parameter_bytes=0, gradient_bytes=8_000_000_000,
                         link_bytes_per_s=100e9)
    every = Communication(**{**comm.__dict__, "reduce_every_micro_batch": True})
    assert every.exposed_seconds([0.0] * 4) == pytest.approx(4 * comm.exposed_seconds([0.0] * 4))


@pytest.mark.slow
def test_out_of_memory_under_fsdp_relaunches_at_half_the_micro_batch(tmp_path, reference, kfit_here):
    """Every rank runs out of memory at the planned micro-batch (injected): no rank can redo the step alone, so the
    run marks half the micro-batch, torchrun is relaunched, and the run restarts in the same directory with
    the same effective batch: the same weights as one process."""
    weights, _ = reference
    config = write_config(tmp_path, "CONFIG_OOM_MAX_HALVINGS=10\n")  # evaluation halves from 31 to below it
    # the plan `make plan GPUS=2` shows, in this process (what trains below is a real torchrun run)
    planned = kfit_here(tmp_path, "plan", "--format", "json", KCONFIG_CONFIG=str(config), GPUS="2")
    micro = json.loads(planned.stdout)["micro_batch"]  # the planner's pick among near-ties: 4 or 8 here
    assert micro >= 2, planned.stdout
    resolves = tmp_path / "resolves.log"
    env = env_for(config, GPUS="2", KFIT_INJECT_OOM_ABOVE=str(micro - 1), **counting_resolves(resolves))
    result = subprocess.run(KFIT + ["train"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    half = micro // 2
    assert f"under FSDP: relaunching from the last checkpoint at micro-batch {half}" in result.stdout, result.stdout
    # planned once, by the launcher: the ranks, relaunched ones included, take its plan and halve it themselves
    [launcher] = resolves.read_text().splitlines()
    assert launcher.endswith(" gpt2 world_size=2")
    [run_dir] = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / checkpoint.OOM_MARKER).read_text())["micro_batch"] == half
    state = checkpoint.load_checkpoint(checkpoint.finished_checkpoint(run_dir))
    assert state["progress"]["micro_batch"] <= half and state["step"] == STEPS
    assert_close_weights(load_exported(export(run_dir, tmp_path / "e")), weights)


def _node(directory: Path, config: Path, rank: int, port: int) -> subprocess.Popen:
    env = env_for(config, GPUS="1", NNODES="2", NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen(KFIT + ["train"], cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "hsdp"])
def test_two_machines_shard_then_one_machine_resumes_with_the_same_effective_batch(tmp_path, reference, strategy):
    """Two torchrun agents on the loopback interface (two 'machines', one process each) train sharded, are
    stopped together as a scheduler stops a job, and one machine with two processes finishes the run from the
    sharded checkpoint: the losses and weights of one process taking the same 16 samples per step."""
    import socket

    weights, reference_losses = reference
    config = write_config(tmp_path, "CONFIG_PARALLEL_HSDP=y\n" if strategy == "hsdp" else "")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [_node(tmp_path, config, rank, port) for rank in (0, 1)]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and all(node.poll() is None for node in nodes):
        metrics = list((tmp_path / "runs").glob("*/metrics.jsonl"))
        if metrics and metrics[0].read_text().count('"loss"') >= 3:
            break
        time.sleep(0.05)
    for node in nodes:
        os.killpg(node.pid, signal.SIGTERM)
    outputs = [node.communicate(timeout=120) for node in nodes]
    for node, (out, err) in zip(nodes, outputs):
        assert node.returncode == 143, out + err  # each machine: a checkpoint, then stopped
        assert "Traceback" not in err and "frame #" not in err, err
    [run_dir] = (tmp_path / "runs").iterdir()
    plan = json.loads((run_dir / "plan.json").read_text())
    # HSDP across two machines of one process each: each machine holds whole parameters, replicated across them
    assert (plan["nodes"], plan["world_size"], plan["strategy"]) == (2, 2, strategy)
    at = int(outputs[0][0].split("checkpoint saved at step ")[1].split()[0])
    assert checkpoint.periodic_path(run_dir, at, sharded=True).is_dir() and at < STEPS
    finished = train(tmp_path, config, gpus=2)  # one machine now
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"from step {at}" in finished.stdout and "effective=16" in finished.stdout
    got = losses(run_dir)
    for step, loss in reference_losses.items():
        assert got[step] == pytest.approx(loss, abs=1e-4), step
    assert_close_weights(load_exported(export(run_dir, tmp_path / "e")), weights)


def test_net_gbps_sets_the_network_between_machines_and_never_beats_the_gpus_own_link():
    """CONFIG_NET_GBPS (make plan ... NET_GBPS=50): the network a ring over several machines crosses; 0 keeps
    the catalog's 25 GB/s, and a figure above the GPU's link within a machine is capped by that link."""
    from lib.hardware import catalog
    from lib.steptime.comm import communication_for

    def network(gbps, gpu="h100", world=16, local=8):
        comm = communication_for("fsdp", world_size=world, local_world_size=local, parameters=10**8,
                                 precision="bf16", device_name=gpu, device_kind="gpu", network_gbps=gbps)
        return comm.network_bytes_per_s

    assert network(None) == catalog.NETWORK_GBS * 1e9 == network(0)
    assert network(50) == 50e9 and network(12) == 12e9
    assert network(1000, gpu="h100-pcie") == catalog.PCIE5_X16_GBS * 1e9  # capped by its own PCIe link
    assert network(50, world=8, local=8) is None  # one machine: no network
    slow, fast = (communication_for("fsdp", world_size=16, local_world_size=8, parameters=10**9, precision="bf16",
                                    device_name="h100", device_kind="gpu", network_gbps=g) for g in (12, 50))
    assert fast.gather_seconds() < slow.gather_seconds() and "50 GB/s" in fast.describe()
