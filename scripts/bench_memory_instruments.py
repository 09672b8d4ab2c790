"""bench_memory's instruments, which share nothing with the tracer they check: a block's peak resident
memory (`PeakRSS`: the kernel's VmHWM, reset first, on Linux; else psutil sampled every millisecond), the
resident memory now (`rss`), and the CPU allocator's peak over a run, from torch.profiler's memory events
(`allocator_peak`)."""

from __future__ import annotations

import threading

import torch

from lib.validation.measure import quiet_stderr


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


def allocator_peak(run) -> int:
    """torch.profiler's memory events around run(), which builds everything it uses: the CPU allocator's peak."""
    from torch._C._profiler import _EventType

    with quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                profile_memory=True) as prof:
        run()
    allocations, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            allocations.append((node.start_time_ns, node.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak
