"""make bench-steptime (scripts/bench_steptime.py) with few rounds: both models timed, both predictions of each,
the table and the summary."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"^steptime-transfer: models=2 max_error=(\d+\.\d)% roofline_max_error=(\d+\.\d)% trials=2 "
                     r"trial_max_error=(\d+\.\d)% goal=10% "
                     r"load=\d+\.\d$")


def test_bench_steptime_prints_each_models_transfer_and_ends_with_the_worst():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_steptime.py"), "--rounds", "3",
                             "--trials", "2"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    match = SUMMARY.match(lines[-1])
    assert match, lines[-1]
    errors: dict[str, list[float]] = {"timed": [], "roofline": []}
    trial_errors: list[float] = []
    for name in ("mlp", "lenet5"):
        rows = {line.split()[1]: line.split() for line in lines if line.startswith(name)}
        assert set(rows) == set(errors), lines
        for way, cells in rows.items():
            measured_small, measured_large, predicted_small, predicted_large = map(float, cells[2:6])
            assert 0 < measured_small < measured_large and 0 < predicted_small < predicted_large
            assert abs(float(cells[7].rstrip("x")) / (predicted_large / predicted_small) - 1) < 0.01  # rounded ms
            up, down = (float(c.rstrip("%")) / 100 for c in cells[8:10])
            assert abs((1 + up) * (1 + down) - 1) < 2e-3  # the two ways are one factor's inverse
            errors[way] += [abs(up), abs(down)]
        assert rows["timed"][2:4] == rows["roofline"][2:4]  # one measurement, two predictions of it
        assert rows["timed"][10] == rows["roofline"][10] and float(rows["timed"][10].rstrip("x")) > 1
        assert rows["timed"][11] == rows["roofline"][11] and len(rows["timed"][11].split("/")) == 2  # per trial
        trial_errors += [float(e.rstrip("%")) for e in rows["timed"][11].split("/")]
    assert abs(max(errors["timed"]) * 100 - float(match.group(1))) < 0.1
    assert abs(max(errors["roofline"]) * 100 - float(match.group(2))) < 0.1
    assert abs(max(trial_errors) - float(match.group(3))) <= 0.5  # the column is in whole percent
