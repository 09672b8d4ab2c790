"""Heat and battery: what a run does about them, at optimizer step boundaries.

Heat (CONFIG_THERMAL_PAUSE, with the monitor's NVML telemetry, read between steps at most every
`Sensors.thermal_every_s`): at CONFIG_THERMAL_PAUSE_AT_C, or a thermal throttle reason, the run writes a
checkpoint, then waits, reading the GPU every few seconds, until it is below CONFIG_THERMAL_RESUME_BELOW_C
with no thermal throttle; "thermal_pause" and "thermal_resume" events go to the monitor and metrics.jsonl.
The pause does not count as training time (CONFIG_TIME_LIMIT, throughput). A stop signal ends the pause;
the next step boundary stops. CONFIG_THERMAL_WARN leaves it to the monitor's one warning.

Battery (CONFIG_BATTERY_LOW_PERCENT, read by rank 0 at most every `Sensors.battery_every_s`): on
battery below that charge, checkpoints come every CONFIG_BATTERY_CHECKPOINT_MINUTES, and with
CONFIG_BATTERY_STOP every rank stops after the next step (agreed in the step's collective), saving
a checkpoint first, with the command that resumes (exit 4); on mains power again the usual interval
returns.

`Sensors` says where readings come from: NVML and psutil, or fakes in tests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import Config
from ..monitor import BatteryState, battery_state, thermal_throttle
from .resume import BATTERY_EXIT, StoppedToResume, resume_command

POLL_S = 5.0  # between readings while paused


@dataclass
class Sensors:
    gpu: object | None = None  # a telemetry source for the monitor (GpuTelemetry's read/index/close); None: NVML
    battery: Callable[[], BatteryState | None] = battery_state
    sleep: Callable[[float], None] = time.sleep
    battery_every_s: float = 60.0
    thermal_every_s: float = 1.0  # between readings while training (CONFIG_THERMAL_PAUSE), as the monitor samples


class Conditions:
    """The thermal and battery policies of one run. `save()` writes a periodic checkpoint and returns its
    path (None where this process does not save); `event(kind, message, **data)` goes to the monitor."""

    def __init__(self, config: Config, sensors: Sensors, *, read: Callable[[], dict],
                 save: Callable[[], Path | None], event: Callable[..., None],
                 stopping: Callable[[], bool], main: bool = True) -> None:
        self.config, self.sensors, self.read, self.save, self.event = config, sensors, read, save, event
        self.stopping, self.main = stopping, main
        self.low_battery = False
        self.percent: float | None = None  # the charge when it became low
        self.stop_requested = False
        self.next_battery = self.next_thermal = 0.0
        self.pauses = config.thermal_policy == "pause"
        self.battery = main and bool(config.battery_low_percent)  # one machine: rank 0 decides

    def after_step(self, step: int) -> float:
        """Apply both policies after optimizer step `step`; returns the seconds spent paused. Each reads its
        sensor at most every battery_every_s or thermal_every_s (a GPU reading is an NVML call, not for every
        step); with neither policy on, a step costs two attribute reads."""
        if self.battery:
            self.check_battery(step)
        if not self.pauses:
            return 0.0
        now = time.monotonic()
        if now < self.next_thermal:
            return 0.0
        self.next_thermal = now + self.sensors.thermal_every_s
        return self.cool_down(step)

    @property
    def checkpoint_minutes(self) -> int | None:
        """The low-battery checkpoint interval while it applies, else None (the usual one)."""
        return self.config.battery_checkpoint_minutes if self.low_battery else None

    def stop_for_battery(self, step: int, path: Path | None) -> None:
        """Every rank agreed to stop (CONFIG_BATTERY_STOP) and saved checkpoint `path`: say how to resume."""
        c = self.config
        charge = f"{self.percent:.0f}%" if self.percent is not None else "a low charge"
        message = (f"on battery at {charge} (below CONFIG_BATTERY_LOW_PERCENT={c.battery_low_percent}): stopped after "
                   f"step {step}" + (f", checkpoint {path.name} saved" if path else "")
                   + f" (CONFIG_BATTERY_STOP); plug in and resume with "
                   f"'{resume_command(c, path.parent if path else None)}'")
        self.event("battery_stop", message, percent=self.percent, path=str(path) if path else None)
        raise StoppedToResume(message, step, path, BATTERY_EXIT)

    # -- heat --------------------------------------------------------------------

    def cool_down(self, step: int) -> float:
        c = self.config
        reading = self.read()
        if not (reading.get("temp_c", 0) >= c.thermal_pause_at_c or thermal_throttle(reading)):
            return 0.0
        started = time.perf_counter()
        path = self.save()
        self.event("thermal_pause", f"GPU at {reading.get('temp_c', '?')}C"
                   + (" and throttled for heat" if thermal_throttle(reading) else "")
                   + f" (CONFIG_THERMAL_PAUSE_AT_C={c.thermal_pause_at_c}): paused after step {step}"
                   + (f", checkpoint {path.name} saved" if path else "")
                   + f"; resuming below {c.thermal_resume_below_c}C", temp_c=reading.get("temp_c"),
                   path=str(path) if path else None)
        while not self.stopping():
            self.sensors.sleep(POLL_S)
            reading = self.read()
            if reading.get("temp_c", c.thermal_resume_below_c) < c.thermal_resume_below_c \
                    and not thermal_throttle(reading):
                break
        paused = time.perf_counter() - started
        self.event("thermal_resume", f"GPU at {reading.get('temp_c', '?')}C: resuming after a {paused:.0f}s pause",
                   temp_c=reading.get("temp_c"), paused_s=round(paused, 3))
        return paused

    # -- battery -----------------------------------------------------------------

    def check_battery(self, step: int) -> None:
        c, now = self.config, time.monotonic()
        if not self.battery or now < self.next_battery:
            return
        self.next_battery = now + self.sensors.battery_every_s
        state = self.sensors.battery()
        low = bool(state is not None and state.on_battery and state.percent < c.battery_low_percent)
        if low == self.low_battery:
            return
        self.low_battery = low
        if not low:
            self.event("battery_ok", "On mains power again: the usual checkpoint interval is back")
            return
        self.percent = state.percent if low else None
        if c.battery_stop:
            self.stop_requested = True  # every rank stops after the next step, when all have agreed (loop.py)
            return
        self.event("battery_low", f"On battery at {state.percent:.0f}% (below CONFIG_BATTERY_LOW_PERCENT="
                   f"{c.battery_low_percent}): a checkpoint every {c.battery_checkpoint_minutes} minute(s) until "
                   "the charger is back", percent=state.percent)
