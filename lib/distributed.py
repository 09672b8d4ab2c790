"""Several training processes: launching torchrun, and the process group inside each rank.

`kfit train` decides the process count (GPUS=N, CONFIG_NPROC_MANUAL, or one per
identical GPU under CONFIG_NPROC_AUTO), validates the config, then replaces
itself with `python -m torch.distributed.run ... scripts/kfit.py train`. Each
rank then calls `setup()`: gloo on CPUs, NCCL on GPUs, device cuda:LOCAL_RANK.

Several machines: NNODES, NODE_RANK, MASTER_ADDR (and MASTER_PORT, default
29500) in the environment of every machine's `make train`; one machine uses
torchrun's --standalone rendezvous. NNODES=MIN:MAX is an elastic run: torchrun's
c10d rendezvous at MASTER_ADDR:MASTER_PORT (RDZV_ID names the job, default
"kfit"), machines joining and leaving between MIN and MAX; each restart plans
for the world size it gets, keeping the effective batch.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from .env import env_number
from .errors import KfitError
from .hardware.host import usable_cores
from .threads import cores_per_process

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class Rank:
    """Where this process stands; a single process is rank 0 of 1."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


SINGLE = Rank()


def under_torchrun(env=os.environ) -> bool:
    return "TORCHELASTIC_RUN_ID" in env or ("LOCAL_RANK" in env and "RANK" in env)


def process_count(config, hardware, device_type: str, env=os.environ) -> tuple[int, str]:
    """Training processes on this machine, and why: GPUS= wins, then NPROC_MANUAL, then AUTO."""
    gpus = env_number("GPUS", int, None, env)
    if gpus is not None:
        if gpus < 1:
            raise KfitError(f"GPUS={gpus}: give at least 1 process")
        return gpus, f"GPUS={gpus}"
    if config.nproc_mode == "manual":
        return config.nproc, f"CONFIG_NPROC={config.nproc}"
    if device_type == "cuda" and hardware.identical_gpu_count > 1:
        return hardware.identical_gpu_count, f"AUTO: {hardware.identical_gpu_count} identical GPUs"
    return 1, "AUTO: one process"


def nodes_range(env=os.environ) -> tuple[int, int]:
    """NNODES as (min, max) machines: N is (N, N), MIN:MAX an elastic range."""
    text = (env.get("NNODES") or "1").strip()
    low, _, high = text.partition(":")
    try:
        first, last = int(low), int(high or low)
    except ValueError:
        raise KfitError(f"NNODES={text!r}: give a number of machines, or MIN:MAX for an elastic run") from None
    if not 1 <= first <= last:
        raise KfitError(f"NNODES={text!r}: machines must be at least 1 (and MIN <= MAX)")
    return first, last


def torchrun_command(nproc: int, script: Path, env=os.environ) -> list[str]:
    """The torchrun command line that runs `script train` in nproc processes on this machine."""
    low, high = nodes_range(env)
    nnodes = high
    if low != high:
        if not env.get("MASTER_ADDR"):
            raise KfitError(f"NNODES={low}:{high} (elastic) needs MASTER_ADDR= (the rendezvous host, any machine "
                            "of the job) on every machine")
        endpoint = f"{env['MASTER_ADDR']}:{env_number('MASTER_PORT', int, DEFAULT_MASTER_PORT, env)}"
        rendezvous = ["--nnodes", f"{low}:{high}", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                      "--rdzv-id", env.get("RDZV_ID") or "kfit", "--max-restarts", "3"]
    elif nnodes > 1:
        if not env.get("MASTER_ADDR"):
            raise KfitError(f"NNODES={nnodes} needs MASTER_ADDR= (the address of the NODE_RANK=0 machine) and "
                            "NODE_RANK= (0..NNODES-1) on every machine")
        node_rank = env_number("NODE_RANK", int, None, env)
        if node_rank is None or not 0 <= node_rank < nnodes:
            raise KfitError(f"NODE_RANK={env.get('NODE_RANK')!r}: give this machine's rank, 0..{nnodes - 1}")
        rendezvous = ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr",
                      env["MASTER_ADDR"], "--master-port", str(env_number("MASTER_PORT", int, DEFAULT_MASTER_PORT, env))]
    else:
        rendezvous = ["--standalone"]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *rendezvous,
            str(script), "train"]


