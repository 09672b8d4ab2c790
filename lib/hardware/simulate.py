"""resolve_hardware, the one entry the CLI uses, and the machines it simulates.

* ``HW=profile.json``  -> :func:`load_profile` (a file written by ``to_json``)
* ``GPU=h100``         -> :func:`from_catalog` (lib.hardware.catalog), with the CPU and RAM of the machine
                          that GPU usually comes in (catalog.HOSTS)
* ``GPU=cpu``          -> this machine's CPU, no GPU
* neither              -> :func:`detect`, the real machine
* ``FREE_GB=`` / ``GPUS=`` override the result in every case.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..errors import HardwareError
from ..units import GiB, gib

from . import catalog
from .detection import detect, torch_versions
from .host import detect_cpu, disk_free, on_battery
from .profile import CPUInfo, GPUInfo, HardwareProfile, load_profile
from .strict import MAX_GPUS, MAX_MEMORY_BYTES, describe_value


def _positive_number(name: str, value: Any) -> float:
    """A GiB figure above 0 and at most strict.MAX_MEMORY_BYTES (a profile's own bound on a GPU's memory)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or isinstance(value, float) and \
            not math.isfinite(value) or not 0 < value <= MAX_MEMORY_BYTES / GiB:
        raise HardwareError(f"{name}={describe_value(value).partition(' ')[2]} is not a positive number of GiB: "
                            f"give one up to {MAX_MEMORY_BYTES / GiB:,.0f}, e.g. {name}=40.")
    return float(value)


