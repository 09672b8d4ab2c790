"""GpuTelemetry: NVML readings of the GPU a run trains on, for the monitor."""

from __future__ import annotations

from typing import Any

from .nvml import load_pynvml
from .runtime import safe_call

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
        nvml = pynvml_mod if pynvml_mod is not None else load_pynvml()
        if nvml is None:
            return None
        try:
            nvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no library or driver: telemetry off
            return None
        try:
            return cls(nvml, cls._handle(nvml, index, torch_mod), index)
        except Exception:  # noqa: BLE001
            safe_call(nvml.nvmlShutdown)
            return None

    @staticmethod
    def _handle(nvml: Any, index: int, torch_mod: Any) -> Any:
        # torch numbers GPUs after CUDA_VISIBLE_DEVICES (and fastest first); NVML
        # numbers all of them by PCI bus: the UUID names the same card in both.
        if torch_mod is None:
            import torch as torch_mod
        uuid = safe_call(lambda: str(torch_mod.cuda.get_device_properties(index).uuid))
        if uuid:
            try:
                return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
            except Exception:  # noqa: BLE001 - older driver or MIG: by position
                pass
        return nvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> dict:
        """The readings this GPU supports (a query it does not support is left out):
        gpu_util_pct, temp_c, power_w, gpu_mem_used_bytes, throttle (list of names),
        sm_clock_mhz, mem_clock_mhz, sm_clock_max_mhz."""
        n, h, out = self._nvml, self._handle, {}
        util = safe_call(lambda: n.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            out["gpu_util_pct"] = int(util.gpu)
        temp = safe_call(lambda: n.nvmlDeviceGetTemperature(h, getattr(n, "NVML_TEMPERATURE_GPU", 0)))
        if temp is not None:
            out["temp_c"] = int(temp)
        power = safe_call(lambda: n.nvmlDeviceGetPowerUsage(h))
        if power is not None:
            out["power_w"] = round(power / 1000, 1)  # NVML reports milliwatts
        mem = safe_call(lambda: n.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            out["gpu_mem_used_bytes"] = int(mem.used)  # every process, contexts included
        for key, clock, query in (("sm_clock_mhz", "NVML_CLOCK_SM", "nvmlDeviceGetClockInfo"),
                                  ("mem_clock_mhz", "NVML_CLOCK_MEM", "nvmlDeviceGetClockInfo"),
                                  ("sm_clock_max_mhz", "NVML_CLOCK_SM", "nvmlDeviceGetMaxClockInfo")):
            mhz = safe_call(lambda: getattr(n, query)(h, getattr(n, clock)))
            if mhz is not None:
                out[key] = int(mhz)
        bits = safe_call(lambda: self._reasons(h)) if self._reasons else None
        if bits is not None:
            out["throttle"] = [name for bit, name in _THROTTLE_BITS.items() if int(bits) & bit]
        return out

    def power(self) -> tuple[float | None, float | None]:
        """(enforced power limit, current draw) in watts; None where NVML does not say."""
        n, h = self._nvml, self._handle
        limit = safe_call(lambda: n.nvmlDeviceGetEnforcedPowerLimit(h))
        draw = safe_call(lambda: n.nvmlDeviceGetPowerUsage(h))
        return (round(limit / 1000, 1) if limit is not None else None,  # NVML reports milliwatts
                round(draw / 1000, 1) if draw is not None else None)

    def close(self) -> None:
        safe_call(self._nvml.nvmlShutdown)
