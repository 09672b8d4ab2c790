"""The GPU a run trains on, read while it trains, for the monitor and the thermal pause: NVIDIA GPUs through
NVML (GpuTelemetry), AMD GPUs through ROCm's amdsmi (AmdTelemetry). Both have the same interface: open(index)
(None where the library or driver is missing), read() (a dict of the readings the GPU supports), power(),
index and close(); `open_telemetry` picks one by the GPU's vendor."""

from __future__ import annotations

from typing import Any, Callable

from .amd import load_amdsmi, number, pci_bus
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



def _opened(cls, library: Any, init: Callable[[], None], shutdown: Callable[[], None], index: int, torch_mod: Any):
    """cls(library, its handle of torch's device `index`, index) once the vendor library starts, or None where
    it is missing, does not start (no driver: telemetry off) or does not find the device (shut down again)."""
    if library is None:
        return None
    try:
        init()
    except Exception:  # noqa: BLE001 - no library or driver: telemetry off
        return None
    try:
        return cls(library, cls._handle(library, index, torch_mod), index)
    except Exception:  # noqa: BLE001
        safe_call(shutdown)
        return None

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
        return _opened(cls, nvml, lambda: nvml.nvmlInit(), lambda: nvml.nvmlShutdown(), index, torch_mod)

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


class AmdTelemetry:
    """amdsmi readings of one AMD GPU under ROCm: utilisation, temperature, power, memory, clocks (the keys of
    GpuTelemetry.read). No throttle reasons: amdsmi's throttle bits differ between GPU generations and ROCm
    releases; the thermal pause acts on the temperature. Holds an amdsmi session until close()."""

    def __init__(self, smi: Any, handle: Any, index: int) -> None:
        self._smi, self._handle, self.index = smi, handle, index

    @classmethod
    def open(cls, index: int = 0, *, amdsmi_mod: Any = None, torch_mod: Any = None) -> AmdTelemetry | None:
        """Telemetry of torch's GPU ``index`` (ROCm GPUs are torch's "cuda" devices), or None when amdsmi is
        not available (not installed, no amdgpu driver, no AMD GPU)."""
        smi = amdsmi_mod if amdsmi_mod is not None else load_amdsmi()

        def init() -> None:
            flags = getattr(getattr(smi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
            smi.amdsmi_init(flags) if flags is not None else smi.amdsmi_init()

        return _opened(cls, smi, init, lambda: smi.amdsmi_shut_down(), index, torch_mod)

    @staticmethod
    def _handle(smi: Any, index: int, torch_mod: Any) -> Any:
        # torch numbers GPUs after HIP_VISIBLE_DEVICES; amdsmi lists every GPU: the PCI address names the same
        # card in both (torch's device properties carry its domain and bus), else the position does.
        handles = list(smi.amdsmi_get_processor_handles())
        if torch_mod is None:
            import torch as torch_mod
        props = safe_call(lambda: torch_mod.cuda.get_device_properties(index))
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            want = (int(getattr(props, "pci_domain_id", 0) or 0), int(bus))
            for handle in handles:
                if pci_bus(safe_call(lambda: smi.amdsmi_get_gpu_device_bdf(handle))) == want:
                    return handle
        return handles[index]

    def _temperature(self) -> float | None:
        # The edge sensor reads like NVIDIA's GPU temperature; GPUs without one (MI300) report the hotspot.
        kinds, metric = getattr(self._smi, "AmdSmiTemperatureType", None), getattr(self._smi, "AmdSmiTemperatureMetric", None)
        current = getattr(metric, "CURRENT", 0)
        for sensor in ("EDGE", "HOTSPOT"):
            kind = getattr(kinds, sensor, None)
            if kind is None:
                continue
            value = number(safe_call(lambda: self._smi.amdsmi_get_temp_metric(self._handle, kind, current)))
            if value is not None:
                return value
        return None

    def _power_w(self) -> float | None:
        # Watts; the key moved between ROCm releases (socket_power from ROCm 7, current_socket_power on MI300,
        # average_socket_power before), and a sensor a GPU lacks reads "N/A".
        info = safe_call(lambda: self._smi.amdsmi_get_power_info(self._handle)) or {}
        for key in ("socket_power", "current_socket_power", "average_socket_power"):
            value = number(info.get(key))
            if value is not None and value > 0:
                return value
        return None

    def read(self) -> dict:
        """The readings this GPU supports (a query it does not support is left out): gpu_util_pct, temp_c,
        power_w, gpu_mem_used_bytes, sm_clock_mhz (the graphics clock), mem_clock_mhz, sm_clock_max_mhz."""
        smi, h, out = self._smi, self._handle, {}
        activity = safe_call(lambda: smi.amdsmi_get_gpu_activity(h)) or {}
        util = number(activity.get("gfx_activity"))
        if util is not None:
            out["gpu_util_pct"] = int(util)
        temp = self._temperature()
        if temp is not None:
            out["temp_c"] = int(temp)
        power = self._power_w()
        if power is not None:
            out["power_w"] = round(power, 1)
        vram = safe_call(lambda: smi.amdsmi_get_gpu_vram_usage(h)) or {}
        used = number(vram.get("vram_used"))
        if used is not None:
            out["gpu_mem_used_bytes"] = int(used) * 2**20  # amdsmi reports MiB, every process included
        clocks = getattr(smi, "AmdSmiClkType", None)
        for key, kind, field in (("sm_clock_mhz", "GFX", ("clk", "cur_clk")), ("mem_clock_mhz", "MEM", ("clk", "cur_clk")),
                                 ("sm_clock_max_mhz", "GFX", ("max_clk",))):
            if getattr(clocks, kind, None) is None:
                continue
            info = safe_call(lambda: smi.amdsmi_get_clock_info(h, getattr(clocks, kind))) or {}
            mhz = next((number(info[f]) for f in field if number(info.get(f)) is not None), None)
            if mhz is not None:
                out[key] = int(mhz)
        return out

    def power(self) -> tuple[float | None, float | None]:
        """(power cap, current draw) in watts; None where amdsmi does not say."""
        cap = number((safe_call(lambda: self._smi.amdsmi_get_power_cap_info(self._handle)) or {}).get("power_cap"))
        return (round(cap / 1e6, 1) if cap else None,  # amdsmi reports the cap in microwatts
                self._power_w())

    def close(self) -> None:
        safe_call(self._smi.amdsmi_shut_down)


def open_telemetry(vendor: str | None, index: int = 0, **modules: Any) -> GpuTelemetry | AmdTelemetry | None:
    """Telemetry of torch's GPU ``index`` from its vendor's library (NVML for "nvidia", amdsmi for "amd"), or
    None where there is none (another vendor, the library or driver missing). `modules`: the libraries'
    stand-ins (pynvml_mod / amdsmi_mod, torch_mod: tests)."""
    if vendor == "nvidia":
        return GpuTelemetry.open(index, **{k: v for k, v in modules.items() if k != "amdsmi_mod"})
    if vendor == "amd":
        return AmdTelemetry.open(index, **{k: v for k, v in modules.items() if k != "pynvml_mod"})
    return None


TELEMETRY_LIBRARY = {"nvidia": "NVML (no NVIDIA driver, or nvidia-ml-py is not installed)",
                     "amd": "amdsmi (no ROCm driver, or ROCm's amdsmi Python package is not installed)"}
