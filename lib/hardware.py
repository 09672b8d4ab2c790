"""What the machine (real or simulated) offers a training run.

This is the ONLY module in kfit that queries NVML, ``torch.cuda`` or
``torch.backends.mps``.  Everything else consumes the frozen HardwareProfile
returned by :func:`resolve_hardware`, so any machine can be simulated:

* ``HW=profile.json``  -> :func:`load_profile` (a file written by ``to_json``)
* ``GPU=h100``         -> :func:`from_catalog` (lib.gpu_catalog), on this CPU
* ``GPU=cpu``          -> this machine's CPU, no GPU
* neither              -> :func:`detect`, the real machine
* ``FREE_GB=`` / ``GPUS=`` override the result in every case.

Units: every ``*_bytes`` field is bytes; every ``*_gb`` argument is GiB
(2**30 bytes), the unit :func:`gib` prints, so a number copied from kfit's
output means the same thing when typed back in.

A profile describes what *training* can use.  When NVML sees NVIDIA GPUs but
this torch cannot use them (CPU-only build, driver trouble, hidden devices) the
profile has no GPUs and a note that says why and how to fix it.  A machine
without GPUs gives a CPU profile with no notes and no warnings.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from lib import gpu_catalog
from lib.errors import HardwareError

__all__ = [
    "CPUInfo",
    "GPUInfo",
    "HardwareProfile",
    "detect",
    "detect_cpu",
    "from_catalog",
    "gib",
    "load_profile",
    "resolve_hardware",
    # runtime queries (the trainer and the monitor)
    "GpuTelemetry",
    "THROTTLE_KIND",
    "device_memory",
    "empty_device_cache",
    "gpu_unusable_reason",
    "on_battery",
    "reset_peak_memory",
]

GiB = 2**30
VENDORS = ("nvidia", "amd", "apple")
BACKENDS = ("cuda", "rocm", "mps")
_BACKEND_OF_VENDOR = {"nvidia": "cuda", "amd": "rocm", "apple": "mps"}


def gib(n_bytes: int | float) -> float:
    """Bytes as GiB (2**30), the unit kfit prints and reads."""
    return n_bytes / GiB


def format_size(n_bytes: int, mb_decimals: int = 1) -> str:
    """Bytes for plans and reports: '1.23GB' from a GiB up, else '37.1MB' (GB and MB are 2**30 and 2**20)."""
    return f"{gib(n_bytes):.2f}GB" if n_bytes >= GiB else f"{n_bytes / 2**20:.{mb_decimals}f}MB"


# --------------------------------------------------------------------------
# The profile
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class GPUInfo:
    index: int  # torch device index (after CUDA_VISIBLE_DEVICES)
    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    vendor: str  # "nvidia" | "amd" | "apple"
    backend: str  # "cuda" | "rocm" | "mps"
    total_bytes: int
    free_bytes: int  # NVML free less gpu_catalog.CONTEXT_RESERVE_BYTES; torch.cuda.mem_get_info without NVML (and on ROCm)
    compute_capability: tuple[int, int] | None  # NVIDIA (major, minor); None for AMD/Apple
    arch: str  # "sm_90", "gfx90a", "gfx1100", "apple"
    supports_bf16: bool
    supports_tf32: bool  # NVIDIA cc >= 8.0 only


@dataclass(frozen=True)
class CPUInfo:
    name: str
    physical_cores: int
    logical_cores: int
    ram_total_bytes: int
    ram_available_bytes: int


@dataclass(frozen=True)
class HardwareProfile:
    gpus: tuple[GPUInfo, ...]
    cpu: CPUInfo
    disk_free_bytes: int
    on_battery: bool | None  # None = no battery
    torch_version: str
    cuda_version: str | None
    hip_version: str | None
    source: str  # "detected", "file:<path>", "catalog:<key>"
    notes: tuple[str, ...]  # what a user should know, each naming the fix

    @property
    def accelerator(self) -> str:
        """"cuda" | "rocm" | "mps" | "cpu"."""
        return self.gpus[0].backend if self.gpus else "cpu"

    @property
    def primary_gpu(self) -> GPUInfo | None:
        return self.gpus[0] if self.gpus else None

    @property
    def identical_gpu_count(self) -> int:
        """GPUs with the same name and total memory as gpus[0]; 0 when none."""
        if not self.gpus:
            return 0
        first = self.gpus[0]
        return sum(1 for g in self.gpus if g.name == first.name and g.total_bytes == first.total_bytes)

    def to_dict(self) -> dict:
        """Plain JSON-ready data (lists, not tuples); from_dict reverses it."""
        return {
            "gpus": [_gpu_to_dict(g) for g in self.gpus],
            "cpu": dataclasses.asdict(self.cpu),
            "disk_free_bytes": self.disk_free_bytes,
            "on_battery": self.on_battery,
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "hip_version": self.hip_version,
            "source": self.source,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, d: Any) -> HardwareProfile:
        """Strict: a missing, extra or mistyped key raises HardwareError naming it."""
        return _profile_from_dict(d, origin="hardware profile")


def _gpu_to_dict(g: GPUInfo) -> dict:
    d = dataclasses.asdict(g)
    d["compute_capability"] = list(g.compute_capability) if g.compute_capability is not None else None
    return d


# --------------------------------------------------------------------------
# Strict parsing (profile files are written by hand too)
# --------------------------------------------------------------------------

_FIX = "fix the value, or regenerate the file with 'make check-hardware FORMAT=json > FILE'"


def _bad(origin: str, key: str, problem: str) -> HardwareError:
    return HardwareError(f"{origin}: key '{key}' {problem}; {_FIX}.")


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _check_keys(origin: str, where: str, d: Any, fields: tuple[str, ...]) -> None:
    if not isinstance(d, dict):
        label = f"'{where}'" if where else "the top level"
        raise HardwareError(f"{origin}: {label} must be a JSON object, got {_describe(d)}; {_FIX}.")
    prefix = f"{where}." if where else ""
    missing = [k for k in fields if k not in d]
    if missing:
        raise HardwareError(
            f"{origin}: key '{prefix}{missing[0]}' is missing"
            + (f" (also missing: {', '.join(prefix + k for k in missing[1:])})" if len(missing) > 1 else "")
            + f"; {_FIX}."
        )
    extra = sorted(str(k) for k in d if k not in fields)
    if extra:
        raise HardwareError(
            f"{origin}: key '{prefix}{extra[0]}' is not a profile field"
            + (f" (nor: {', '.join(prefix + k for k in extra[1:])})" if len(extra) > 1 else "")
            + f"; valid keys here: {', '.join(fields)}; {_FIX}."
        )


def _int(origin: str, key: str, v: Any, *, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(origin, key, f"must be an integer, got {_describe(v)}")
    if v < minimum:
        raise _bad(origin, key, f"must be >= {minimum}, got {v}")
    return v


def _str(origin: str, key: str, v: Any, *, optional: bool = False) -> str | None:
    if v is None and optional:
        return None
    if not isinstance(v, str):
        want = "a string or null" if optional else "a string"
        raise _bad(origin, key, f"must be {want}, got {_describe(v)}")
    return v


def _bool(origin: str, key: str, v: Any, *, optional: bool = False) -> bool | None:
    if v is None and optional:
        return None
    if not isinstance(v, bool):
        want = "true, false or null" if optional else "true or false"
        raise _bad(origin, key, f"must be {want}, got {_describe(v)}")
    return v


def _list(origin: str, key: str, v: Any) -> list:
    if not isinstance(v, (list, tuple)):
        raise _bad(origin, key, f"must be a list, got {_describe(v)}")
    return list(v)


_GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GPUInfo))
_CPU_FIELDS = tuple(f.name for f in dataclasses.fields(CPUInfo))
_PROFILE_FIELDS = tuple(f.name for f in dataclasses.fields(HardwareProfile))


def _gpu_from_dict(origin: str, where: str, d: Any, position: int) -> GPUInfo:
    _check_keys(origin, where, d, _GPU_FIELDS)
    k = lambda name: f"{where}.{name}"  # noqa: E731
    index = _int(origin, k("index"), d["index"])
    if index != position:
        raise _bad(origin, k("index"), f"must be {position} (GPUs are listed in torch device order), got {index}")
    vendor = _str(origin, k("vendor"), d["vendor"])
    if vendor not in VENDORS:
        raise _bad(origin, k("vendor"), f"must be one of {', '.join(VENDORS)}, got {vendor!r}")
    backend = _str(origin, k("backend"), d["backend"])
    if backend != _BACKEND_OF_VENDOR[vendor]:
        raise _bad(origin, k("backend"), f"must be {_BACKEND_OF_VENDOR[vendor]!r} for vendor {vendor!r}, got {backend!r}")
    total = _int(origin, k("total_bytes"), d["total_bytes"], minimum=1)
    free = _int(origin, k("free_bytes"), d["free_bytes"])
    if free > total:
        raise _bad(origin, k("free_bytes"), f"({free}) must not exceed total_bytes ({total})")
    cc_raw = d["compute_capability"]
    cc: tuple[int, int] | None
    if cc_raw is None:
        cc = None
    else:
        if (
            not isinstance(cc_raw, (list, tuple))
            or len(cc_raw) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in cc_raw)
        ):
            raise _bad(origin, k("compute_capability"), f"must be [major, minor] or null, got {_describe(cc_raw)}")
        cc = (cc_raw[0], cc_raw[1])
    if vendor == "nvidia" and cc is None:
        raise _bad(origin, k("compute_capability"), "must be [major, minor] for an NVIDIA GPU (e.g. [9, 0] for an H100)")
    if vendor != "nvidia" and cc is not None:
        raise _bad(origin, k("compute_capability"), f"must be null for vendor {vendor!r} (it is an NVIDIA notion)")
    bf16 = _bool(origin, k("supports_bf16"), d["supports_bf16"])
    tf32 = _bool(origin, k("supports_tf32"), d["supports_tf32"])
    if tf32 and (cc is None or cc < (8, 0)):
        raise _bad(origin, k("supports_tf32"), "can only be true for an NVIDIA GPU with compute capability >= 8.0")
    return GPUInfo(
        index=index,
        name=_str(origin, k("name"), d["name"]),
        vendor=vendor,
        backend=backend,
        total_bytes=total,
        free_bytes=free,
        compute_capability=cc,
        arch=_str(origin, k("arch"), d["arch"]),
        supports_bf16=bf16,
        supports_tf32=tf32,
    )


def _cpu_from_dict(origin: str, d: Any) -> CPUInfo:
    _check_keys(origin, "cpu", d, _CPU_FIELDS)
    ram_total = _int(origin, "cpu.ram_total_bytes", d["ram_total_bytes"], minimum=1)
    ram_avail = _int(origin, "cpu.ram_available_bytes", d["ram_available_bytes"])
    if ram_avail > ram_total:
        raise _bad(origin, "cpu.ram_available_bytes", f"({ram_avail}) must not exceed ram_total_bytes ({ram_total})")
    return CPUInfo(
        name=_str(origin, "cpu.name", d["name"]),
        physical_cores=_int(origin, "cpu.physical_cores", d["physical_cores"], minimum=1),
        logical_cores=_int(origin, "cpu.logical_cores", d["logical_cores"], minimum=1),
        ram_total_bytes=ram_total,
        ram_available_bytes=ram_avail,
    )


def _profile_from_dict(d: Any, *, origin: str) -> HardwareProfile:
    _check_keys(origin, "", d, _PROFILE_FIELDS)
    gpus = tuple(
        _gpu_from_dict(origin, f"gpus[{i}]", g, i) for i, g in enumerate(_list(origin, "gpus", d["gpus"]))
    )
    backends = {g.backend for g in gpus}
    if len(backends) > 1:
        raise _bad(origin, "gpus", f"mixes backends ({', '.join(sorted(backends))}); one torch build drives one backend")
    notes = []
    for i, n in enumerate(_list(origin, "notes", d["notes"])):
        notes.append(_str(origin, f"notes[{i}]", n))
    return HardwareProfile(
        gpus=gpus,
        cpu=_cpu_from_dict(origin, d["cpu"]),
        disk_free_bytes=_int(origin, "disk_free_bytes", d["disk_free_bytes"]),
        on_battery=_bool(origin, "on_battery", d["on_battery"], optional=True),
        torch_version=_str(origin, "torch_version", d["torch_version"]),
        cuda_version=_str(origin, "cuda_version", d["cuda_version"], optional=True),
        hip_version=_str(origin, "hip_version", d["hip_version"], optional=True),
        source=_str(origin, "source", d["source"]),
        notes=tuple(notes),
    )


def load_profile(path: str) -> HardwareProfile:
    """HW=profile.json: a profile saved with to_json (or written by hand)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise HardwareError(
            f"hardware profile {path!r} does not exist: check the HW= path, or save one from a "
            "machine with 'make check-hardware FORMAT=json > FILE'."
        ) from None
    except UnicodeDecodeError:
        raise HardwareError(
            f"hardware profile {path!r} is not UTF-8 text: HW= must name a JSON file written by "
            "'make check-hardware FORMAT=json > FILE'."
        ) from None
    except OSError as e:
        raise HardwareError(f"hardware profile {path!r} cannot be read ({e.strerror}): check the HW= path and its permissions.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise HardwareError(
            f"hardware profile {path!r} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}): "
            "fix the file, or regenerate it with 'make check-hardware FORMAT=json > FILE'."
        ) from None
    profile = _profile_from_dict(data, origin=f"hardware profile {path!r}")
    return dataclasses.replace(profile, source=f"file:{path}")


