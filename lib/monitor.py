"""Live view of a training run, and the one writer of run_dir/metrics.jsonl.

The trainer calls ``update`` after every optimizer step (cheap: counters, and a progress-bar refresh at most
10 times a second on a terminal), ``log_entry`` at LOG_INTERVAL (with the measured MFU where the plan predicts
one) and for every evaluation, ``event`` for things that happen (OOM recovery, checkpoint, resume), and
``epoch_end``. A background thread samples memory and GPU telemetry (NVML on NVIDIA GPUs, amdsmi on AMD ones
under ROCm) every ``interval_s``; it does no I/O of its own: the warnings it raises are printed and written by
the training thread at its next call, so lines never interleave. Without a terminal (a log file, CI,
CONFIG_MONITOR=n) every entry is one plain line; on a terminal a ``\\r``-refreshed progress bar stays at the
bottom and evaluation, event and warning lines are printed above it.
"""

from __future__ import annotations

import collections
import errno
import json
import math
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import torch

from .checkpoint import full_disk_is_an_error
from .fileio import format_bytes, open_nofollow, unsafe
from .hardware import (TELEMETRY_LIBRARY, THROTTLE_KIND, GpuTelemetry, HardwareProfile, device_memory,
                       on_battery, open_telemetry)
from .hardware.host import BatteryState, battery_state  # noqa: F401  (re-exported for the trainer)
from .hardware.runtime import is_device_lost
from .plan import Plan
from .redact import redact

REDRAW_S = 0.1  # progress-bar refresh period
BAR_WIDTH = 20
RATE_POINT_S = 0.25  # spacing of the (time, step, samples) points of the rate window
RATE_POINTS = 40  # so the rate and ETA follow the last ~10 s (or 40 steps when slower)
BATTERY_CHECK_S = 60.0
GROWTH_EPOCHS = 3  # memory growing this many epochs in a row ...
GROWTH_FRACTION = 0.05  # ... by more than this each time is a warning
INPUT_WAIT_STEPS = 20  # the window of steps the input-wait warning judges ...
INPUT_WAIT_WARN = 0.20  # ... when they spent more than this share of their time waiting for the loader
INPUT_WAIT_SHOW = 0.05  # a log line shows the interval's input wait from this share on


_THROTTLE_FIX = {
    "thermal": "check cooling, airflow and fan speed (nvidia-smi -q -d TEMPERATURE,PERFORMANCE)",
    "power": "check the power limit and supply (nvidia-smi -q -d POWER,PERFORMANCE)",
}


# The live readings the trainer acts on, through the monitor (the trainer imports no lib.hardware module):
# the battery (conditions.py's default sensor), a thermal throttle in a GPU reading, a device lost for good.
def device_lost(error: BaseException) -> bool:
    """Whether `error` says the device (or this process's context on it) cannot be used again: ECC, lost,
    a launch failure (lib/hardware/runtime.py)."""
    return is_device_lost(error)


def thermal_throttle(reading: dict) -> bool:
    """Whether a telemetry reading (Monitor.read_telemetry) names a thermal throttle reason."""
    return any(THROTTLE_KIND.get(name) == "thermal" for name in reading.get("throttle", ()))


def format_duration(seconds: float) -> str:
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def format_seconds(seconds: float) -> str:
    """'40ms' under a second, '2.6s' under a minute, else format_duration's h:mm:ss."""
    if seconds < 1:
        return f"{seconds * 1e3:.0f}ms"
    return f"{seconds:.1f}s" if seconds < 60 else format_duration(seconds)


def format_eval(entry: dict) -> str:
    parts = [f"eval loss {entry['eval_loss']:.4f}"]
    if "accuracy" in entry:
        parts.append(f"accuracy {entry['accuracy']:.2%}")
    if "perplexity" in entry:
        parts.append(f"perplexity {entry['perplexity']:.2f}")
    prefix = "final " if entry.get("final") else ""
    return f"{prefix}eval @ step {entry['step']} (epoch {entry['epoch']}): {', '.join(parts)}"


def _telemetry_text(t: dict) -> str:
    parts = [f"{t['gpu_util_pct']}%" if "gpu_util_pct" in t else "",
             f"{t['temp_c']}C" if "temp_c" in t else "",
             f"{t['power_w']:.0f}W" if "power_w" in t else ""]
    text = " ".join(p for p in parts if p)
    return f"GPU {text}" if text else ""


