"""bench_memory's instruments, which share nothing with the tracer they check: a block's peak resident
memory (`PeakRSS`: the kernel's VmHWM, reset first, on Linux; else psutil sampled every millisecond), the
resident memory now (`rss`), and the CPU allocator's peak over a run, from torch.profiler's memory events
(`allocator_peak`, lib/memory/measured.py's: where the tracer cannot run a model, the planner measures with it)."""

from __future__ import annotations

import threading

from lib.memory.measured import allocator_peak  # noqa: F401  the planner's measured fallback uses it too


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakRSS:
    """Peak resident memory over a block: the kernel's VmHWM (reset first) on Linux, else psutil sampling."""

    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            self._sampler = None
        except OSError:
            import psutil

            process, self._stop = psutil.Process(), threading.Event()
            self._samples = [process.memory_info().rss]

            def sample():
                while not self._stop.wait(0.001):
                    self._samples.append(process.memory_info().rss)

            self._sampler = threading.Thread(target=sample, daemon=True)
            self._sampler.start()
        return self

    def __exit__(self, *exc):
        if self._sampler is None:
            self.peak = _status_bytes("VmHWM")
        else:
            self._stop.set()
            self._sampler.join()
            self.peak = max(self._samples)


def rss() -> int:
    """This process's resident memory now."""
    rss = _status_bytes("VmRSS")
    if rss is None:
        import psutil

        rss = psutil.Process().memory_info().rss
    return rss
