"""lib/progress.py: long operations say they are alive on stderr, a line at a time when not on a terminal."""

from __future__ import annotations

import io

from lib import progress


def test_plain_lines_at_most_every_interval(monkeypatch):
    clock = iter([0.0, 1.0, 11.0, 12.0, 25.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    with progress.Bar(4, "find-lr", stream=out) as bar:
        for i in range(4):
            bar.update(postfix=f"lr {i}")
    assert out.getvalue().splitlines() == ["find-lr: 2/4 steps (lr 1)", "find-lr: 4/4 steps (lr 3)"]


def test_a_terminal_gets_a_tqdm_bar():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    with progress.Bar(3, "find-lr", stream=out) as bar:
        bar.update(3, postfix="lr 1e-3")
    assert out.getvalue().startswith("\rfind-lr:   0%|") and "0/3" in out.getvalue()  # drawn, then cleared