def input_wait_fix(plan: Plan | None) -> str:
    """The settings that let the loader keep up, for the plan's loader as it is."""
    bench = "; `make bench-data` measures which setting loads fastest"
    if plan is None:
        return "more data loader workers (CONFIG_DATALOADER_WORKERS) or a deeper prefetch " \
               "(CONFIG_DATA_PREFETCH_FACTOR)" + bench
    if not plan.num_workers:
        fix = ("load batches in worker processes: CONFIG_DATALOADER_WORKERS_MANUAL=y with "
               "CONFIG_DATALOADER_WORKERS=2 or more (then CONFIG_DATA_PREFETCH_FACTOR)")
    else:
        fix = (f"raise CONFIG_DATALOADER_WORKERS (now {plan.num_workers}) or CONFIG_DATA_PREFETCH_FACTOR "
               f"(now {plan.prefetch_factor or 2})")
    if plan.device_type == "cuda" and not plan.pin_memory:
        fix += ", and pin host memory"
    return fix + bench


def measured_mfu(plan: Plan | None, samples_per_s: float | None) -> float | None:
    """MFU at a measured rate: the plan's predicted_mfu (counted FLOPs per sample x predicted samples/s over the
    datasheet peak of its precision x devices) scaled by measured / predicted samples/s; None without them."""
    if plan is None or not (plan.predicted_mfu and plan.predicted_samples_per_second and samples_per_s):
        return None
    return plan.predicted_mfu * samples_per_s / plan.predicted_samples_per_second


def open_metrics(path: Path, append: bool) -> int:
    """metrics.jsonl's descriptor to append to (emptied first unless `append`): never through a link, a
    directory or a file with other hard links planted in the run directory (a shared OUTPUT_DIR), which are an
    UnsafeFileError naming the file; nothing is emptied before that check."""
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    if os.fstat(fd).st_nlink != 1:
        os.close(fd)
        raise unsafe(path, "a file with other hard links")
    if not append:
        os.ftruncate(fd, 0)
    return fd


