"""A plan for a catalog machine takes its CPU facts (loader workers, CPU threads, host RAM) from the machine
planned for: the GPU's usual cloud instance (catalog.HOSTS), or a HW= profile's own CPU."""

from __future__ import annotations

import dataclasses
import os

import pytest

from lib import config as kc
from lib.hardware import CPUInfo, catalog, detect_cpu, load_profile, resolve_hardware
from lib.hyperparams import ModelDescription, TierPolicy, resolve
from lib.units import GiB

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lenet5(tmp_path_factory):
    return kc.make_defconfig("lenet5", out=tmp_path_factory.mktemp("cfg") / ".config")


def plan(config, hardware, world_size: int = 1):
    return resolve(config, hardware, ModelDescription.from_config(config), world_size, TierPolicy())


def test_every_catalog_gpu_states_its_host():
    assert set(catalog.HOSTS) == set(catalog.catalog_keys())
    for key, host in catalog.HOSTS.items():
        assert host.machine and host.vcpus >= 4 and host.ram_gib >= 16, key


def test_a_catalog_machine_has_its_instance_s_cpu_and_ram():
    h100 = resolve_hardware(gpu="h100")
    assert h100.cpu.name == "AWS p5.48xlarge: 24 vCPUs and 256 GiB per GPU"
    assert (h100.cpu.logical_cores, h100.cpu.physical_cores, h100.cpu.ram_total_bytes, h100.cpu.idle_cores) == \
        (24, 12, 256 * GiB, None)
    eight = resolve_hardware(gpu="h100", gpus=8)  # the whole p5.48xlarge: 192 vCPUs, 2 TiB
    assert (eight.cpu.logical_cores, eight.cpu.ram_available_bytes) == (192, 2048 * GiB)
    assert resolve_hardware(gpu="mi300x").cpu.physical_cores == 12  # Azure's vCPUs are whole cores
    assert resolve_hardware(gpu="cpu").cpu.name == detect_cpu().name  # GPU=cpu is still this machine


def test_gpu_h100_plans_loader_workers_on_this_small_machine(lenet5, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # conftest.py's, which the threads would obey
    assert (os.cpu_count() or 1) <= 24  # planned from 24 cores however few this machine has
    p = plan(lenet5, resolve_hardware(gpu="h100"))
    assert (p.num_workers, p.cpu_threads) == (4, 4)
    assert p.reasons["workers"].startswith("AUTO: 24 usable cores")
    eight = plan(lenet5, resolve_hardware(gpu="h100", gpus=8), world_size=8)  # 24 cores for each process
    assert (eight.num_workers, eight.cpu_threads) == (4, 4)
    a10g = plan(lenet5, resolve_hardware(gpu="a10g"))  # g5.xlarge: 4 vCPUs, one for the loop
    assert (a10g.num_workers, a10g.cpu_threads) == (3, 1)


def test_a_hw_profile_plans_with_its_own_cpu(lenet5, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    box = dataclasses.replace(resolve_hardware(gpu="l4"), cpu=CPUInfo("Box CPU", 8, 16, 64 * GiB, 60 * GiB),
                              source="detected")
    (tmp_path / "box.json").write_text(box.to_json())
    loaded = resolve_hardware(hw=str(tmp_path / "box.json"))
    assert loaded.cpu.name == "Box CPU" and loaded.cpu.logical_cores == 16
    assert (plan(lenet5, loaded).num_workers, plan(lenet5, loaded).cpu_threads) == (4, 4)
    busy = dataclasses.replace(box, cpu=dataclasses.replace(box.cpu, idle_cores=2.0))  # measured busy when saved
    (tmp_path / "busy.json").write_text(busy.to_json())
    assert plan(lenet5, load_profile(str(tmp_path / "busy.json"))).num_workers == 1