# --------------------------------------------------------------------------
# CPU, RAM, disk, battery (psutil)
# --------------------------------------------------------------------------


def _cpu_name() -> str:
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.lower().startswith(("model name", "hardware", "cpu model")):
                        value = line.split(":", 1)[1].strip()
                        if value:
                            return value
        except OSError:
            pass
    if sys.platform == "darwin":
        import subprocess

        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=2
            ).stdout.strip()
            if out:
                return out  # e.g. "Apple M2 Max"
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _cgroup_memory_limit() -> int | None:
    """A container's memory limit (cgroup v2 or v1), None when unlimited/unknown.

    psutil reports the host's RAM; inside a container the limit is what counts.
    """
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as f:
                raw = f.read().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if raw.isdigit():
            limit = int(raw)
            # v1 spells "no limit" as a huge page-aligned number.
            return limit if limit < 2**60 else None
        return None  # "max"
    return None


def detect_cpu() -> CPUInfo:
    """This machine's CPU and RAM.

    logical_cores is what this process may run on (CPU affinity, e.g. taskset or
    a container's cpuset), physical_cores is capped to it.  RAM is capped to the
    container's cgroup memory limit when there is one.
    """
    import psutil

    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        try:
            logical = min(logical, len(os.sched_getaffinity(0))) or logical
        except OSError:
            pass
    physical = psutil.cpu_count(logical=False) or logical
    physical = max(1, min(physical, logical))
    vm = psutil.virtual_memory()
    total, available = int(vm.total), int(vm.available)
    limit = _cgroup_memory_limit()
    if limit is not None and 0 < limit < total:
        total = limit
    available = min(available, total)
    return CPUInfo(
        name=_cpu_name(),
        physical_cores=int(physical),
        logical_cores=int(logical),
        ram_total_bytes=total,
        ram_available_bytes=available,
    )