class Monitor:
    def __init__(self, run_dir: Path, total_steps: int, device: torch.device, hardware: HardwareProfile, *,
                 interval_s: float = 1.0, telemetry: bool = True, tokens_per_sample: int = 0,
                 log: Callable[[str], None] = print, enabled: bool = True, append: bool = False,
                 write_metrics: bool = True, stream=None, gpu: GpuTelemetry | None = None,
                 tracking=None, plan: Plan | None = None) -> None:
        """``enabled=False`` (CONFIG_MONITOR=n): no sampler thread, no bar, still metrics.jsonl and plain lines.
        ``write_metrics=False`` (DDP ranks other than 0): nothing at all. ``append=True`` (resume) keeps earlier
        lines. ``gpu``: the telemetry source (anything with GpuTelemetry's read, index and close; a fake in tests)
        instead of NVML's or amdsmi's. ``tracking``: experiment trackers (lib.tracking.Tracking) that get every
        metrics.jsonl line too; closed with the monitor. ``plan``: the run's plan, whose loader settings the
        input-wait warning names and whose predicted MFU the measured one scales."""
        self.total_steps, self.device, self.log = max(1, total_steps), torch.device(device), log
        self.interval_s, self.tokens_per_sample, self.active = interval_s, tokens_per_sample, write_metrics
        self.enabled, self.stream = enabled and write_metrics, stream if stream is not None else sys.stdout
        self.tty = self.enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self.step, self.epoch, self.samples, self.loss, self.lr = 0, 0, 0, math.nan, math.nan
        self._points: collections.deque = collections.deque(maxlen=RATE_POINTS)
        self._last_draw, self._bar_shown = 0.0, False
        self._mem = (0, 0)  # (current, peak) bytes, refreshed by the sampler and log_entry
        self.telemetry: dict = {}  # latest GPU reading (NVML or amdsmi)
        self._pending: collections.deque = collections.deque()  # (kind, message, data) from the sampler
        self._warned, self._epoch_mem = set(), []  # warnings given once; each epoch's peak memory
        self.plan = plan
        self._waits: collections.deque = collections.deque(maxlen=INPUT_WAIT_STEPS)  # (input wait s, step s)
        self._interval_wait = [0.0, 0.0]  # input wait and step seconds since the last training log entry
        self._stop, self._thread, self._gpu = threading.Event(), None, None  # _thread, _gpu: set by start()
        self._next_battery, self._fd = 0.0, None
        self.tracking = tracking if write_metrics else None
        if not self.active:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self._path = run_dir / "metrics.jsonl"
        self._fd = open_metrics(self._path, append)
        size = os.fstat(self._fd).st_size
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            self._write_line(b"\n")  # a line a full disk cut short: the next ones start whole
        vendor = hardware.primary_gpu.vendor if hardware.primary_gpu is not None else None
        if self.enabled and gpu is not None:
            self._gpu = gpu
        elif self.enabled and telemetry and vendor in TELEMETRY_LIBRARY and self.device.type == "cuda":
            self._gpu = open_telemetry(vendor, self.device.index or 0)  # NVML, or amdsmi under ROCm
            if self._gpu is None:
                self._print(f"note: GPU telemetry is off: {TELEMETRY_LIBRARY[vendor]} is not available; "
                            "memory and throughput are still monitored")

    # -- the trainer's calls ---------------------------------------------------

    def start(self) -> Monitor:
        if not self.active or self._thread is not None:
            return self
        self._sample()  # battery and a first reading now, not one interval in
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="kfit-monitor", daemon=True)
            self._thread.start()
        self._flush_pending()
        return self

    def update(self, step: int, epoch: int, loss: float, lr: float, samples: int, *,
               input_wait_s: float = 0.0, step_s: float | None = None) -> None:
        """After every optimizer step; ``samples`` is the running total of training
        samples (not this step's), ``epoch`` is 1-based like the log entries;
        ``input_wait_s``: the part of the step's ``step_s`` seconds spent waiting for the data loader."""
        if not self.active:
            return
        now = time.perf_counter()
        self.step, self.epoch, self.loss, self.lr, self.samples = step, epoch, loss, lr, samples
        if step_s:
            self._input_wait(step, input_wait_s, step_s)
        if not self._points or now - self._points[-1][0] >= RATE_POINT_S:
            self._points.append((now, step, samples))
        if self._pending:
            self._flush_pending()
        if self.tty and now - self._last_draw >= REDRAW_S:
            self._draw(now)

    def log_entry(self, entry: dict) -> None:
        """A training entry (step, epoch, loss, lr, samples_per_s ...) or an
        evaluation (eval_loss, accuracy/perplexity, final): adds memory,
        telemetry and ETA, writes one JSON line and shows it."""
        if not self.active:
            return
        record = dict(entry)
        self._mem = device_memory(self.device)
        record["mem_bytes"], record["mem_peak_bytes"] = self._mem
        record.update({k: v for k, v in self.telemetry.items() if k not in record})
        is_eval = "eval_loss" in record
        if not is_eval and self._interval_wait[1] > 0:
            waited, stepped = self._interval_wait
            record.setdefault("input_wait_s", round(waited, 4))
            record.setdefault("input_wait_fraction", round(min(1.0, waited / stepped), 4))
            self._interval_wait = [0.0, 0.0]
        if not is_eval:
            if "tokens_per_s" not in record and self.tokens_per_sample and "samples_per_s" in record:
                record["tokens_per_s"] = record["samples_per_s"] * self.tokens_per_sample
            if (mfu := measured_mfu(self.plan, record.get("samples_per_s"))) is not None:
                record.setdefault("mfu", round(mfu, 4))
            eta = self.eta_s(record.get("step", self.step))
            if eta is not None:
                record["eta_s"] = round(eta, 1)
        record["time"] = round(time.time(), 3)
        self._write(record)
        if is_eval:
            self._print(format_eval(record))
        elif self.tty:
            self._draw(time.perf_counter())
        else:
            self._print(self.format_line(record))

    def event(self, kind: str, message: str, *, show: bool = True, **data) -> None:
        """Something that happened (oom_recovery, checkpoint, resume, warning...):
        a JSON line {"event": kind, "message": ..., "step": ..., **data} and the message
        (``show=False``: the caller prints it itself, an error line on stderr, say)."""
        if not self.active:
            return
        self._write({"event": kind, "message": message, "step": self.step, **data,
                     "time": round(time.time(), 3)})
        if show:
            self._print(message)

    def read_telemetry(self) -> dict:
        """A fresh GPU reading now (the sampler's is up to an interval old); {} without telemetry."""
        if self._gpu is None:
            return {}
        self.telemetry = self._gpu.read()
        return self.telemetry

    def epoch_end(self, epoch: int) -> None:
        """Memory at the end of each epoch; growth epoch over epoch is a leak's signature
        (losses kept as tensors, caches that never evict) and is warned about once."""
        if not self.active:
            return
        self._mem = device_memory(self.device)
        self._epoch_mem.append(self._mem[0])
        recent = self._epoch_mem[-(GROWTH_EPOCHS + 1):]
        if len(recent) == GROWTH_EPOCHS + 1 and all(b > a * (1 + GROWTH_FRACTION) for a, b in zip(recent, recent[1:])):
            what = "GPU memory allocated" if self.device.type == "cuda" else "process memory (RSS)"
            self._warn("memory_growth",
                       f"{what} grew every epoch for {GROWTH_EPOCHS} epochs ({format_bytes(recent[0])} at epoch "
                       f"{epoch - GROWTH_EPOCHS} -> {format_bytes(recent[-1])} at epoch {epoch}): something keeps "
                       "tensors alive across steps (e.g. a loss stored without .item()); it may run out of memory",
                       epoch=epoch, mem_bytes=recent)
        self._flush_pending()

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None
        if self._fd is not None:
            self._flush_pending()
            if self._bar_shown:
                self.stream.write("\n")
                self.stream.flush()
                self._bar_shown = False
            os.close(self._fd)
            self._fd = None
        if self.tracking is not None:
            self.tracking.close()
            self.tracking = None

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- derived figures -------------------------------------------------------

    def _rate(self, now: float) -> tuple[float, float] | None:
        """(steps/s, samples/s) over the recent window; None before two points."""
        if not self._points:
            return None
        t0, step0, samples0 = self._points[0]
        dt = now - t0
        if self.step <= step0 or dt <= 0:
            return None
        return (self.step - step0) / dt, (self.samples - samples0) / dt

    def eta_s(self, step: int | None = None) -> float | None:
        rate = self._rate(time.perf_counter())
        if rate is None:
            return None
        return max(0, self.total_steps - (self.step if step is None else step)) / rate[0]

    def format_line(self, entry: dict) -> str:
        """``step    10/120 | epoch   1 | loss 1.2345 | lr 1.00e-02 | 15,000 samples/s | MFU 41.2% | mem 312MiB (peak 340MiB) | ETA 0:12``"""
        parts = [f"step {entry['step']:>5}/{self.total_steps}", f"epoch {entry['epoch']:>3}",
                 f"loss {entry['loss']:.4f}", f"lr {entry['lr']:.2e}"]
        if "tokens_per_s" in entry:
            parts.append(f"{entry['tokens_per_s']:,.0f} tokens/s")
        elif "samples_per_s" in entry:
            parts.append(f"{entry['samples_per_s']:,.0f} samples/s")
        if "mfu" in entry:
            parts.append(f"MFU {entry['mfu']:.1%}")
        parts.append(f"mem {format_bytes(entry['mem_bytes'])} (peak {format_bytes(entry['mem_peak_bytes'])})")
        if entry.get("input_wait_fraction", 0) >= INPUT_WAIT_SHOW:
            parts.append(f"input wait {entry['input_wait_fraction']:.0%}")
        gpu = _telemetry_text(entry)
        if gpu:
            parts.append(gpu)
        if "eta_s" in entry:
            parts.append(f"ETA {format_duration(entry['eta_s'])}")
        return " | ".join(parts)

    # -- output ----------------------------------------------------------------

    def _write(self, record: dict) -> None:
        if "message" in record:  # an event's line may quote a library's error: never a credential (lib/redact.py)
            record = {**record, "message": redact(str(record["message"]))}
        self._write_line((json.dumps(record, default=str) + "\n").encode())
        if self.tracking is not None:
            self.tracking.log(record)

    def _write_line(self, line: bytes) -> None:
        """One write(2) of the whole line on an O_APPEND descriptor, unbuffered: a kill -9 loses no line before
        it and cuts none, and lines of two writers could never interleave."""
        with full_disk_is_an_error(self._path):
            if os.write(self._fd, line) < len(line):
                raise OSError(errno.ENOSPC, "the line was cut short (disk full?)")

    def _print(self, line: str) -> None:
        if self._bar_shown:  # clear the bar, print above it, redraw it below
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self.log(line)
        if self._bar_shown:
            self._draw(time.perf_counter())

    def _draw(self, now: float) -> None:
        self._last_draw = now
        frac = min(1.0, self.step / self.total_steps)
        rate = self._rate(now)
        parts = [f"{frac:4.0%} {self.step}/{self.total_steps}",
                 f"ETA {format_duration(max(0, self.total_steps - self.step) / rate[0])}" if rate else "ETA ?"]
        if math.isfinite(self.loss):
            parts.append(f"loss {self.loss:.4f}")
        if rate:
            parts.append(f"{rate[1] * self.tokens_per_sample:,.0f} tokens/s" if self.tokens_per_sample
                         else f"{rate[1]:,.0f} samples/s")
        if self._mem[0]:
            parts.append(f"mem {format_bytes(self._mem[0])} (peak {format_bytes(self._mem[1])})")
        gpu = _telemetry_text(self.telemetry)
        if gpu:
            parts.append(gpu)
        text = " | ".join(parts)
        # A line longer than the terminal wraps, and \r then redraws only its last row:
        # the bar gives up its width first, then the line is cut.
        columns = shutil.get_terminal_size((100, 24)).columns
        width = min(BAR_WIDTH, columns - 2 - len(text))
        if width >= 5:
            filled = int(frac * width)
            text = f"{'#' * filled}{'.' * (width - filled)} {text}"
        self.stream.write("\r" + text[:columns - 1] + "\x1b[K")
        self.stream.flush()
        self._bar_shown = True

    # -- sampling and warnings -------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        """Memory, telemetry, battery: cheap reads, no I/O beyond /proc and NVML or amdsmi."""
        try:
            self._mem = device_memory(self.device)
            if self._gpu is not None:
                self.telemetry = reading = self._gpu.read()
                for name in reading.get("throttle", ()):
                    kind = THROTTLE_KIND[name]
                    self._warn(f"{kind}_throttle",
                               f"GPU {self._gpu.index} clocks are lowered by a {kind} limit ({name}; "
                               f"{reading.get('temp_c', '?')}C, {reading.get('power_w', '?')}W), so training "
                               f"runs slower: {_THROTTLE_FIX[kind]}", reason=name)
            now = time.monotonic()
            if now >= self._next_battery:
                self._next_battery = now + BATTERY_CHECK_S
                if on_battery():
                    self._warn("on_battery", "running on battery: training drains it fast and power saving "
                               "may slow it down; plug in the charger")
        except Exception as e:  # noqa: BLE001 - monitoring must never stop training
            self._warn("monitor_error", f"monitoring stopped sampling ({type(e).__name__}: {e})")
            self._stop.set()

    def _input_wait(self, step: int, waited: float, stepped: float) -> None:
        """Count a step's wait for input; warn once when the last INPUT_WAIT_STEPS steps spent more than
        INPUT_WAIT_WARN of their time waiting."""
        waited = min(waited, stepped)
        self._interval_wait[0] += waited
        self._interval_wait[1] += stepped
        self._waits.append((waited, stepped))
        if len(self._waits) < INPUT_WAIT_STEPS or "input_wait" in self._warned:
            return
        total_wait, total = sum(w for w, _ in self._waits), sum(s for _, s in self._waits)
        if total > 0 and total_wait / total > INPUT_WAIT_WARN:
            self._warn("input_wait",
                       f"steps {step - INPUT_WAIT_STEPS + 1}-{step} spent {total_wait / total:.0%} of their time "
                       f"waiting for the data loader ({format_seconds(total_wait)} of {format_seconds(total)}), "
                       f"so training idles: {input_wait_fix(self.plan)}",
                       input_wait_fraction=round(total_wait / total, 4), steps=INPUT_WAIT_STEPS)

    def _warn(self, kind: str, message: str, **data) -> None:
        """Queue a warning, once per kind; the training thread prints and writes it."""
        if kind not in self._warned:
            self._warned.add(kind)
            self._pending.append((kind, message, data))

    def _flush_pending(self) -> None:
        while self._pending:
            kind, message, data = self._pending.popleft()
            self.event("warning", f"warning: {message}", warning=kind, **data)
