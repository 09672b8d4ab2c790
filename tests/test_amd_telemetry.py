"""AMD GPUs' telemetry through ROCm's amdsmi, behind the interface NVML's has: the monitor's readings and the
thermal pause on ROCm, from a fake amdsmi module with the real one's names."""

from __future__ import annotations

import json
import types

import pytest
import torch

from lib import hardware
from lib.hardware import AmdTelemetry, open_telemetry
from lib.hardware.details import gpu_power
from lib.monitor import Monitor
from lib.trainer import Trainer
from lib.trainer.conditions import Sensors
from tests.helpers import CPU, manual

MiB = 2**20


class FakeAmdSmiLibraryException(Exception):
    """amdsmi's AmdSmiLibraryException: a query the GPU or driver does not support."""


def fake_amdsmi(cards, *, init_error=None):
    """cards: a dict per GPU with bdf and the readings it reports (edge, hotspot, power (a dict as
    amdsmi_get_power_info returns it), cap_uw, gfx, vram_used_mib, gfx_mhz, gfx_max_mhz, mem_mhz); a reading
    left out raises as an unsupported query does. Change a card's dict to change its readings."""
    calls: list = []
    mod = types.SimpleNamespace(
        calls=calls, cards=cards,
        AmdSmiLibraryException=FakeAmdSmiLibraryException,
        AmdSmiInitFlags=types.SimpleNamespace(INIT_AMD_GPUS=2),
        AmdSmiTemperatureType=types.SimpleNamespace(EDGE=0, HOTSPOT=1, JUNCTION=1, VRAM=2),
        AmdSmiTemperatureMetric=types.SimpleNamespace(CURRENT=0, MAX=1),
        AmdSmiClkType=types.SimpleNamespace(SYS=0, GFX=0, DF=1, DCEF=2, SOC=3, MEM=4),
    )

    def reading(handle, key):
        calls.append(key)
        if key not in cards[handle]:
            raise FakeAmdSmiLibraryException("AMDSMI_STATUS_NOT_SUPPORTED")
        return cards[handle][key]

    def amdsmi_init(flags=None):
        calls.append(("init", flags))
        if init_error is not None:
            raise init_error

    mod.amdsmi_init = amdsmi_init
    mod.amdsmi_shut_down = lambda: calls.append("shutdown")
    mod.amdsmi_get_processor_handles = lambda: list(range(len(cards)))
    mod.amdsmi_get_gpu_device_bdf = lambda h: reading(h, "bdf")
    mod.amdsmi_get_temp_metric = lambda h, kind, metric: reading(h, {0: "edge", 1: "hotspot"}[kind])
    mod.amdsmi_get_power_info = lambda h: reading(h, "power")
    mod.amdsmi_get_power_cap_info = lambda h: {"power_cap": reading(h, "cap_uw"), "dpm_cap": 0}
    mod.amdsmi_get_gpu_activity = lambda h: {"gfx_activity": reading(h, "gfx"), "umc_activity": 0, "mm_activity": "N/A"}
    mod.amdsmi_get_gpu_vram_usage = lambda h: {"vram_total": 65520, "vram_used": reading(h, "vram_used_mib")}

    def clock(h, kind):
        if kind == mod.AmdSmiClkType.GFX:
            return {"clk": reading(h, "gfx_mhz"), "min_clk": 500, "max_clk": reading(h, "gfx_max_mhz"),
                    "clk_locked": False, "clk_deep_sleep": False}
        return {"clk": reading(h, "mem_mhz"), "min_clk": 100, "max_clk": 1600}

    mod.amdsmi_get_clock_info = clock
    return mod


def torch_with_bus(bus: int | None):
    """torch as ROCm shows it: device 0 at PCI bus `bus` (None: properties without PCI fields)."""
    props = types.SimpleNamespace(name="AMD Instinct MI210", total_memory=64 * 2**30)
    if bus is not None:
        props.pci_bus_id, props.pci_domain_id = bus, 0
    return types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_properties=lambda i: props))


MI210 = {"bdf": "0000:c1:00.0", "edge": 48, "hotspot": 61, "gfx": 97, "vram_used_mib": 30000,
         "power": {"current_socket_power": "N/A", "average_socket_power": 281, "gfx_voltage": 900,
                   "soc_voltage": 800, "mem_voltage": 1200, "power_limit": 300_000_000},
         "cap_uw": 300_000_000, "gfx_mhz": 1700, "gfx_max_mhz": 1700, "mem_mhz": 1600}


def test_readings_have_nvml_s_names_and_units():
    other = {"bdf": "0000:03:00.0", "edge": 30, "gfx": 0}
    smi = fake_amdsmi([other, dict(MI210)])
    telemetry = AmdTelemetry.open(0, amdsmi_mod=smi, torch_mod=torch_with_bus(0xC1))  # torch's 0 is amdsmi's 1
    assert telemetry is not None and telemetry.index == 0 and ("init", 2) in smi.calls
    assert telemetry.read() == {"gpu_util_pct": 97, "temp_c": 48, "power_w": 281.0,
                                "gpu_mem_used_bytes": 30000 * MiB, "sm_clock_mhz": 1700, "mem_clock_mhz": 1600,
                                "sm_clock_max_mhz": 1700}
    assert telemetry.power() == (300.0, 281.0)  # the cap in microwatts, the draw in watts
    telemetry.close()
    assert smi.calls[-1] == "shutdown"


