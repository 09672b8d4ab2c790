"""NVML (nvidia-ml-py): what the NVIDIA driver sees, read without creating a
CUDA context.  Detection takes free memory from here; telemetry loads it too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import catalog


def load_pynvml() -> Any:
    try:
        import pynvml
    except Exception:  # noqa: BLE001 - not installed or broken: no NVML
        return None
    return pynvml


@dataclass(frozen=True)
class _NvmlDevice:
    name: str
    uuid: str | None
    total_bytes: int | None
    free_bytes: int | None


@dataclass(frozen=True)
class NvmlReport:
    devices: tuple[_NvmlDevice, ...]
    driver_cuda: tuple[int, int] | None  # highest CUDA version the driver supports
    problem: str | None = None  # NVML loaded but says the GPUs are unusable


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def query_nvml(pynvml_mod: Any) -> NvmlReport | None:
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
            return NvmlReport(
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
        return NvmlReport(devices=tuple(devices), driver_cuda=driver_cuda)
    except Exception:
        return None
    finally:
        try:
            pynvml_mod.nvmlShutdown()
        except Exception:
            pass


def uuid_key(u: str | None) -> str | None:
    if not u:
        return None
    u = u.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def nvml_free(nvml: NvmlReport | None, by_uuid: dict, props: Any, i: int, count: int) -> int | None:
    """Free bytes of torch's GPU i as NVML reports it, less the context training
    will create (catalog.CONTEXT_RESERVE_BYTES), so an idle card reads like
    its catalog entry.  Matched by UUID (torch and NVML may order GPUs
    differently), else by position when the counts agree; None without a match."""
    match = by_uuid.get(uuid_key(str(getattr(props, "uuid", "") or "")))
    if match is None and nvml and len(nvml.devices) == count:
        match = nvml.devices[i]
    if match is None or match.free_bytes is None:
        return None
    return max(0, match.free_bytes - catalog.CONTEXT_RESERVE_BYTES)
