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
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import torch
import torch.distributed as dist

from .env import env_number, environ, out_of_range
from .units import MAXIMA
from .torchrun_output import TorchrunOutput, explain
from .errors import KfitError
from .hardware.host import usable_cores
from .redact import shown
from .threads import cores_per_process

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class Rank:
    """Where this process stands; a single process is rank 0 of 1."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    tensor: int = 1  # processes per tensor-parallel group (CONFIG_TP): consecutive ranks, the same samples
    pipeline: int = 1  # pipeline stages (CONFIG_PP): the outermost cut, world_size / pipeline processes each
    context: int = 1  # processes per context-parallel group (CONFIG_CP): around each tensor-parallel group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def stage_rank(self) -> int:
        """Which pipeline stage (of CONFIG_PP's) this process runs: 0 without pipeline parallelism."""
        return self.rank // (self.world_size // self.pipeline)

    @property
    def data_rank(self) -> int:
        """Which data-parallel group this process belongs to: which slice of every window it trains on."""
        return self.rank % (self.world_size // self.pipeline) // (self.tensor * self.context)

    @property
    def data_world(self) -> int:
        """The data-parallel groups: how many slices a window is cut into."""
        return self.world_size // (self.tensor * self.pipeline * self.context)

    @property
    def counts(self) -> bool:
        """Whether this rank's loss sums count in the sums over ranks: one rank per tensor-parallel group, whose
        processes all computed the same loss on the same samples, on the last pipeline stage (the only one
        that computes it). Every process of a context-parallel group counts, each for its chunks of the
        samples (`loss_weight`)."""
        return self.rank % self.tensor == 0 and self.stage_rank == self.pipeline - 1

    @property
    def loss_weight(self) -> float:
        """What this rank's loss sum weighs in the sums over ranks: 0 where it does not count, 1 / CP for each
        process of a context-parallel group, whose losses are its chunks' means (equal chunks: their mean is
        the samples')."""
        return 1.0 / self.context if self.counts else 0.0

    @property
    def active(self) -> bool:
        return self.world_size > 1


SINGLE = Rank()


def under_torchrun(env: Mapping[str, str] | None = None) -> bool:
    env = environ() if env is None else env
    return "TORCHELASTIC_RUN_ID" in env or ("LOCAL_RANK" in env and "RANK" in env)


def nodes_range(env: Mapping[str, str]) -> tuple[int, int]:
    """NNODES as (min, max) machines: N is (N, N), MIN:MAX an elastic range."""
    text = (env.get("NNODES") or "1").strip()
    low, _, high = text.partition(":")
    most = MAXIMA["NODES"]
    accepted = (f"give a whole number of machines from 1 to {most:,}, or MIN:MAX (1 <= MIN <= MAX) for an elastic "
                "run")
    try:
        if not text.isascii():  # int() reads every script's digits: NNODES=٣ planned 3 machines
            raise ValueError(text)
        first, last = int(low), int(high or low)
    except ValueError:
        if all(out_of_range(part) for part in (low, high or low)):  # more digits than Python converts
            raise KfitError(f"NNODES='{shown(text, 40)}' is out of range: {accepted}") from None
        raise KfitError(f"NNODES='{shown(text, 40)}' is not a number of machines: {accepted}") from None
    if not 1 <= first <= last <= most:
        raise KfitError(f"NNODES='{shown(text, 40)}' is out of range: {accepted}")
    return first, last


# A host name or IPv4/IPv6 address, as MASTER_ADDR= may give one (letters, digits, '.', '-', ':', '[', ']')
_HOST = re.compile(r"[A-Za-z0-9.:\[\]-]{1,253}")


def _check_rendezvous(env: Mapping[str, str]) -> None:
    """MASTER_ADDR= and MASTER_PORT= checked before torchrun starts (it would fail with its own traceback)."""
    address = env.get("MASTER_ADDR")
    if address and not _HOST.fullmatch(address):
        raise KfitError(f"MASTER_ADDR='{shown(address, 80)}' is not a host name or address: give the NODE_RANK=0 "
                        "machine's name or IP address")
    env_number("MASTER_PORT", int, DEFAULT_MASTER_PORT, env, minimum=1, maximum=65535)


def torchrun_command(nproc: int, script: Path, env: Mapping[str, str], script_args: tuple[str, ...] = ("train",)
                     ) -> list[str]:
    """The torchrun command line that runs `script <script_args>` in nproc processes on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *rendezvous_args(env),
            str(script), *script_args]


def rendezvous_args(env: Mapping[str, str]) -> list[str]:
    """torchrun's arguments for the machines NNODES= names (NODE_RANK, MASTER_ADDR, MASTER_PORT), each checked:
    a KfitError naming the variable and its range. `make train` asks before it plans, so a bad one is refused
    before any work."""
    low, high = nodes_range(env)
    nnodes = high
    if nnodes > 1 or low != high:
        _check_rendezvous(env)
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
            raise KfitError(f"NODE_RANK='{shown(env.get('NODE_RANK') or '', 40)}': give this machine's rank, "
                            f"0..{nnodes - 1}")
        rendezvous = ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr",
                      env["MASTER_ADDR"], "--master-port", str(env_number("MASTER_PORT", int, DEFAULT_MASTER_PORT, env))]
    else:
        rendezvous = ["--standalone"]
    return rendezvous


def _with_threads(nproc: int, env: dict[str, str], threads: int | None) -> dict[str, str]:
    """threads: each rank's intra-op threads, lib.threads.decide_cpu_threads for nproc processes with the
    load measured here, before any rank starts (a rank would count its siblings as load). It reaches the
    ranks as OMP_NUM_THREADS, which their own decision then obeys (as it obeys one already set); without
    it, the usable cores are shared as if idle."""
    # set, torchrun's banner about defaulting it to 1 stays away; a user's 0 is no count (lib.threads ignores
    # it too), and would reach every rank's OpenMP as an invalid value
    if (env_number("OMP_NUM_THREADS", int, None, env) or 0) < 1:
        env["OMP_NUM_THREADS"] = str(threads or cores_per_process(usable_cores(), nproc))
    return env


def exec_torchrun(nproc: int, script: Path, env: dict[str, str], threads: int | None = None) -> None:
    """Replace this process with torchrun. `kfit train` uses run_torchrun, which keeps torchrun's own
    tracebacks off the terminal; this is for callers that want torchrun's exit status and output as is."""
    command = torchrun_command(nproc, script, env)
    _with_threads(nproc, env, threads)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)


def _die_with_parent() -> None:
    """In the torchrun child, before exec: SIGTERM when kfit dies, so that no orphaned torchrun keeps training
    (it runs in its own session, out of reach of signals to kfit's process group)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_torchrun(nproc: int, script: Path, env: dict[str, str], *, threads: int | None = None,
                 relaunch: Callable[[float], str | None] | None = None, attempts: int = 0,
                 log_path: Path | None = None, script_args: tuple[str, ...] = ("train",),
                 withheld: frozenset[str] = frozenset()) -> int:
    """torchrun as a child process; its exit status, as one process's would be, is returned.

    torchrun runs in its own session: SIGTERM and SIGINT reach it once, from here (it passes SIGTERM to the
    ranks: they checkpoint and stop), and the status is then 143 / 130 as for one process. Its own output on
    stderr (the traceback it prints when stopped or when a rank fails) is appended to `log_path` instead
    (default: kfit-torchrun-<this pid>.log in the temporary directory, out of the runs' directory), and a
    rank killed by a signal is one error line naming it and the log.

    It is relaunched (at most `attempts` times) when it failed and `relaunch(launched_at)` gives a reason:
    a sharded run that ran out of memory, which continues from its last checkpoint at half the micro-batch
    (lib/trainer/loop.py mark_oom). `threads` as _with_threads'. `env` says where the job meets (NNODES=,
    MASTER_ADDR=, ...); the variables named in `withheld` are kept from torchrun and its ranks."""
    command = torchrun_command(nproc, script, env, script_args)
    env = {name: value for name, value in env.items() if name not in withheld}
    _with_threads(nproc, env, threads)
    log_path = log_path or Path(tempfile.gettempdir()) / f"kfit-torchrun-{os.getpid()}.log"
    stopped: list[int] = []
    code = 1
    for _ in range(attempts + 1):
        launched = time.time()
        sys.stdout.flush()
        sys.stderr.flush()
        child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, errors="replace",
                                 bufsize=1, start_new_session=True, preexec_fn=_die_with_parent)

        def forward(signum, frame, child=child):
            stopped.append(signum)
            child.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        output = TorchrunOutput(child.pid, sys.stderr)

        def read(stream=child.stderr, output=output):
            for line in stream:
                output.feed(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            code = child.wait()
            # ranks orphaned by a killed torchrun may hold the pipe open: do not wait for them for ever
            reader.join(timeout=60)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            log_path = output.close(log_path)
        if output.signal and not stopped:  # torchrun itself was signalled, not through kfit
            stopped.append(output.signal)
        if stopped:
            return 128 + stopped[0] if code else 0
        if code == 0:
            return 0
        why = relaunch(launched) if relaunch else None
        if why is None:
            return explain(output, code, log_path)
        print(why, flush=True)
    return code


def current(env: Mapping[str, str] | None = None) -> Rank:
    """This process's rank, from torchrun's environment."""
    env = environ() if env is None else env
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


# What a collective raises when another process of the job is gone (gloo's and NCCL's words, and c10d's store)
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
              "DistNetworkError", "recvValueWithTimeout failed", "Socket Timeout", "remote process exited")


def peer_lost(error: BaseException) -> bool:
    """Whether `error` says another training process (a rank, or a whole machine) stopped under this one."""
    text = f"{type(error).__name__}: {error}"
    return isinstance(error, RuntimeError) and any(words in text for words in _PEER_LOST)


def teardown() -> None:
    """Leave the process group. Everything holding tensors must be released first: gloo aborts at exit
    ('terminate called without an active exception') about 1 run in 4 otherwise. With a peer gone the
    closing barrier cannot complete: the group is left without it."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        try:
            dist.barrier()
        except RuntimeError as err:
            if not peer_lost(err):
                raise
        dist.destroy_process_group()


def device_for(rank: Rank, device_type: str) -> torch.device:
    return torch.device("cuda", rank.local_rank) if device_type == "cuda" and rank.active else torch.device(device_type)


def all_sum(values: list[float], device: torch.device, group=None) -> list[float]:
    """Element-wise sum over all ranks (the values themselves in a single process); group: the ranks' group
    to sum over (None: the default one), its tensor on `device`."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, group=group)
    return t.tolist()


def sum_on_device(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over all ranks in place, over the default group: with NCCL the host queues the
    collective and goes on, and waits only when it reads the tensor."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def collectives_on_device() -> bool:
    """Whether the default group's collectives run on the device (NCCL), so that reading their result back
    waits for every kernel queued before them; gloo's run on the host."""
    return dist.is_available() and dist.is_initialized() and dist.get_backend() != "gloo"


def host_group():
    """A gloo group of all ranks, for values the host holds (a step's flags): its all-reduce waits for the
    other ranks' hosts, never for a device. Every rank must call it, in the same order."""
    return dist.new_group(backend="gloo")


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


def hardware_for_rank(hardware, rank: Rank):
    """The profile a rank plans against: its own GPU first. Where the GPUs differ, the resolver sizes the
    plan for the smallest the processes use (HardwareProfile.for_processes), the same plan on every rank."""
    gpus = hardware.gpus
    if not rank.active or len(gpus) <= 1:
        return hardware
    mine = rank.local_rank % len(gpus)
    return dataclasses.replace(hardware, gpus=(gpus[mine],) + gpus[:mine] + gpus[mine + 1:])
