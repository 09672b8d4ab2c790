"""What the machine (real or simulated) offers a training run.

This package is the ONLY code in kfit that queries NVML, ``torch.cuda`` or
``torch.backends.mps``.  Everything else consumes the frozen HardwareProfile
returned by :func:`resolve_hardware`, so any machine can be simulated.

Who owns what:

* ``profile``   GPUInfo, CPUInfo, HardwareProfile, format_size (lib.units.format_bytes), JSON and load_profile
* ``strict``    the strict readers behind HardwareProfile.from_dict
* ``host``      CPU, RAM, disk and battery (psutil)
* ``nvml``      what the NVIDIA driver sees (NVML), without a CUDA context
* ``detection`` detect(): GPUs through torch (CUDA, ROCm, MPS) and notes on unusable ones
* ``runtime``   the device in use: memory, cache, whether a GPU can train
* ``telemetry`` GpuTelemetry (NVML), AmdTelemetry (amdsmi): readings while training, throttle reasons
* ``amd``       ROCm's amdsmi, loaded lazily
* ``simulate``  resolve_hardware: HW= files, GPU= catalog machines, GPU=cpu, FREE_GB=/GPUS=
* ``catalog``   GPUs to plan for without having them (data)
"""

from __future__ import annotations

from . import catalog
from .allocator import use_expandable_segments

use_expandable_segments()  # before anything here starts CUDA (allocator.py says why)

from ..units import GiB, gib
from .detection import detect
from .host import detect_cpu, on_battery
from .profile import BACKENDS, VENDORS, CPUInfo, GPUInfo, HardwareProfile, format_size, load_profile
from .runtime import device_memory, empty_device_cache, gpu_unusable_reason, reset_peak_memory
from .simulate import from_catalog, resolve_hardware
from .telemetry import TELEMETRY_LIBRARY, THROTTLE_KIND, AmdTelemetry, GpuTelemetry, open_telemetry

__all__ = [
    "BACKENDS",
    "VENDORS",
    "GiB",
    "catalog",
    "CPUInfo",
    "GPUInfo",
    "HardwareProfile",
    "detect",
    "detect_cpu",
    "format_size",
    "from_catalog",
    "gib",
    "load_profile",
    "resolve_hardware",
    # runtime queries (the trainer and the monitor)
    "AmdTelemetry",
    "GpuTelemetry",
    "TELEMETRY_LIBRARY",
    "open_telemetry",
    "THROTTLE_KIND",
    "device_memory",
    "empty_device_cache",
    "gpu_unusable_reason",
    "on_battery",
    "reset_peak_memory",
]
