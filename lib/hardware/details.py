"""What `make check-hardware` shows beyond the profile, and `make recommend` reads:
CPU architecture, clock and NUMA nodes, swap, host memory bandwidth, the data directory's disk type and
read speed, each GPU's power limit and draw, and INT8/FP8 support. Each item is read or measured where
this machine allows and is None otherwise (shown as "unknown"), never an error.

Measurements are short and cached in kfit's cache directory (<cache>/host-details.json, versioned, checked
on every read and never written through a link, as every kfit cache is: lib/fileio.py): the host memory
bandwidth (a 256 MiB tensor copy, best of 3) per CPU; a directory's read speed per directory and the size
and modification time of the file read (at most READ_BYTES of its largest file, the page cache dropped
for it first with posix_fadvise so that the disk, not memory, is timed).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from ..env import cache_dir
from ..fileio import UnsafeFileError, cache_note, is_number, read_json_cache, sweep_temporaries, write_json_atomic

CACHE_FILE = "host-details.json"
CACHE_SCHEMA = 1
READ_BYTES = 256 * 2**20
COPY_BYTES = 256 * 2**20


def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def cached() -> dict:
    """host-details.json's measurements by key, each a positive number: a damaged or foreign file, or a damaged
    entry, is dropped with one note naming the file (and measured again); never a traceback."""
    path = cache_path()
    data = read_json_cache(path, CACHE_SCHEMA) or {}
    data.pop("schema", None)
    good = {key: value for key, value in data.items() if is_number(value, positive=True)}
    if len(good) < len(data):
        cache_note(path, f"{len(data) - len(good)} entr{'y' if len(data) - len(good) == 1 else 'ies'} not a "
                   "positive number")
    return good


def _remember(key: str, value: float) -> None:
    path = cache_path()
    data = cached()
    data[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {**data, "schema": CACHE_SCHEMA})  # never through a link planted there
    except UnsafeFileError as err:
        cache_note(path, err.what, then="not updated")
    except OSError:
        return  # a read-only cache: measured again next time
    sweep_temporaries(path.parent)


def cpu_details() -> dict:
    """Architecture, the highest clock psutil reports (MHz) and the NUMA node count (Linux sysfs)."""
    import psutil

    freq = None
    try:
        f = psutil.cpu_freq()
        freq = round(f.max or f.current) if f and (f.max or f.current) else None
    except (OSError, AttributeError, NotImplementedError):
        pass
    nodes = Path("/sys/devices/system/node")
    numa = len([p for p in nodes.glob("node[0-9]*")]) if nodes.is_dir() else None
    return {"arch": platform.machine() or None, "clock_mhz": freq, "numa_nodes": numa or None}


def swap_bytes() -> int | None:
    import psutil

    try:
        return int(psutil.swap_memory().total)
    except (OSError, RuntimeError):
        return None


def memory_bandwidth(cpu_name: str) -> float | None:
    """Host memory bandwidth in bytes/s, read + write of a 256 MiB copy (best of 3); cached per CPU."""
    key = f"bandwidth:{cpu_name}"
    known = cached().get(key)
    if known is not None:
        return float(known)
    import torch

    try:
        src = torch.ones(COPY_BYTES // 4)
        dst = torch.empty_like(src)
        best = min(_timed(lambda: dst.copy_(src)) for _ in range(3))
    except RuntimeError:  # not enough memory for the buffers
        return None
    value = 2 * COPY_BYTES / best
    _remember(key, value)
    return value


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return max(time.perf_counter() - start, 1e-9)


def _block_device(path: Path) -> Path | None:
    """/sys/block/<disk> holding `path` (a partition's parent disk), or None (tmpfs, overlay, not Linux)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    sys_dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not sys_dev.exists():
        return None
    real = sys_dev.resolve()
    return real.parent if (real / "partition").exists() else real


def disk_kind(path: str | Path) -> str | None:
    """"NVMe", "SSD" or "HDD" for the disk holding `path`, from its name and the kernel's rotational flag."""
    device = _block_device(Path(path))
    if device is None:
        return None
    if device.name.startswith("nvme"):
        return "NVMe"
    try:
        rotational = (device / "queue" / "rotational").read_text().strip()
    except OSError:
        return None
    return {"0": "SSD", "1": "HDD"}.get(rotational)


def read_speed(directory: str | Path, budget_s: float = 2.0) -> tuple[float | None, str]:
    """(bytes/s, how) reading the largest file under `directory` sequentially (at most READ_BYTES, stopped
    after `budget_s`), or (None, why not). Cached per directory, file size and modification time."""
    directory = Path(directory).expanduser()
    try:
        files = [p for p in directory.rglob("*") if p.is_file()] if directory.is_dir() else []
    except OSError:
        files = []
    if not files:
        return None, f"no files in {directory} to read"
    largest = max(files, key=lambda p: p.stat().st_size)
    st = largest.stat()
    key = f"read:{largest.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    known = cached().get(key)
    if known is not None:
        return float(known), f"{largest.name}, cached"
    if st.st_size < 4 * 2**20:
        return None, f"{largest.name} is under 4 MiB: too small to time a disk"
    done, start = 0, time.perf_counter()
    try:
        with open(largest, "rb", buffering=0) as f:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # time the disk, not the page cache
            while done < READ_BYTES and time.perf_counter() - start < budget_s:
                chunk = f.read(8 * 2**20)
                if not chunk:
                    break
                done += len(chunk)
    except OSError as err:
        return None, f"reading {largest} failed ({err.strerror})"
    value = done / max(time.perf_counter() - start, 1e-9)
    _remember(key, value)
    return value, f"{done / 2**20:.0f} MiB of {largest.name}"


def gpu_power(index: int, vendor: str = "nvidia", **modules) -> tuple[float | None, float | None]:
    """(enforced power limit, current draw) in watts through NVML (amdsmi for vendor "amd"); (None, None)
    without the library. `modules`: open_telemetry's pynvml_mod / amdsmi_mod / torch_mod (tests)."""
    from .telemetry import open_telemetry

    telemetry = open_telemetry(vendor, index, **modules)
    if telemetry is None:
        return None, None
    try:
        return telemetry.power()
    finally:
        telemetry.close()


def low_precision(compute_capability: tuple[int, int] | None) -> dict:
    """INT8 and FP8 matmul support from an NVIDIA compute capability (None: unknown): INT8 tensor cores
    from Turing (7.5; 7.2 on Xavier), FP8 from Ada (8.9) and Hopper (9.0)."""
    if not compute_capability:
        return {"int8": None, "fp8": None}
    cc = tuple(compute_capability)
    return {"int8": cc >= (7, 2), "fp8": cc >= (8, 9)}


def collect(hardware, data_dir: str | Path | None) -> dict:
    """Every item above for `hardware` (a HardwareProfile detected here) and the data directory (None: the
    data is built in): plain JSON-ready values, None where unknown. check-hardware shows it and writes it
    beside the profile (FORMAT=json); make recommend reads the data's read speed from it."""
    cpu = cpu_details()
    out = {"cpu": {**cpu, "memory_bandwidth_bytes_per_s": memory_bandwidth(hardware.cpu.name),
                   "swap_bytes": swap_bytes()},
           "data": {"directory": str(data_dir) if data_dir else None,
                    "disk": disk_kind(data_dir or "."), "read_bytes_per_s": None, "read": None},
           "gpus": []}
    if data_dir:
        out["data"]["read_bytes_per_s"], out["data"]["read"] = read_speed(data_dir)
    for gpu in hardware.gpus:
        limit, draw = gpu_power(gpu.index, gpu.vendor)
        out["gpus"].append({"index": gpu.index, "power_limit_watts": limit, "power_draw_watts": draw,
                            **low_precision(gpu.compute_capability)})
    return out