def _disk_free(path: str) -> int:
    """Free bytes on the filesystem holding path (or its nearest existing parent,
    so a run directory that does not exist yet still works)."""
    import psutil

    p = os.path.abspath(path or ".")
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    try:
        return int(psutil.disk_usage(p).free)
    except OSError as e:
        raise HardwareError(f"cannot measure free disk space at {path!r} ({e.strerror}): pass an existing directory.") from None


def on_battery() -> bool | None:
    """True when running on battery, False on mains power, None without a battery."""
    import psutil

    try:
        battery = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError, RuntimeError):
        return None
    if battery is None:
        return None
    plugged = getattr(battery, "power_plugged", None)
    return None if plugged is None else not plugged


# --------------------------------------------------------------------------
# GPUs: NVML and torch, each behind one function that takes the module
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _NvmlDevice:
    name: str
    uuid: str | None
    total_bytes: int | None
    free_bytes: int | None


@dataclass(frozen=True)
class _NvmlReport:
    devices: tuple[_NvmlDevice, ...]
    driver_cuda: tuple[int, int] | None  # highest CUDA version the driver supports
    problem: str | None = None  # NVML loaded but says the GPUs are unusable


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _query_nvml(pynvml_mod: Any) -> _NvmlReport | None:
    """What NVML sees, or None when there is no usable NVML (no library, no
    driver, no module): that is the normal state of a machine without NVIDIA
    GPUs and is not worth a word.  Never raises."""
    if pynvml_mod is None:
        return None
    nvml_error = getattr(pynvml_mod, "NVMLError", Exception)
    try:
        pynvml_mod.nvmlInit()
    except nvml_error as e:
        mismatch = getattr(pynvml_mod, "NVMLError_LibRmVersionMismatch", None)
        if mismatch is not None and isinstance(e, mismatch):
            # The kernel module and the user-space driver differ: GPUs exist but
            # nothing can use them until the new driver is loaded.
            return _NvmlReport(
                devices=(),
                driver_cuda=None,
                problem="the NVIDIA kernel driver and its user-space library have different versions "
                "(driver updated without a reboot?): reboot, or reload the nvidia kernel modules",
            )
        return None
    except Exception:  # a broken install must not stop kfit
        return None
    try:
        try:
            count = int(pynvml_mod.nvmlDeviceGetCount())
        except nvml_error:
            return None
        devices = []
        for i in range(count):
            try:
                handle = pynvml_mod.nvmlDeviceGetHandleByIndex(i)
                name = _text(pynvml_mod.nvmlDeviceGetName(handle))
            except nvml_error:
                continue
            uuid = total = free = None
            try:
                uuid = _text(pynvml_mod.nvmlDeviceGetUUID(handle))
            except (nvml_error, AttributeError):
                pass
            try:
                mem = pynvml_mod.nvmlDeviceGetMemoryInfo(handle)
                total, free = int(mem.total), int(mem.free)
            except (nvml_error, AttributeError):
                pass
            devices.append(_NvmlDevice(name=name, uuid=uuid, total_bytes=total, free_bytes=free))
        driver_cuda = None
        try:
            v = int(pynvml_mod.nvmlSystemGetCudaDriverVersion())  # e.g. 12040
            driver_cuda = (v // 1000, (v % 1000) // 10)
        except (nvml_error, AttributeError, TypeError, ValueError):
            pass
        return _NvmlReport(devices=tuple(devices), driver_cuda=driver_cuda)
    except Exception:
        return None
    finally:
        try:
            pynvml_mod.nvmlShutdown()
        except Exception:
            pass


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


def _uuid_key(u: str | None) -> str | None:
    if not u:
        return None
    u = u.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def _nvml_free(nvml: _NvmlReport | None, by_uuid: dict, props: Any, i: int, count: int) -> int | None:
    """Free bytes of torch's GPU i as NVML reports it, less the context training
    will create (gpu_catalog.CONTEXT_RESERVE_BYTES), so an idle card reads like
    its catalog entry.  Matched by UUID (torch and NVML may order GPUs
    differently), else by position when the counts agree; None without a match."""
    match = by_uuid.get(_uuid_key(str(getattr(props, "uuid", "") or "")))
    if match is None and nvml and len(nvml.devices) == count:
        match = nvml.devices[i]
    if match is None or match.free_bytes is None:
        return None
    return max(0, match.free_bytes - gpu_catalog.CONTEXT_RESERVE_BYTES)


def _query_torch_gpus(
    torch_mod: Any, *, nvml: _NvmlReport | None = None, cpu: CPUInfo | None = None
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
    if cuda is not None and _safe_call(getattr(cuda, "is_available", None), default=False):
        count = int(_safe_call(getattr(cuda, "device_count", None), default=0) or 0)
        nvml_by_uuid = {_uuid_key(d.uuid): d for d in (nvml.devices if nvml else ()) if d.uuid}
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
            free = None if hip else _nvml_free(nvml, nvml_by_uuid, props, i, count)
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
    if mps is not None and _safe_call(getattr(mps, "is_available", None), default=False):
        cpu = cpu or detect_cpu()
        total = cpu.ram_total_bytes  # unified memory
        free = cpu.ram_available_bytes
        recommended = _safe_call(getattr(getattr(torch_mod, "mps", None), "recommended_max_memory", None))
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


def _safe_call(fn: Any, default: Any = None) -> Any:
    if fn is None:
        return default
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a probe that fails means "not available"
        return default


def _parse_version(v: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _unusable_gpu_note(torch_mod: Any, nvml: _NvmlReport | None) -> str | None:
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
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
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


def _torch_versions(torch_mod: Any) -> tuple[str, str | None, str | None]:
    version = getattr(torch_mod, "version", None)
    cuda = getattr(version, "cuda", None)
    hip = getattr(version, "hip", None)
    return str(getattr(torch_mod, "__version__", "unknown")), (str(cuda) if cuda else None), (str(hip) if hip else None)


def _detect(torch_mod: Any, pynvml_mod: Any, disk_path: str = ".") -> HardwareProfile:
    """detect() with the modules passed in, so tests can hand over fakes."""
    cpu = detect_cpu()
    nvml = _query_nvml(pynvml_mod)
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
    torch_version, cuda_version, hip_version = _torch_versions(torch_mod)
    return HardwareProfile(
        gpus=gpus,
        cpu=cpu,
        disk_free_bytes=_disk_free(disk_path),
        on_battery=on_battery(),
        torch_version=torch_version,
        cuda_version=cuda_version,
        hip_version=hip_version,
        source="detected",
        notes=tuple(all_notes),
    )


def _load_pynvml() -> Any:
    try:
        import pynvml
    except Exception:  # noqa: BLE001 - not installed or broken: no NVML
        return None
    return pynvml


def detect(disk_path: str = ".") -> HardwareProfile:
    """The real machine.

    On NVIDIA GPUs free memory comes from NVML, which creates no CUDA context.
    Without NVML (and on ROCm) it comes from torch.cuda.mem_get_info, which
    creates a context (~0.5 GiB) on every visible GPU for the life of the
    process: under torchrun, restrict each rank with CUDA_VISIBLE_DEVICES first.
    """
    import torch

    return _detect(torch, _load_pynvml(), disk_path)


# --------------------------------------------------------------------------
# Runtime queries: memory, usability and telemetry of the device in use
# --------------------------------------------------------------------------

_rss_peak: dict[int, int] = {}  # pid -> highest RSS seen by device_memory since reset_peak_memory
_process: list = []  # [psutil.Process] of this pid (a forked DataLoader worker gets its own)


def _rss() -> int:
    import psutil

    if not _process or _process[0].pid != os.getpid():
        _process[:] = [psutil.Process()]
    return int(_process[0].memory_info().rss)


def device_memory(device: Any) -> tuple[int, int]:
    """(current, peak) bytes in use by training on ``device``.

    CUDA/ROCm: the caching allocator's allocated bytes and its max since
    reset_peak_memory.  MPS: Metal's allocated bytes, peak tracked like the CPU's.
    CPU: the process RSS and the highest RSS seen by calls to this function (the
    monitor's sampler calls it every interval); unlike ru_maxrss it can be reset.
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device)), int(torch.cuda.max_memory_allocated(device))
    current = int(torch.mps.current_allocated_memory()) if device.type == "mps" else _rss()
    key = -1 if device.type == "mps" else os.getpid()
    peak = max(current, _rss_peak.get(key, 0))
    _rss_peak[key] = peak
    return current, peak


def reset_peak_memory(device: Any) -> None:
    """Start a new peak for device_memory (e.g. per probe trial, after recovering from OOM)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        _rss_peak.pop(-1 if device.type == "mps" else os.getpid(), None)


def empty_device_cache(device: Any) -> None:
    """Give memory held by dead tensors back: collect reference cycles first (a
    failed step's traceback holds its activations), then release the allocator's
    cached blocks so the next attempt, and other processes, can use them."""
    import gc

    import torch

    gc.collect()
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def _unusable_fix(text: str) -> str:
    low = text.lower()
    if "out of memory" in low:
        return "other processes hold its memory: stop them (see nvidia-smi or rocm-smi) or pick another GPU with CUDA_VISIBLE_DEVICES"
    if "busy or unavailable" in low:
        return "it is in exclusive-process compute mode and another process uses it: free it, or pick another GPU with CUDA_VISIBLE_DEVICES"
    if "no kernel image" in low or "not compatible" in low or "invalid device function" in low:
        return "this torch build has no kernels for this GPU's architecture: install a torch build that supports it (see README)"
    if "driver" in low:
        return "update the NVIDIA (or ROCm) driver to one this torch's CUDA/HIP version supports, or install a matching torch build"
    if "invalid device ordinal" in low:
        return "that GPU index does not exist: check CUDA_VISIBLE_DEVICES and the GPU count"
    return "check that nvidia-smi (or rocm-smi) works and CUDA_VISIBLE_DEVICES is right, and reinstall the driver if it does not"


def gpu_unusable_reason(index: int = 0, *, torch_mod: Any = None) -> str | None:
    """Why GPU ``index`` cannot train, found by initialising CUDA and allocating a
    few bytes on it; None when it can, or when torch sees no CUDA/ROCm GPU."""
    if torch_mod is None:
        import torch as torch_mod
    cuda = torch_mod.cuda
    if not _safe_call(cuda.is_available, default=False) or not _safe_call(cuda.device_count, default=0):
        return None
    try:
        torch_mod.ones(1, device=f"cuda:{index}").add_(1)
        cuda.synchronize(index)  # errors of asynchronous kernels surface here
    except Exception as e:  # noqa: BLE001 - any failure means "unusable", said with its cause
        text = " ".join(str(e).split())[:300]
        return f"GPU {index} is unusable ({type(e).__name__}: {text}): {_unusable_fix(text)}"
    return None


# Clock-event (formerly "throttle") reason bits, from nvml.h; the others (idle,
# application clocks, sync boost, display) are not a problem worth a warning.
_THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",  # thermal or power brake, reported by the board
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
THROTTLE_KIND = {"sw_power_cap": "power", "hw_slowdown": "thermal", "sw_thermal": "thermal",
                 "hw_thermal": "thermal", "hw_power_brake": "power"}


class GpuTelemetry:
    """NVML readings of one NVIDIA GPU: utilisation, temperature, power,
    throttle reasons, memory.  Holds an NVML session until close()."""

    def __init__(self, nvml: Any, handle: Any, index: int) -> None:
        self._nvml, self._handle, self.index = nvml, handle, index
        # nvmlDeviceGetCurrentClocksThrottleReasons was renamed ...ClocksEventReasons (driver 535).
        self._reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))

    @classmethod
    def open(cls, index: int = 0, *, pynvml_mod: Any = None, torch_mod: Any = None) -> GpuTelemetry | None:
        """Telemetry of torch's CUDA device ``index``, or None when NVML is not
        available (no driver, no nvidia-ml-py, not an NVIDIA GPU)."""
        nvml = pynvml_mod if pynvml_mod is not None else _load_pynvml()
        if nvml is None:
            return None
        try:
            nvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no library or driver: telemetry off
            return None
        try:
            return cls(nvml, cls._handle(nvml, index, torch_mod), index)
        except Exception:  # noqa: BLE001
            _safe_call(nvml.nvmlShutdown)
            return None

    @staticmethod
    def _handle(nvml: Any, index: int, torch_mod: Any) -> Any:
        # torch numbers GPUs after CUDA_VISIBLE_DEVICES (and fastest first); NVML
        # numbers all of them by PCI bus: the UUID names the same card in both.
        if torch_mod is None:
            import torch as torch_mod
        uuid = _safe_call(lambda: str(torch_mod.cuda.get_device_properties(index).uuid))
        if uuid:
            try:
                return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
            except Exception:  # noqa: BLE001 - older driver or MIG: by position
                pass
        return nvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> dict:
        """The readings this GPU supports (a query it does not support is left out):
        gpu_util_pct, temp_c, power_w, gpu_mem_used_bytes, throttle (list of names)."""
        n, h, out = self._nvml, self._handle, {}
        util = _safe_call(lambda: n.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            out["gpu_util_pct"] = int(util.gpu)
        temp = _safe_call(lambda: n.nvmlDeviceGetTemperature(h, getattr(n, "NVML_TEMPERATURE_GPU", 0)))
        if temp is not None:
            out["temp_c"] = int(temp)
        power = _safe_call(lambda: n.nvmlDeviceGetPowerUsage(h))
        if power is not None:
            out["power_w"] = round(power / 1000, 1)  # NVML reports milliwatts
        mem = _safe_call(lambda: n.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            out["gpu_mem_used_bytes"] = int(mem.used)  # every process, contexts included
        bits = _safe_call(lambda: self._reasons(h)) if self._reasons else None
        if bits is not None:
            out["throttle"] = [name for bit, name in _THROTTLE_BITS.items() if int(bits) & bit]
        return out

    def close(self) -> None:
        _safe_call(self._nvml.nvmlShutdown)


# --------------------------------------------------------------------------
# Simulated machines: catalog, CPU-only, overrides
# --------------------------------------------------------------------------


def _positive_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise HardwareError(f"{name}={value!r} is not a positive number of GiB: give e.g. {name}=40.")
    return float(value)


def _gpu_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HardwareError(f"GPUS={value!r} is not a GPU count: give a whole number >= 1, e.g. GPUS=2.")
    return value


def _this_torch() -> tuple[str, str | None, str | None]:
    import torch

    return _torch_versions(torch)


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

    The CPU is ``cpu`` when given, else THIS machine's detected CPU and RAM:
    ``GPU=h100`` plans for an H100 attached to a CPU like this one (data loading
    and host RAM are planned from it).  Disk is this machine's; there is no
    battery.  torch/CUDA/HIP versions are this torch's (None where it lacks the
    backend) - the catalog describes hardware, not software.

    free memory: ``free_gb`` (GiB) when given, else total minus
    gpu_catalog.CONTEXT_RESERVE_BYTES.  ``total_gb`` (GiB) replaces the
    catalog's total, for a variant of the card.
    """
    entry = gpu_catalog.lookup(key)
    count = _gpu_count(gpus)
    total = entry.total_bytes
    if total_gb is not None:
        total = int(_positive_number("TOTAL_GB", total_gb) * GiB)
    if free_gb is not None:
        free = _checked_free(free_gb, total, entry.name)
    else:
        free = max(0, total - gpu_catalog.CONTEXT_RESERVE_BYTES)
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
        cpu=cpu if cpu is not None else detect_cpu(),
        disk_free_bytes=_disk_free(disk_path),
        on_battery=None,
        torch_version=torch_version,
        cuda_version=cuda_version,
        hip_version=hip_version,
        source=f"catalog:{entry.key}",
        notes=(),
    )


def _cpu_only(disk_path: str) -> HardwareProfile:
    """GPU=cpu: this machine's CPU, RAM, disk and battery, and no GPU (torch is
    not asked about devices, so this is cheap even on a GPU machine)."""
    torch_version, cuda_version, hip_version = _this_torch()
    return HardwareProfile(
        gpus=(),
        cpu=detect_cpu(),
        disk_free_bytes=_disk_free(disk_path),
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
        raise HardwareError(
            f"FREE_GB={free_gb!r} is more than the {gib(total_bytes):.2f} GiB total of {name}: "
            f"give at most {math.floor(gib(total_bytes) * 100) / 100:.2f}."
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
