"""detect(): the real machine's GPUs, as this torch can train on them.

CUDA and ROCm answer through torch.cuda, Apple silicon through torch.backends.mps;
NVML supplies NVIDIA free memory without a CUDA context.  Each query is one
function that takes the module, so tests hand over fakes.

A profile describes what *training* can use.  When NVML sees NVIDIA GPUs but
this torch cannot use them (CPU-only build, driver trouble, hidden devices) the
profile has no GPUs and a note that says why and how to fix it.  A machine
without GPUs gives a CPU profile with no notes and no warnings.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from typing import Any

from ..units import GiB, gib
from .host import detect_cpu, disk_free, on_battery
from .nvml import NvmlReport, load_pynvml, nvml_free, query_nvml, uuid_key
from .profile import CPUInfo, GPUInfo, HardwareProfile
from .runtime import safe_call
from ..env import environ


def _rocm_bf16(arch: str) -> bool:
    """bf16 on ROCm: CDNA2 (gfx90a, MI200), CDNA3+ (gfx94x/gfx95x, MI300+) and
    RDNA3+ (gfx11xx, gfx12xx).  Older parts (incl. gfx908/MI100, whose bf16 is
    a slow path in practice) plan for fp16."""
    m = re.fullmatch(r"gfx([0-9]+)([0-9a-f]?)", arch)
    if not m:
        return False
    digits = m.group(1) + m.group(2)
    if len(digits) >= 4:  # gfx1030, gfx1100, gfx1201: generation = first two digits
        return int(digits[:2]) >= 11
    return digits == "90a" or digits[:2] in ("94", "95")


def _query_torch_gpus(
    torch_mod: Any, *, nvml: NvmlReport | None = None, cpu: CPUInfo | None = None
) -> tuple[tuple[GPUInfo, ...], tuple[str, ...]]:
    """The GPUs this torch can train on, and notes about devices it had to skip.

    CUDA and ROCm both answer through torch.cuda; torch.version.hip tells them
    apart.  Apple silicon answers through torch.backends.mps.  ``nvml`` supplies
    NVIDIA free memory (torch.cuda.mem_get_info is the fallback without it, as it
    creates a CUDA context); ``cpu`` supplies the unified memory figures for MPS.
    """
    cuda = getattr(torch_mod, "cuda", None)
    version = getattr(torch_mod, "version", None)
    hip = getattr(version, "hip", None)
    notes: list[str] = []
    if cuda is not None and safe_call(getattr(cuda, "is_available", None), default=False):
        count = int(safe_call(getattr(cuda, "device_count", None), default=0) or 0)
        nvml_by_uuid = {uuid_key(d.uuid): d for d in (nvml.devices if nvml else ()) if d.uuid}
        gpus: list[GPUInfo] = []
        for i in range(count):
            try:
                props = cuda.get_device_properties(i)
                name = str(props.name)
                total = int(props.total_memory)
            except Exception as e:  # noqa: BLE001 - report and carry on with the others
                notes.append(
                    f"GPU {i} was skipped: torch could not read its properties ({type(e).__name__}: {e}); "
                    "run nvidia-smi (or rocm-smi) to check it, or hide it with CUDA_VISIBLE_DEVICES"
                )
                continue
            free = None if hip else nvml_free(nvml, nvml_by_uuid, props, i, count)
            if free is None:
                # Only without NVML: mem_get_info creates a CUDA context (~0.5 GiB) on
                # GPU i that lives as long as the process, once per rank under torchrun.
                try:
                    free, _ = cuda.mem_get_info(i)
                    free = int(free)
                except Exception:  # noqa: BLE001 - exclusive-process mode, old torch, ...
                    free = None
            if hip:
                arch = str(getattr(props, "gcnArchName", "") or "").split(":", 1)[0] or "gfx?"
                info = GPUInfo(
                    index=len(gpus),
                    name=name,
                    vendor="amd",
                    backend="rocm",
                    total_bytes=total,
                    free_bytes=total,
                    compute_capability=None,
                    arch=arch,
                    supports_bf16=_rocm_bf16(arch),
                    supports_tf32=False,
                )
            else:
                cc = (int(props.major), int(props.minor))
                info = GPUInfo(
                    index=len(gpus),
                    name=name,
                    vendor="nvidia",
                    backend="cuda",
                    total_bytes=total,
                    free_bytes=total,
                    compute_capability=cc,
                    arch=f"sm_{cc[0]}{cc[1]}",
                    # torch.cuda.is_bf16_supported() only looks at the current
                    # device and, by default, says True for emulated bf16 on
                    # pre-Ampere cards; the hardware question is cc >= 8.0.
                    supports_bf16=cc >= (8, 0),
                    supports_tf32=cc >= (8, 0),
                )
            if free is None:
                notes.append(
                    f"GPU {i} ({name}): free memory could not be measured, so all of it is assumed free; "
                    "check nvidia-smi for other processes, or set FREE_GB="
                )
                free = total
            gpus.append(dataclasses.replace(info, free_bytes=max(0, min(free, total))))
        return tuple(gpus), tuple(notes)

    backends = getattr(torch_mod, "backends", None)
    mps = getattr(backends, "mps", None)
    if mps is not None and safe_call(getattr(mps, "is_available", None), default=False):
        cpu = cpu or detect_cpu()
        total = cpu.ram_total_bytes  # unified memory
        free = cpu.ram_available_bytes
        recommended = safe_call(getattr(getattr(torch_mod, "mps", None), "recommended_max_memory", None))
        if isinstance(recommended, int) and not isinstance(recommended, bool) and recommended > 0:
            # Metal's recommended working set; the RAM other programs use is not
            # in it, so take whichever is smaller.
            free = min(recommended, free)
        name = cpu.name if cpu.name.startswith("Apple") else "Apple GPU (MPS)"
        gpu = GPUInfo(
            index=0,
            name=name,
            vendor="apple",
            backend="mps",
            total_bytes=total,
            free_bytes=max(0, min(free, total)),
            compute_capability=None,
            arch="apple",
            supports_bf16=False,  # planned as fp16/fp32: bf16 on MPS depends on the macOS version
            supports_tf32=False,
        )
        return (gpu,), ()
    return (), ()


def _parse_version(v: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _unusable_gpu_note(torch_mod: Any, nvml: NvmlReport | None) -> str | None:
    """Why NVML sees NVIDIA GPUs that this torch cannot use, and the fix."""
    if nvml is None:
        return None
    if nvml.problem:
        return f"NVIDIA GPUs are present but unusable: {nvml.problem}"
    if not nvml.devices:
        return None
    names = sorted({d.name for d in nvml.devices})
    seen = f"NVML sees {len(nvml.devices)} NVIDIA GPU(s) ({', '.join(names)})"
    version = getattr(torch_mod, "version", None)
    torch_cuda = getattr(version, "cuda", None)
    torch_ver = str(getattr(torch_mod, "__version__", "?"))
    driver = f"CUDA {nvml.driver_cuda[0]}.{nvml.driver_cuda[1]}" if nvml.driver_cuda else None
    fit = f" whose CUDA version the driver supports ({driver} or older)" if driver else ""
    if getattr(version, "hip", None):
        return f"{seen} but this torch {torch_ver} is a ROCm build: install a CUDA build of torch{fit} (see README)"
    if not torch_cuda:
        return f"{seen} but this torch {torch_ver} is a CPU-only build: install a CUDA build of torch{fit} (see README)"
    visible = environ().get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"{seen} but CUDA_VISIBLE_DEVICES={visible!r} hides them: unset it or list the GPUs to use"
    wanted = _parse_version(torch_cuda)
    if nvml.driver_cuda and wanted and nvml.driver_cuda[0] < wanted[0]:
        return (
            f"{seen} but the driver supports only {driver} and this torch was built for CUDA {torch_cuda}: "
            f"update the NVIDIA driver, or install a torch build for CUDA {nvml.driver_cuda[0]}.x (see README)"
        )
    return (
        f"{seen} but torch {torch_ver} (CUDA {torch_cuda}) cannot use them (torch.cuda.is_available() is False): "
        "check that nvidia-smi works and CUDA_VISIBLE_DEVICES is right, and reinstall or update the NVIDIA driver "
        f"if it is older than torch's CUDA {torch_cuda} needs"
    )


def _gpu_notes(gpus: tuple[GPUInfo, ...]) -> list[str]:
    """Mixed GPUs and memory taken by other processes: worth a line each."""
    notes = []
    if gpus and any(g.name != gpus[0].name or g.total_bytes != gpus[0].total_bytes for g in gpus):
        kinds = []
        for g in gpus:
            label = f"{g.name} ({gib(g.total_bytes):.1f} GiB)"
            if label not in kinds:
                kinds.append(label)
        notes.append(
            f"the GPUs differ ({'; '.join(kinds)}); {sum(1 for g in gpus if g.name == gpus[0].name and g.total_bytes == gpus[0].total_bytes)} "
            f"of {len(gpus)} match GPU 0: set CUDA_VISIBLE_DEVICES to choose the ones training uses"
        )
    for g in gpus:
        if g.backend == "mps":
            continue
        used = g.total_bytes - g.free_bytes
        # Our own CUDA context takes ~0.5 GiB; more than that (and more than a
        # tenth of the card) is someone else's.
        if used > max(2 * GiB, g.total_bytes // 10):
            notes.append(
                f"GPU {g.index} ({g.name}): {gib(used):.1f} of {gib(g.total_bytes):.1f} GiB is already in use "
                f"(other processes?), only {gib(g.free_bytes):.1f} GiB is free: stop them (see nvidia-smi or "
                "rocm-smi) or choose another GPU with CUDA_VISIBLE_DEVICES"
            )
    return notes


def torch_versions(torch_mod: Any) -> tuple[str, str | None, str | None]:
    version = getattr(torch_mod, "version", None)
    cuda = getattr(version, "cuda", None)
    hip = getattr(version, "hip", None)
    return str(getattr(torch_mod, "__version__", "unknown")), (str(cuda) if cuda else None), (str(hip) if hip else None)


def _detect(torch_mod: Any, pynvml_mod: Any, disk_path: str = ".") -> HardwareProfile:
    """detect() with the modules passed in, so tests can hand over fakes."""
    cpu = detect_cpu()
    nvml = query_nvml(pynvml_mod)
    # torch reports some GPU trouble only as a warning (e.g. "NVIDIA B200 with
    # CUDA capability sm_100 is not compatible with the current PyTorch
    # installation"); turn those into notes instead of printing them, and drop
    # them on a machine with no GPU at all, which must stay quiet.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpus, notes = _query_torch_gpus(torch_mod, nvml=nvml, cpu=cpu)
    all_notes = list(notes)
    if not gpus:
        note = _unusable_gpu_note(torch_mod, nvml)
        if note:
            all_notes.append(note)
    if gpus or (nvml is not None and (nvml.devices or nvml.problem)):
        for w in caught:
            text = " ".join(str(w.message).split())
            text = f"torch warned: {text[:400]}"
            if text not in all_notes:
                all_notes.append(text)
    all_notes.extend(_gpu_notes(gpus))
    torch_version, cuda_version, hip_version = torch_versions(torch_mod)
    return HardwareProfile(
        gpus=gpus,
        cpu=cpu,
        disk_free_bytes=disk_free(disk_path),
        on_battery=on_battery(),
        torch_version=torch_version,
        cuda_version=cuda_version,
        hip_version=hip_version,
        source="detected",
        notes=tuple(all_notes),
    )


def detect(disk_path: str = ".") -> HardwareProfile:
    """The real machine.

    On NVIDIA GPUs free memory comes from NVML, which creates no CUDA context.
    Without NVML (and on ROCm) it comes from torch.cuda.mem_get_info, which
    creates a context (~0.5 GiB) on every visible GPU for the life of the
    process: under torchrun, restrict each rank with CUDA_VISIBLE_DEVICES first.
    """
    import torch

    return _detect(torch, load_pynvml(), disk_path)
