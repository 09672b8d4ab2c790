"""How many CPU threads each training process runs, decided for the machine as it is when training starts.

The one place for that decision: the plan (lib.hyperparams), the trainer
(torch.set_num_threads) and the torchrun launcher (OMP_NUM_THREADS for every
rank, lib.distributed) all take it from here. The load other processes put on
the CPU is measured by lib.hardware.host.cpu_load(); this module only decides.

Measured on a 2-core CPU shared with other jobs, 2 threads against 1: with
about one core busy elsewhere a LeNet-5 step (batch 512) took 1.2-1.3x and a
ResNet-18 step (batch 32) 1.7-1.9x as long; with 1.3-1.7 cores busy, 3.5-12x
and 3.5-7x (OpenMP's threads wait at every barrier for the one sharing its
core). A thread too few costs at most the idle core's share. So the rule rounds
down: idle cores / processes, at least 1. Load moves within seconds there, so a
timed comparison of thread counts cached per machine and model would keep the
load of its moment: none is made.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from .config import Config
from .hardware import HardwareProfile

# Other processes' use below this many cores (daemons, a shell) does not take a core away.
IDLE_SLACK_CORES = 0.25
# On a GPU the CPU runs the training loop and feeds the loader: a few intra-op threads are plenty.
GPU_MAX_THREADS = 4
GPU_MAX_WORKERS = 4


def cores_per_process(idle_cores: float, processes: int) -> int:
    """Whole idle cores for each of `processes` processes, at least 1."""
    return max(1, int((idle_cores + IDLE_SLACK_CORES) // max(1, processes)))


def _idle(hardware: HardwareProfile, idle_cores: float | None) -> tuple[float, str]:
    usable = hardware.cpu.logical_cores
    if idle_cores is None:
        return float(usable), f"{usable} usable cores (load not measured)"
    idle = max(0.0, min(float(usable), idle_cores))
    return idle, f"{idle:.1f} of {usable} usable cores idle at start"


def decide_cpu_threads(config: Config, device_type: str, hardware: HardwareProfile, world_size: int, *,
                       idle_cores: float | None, omp_threads: int | None = None) -> tuple[int, str]:
    """Intra-op threads per training process, and why.

    world_size: the training processes sharing this machine's cores. idle_cores:
    usable cores that other processes leave idle (host.cpu_load().idle_cores), None when
    not measured (a profile from JSON or the catalog): then every usable core counts as idle.
    CONFIG_CPU_THREADS wins, then `omp_threads`: OMP_NUM_THREADS in the environment (which the torchrun
    launcher sets for its ranks from this same decision; lib.planning.Settings reads it), then the rule.
    """
    if config.cpu_threads:
        return config.cpu_threads, f"MANUAL: CONFIG_CPU_THREADS={config.cpu_threads}"
    if omp_threads is not None and omp_threads > 0:
        return omp_threads, f"AUTO: OMP_NUM_THREADS={omp_threads} in the environment"
    processes = max(1, world_size)
    idle, load = _idle(hardware, idle_cores)
    per_process = cores_per_process(idle, processes)
    share = f"{load}, {processes} process(es): {per_process} core(s) each"
    if device_type == "cpu":
        return per_process, (f"AUTO: {share}; not more threads than idle cores (one more made steps "
                             "1.2-12x slower here)")
    workers = loader_workers(per_process)
    threads = max(1, min(GPU_MAX_THREADS, per_process - workers))
    return threads, f"AUTO: {share}, {workers} for data loader workers; the GPU computes (at most {GPU_MAX_THREADS})"


def loader_workers(per_process_cores: int) -> int:
    """Data loader workers beside a GPU training loop: the process's cores less one for the loop, at most 4."""
    return max(0, min(GPU_MAX_WORKERS, per_process_cores - 1))


def decide_loader_workers(config: Config, device_type: str, hardware: HardwareProfile, world_size: int, *,
                          idle_cores: float | None) -> tuple[int, str]:
    """DataLoader worker processes per training process, and why (from the same idle cores as the threads)."""
    if config.workers_mode == "manual":
        return config.dataloader_workers, "MANUAL: CONFIG_DATALOADER_WORKERS"
    if device_type == "cpu":
        return 0, "AUTO: CPU training: worker processes would compete with training for the same cores"
    idle, load = _idle(hardware, idle_cores)
    per_process = cores_per_process(idle, world_size)
    return loader_workers(per_process), (f"AUTO: {load}, {per_process} per process, one kept for the "
                                         f"training loop (at most {GPU_MAX_WORKERS})")


def decide_prefetch(config: Config, workers: int) -> tuple[int, str | None]:
    """Batches each loader worker prepares ahead (0: torch's default), and a note where
    CONFIG_DATA_PREFETCH_FACTOR is set but the plan has no workers to use it."""
    factor = config.data_prefetch_factor
    if factor and not workers:
        return 0, (f"CONFIG_DATA_PREFETCH_FACTOR={factor} is unused: the plan has no data loader workers "
                   "(CONFIG_DATALOADER_WORKERS_MANUAL sets some)")
    return factor, None


@contextlib.contextmanager
def using_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `threads` inside (unchanged for None), restored after: timings taken
    while planning (lib.steptime) must run at the threads the training will."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