def _gpu_count(value: Any) -> int:
    """GPUS=: the GPUs of one machine, 1 to strict.MAX_GPUS (a profile's own bound: GPUS=10**30 would build a
    list of 10**30 GPUs)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPUS:
        raise HardwareError(f"GPUS={describe_value(value).partition(' ')[2]} is not a GPU count: give a whole number "
                            f"from 1 to {MAX_GPUS} (the GPUs of one machine), e.g. GPUS=2.")
    return value


def _this_torch() -> tuple[str, str | None, str | None]:
    import torch

    return torch_versions(torch)


def from_catalog(
    key: str,
    *,
    free_gb: float | None = None,
    gpus: int = 1,
    total_gb: float | None = None,
    cpu: CPUInfo | None = None,
    disk_path: str = ".",
) -> HardwareProfile:
    """A machine with ``gpus`` identical catalog GPUs.

    The CPU is ``cpu`` when given, else the machine the GPU usually comes in
    (catalog.HOSTS: ``gpus`` times one GPU's share of its cores and RAM, all idle):
    ``GPU=h100`` plans data loader workers, CPU threads and host RAM for an H100
    machine, not for the machine planning.  Disk is this machine's; there is no
    battery.  torch/CUDA/HIP versions are this torch's (None where it lacks the
    backend) - the catalog describes hardware, not software.

    free memory: ``free_gb`` (GiB) when given, else total minus
    catalog.CONTEXT_RESERVE_BYTES.  ``total_gb`` (GiB) replaces the
    catalog's total, for a variant of the card.
    """
    entry = catalog.lookup(key)
    count = _gpu_count(gpus)
    total = entry.total_bytes
    if total_gb is not None:
        total = int(_positive_number("TOTAL_GB", total_gb) * GiB)
    if free_gb is not None:
        free = _checked_free(free_gb, total, entry.name)
    else:
        free = max(0, total - catalog.CONTEXT_RESERVE_BYTES)
    gpu = GPUInfo(
        index=0,
        name=entry.name,
        vendor=entry.vendor,
        backend=entry.backend,
        total_bytes=total,
        free_bytes=free,
        compute_capability=entry.compute_capability,
        arch=entry.arch,
        supports_bf16=entry.bf16,
        supports_tf32=entry.tf32,
    )
    torch_version, cuda_version, hip_version = _this_torch()
    return HardwareProfile(
        gpus=tuple(dataclasses.replace(gpu, index=i) for i in range(count)),
        cpu=cpu if cpu is not None else host_cpu(entry.key, count),
        disk_free_bytes=disk_free(disk_path),
        on_battery=None,
        torch_version=torch_version,
        cuda_version=cuda_version,
        hip_version=hip_version,
        source=f"catalog:{entry.key}",
        notes=(),
    )


def host_cpu(key: str, gpus: int = 1) -> CPUInfo:
    """The CPU and RAM of a machine with `gpus` of catalog GPU `key`, as catalog.HOSTS gives them per GPU;
    planned idle (idle_cores None: every core counts)."""
    h = catalog.host(key)
    logical, ram = h.vcpus * gpus, h.ram_gib * gpus * GiB
    return CPUInfo(name=f"{h.machine}: {h.vcpus} vCPUs and {h.ram_gib} GiB per GPU",
                   physical_cores=logical // 2 if h.smt else logical, logical_cores=logical,
                   ram_total_bytes=ram, ram_available_bytes=ram, idle_cores=None)


def _cpu_only(disk_path: str) -> HardwareProfile:
    """GPU=cpu: this machine's CPU, RAM, disk and battery, and no GPU (torch is
    not asked about devices, so this is cheap even on a GPU machine)."""
    torch_version, cuda_version, hip_version = _this_torch()
    return HardwareProfile(
        gpus=(),
        cpu=detect_cpu(),
        disk_free_bytes=disk_free(disk_path),
        on_battery=on_battery(),
        torch_version=torch_version,
        cuda_version=cuda_version,
        hip_version=hip_version,
        source="catalog:cpu",
        notes=(),
    )


def _checked_free(free_gb: Any, total_bytes: int, name: str) -> int:
    value = _positive_number("FREE_GB", free_gb)
    free = int(value * GiB)
    if free > total_bytes:
        # as many decimals as it takes for the printed total (rounded down, so that it is a valid FREE_GB)
        # to be below the value given: "79.65 is more than the 79.65 GiB total" would contradict itself
        given = len(f"{value:.15g}".partition(".")[2])  # as precise as the value given, at least 2 decimals
        for digits in range(max(2, given), 16):
            most = math.floor(gib(total_bytes) * 10**digits) / 10**digits
            if most < value and int(most * GiB) <= total_bytes:
                break
        raise HardwareError(
            f"FREE_GB={value:.15g} is more than the {most:.{digits}f} GiB total of {name}: "
            f"give at most {most:.{digits}f}."
        )
    return free


def _override(profile: HardwareProfile, *, free_gb: float | None, gpus: int | None) -> HardwareProfile:
    if free_gb is None and gpus is None:
        return profile
    if not profile.gpus:
        what = "GPUS" if gpus is not None else "FREE_GB"
        raise HardwareError(
            f"{what}= was given but the hardware profile ({profile.source}) has no GPU: "
            "drop it, or pick a GPU with GPU=<catalog key> or HW=<profile.json>."
        )
    new = list(profile.gpus)
    notes = list(profile.notes)
    if gpus is not None:
        count = _gpu_count(gpus)
        if count > len(new):
            extra = count - len(new)
            notes.append(
                f"GPUS={count} simulates {extra} more {new[0].name} than the {len(new)} this profile has "
                "(copies of GPU 0)"
            )
            new += [new[0]] * extra
        new = [dataclasses.replace(g, index=i) for i, g in enumerate(new[:count])]
    if free_gb is not None:
        new = [
            dataclasses.replace(g, free_bytes=_checked_free(free_gb, g.total_bytes, f"GPU {g.index} ({g.name})"))
            for g in new
        ]
    return dataclasses.replace(profile, gpus=tuple(new), notes=tuple(notes))


def resolve_hardware(
    *,
    hw: str | None = None,
    gpu: str | None = None,
    free_gb: float | None = None,
    gpus: int | None = None,
    disk_path: str = ".",
) -> HardwareProfile:
    """The one entry the CLI uses.

    ``hw`` (a profile file) wins; else ``gpu`` (a catalog key, case-insensitive,
    or "cpu" for a CPU-only profile of this machine); else detect().  ``free_gb``
    (GiB per GPU, > 0 and <= total) and ``gpus`` (>= 1) then override the result;
    either on a profile without GPUs is a HardwareError.
    """
    if hw:
        profile = load_profile(hw)
        if gpu:
            profile = dataclasses.replace(
                profile, notes=profile.notes + (f"GPU={gpu} was ignored because HW={hw} was given: drop one of them",)
            )
        return _override(profile, free_gb=free_gb, gpus=gpus)
    if gpu is not None and gpu.strip().lower() == "cpu":
        return _override(_cpu_only(disk_path), free_gb=free_gb, gpus=gpus)
    if gpu:
        if gpus is not None:
            _gpu_count(gpus)
        return from_catalog(gpu, free_gb=free_gb, gpus=gpus if gpus is not None else 1, disk_path=disk_path)
    return _override(detect(disk_path), free_gb=free_gb, gpus=gpus)
