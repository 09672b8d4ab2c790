"""make bench-loop (scripts/bench_loop.py) at a tiny size: both loops run, the table and the summary line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"^loop-overhead: cases=(\d+) rounds=(\d+) min_ratio=(\d+\.\d+) max_overhead=(-?\d+\.\d+)$")


def test_bench_loop_times_both_loops_and_ends_with_its_summary_line():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_loop.py"), "--cases", "lenet5",
                             "--steps", "6", "--warmup", "1", "--rounds", "1"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    match = SUMMARY.match(lines[-1])
    assert match and match.group(1) == "1" and match.group(2) == "1", lines[-1]
    [row] = [line for line in lines if line.startswith("lenet5")]
    reference, kfit, ratio, overhead = row.split()[-4:]
    assert float(reference.replace(",", "")) > 0 and float(kfit.replace(",", "")) > 0
    assert ratio == match.group(3) and abs(float(overhead.rstrip("%")) / 100 - float(match.group(4))) < 1e-3
    assert abs(float(match.group(4)) - (1 / float(ratio) - 1)) < 2e-3  # the overhead is the ratio's inverse, less 1


def test_an_unknown_case_is_one_error_line():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_loop.py"), "--cases", "resnet9"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: unknown case resnet9: choose from lenet5, gpt2-tiny"]
