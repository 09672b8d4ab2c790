"""lib.monitor: metrics.jsonl, plain lines and the progress bar, warnings, the sampler thread."""

from __future__ import annotations

import collections
import io
import json
import mmap
import re
import threading
import time

import psutil
import pytest
import torch

from lib import hardware
from lib.monitor import Monitor
from tests.helpers import fake_pynvml

CPU = torch.device("cpu")
TRAIN_KEYS = {"step", "epoch", "loss", "lr", "samples_per_s", "mem_bytes", "mem_peak_bytes", "time"}


class TTY(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def cpu_profile():
    return hardware.resolve_hardware(gpu="cpu")


@pytest.fixture(autouse=True)
def on_mains(monkeypatch):
    monkeypatch.setattr(psutil, "sensors_battery", lambda: None)


def monitor(tmp_path, profile, lines=None, **kw):
    kw.setdefault("log", (lines if lines is not None else []).append)
    kw.setdefault("stream", io.StringIO())
    return Monitor(tmp_path, 40, kw.pop("device", CPU), profile, **kw)


def train_entry(step, **extra):
    return {"step": step, "epoch": 1, "loss": 1.0 / step, "lr": 0.01, "samples_per_s": 1500.0, **extra}


def run_steps(m, steps, log_every=10, start=1):
    for step in range(start, start + steps):
        m.update(step, 1, 1.0 / step, 0.01, step * 32)
        if step % log_every == 0:
            m.log_entry(train_entry(step))


def records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def warnings_of(tmp_path):
    return [r for r in records(tmp_path) if r.get("event") == "warning"]


def test_metrics_jsonl_lines_are_json_with_the_expected_keys(tmp_path, cpu_profile):
    lines = []
    with monitor(tmp_path, cpu_profile, lines, tokens_per_sample=128) as m:
        run_steps(m, 20)
        m.log_entry({"step": 20, "epoch": 1, "eval_loss": 0.1234, "accuracy": 0.9833, "final": True})
        m.event("checkpoint", "Saved checkpoint.pt", path="checkpoint.pt")
    r10, r20, ev, ck = records(tmp_path)
    assert TRAIN_KEYS | {"eta_s", "tokens_per_s"} <= set(r10)
    assert r10["tokens_per_s"] == 1500.0 * 128
    assert r10["mem_bytes"] > 0 and r10["mem_peak_bytes"] >= r10["mem_bytes"]
    assert r20["eta_s"] == 0  # the last step
    assert ev["eval_loss"] == 0.1234 and ev["final"] is True and "eta_s" not in ev
    assert ck == {"event": "checkpoint", "message": "Saved checkpoint.pt", "step": 20, "path": "checkpoint.pt",
                  "time": ck["time"]}
    assert lines[-2] == "final eval @ step 20 (epoch 1): eval loss 0.1234, accuracy 98.33%"
    assert lines[-1] == "Saved checkpoint.pt"


def test_append_keeps_earlier_lines_and_a_fresh_run_does_not(tmp_path, cpu_profile):
    with monitor(tmp_path, cpu_profile) as m:
        run_steps(m, 20)
    with monitor(tmp_path, cpu_profile, append=True) as m:
        run_steps(m, 10, start=21)
    assert [r["step"] for r in records(tmp_path)] == [10, 20, 30]
    with monitor(tmp_path, cpu_profile) as m:
        run_steps(m, 10)
    assert [r["step"] for r in records(tmp_path)] == [10]


def test_without_a_terminal_each_entry_is_one_plain_line(tmp_path, cpu_profile):
    lines, stream = [], io.StringIO()
    with monitor(tmp_path, cpu_profile, lines, stream=stream) as m:
        run_steps(m, 20)
        m.log_entry({"step": 20, "epoch": 1, "eval_loss": 0.5, "perplexity": 1.65})
    assert stream.getvalue() == ""
    assert len(lines) == 3 and not any("\r" in line for line in lines)
    assert lines[0].startswith("step    10/40 | epoch   1 | loss 0.1000 | lr 1.00e-02 | 1,500 samples/s | mem ")
    # this process's resident memory: MiB or GiB, whatever the tests before this one left behind
    assert re.search(r"\| mem [\d.]+[MG]iB \(peak [\d.]+[MG]iB\) \| ETA ", lines[0]), lines[0]
    assert lines[2] == "eval @ step 20 (epoch 1): eval loss 0.5000, perplexity 1.65"


def test_a_terminal_gets_a_progress_bar_with_eta_and_lines_above_it(tmp_path, cpu_profile):
    lines, tty = [], TTY()
    m = monitor(tmp_path, cpu_profile, lines, stream=tty).start()
    run_steps(m, 20)
    bar = tty.getvalue()
    assert bar.startswith("\r") and "20/40" in bar and "ETA " in bar.split("\r")[-1]
    assert "ETA ?" not in bar.split("\r")[-1] and "samples/s" in bar and "mem " in bar
    assert lines == []  # training entries only refresh the bar
    m.log_entry({"step": 20, "epoch": 1, "eval_loss": 0.5, "accuracy": 0.5})
    assert lines == ["eval @ step 20 (epoch 1): eval loss 0.5000, accuracy 50.00%"]
    assert tty.getvalue()[len(bar):].startswith("\r\x1b[K")  # the bar is cleared, the line printed, the bar redrawn
    m.close()
    assert tty.getvalue().endswith("\n")
    assert len(records(tmp_path)) == 3


def test_disabled_monitor_has_no_thread_or_bar_but_writes_metrics(tmp_path, cpu_profile):
    lines, tty = [], TTY()
    with monitor(tmp_path, cpu_profile, lines, stream=tty, enabled=False) as m:
        assert m._thread is None
        run_steps(m, 20)
    assert tty.getvalue() == "" and len(lines) == 2 and lines[0].startswith("step    10/40")
    assert len(records(tmp_path)) == 2


def test_non_zero_rank_writes_and_prints_nothing(tmp_path, cpu_profile):
    lines, tty = [], TTY()
    with monitor(tmp_path / "run", cpu_profile, lines, stream=tty, write_metrics=False) as m:
        run_steps(m, 20)
        m.event("checkpoint", "Saved")
        m.epoch_end(1)
    assert not (tmp_path / "run").exists() and lines == [] and tty.getvalue() == ""


def test_the_sampler_thread_runs_and_stops_on_close(tmp_path, cpu_profile):
    m = monitor(tmp_path, cpu_profile, interval_s=0.01).start()
    thread = m._thread
    assert thread.is_alive() and thread.daemon
    m.close()
    assert not thread.is_alive() and m._thread is None
    assert "kfit-monitor" not in [t.name for t in threading.enumerate()]
    m.close()  # twice is harmless


def _wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert condition()


def test_throttling_from_nvml_gives_exactly_one_warning(tmp_path, monkeypatch):
    h100 = hardware.resolve_hardware(gpu="h100")
    nvml = fake_pynvml([("NVIDIA H100 80GB HBM3", 80 * 2**30, 70 * 2**30)],
                       telemetry=dict(util=99, temp=91, power_mw=700_000, reasons=0x20 | 0x40))
    monkeypatch.setattr("lib.hardware.telemetry.load_pynvml", lambda: nvml)
    lines = []
    m = monitor(tmp_path, h100, lines, device=torch.device("cuda", 0), interval_s=0.001).start()
    _wait_for(lambda: nvml.calls.count("reasons") >= 5)  # throttled at every reading
    run_steps(m, 10)
    m.close()
    (warning,) = warnings_of(tmp_path)
    assert warning["warning"] == "thermal_throttle" and warning["reason"] in ("sw_thermal", "hw_thermal")
    assert "GPU 0" in warning["message"] and "cooling" in warning["message"]
    assert sum("warning:" in line for line in lines) == 1
    entry = records(tmp_path)[-1]
    assert entry["step"] == 10 and entry["gpu_util_pct"] == 99 and entry["temp_c"] == 91 and entry["power_w"] == 700.0
    assert "GPU 99% 91C 700W" in lines[-1]
    assert nvml.calls[-1] == "shutdown"


def test_without_nvml_telemetry_is_off_with_one_note(tmp_path, monkeypatch):
    monkeypatch.setattr("lib.hardware.telemetry.load_pynvml", lambda: None)
    lines = []
    with monitor(tmp_path, hardware.resolve_hardware(gpu="h100"), lines, device=torch.device("cuda", 0)) as m:
        run_steps(m, 10)
    assert sum("telemetry is off" in line for line in lines) == 1
    assert not {"gpu_util_pct", "temp_c", "power_w"} & set(records(tmp_path)[0])
    lines.clear()
    with monitor(tmp_path, hardware.resolve_hardware(gpu="cpu"), lines) as m:  # a CPU run: nothing to say
        run_steps(m, 10)
    assert not any("telemetry" in line for line in lines)


def test_running_on_battery_warns_once(tmp_path, cpu_profile, monkeypatch):
    battery = collections.namedtuple("sbattery", "percent secsleft power_plugged")
    monkeypatch.setattr(psutil, "sensors_battery", lambda: battery(42.0, 3600, False))
    lines = []
    with monitor(tmp_path, cpu_profile, lines, interval_s=0.01) as m:
        run_steps(m, 20)
    (warning,) = warnings_of(tmp_path)
    assert warning["warning"] == "on_battery" and lines[0].startswith("warning: running on battery")


def resident_pages(n: int) -> mmap.mmap:
    """n bytes of fresh, touched pages. A bytes object of that size may land in heap pages an earlier
    test freed and glibc kept, and then the RSS does not grow (this test failed so after test_resume)."""
    pages = mmap.mmap(-1, n)
    pages[::mmap.PAGESIZE] = b"\x01" * len(range(0, n, mmap.PAGESIZE))
    return pages


def test_memory_growing_across_epochs_warns_once(tmp_path, cpu_profile):
    kept, lines = [], []
    with monitor(tmp_path, cpu_profile, lines, enabled=False) as m:
        for epoch in range(1, 4):  # steady: no warning
            m.epoch_end(epoch)
        assert warnings_of(tmp_path) == []
        for epoch in range(4, 9):  # a leak: every epoch keeps ~12% more memory alive
            kept.append(resident_pages(hardware.device_memory("cpu")[0] // 8))
            m.epoch_end(epoch)
    (warning,) = warnings_of(tmp_path)
    assert warning["warning"] == "memory_growth" and warning["epoch"] == 6
    assert "grew every epoch for 3 epochs" in warning["message"] and len(warning["mem_bytes"]) == 4
    assert sum(line.startswith("warning: process memory (RSS) grew") for line in lines) == 1


def test_measured_mfu_scales_the_plans_predicted_mfu_by_the_measured_rate(tmp_path, cpu_profile):
    """MFU = counted FLOPs per sample x measured samples/s / (datasheet peak x devices): the plan's predicted MFU
    carries the FLOPs and the peak, at its predicted rate; a line at 1500 samples/s against 3000 predicted
    halves it. A plan without a prediction (or no plan) logs no MFU."""
    from types import SimpleNamespace

    from lib.monitor import measured_mfu

    plan = SimpleNamespace(predicted_mfu=0.4, predicted_samples_per_second=3000.0, num_workers=0,
                           prefetch_factor=0, device_type="cpu", pin_memory=False)
    assert measured_mfu(plan, 1500.0) == pytest.approx(0.2)
    assert measured_mfu(None, 1500.0) is None
    assert measured_mfu(SimpleNamespace(predicted_mfu=None, predicted_samples_per_second=3000.0), 1500.0) is None
    lines = []
    with monitor(tmp_path, cpu_profile, lines, plan=plan) as m:
        run_steps(m, 10)
    train = [r for r in records(tmp_path) if "loss" in r]
    assert train and all(r["mfu"] == pytest.approx(0.2) for r in train)
    assert any("MFU 20.0%" in line for line in lines)
    with monitor(tmp_path / "none", cpu_profile) as m:
        run_steps(m, 10)
    assert all("mfu" not in r for r in records(tmp_path / "none"))
