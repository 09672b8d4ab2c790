"""This machine's CPU, RAM, disk and battery, through psutil (and cgroups)."""

from __future__ import annotations

import os
import platform
import sys

from lib.errors import HardwareError

from .profile import CPUInfo


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