def exec_torchrun(nproc: int, script: Path, env: dict[str, str], threads: int | None = None) -> None:
    """Replace this process with torchrun: signals reach it directly and its exit status is ours.

    threads: each rank's intra-op threads, lib.threads.decide_cpu_threads for nproc processes with the
    load measured here, before any rank starts (a rank would count its siblings as load). It reaches the
    ranks as OMP_NUM_THREADS, which their own decision then obeys (as it obeys one already set); without
    it, the usable cores are shared as if idle."""
    command = torchrun_command(nproc, script, env)
    if threads is None:
        threads = cores_per_process(usable_cores(), nproc)
    env.setdefault("OMP_NUM_THREADS", str(threads))  # set, torchrun's banner about defaulting it to 1 stays away
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)


def run_torchrun(nproc: int, script: Path, env: dict[str, str], *, threads: int | None = None,
                 relaunch: Callable[[float], str | None] | None = None, attempts: int = 0) -> int:
    """torchrun as a child process, relaunched (at most `attempts` times) when it failed and
    `relaunch(launched_at)` gives a reason: a sharded run that ran out of memory, which continues from its
    last checkpoint at half the micro-batch (lib/trainer/stepper.py mark_oom). Used for sharded runs only,
    where no rank can recover in place; SIGTERM is passed on to torchrun (which passes it to the ranks:
    they checkpoint and stop), and the exit status is then 143 as for one process. `threads` as
    exec_torchrun's."""
    command = torchrun_command(nproc, script, env)
    env.setdefault("OMP_NUM_THREADS", str(threads or cores_per_process(usable_cores(), nproc)))
    stopped: list[int] = []
    code = 1
    for _ in range(attempts + 1):
        launched = time.time()
        sys.stdout.flush()
        sys.stderr.flush()
        child = subprocess.Popen(command, env=env)

        def forward(signum, frame, child=child):
            stopped.append(signum)
            if signum == signal.SIGTERM:  # Ctrl-C reaches torchrun and the ranks from the terminal already
                child.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            code = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if stopped:
            return 128 + stopped[0] if code else 0
        why = relaunch(launched) if code and relaunch else None
        if why is None:
            return code
        print(why, flush=True)
    return code


def current(env=os.environ) -> Rank:
    """This process's rank, from torchrun's environment."""
    if not under_torchrun(env):
        return SINGLE
    return Rank(rank=env_number("RANK", int, 0, env), local_rank=env_number("LOCAL_RANK", int, 0, env),
                world_size=env_number("WORLD_SIZE", int, 1, env), local_world_size=env_number("LOCAL_WORLD_SIZE", int, 1, env))


def setup(device_type: str) -> Rank:
    """Join the process group (NCCL on GPUs, gloo on CPUs).

    Threads are not set here: each rank runs the plan's (lib.threads, which obeys the OMP_NUM_THREADS
    the launcher sets), as oversubscribed threads made a 0.3 s epoch take 33 s."""
    rank = current()
    if not rank.active:
        return rank
    if device_type == "cuda":
        torch.cuda.set_device(rank.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return rank


def teardown() -> None:
    """Leave the process group. Everything holding tensors must be released first: gloo aborts at exit
    ('terminate called without an active exception') about 1 run in 4 otherwise."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def device_for(rank: Rank, device_type: str) -> torch.device:
    return torch.device("cuda", rank.local_rank) if device_type == "cuda" and rank.active else torch.device(device_type)


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum over all ranks (the values themselves in a single process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_min(value: int, device: torch.device) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def broadcast(value, src: int = 0):
    """rank src's picklable value on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_gradients(parameters: list[torch.nn.Parameter]) -> None:
    """Sum gradients over ranks in one flat buffer (used when every micro-batch ran under no_sync,
    so an out-of-memory error on one rank could not leave DDP's collectives half done)."""
    grads = []
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
        g.copy_(reduced)


def hardware_for_rank(hardware, rank: Rank, nproc: int, warn):
    """The profile a rank plans against: its own GPU first; mixed models plan for the smallest."""
    gpus = hardware.gpus
    if not rank.active or len(gpus) <= 1:
        return hardware
    used = gpus[:max(1, min(nproc, len(gpus)))]
    mine = rank.local_rank % len(gpus)
    own = gpus[mine]
    if len({(g.name, g.total_bytes) for g in used}) > 1:
        smallest = min(used, key=lambda g: (g.free_bytes, g.total_bytes))
        if rank.is_main:
            warn(f"warning: the {len(used)} GPUs differ ({', '.join(sorted({g.name for g in used}))}): every "
                 f"rank plans for the smallest, {smallest.name} ({smallest.free_bytes / 2**30:.1f}GiB free)")
        own = dataclasses.replace(smallest, index=own.index)
    return dataclasses.replace(hardware, gpus=(own,) + gpus[:mine] + gpus[mine + 1:])
