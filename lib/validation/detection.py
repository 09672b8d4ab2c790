"""Detection against nvidia-smi, and NVML telemetry read while the GPU works.

detection: `nvidia-smi --query-gpu=name,memory.total,memory.used,compute_cap,driver_version
--format=csv` against lib.hardware.detect(): the same name and compute capability,
total memory within TOTAL_TOLERANCE (torch's total is the driver's usable memory,
a little below NVML's), and kfit's free memory next to nvidia-smi's total - used.

telemetry: lib.hardware.GpuTelemetry (utilisation, temperature, power, throttle
reasons) and the SM and memory clocks, sampled every INTERVAL_S while bf16
matmuls load the GPU; it passes when temperature, power and clocks were read.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from typing import Any, Callable

from .report import Context, Result, failed, passed, skipped

SMI_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total,memory.used,compute_cap,driver_version", "--format=csv"]
TOTAL_TOLERANCE = 0.03
INTERVAL_S = 0.25
MiB = 2**20


def run_command(argv: list[str], timeout: float = 30) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True).stdout


def _mib(text: str | None) -> int | None:
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*MiB", text or "")
    return int(float(match.group(1)) * MiB) if match else None


def _capability(text: str | None) -> tuple[int, int] | None:
    match = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_smi_csv(text: str) -> list[dict]:
    """nvidia-smi's CSV (a header such as 'memory.total [MiB]', then one line per GPU) as dicts."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return []
    keys = [h.strip().split(" ")[0] for h in lines[0].split(",")]
    rows = []
    for line in lines[1:]:
        d = dict(zip(keys, (v.strip() for v in line.split(","))))
        rows.append({"name": d.get("name"), "memory_total_bytes": _mib(d.get("memory.total")),
                     "memory_used_bytes": _mib(d.get("memory.used")),
                     "compute_capability": _capability(d.get("compute_cap")),
                     "driver_version": d.get("driver_version")})
    return rows


def compare_detection(rows: list[dict], profile: Any) -> Result:
    """nvidia-smi's rows against a HardwareProfile's GPUs (matched by name, in order)."""
    if not rows:
        return failed("nvidia-smi listed no GPU")
    if not profile.gpus:
        return failed(f"nvidia-smi lists {len(rows)} GPU(s) but kfit detected none: " + "; ".join(profile.notes),
                      nvidia_smi=rows)
    compared, problems = [], []
    unmatched = list(rows)
    for gpu in profile.gpus:
        row = next((r for r in unmatched if r["name"] == gpu.name), None)
        if row is None:
            problems.append(f"GPU {gpu.index} '{gpu.name}' is not in nvidia-smi's list "
                            f"({', '.join(r['name'] for r in rows)})")
            continue
        unmatched.remove(row)
        total = row["memory_total_bytes"] or 0
        diff = (gpu.total_bytes - total) / total if total else None
        smi_free = total - row["memory_used_bytes"] if total and row["memory_used_bytes"] is not None else None
        cc = tuple(gpu.compute_capability) if gpu.compute_capability else None
        compared.append({"index": gpu.index, "name": gpu.name, "kfit_total_bytes": gpu.total_bytes,
                         "smi_total_bytes": total, "total_rel_diff": None if diff is None else round(diff, 4),
                         "kfit_free_bytes": gpu.free_bytes, "smi_free_bytes": smi_free,
                         "kfit_compute_capability": cc, "smi_compute_capability": row["compute_capability"]})
        if row["compute_capability"] and cc != row["compute_capability"]:
            problems.append(f"{gpu.name}: compute capability {cc} but nvidia-smi says {row['compute_capability']}")
        if diff is None or abs(diff) > TOTAL_TOLERANCE:
            problems.append(f"{gpu.name}: total {gpu.total_bytes / MiB:.0f} MiB but nvidia-smi says "
                            f"{total / MiB:.0f} MiB")
    figures = {"gpus": compared, "nvidia_smi": rows, "driver": rows[0]["driver_version"],
               "kfit_gpu_count": len(profile.gpus), "smi_gpu_count": len(rows)}
    if problems:
        return failed("; ".join(problems), **figures)
    first = compared[0]
    return passed(f"{len(compared)} GPU(s) match nvidia-smi: {first['name']}, cc "
                  f"{'.'.join(map(str, first['kfit_compute_capability'] or ()))}, total "
                  f"{first['kfit_total_bytes'] / MiB:.0f} MiB (nvidia-smi {first['smi_total_bytes'] / MiB:.0f}, "
                  f"{first['total_rel_diff']:+.2%}), driver {figures['driver']}", **figures)