def test_a_gpu_without_an_edge_sensor_or_a_current_power_reads_what_it_has():
    mi300 = {"bdf": "0000:05:00.0", "hotspot": 74, "power": {"socket_power": 612, "current_socket_power": "N/A"}}
    smi = fake_amdsmi([mi300])
    telemetry = AmdTelemetry.open(0, amdsmi_mod=smi, torch_mod=torch_with_bus(None))  # by position
    assert telemetry.read() == {"temp_c": 74, "power_w": 612.0}  # unsupported queries left out, as with NVML
    assert telemetry.power() == (None, 612.0)


def test_no_library_or_driver_means_no_readings(monkeypatch):
    monkeypatch.setattr("lib.hardware.telemetry.load_amdsmi", lambda: None)
    assert AmdTelemetry.open(0) is None and open_telemetry("amd", 0) is None
    broken = fake_amdsmi([MI210], init_error=FakeAmdSmiLibraryException("AMDSMI_STATUS_DRIVER_NOT_LOADED"))
    assert AmdTelemetry.open(0, amdsmi_mod=broken, torch_mod=torch_with_bus(0xC1)) is None
    empty = fake_amdsmi([])
    assert AmdTelemetry.open(0, amdsmi_mod=empty, torch_mod=torch_with_bus(0xC1)) is None
    assert empty.calls[-1] == "shutdown"  # the session it opened is closed
    assert open_telemetry("apple", 0) is None
    assert gpu_power(0, "amd", amdsmi_mod=fake_amdsmi([MI210]), torch_mod=torch_with_bus(0xC1)) == (300.0, 281.0)
    assert gpu_power(0, "amd", amdsmi_mod=broken, torch_mod=torch_with_bus(0xC1)) == (None, None)


def test_the_monitor_reads_an_amd_gpu_through_amdsmi(tmp_path, monkeypatch):
    card = dict(MI210, gfx=99, edge=91)
    smi = fake_amdsmi([card])
    monkeypatch.setattr("lib.hardware.telemetry.load_amdsmi", lambda: smi)
    monkeypatch.setattr("torch.cuda.get_device_properties", lambda i: torch_with_bus(0xC1).cuda.get_device_properties(i))
    lines: list[str] = []
    mi210 = hardware.resolve_hardware(gpu="mi210")
    with Monitor(tmp_path, 100, torch.device("cuda", 0), mi210, log=lines.append, enabled=True) as m:
        assert isinstance(m._gpu, AmdTelemetry)
        for step in range(1, 11):
            m.update(step, 1, 0.5, 0.01, step * 8)
        m.log_entry({"step": 10, "epoch": 1, "loss": 0.5, "lr": 0.01, "samples_per_s": 80.0})
    entry = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert (entry["gpu_util_pct"], entry["temp_c"], entry["power_w"]) == (99, 91, 281.0)
    assert "GPU 99% 91C 281W" in lines[-1] and smi.calls[-1] == "shutdown"

    monkeypatch.setattr("lib.hardware.telemetry.load_amdsmi", lambda: None)
    lines.clear()
    with Monitor(tmp_path / "off", 100, torch.device("cuda", 0), mi210, log=lines.append, enabled=True):
        pass
    assert lines == ["note: GPU telemetry is off: amdsmi (no ROCm driver, or ROCm's amdsmi Python package is not "
                     "installed) is not available; memory and throughput are still monitored"]


class CoolingCard(dict):
    """An MI210's readings whose edge temperature drops 5C with every pause poll (Sensors.sleep)."""

    polls = 0

    def sleep(self, seconds: float) -> None:
        self.polls += 1
        self["edge"] -= 5


def test_the_thermal_pause_acts_on_amdsmi_s_temperature(make_config):
    from tests.test_adapt import events, plan_for

    card = CoolingCard(MI210, edge=90)
    gpu = AmdTelemetry.open(0, amdsmi_mod=fake_amdsmi([card]), torch_mod=torch_with_bus(0xC1))
    config = make_config(manual(8, 1, "CONFIG_MAX_STEPS=3\nCONFIG_THERMAL_PAUSE=y\n"))  # pause at 87C, resume below 75C
    lines: list[str] = []
    result = Trainer(config, plan_for(config), CPU, log=lines.append, sensors=Sensors(gpu=gpu, sleep=card.sleep)).fit()
    assert result.steps == 3 and card.polls == 4  # 90 -> 85 -> 80 -> 75 -> 70
    [pause], [resume] = events(result.run_dir, "thermal_pause"), events(result.run_dir, "thermal_resume")
    assert pause["step"] == 1 and pause["temp_c"] == 90 and resume["temp_c"] == 70
    assert any("GPU at 90C" in line and "paused after step 1" in line for line in lines)


@pytest.mark.parametrize("value, expected", [(281, 281.0), ("281", 281.0), ("N/A", None), (True, None), (None, None)])
def test_amdsmi_s_not_available_is_no_reading(value, expected):
    from lib.hardware.amd import number

    assert number(value) == expected
