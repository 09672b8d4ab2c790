"""Progress of a long operation, on stderr so that JSON on stdout stays clean.

On a terminal a tqdm bar (tqdm comes with Optuna); elsewhere (make in CI, a
pipe) one plain line at most every PLAIN_INTERVAL_S, so a log shows the
operation is alive without a line per step.
"""

from __future__ import annotations

import sys
import time

PLAIN_INTERVAL_S = 10.0


class Bar:
    def __init__(self, total: int, label: str, unit: str = "step", stream=None) -> None:
        self.total, self.label, self.unit, self.done = total, label, unit, 0
        self.stream = stream or sys.stderr
        self._bar = None
        self._last = time.monotonic()
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, file=self.stream, unit=unit, leave=False)

    def update(self, n: int = 1, postfix: str = "") -> None:
        self.done += n
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= PLAIN_INTERVAL_S:
            self._last = now
            print(f"{self.label}: {self.done}/{self.total} {self.unit}s" + (f" ({postfix})" if postfix else ""),
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
