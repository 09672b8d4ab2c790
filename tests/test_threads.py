"""CPU threads per training process (lib/threads.py) and the CPU load they are decided from (lib/hardware/host.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest
import torch

from lib import config as kc
from lib import distributed
from lib.hardware import from_catalog, host, resolve_hardware
from lib.threads import cores_per_process, decide_cpu_threads, decide_loader_workers, using_threads

CPU = resolve_hardware(gpu="cpu")
H100 = from_catalog("h100")


def with_cores(hardware, cores: int):
    return dataclasses.replace(hardware, cpu=dataclasses.replace(hardware.cpu, logical_cores=cores,
                                                                 physical_cores=cores))


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return kc.make_defconfig("lenet5", out=tmp_path_factory.mktemp("threads") / ".config")


@pytest.mark.parametrize("cores, idle, processes, expected", [
    (2, 2.0, 1, 2), (2, 1.8, 1, 2),  # a little background use still leaves the core
    (2, 1.7, 1, 1), (2, 1.0, 1, 1), (2, 0.0, 1, 1),  # never more threads than idle cores, never 0
    (2, 2.0, 2, 1), (16, 16.0, 2, 8), (16, 15.0, 1, 15), (16, 12.3, 4, 3),
    (2, None, 1, 2), (16, None, 3, 5),  # load not measured: every usable core counts
    (2, 5.0, 1, 2),  # idle beyond the profile's cores is capped
])
def test_cpu_threads_are_idle_cores_per_process(config, cores, idle, processes, expected):
    threads, why = decide_cpu_threads(config, "cpu", with_cores(CPU, cores), processes, idle_cores=idle)
    assert threads == expected
    assert why.startswith("AUTO: ") and f"{processes} process(es)" in why
    assert ("not measured" in why) == (idle is None)


def test_manual_setting_and_environment_win(config):
    manual = kc.derive(config, {"CPU_THREADS": 3})
    assert manual.cpu_threads == 3 and config.cpu_threads == 0
    assert decide_cpu_threads(manual, "cpu", CPU, 1, idle_cores=0.0, omp_threads=7) == (
        3, "MANUAL: CONFIG_CPU_THREADS=3")
    threads, why = decide_cpu_threads(config, "cpu", with_cores(CPU, 16), 1, idle_cores=16.0,
                                      omp_threads=1)
    assert (threads, why) == (1, "AUTO: OMP_NUM_THREADS=1 in the environment")


def test_gpu_keeps_a_few_threads_beside_the_loader_workers(config):
    threads, why = decide_cpu_threads(config, "cuda", with_cores(H100, 16), 1, idle_cores=16.0)
    assert threads == 4 and "4 for data loader workers" in why
    assert decide_cpu_threads(config, "cuda", with_cores(H100, 16), 8, idle_cores=16.0)[0] == 1
    assert decide_loader_workers(config, "cuda", with_cores(H100, 16), 1, idle_cores=16.0)[0] == 4
    assert decide_loader_workers(config, "cuda", with_cores(H100, 16), 1, idle_cores=2.0)[0] == 1
    assert decide_loader_workers(config, "cuda", with_cores(H100, 16), 8, idle_cores=16.0)[0] == 1
    assert decide_loader_workers(config, "cpu", with_cores(CPU, 16), 1, idle_cores=16.0)[0] == 0


def test_cores_per_process_is_at_least_one():
    assert [cores_per_process(c, 2) for c in (0.0, 1.0, 2.0, 3.8, 4.0)] == [1, 1, 1, 2, 2]


def test_load_meter_counts_other_processes_not_this_one(monkeypatch):
    # (wall s, busy CPU s on the usable cores, this process's CPU s, cgroup CPU s)
    snapshots = iter([(10.0, 100.0, 5.0, None), (10.5, 101.0, 5.2, None)])
    monkeypatch.setattr(host.CPULoadMeter, "_snapshot", lambda self: next(snapshots))
    monkeypatch.setattr(host, "usable_cores", lambda: 4.0)
    load = host.CPULoadMeter().read()
    assert load.busy_cores == pytest.approx(1.6)  # (1.0 - 0.2) CPU s over 0.5 s
    assert load.idle_cores == pytest.approx(2.4)
    assert "2.4 of 4 usable cores idle" in load.describe()


@pytest.mark.parametrize("files, expected", [
    ({"/sys/fs/cgroup/cpu.max": "150000 100000"}, 1.5),
    ({"/sys/fs/cgroup/cpu.max": "max 100000"}, None),
    ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}, None),
    ({"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "300000",
      "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000"}, 3.0),
    ({}, None),
])
def test_cgroup_cpu_quota(monkeypatch, files, expected):
    monkeypatch.setattr(host, "_read_first", lambda *paths: next(((p, files[p]) for p in paths if p in files), None))
    assert host._cgroup_cpu_quota() == expected


def test_cpu_load_sees_a_busy_process_quickly():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        start = time.perf_counter()
        load = host.cpu_load(0.3)
        assert time.perf_counter() - start < 0.6
    finally:
        spinner.kill()
        spinner.wait()
    assert load.busy_cores >= 0.7 and load.usable_cores == host.usable_cores()


def test_launcher_passes_the_threads_to_every_rank(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(distributed.os, "execve", lambda path, argv, env: seen.update(env))
    distributed.exec_torchrun(2, tmp_path / "kfit.py", {}, threads=3)
    assert seen["OMP_NUM_THREADS"] == "3"
    distributed.exec_torchrun(2, tmp_path / "kfit.py", {"OMP_NUM_THREADS": "1"}, threads=3)
    assert seen["OMP_NUM_THREADS"] == "1"  # the user's setting stays
    distributed.exec_torchrun(2, tmp_path / "kfit.py", {})
    assert seen["OMP_NUM_THREADS"] == str(cores_per_process(host.usable_cores(), 2))


def test_using_threads_restores_the_count():
    before = torch.get_num_threads()
    with using_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    with using_threads(None):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before
