"""This machine's CPU, RAM, disk and battery, through psutil (and cgroups)."""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass

from ..errors import HardwareError

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


def _read_first(*paths: str) -> tuple[str, str] | None:
    """(path, stripped text) of the first readable file."""
    for path in paths:
        try:
            with open(path, encoding="ascii") as f:
                return path, f.read().strip()
        except (OSError, UnicodeDecodeError):
            continue
    return None


def _cgroup_cpu_quota() -> float | None:
    """A container's CPU quota in cores (cgroup v2 cpu.max, v1 cfs_quota_us / cfs_period_us), None when unlimited."""
    found = _read_first("/sys/fs/cgroup/cpu.max")
    if found:
        quota, _, period = found[1].partition(" ")
    else:
        quota, period = (_read_first(*(f"/sys/fs/cgroup/{d}/cpu.cfs_{name}_us" for d in ("cpu", "cpu,cpuacct")))
                         for name in ("quota", "period"))
        if not (quota and period):
            return None
        quota, period = quota[1], period[1]
    try:
        cores = int(quota) / int(period or 100_000)
    except ValueError:  # "max", or unreadable
        return None
    return cores if cores > 0 else None


def _cgroup_cpu_seconds() -> float | None:
    """CPU seconds used so far by every process in this cgroup (v2 cpu.stat, v1 cpuacct.usage)."""
    found = _read_first("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/cpuacct/cpuacct.usage",
                        "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage")
    if not found:
        return None
    path, text = found
    if path.endswith("cpu.stat"):
        usage = next((line.split()[1] for line in text.splitlines() if line.startswith("usage_usec ")), None)
        return int(usage) / 1e6 if usage and usage.isdigit() else None
    return int(text) / 1e9 if text.isdigit() else None


def _affinity() -> list[int] | None:
    if hasattr(os, "sched_getaffinity"):
        try:
            return sorted(os.sched_getaffinity(0)) or None
        except OSError:
            pass
    return None


def usable_cores() -> float:
    """Cores this process may run on: its CPU affinity, capped by the container's CPU quota."""
    allowed = _affinity()
    cores = float(len(allowed)) if allowed else float(os.cpu_count() or 1)
    quota = _cgroup_cpu_quota()
    return min(cores, quota) if quota is not None else cores


@dataclass(frozen=True)
class CPULoad:
    """How much of the CPU this process can have now: cores it may use, and cores other processes keep busy."""

    usable_cores: float  # CPU affinity, capped by the container's cgroup quota
    busy_cores: float  # CPU time other processes used over the sample, in cores (this process's own excluded)
    sample_s: float

    @property
    def idle_cores(self) -> float:
        return max(0.0, self.usable_cores - self.busy_cores)

    def describe(self) -> str:
        return (f"{self.idle_cores:.1f} of {self.usable_cores:g} usable cores idle "
                f"(other processes used {self.busy_cores:.1f} over {self.sample_s:.2f}s)")


class CPULoadMeter:
    """Other processes' CPU use between start() and read(), on the cores this process may run on.

    Costs two reads of /proc/stat (and the cgroup's usage under a CPU quota); read()
    can be called repeatedly, each time over the span since the previous start().
    """

    def __init__(self) -> None:
        self.start()

    def _snapshot(self) -> tuple[float, float, float, float | None]:
        import psutil

        per_cpu = psutil.cpu_times(percpu=True)
        cores = self.cores if self.cores is not None else range(len(per_cpu))
        busy = 0.0
        for i in cores:
            if i < len(per_cpu):
                t = per_cpu[i]
                busy += sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - \
                    getattr(t, "guest_nice", 0.0)  # guest time is already counted in user time
        own = psutil.Process().cpu_times()
        return time.perf_counter(), busy, own.user + own.system, _cgroup_cpu_seconds()

    def start(self) -> None:
        self.cores = _affinity()
        self.usable = usable_cores()
        self.first = self._snapshot()

    def read(self) -> CPULoad:
        (t0, busy0, own0, group0), (t1, busy1, own1, group1) = self.first, self._snapshot()
        wall = max(t1 - t0, 1e-6)
        own = max(0.0, own1 - own0)
        others = max(0.0, busy1 - busy0 - own) / wall
        if group0 is not None and group1 is not None and self.usable < len(self.cores or ()):
            # under a CPU quota, this cgroup's other processes spend the same quota
            others = max(others, max(0.0, group1 - group0 - own) / wall)
        return CPULoad(usable_cores=self.usable, busy_cores=min(others, self.usable), sample_s=wall)


def cpu_load(interval_s: float = 0.2) -> CPULoad:
    """The CPU as it is now: usable cores and what other processes use of them, sampled over interval_s."""
    meter = CPULoadMeter()
    time.sleep(interval_s)
    return meter.read()


_SINCE_IMPORT: list[CPULoadMeter] = []
# A long-lived process (a benchmark, a notebook, an HPO study) plans long after import: a sample older than
# this averages over other moments (the bench's background load, started after import, read as 0.2 of 1
# busy core) and is started afresh
STALE_SAMPLE_S = 30.0


def cpu_load_since_start(min_sample_s: float = 0.2) -> CPULoad | None:
    """Other processes' CPU use since this module was imported (kfit imports it before torch, so planning
    gets a sample of a second or more for free), or over the last min_sample_s where that sample is older than
    STALE_SAMPLE_S, waiting out the rest of min_sample_s; None without psutil."""
    try:
        if not _SINCE_IMPORT:
            _SINCE_IMPORT.append(CPULoadMeter())
        meter = _SINCE_IMPORT[0]
        if time.perf_counter() - meter.first[0] > STALE_SAMPLE_S:
            meter.start()
    except Exception:  # noqa: BLE001 - no psutil, no /proc: the load is unknown
        return None
    wait = min_sample_s - (time.perf_counter() - meter.first[0])
    if wait > 0:
        time.sleep(wait)
    return meter.read()


def ram_available_bytes() -> int:
    """RAM available now, capped to the container's cgroup memory limit (as detect_cpu reads it)."""
    import psutil

    available = int(psutil.virtual_memory().available)
    limit = _cgroup_memory_limit()
    return min(available, limit) if limit is not None and limit > 0 else available


def detect_cpu() -> CPUInfo:
    """This machine's CPU and RAM.

    logical_cores is what this process may run on (CPU affinity, e.g. taskset or
    a container's cpuset), physical_cores is capped to it.  RAM is capped to the
    container's cgroup memory limit when there is one.
    """
    import psutil

    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    allowed = _affinity()
    if allowed:
        logical = min(logical, len(allowed))
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
        idle_cores=None if (load := cpu_load_since_start()) is None else round(load.idle_cores, 2),
    )


def disk_free(path: str) -> int:
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


@dataclass(frozen=True)
class BatteryState:
    percent: float  # charge, 0-100
    on_battery: bool | None  # None: the charger's state is unknown


def battery_state() -> BatteryState | None:
    """The battery's charge and whether the machine runs on it; None without a battery."""
    import psutil

    try:
        battery = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError, RuntimeError):
        return None
    if battery is None:
        return None
    plugged = getattr(battery, "power_plugged", None)
    return BatteryState(float(battery.percent), None if plugged is None else not plugged)


def on_battery() -> bool | None:
    """True when running on battery, False on mains power, None without a battery."""
    state = battery_state()
    return None if state is None else state.on_battery


try:  # start the free load sample (cpu_load_since_start) as early as possible
    _SINCE_IMPORT.append(CPULoadMeter())
except Exception:  # noqa: BLE001
    pass