def check_detection(ctx: Context, run: Callable[[list[str]], str] = run_command,
                    detect: Callable[[], Any] | None = None) -> Result:
    if ctx.device != "cuda":
        return skipped("DEVICE=cpu: no GPU to compare with nvidia-smi")
    try:
        text = run(SMI_QUERY)
    except FileNotFoundError:
        return skipped("nvidia-smi is not installed on this machine")
    if detect is None:
        from ..hardware import detect
    return compare_detection(parse_smi_csv(text), detect())


# --------------------------------------------------------------------------
# Telemetry


def sample_while(readers: list[Callable[[], dict]], load: Callable[[], None],
                 interval: float = INTERVAL_S) -> list[dict]:
    """Call every reader each `interval` seconds on a thread while `load` runs here."""
    samples: list[dict] = []
    stop = threading.Event()
    start = time.monotonic()

    def loop() -> None:
        while True:
            sample = {"t": round(time.monotonic() - start, 2)}
            for read in readers:
                sample.update(read())
            samples.append(sample)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, name="validate-telemetry", daemon=True)
    thread.start()
    try:
        load()
    finally:
        stop.set()
        thread.join()
    return samples


def judge_telemetry(samples: list[dict]) -> Result:
    def values(key: str) -> list:
        return [s[key] for s in samples if key in s]

    summary = {key: (min(values(key)), max(values(key))) if values(key) else None
               for key in ("gpu_util_pct", "temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz")}
    throttle = sorted({reason for s in samples for reason in s.get("throttle", ())})
    figures = {"samples": len(samples), "ranges": summary, "throttle_reasons_seen": throttle,
               "sm_clock_max_mhz": max(values("sm_clock_max_mhz"), default=None), "readings": samples}
    missing = [key for key in ("temp_c", "power_w", "sm_clock_mhz") if summary[key] is None]
    if missing:
        return failed(f"{len(samples)} NVML samples but no {', '.join(missing)}", **figures)
    s = summary
    return passed(f"{len(samples)} samples: util up to {s['gpu_util_pct'][1] if s['gpu_util_pct'] else '?'}%, "
                  f"{s['temp_c'][0]}-{s['temp_c'][1]}C, up to {s['power_w'][1]}W, SM clock "
                  f"{s['sm_clock_mhz'][0]}-{s['sm_clock_mhz'][1]} MHz, throttle: {', '.join(throttle) or 'none'}",
                  **figures)


def matmul_load(device: str, seconds: float) -> None:
    import torch

    a = torch.randn((8192, 8192), device=device, dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(10):
            b = a @ a
        torch.cuda.synchronize(device)
    del a, b


def check_telemetry(ctx: Context, telemetry_open: Callable[[int], Any] | None = None,
                    load: Callable[[str, float], None] = matmul_load) -> Result:
    if ctx.device != "cuda":
        return skipped("DEVICE=cpu: NVML telemetry needs an NVIDIA GPU")
    if telemetry_open is None:
        from ..hardware import GpuTelemetry

        telemetry_open = GpuTelemetry.open
    telemetry = telemetry_open(ctx.cuda.index)
    if telemetry is None:
        return failed("NVML is not usable (no driver library or nvidia-ml-py): no telemetry")
    try:
        samples = sample_while([telemetry.read], lambda: load(ctx.cuda.device, 3.0 if ctx.quick else 8.0))
    finally:
        telemetry.close()
    return judge_telemetry(samples)
