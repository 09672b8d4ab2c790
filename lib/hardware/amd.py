"""amdsmi (ROCm's Python library, shipped with ROCm as the `amdsmi` package): what the AMD driver sees,
for telemetry. Imported only when asked for; a machine without it (no ROCm, the package not installed, a
broken install) has no AMD readings, as a machine without NVML has no NVIDIA ones."""

from __future__ import annotations

from typing import Any


def load_amdsmi() -> Any:
    try:
        import amdsmi
    except Exception:  # noqa: BLE001 - not installed or broken (it loads libamd_smi.so on import): no readings
        return None
    return amdsmi


def number(value: Any) -> float | None:
    """A reading as a number; None for amdsmi's "N/A" (a sensor the GPU lacks) or anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except (TypeError, ValueError):
        return None


def pci_bus(bdf: Any) -> tuple[int, int] | None:
    """(domain, bus) of a "DDDD:BB:DD.F" address as amdsmi_get_gpu_device_bdf writes it; None otherwise."""
    try:
        domain, bus = str(bdf).split(":")[:2]
        return int(domain, 16), int(bus, 16)
    except ValueError:
        return None
