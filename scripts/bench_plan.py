#!/usr/bin/env python3
"""How long the memory planner takes, and what it chooses next to the tier policy (make bench-plan).

Part 1, per defconfig: wall time of a fresh `kfit plan` process on an H100
profile with an empty trace cache (cold) and again with the cache filled
(cached), next to `python -c "import torch"`, which every plan pays.
Part 2, per catalog GPU: the micro-batch cap of the tier policy and of the
planner for each defconfig, each with its predicted peak as a share of the
planner's budget (the tier batch is traced too, to show what it would use).
Last line: plan: cached_overhead_s=X cold_max_s=Y
(cached_overhead_s: the slowest cached plan minus the torch import.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib import config as kconfig  # noqa: E402


def timed_run(args: list[str], env: dict, cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(args, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def wall_times(names: list[str]) -> tuple[float, list[tuple[str, float, float]]]:
    kfit = [sys.executable, str(ROOT / "scripts" / "kfit.py")]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "KFIT_CACHE_DIR": str(Path(tmp) / "cache"), "GPU": "h100"}
        torch_s = min(timed_run([sys.executable, "-c", "import torch"], env, tmp) for _ in range(3))
        rows = []
        for name in names:
            env["KCONFIG_CONFIG"] = str(Path(tmp) / f"{name}.config")
            kconfig.make_defconfig(name, out=Path(env["KCONFIG_CONFIG"]))
            cold = timed_run(kfit + ["plan"], env, tmp)
            cached = timed_run(kfit + ["plan"], env, tmp)
            rows.append((name, cold, cached))
    return torch_s, rows


def batch_table(names: list[str]) -> list[str]:
    from lib.hyperparams import ModelDescription, TierPolicy
    from lib.planner import PLANNER
    from lib.report import machines, plan_matrix

    targets = dict(machines())
    lines = [f"{'machine':<10} {'defconfig':<20} {'tier cap':>8} {'tier peak/budget':>16} "
             f"{'planner cap':>11} {'peak/budget at micro':>20}"]
    with tempfile.TemporaryDirectory() as tmp:
        configs = {n: kconfig.make_defconfig(n, out=Path(tmp) / f"{n}.config") for n in names}
        for r in sorted(plan_matrix(names, list(targets.items())), key=lambda r: (r.machine == "cpu", r.machine)):
            if r.plan is None:
                lines.append(f"{r.machine:<10} {r.defconfig:<20} {'':>8} {'':>16} {'none fits':>11}")
                continue
            p, config = r.plan, configs[r.defconfig]
            tier_cap, _ = TierPolicy().max_micro_batch(hardware=targets[r.machine],
                                                       model=ModelDescription.from_config(config),
                                                       device_type=p.device_type, compile=p.compile,
                                                       precision=p.precision)
            tier_peak = PLANNER.predictor.predict(config, batch=tier_cap, device_type=p.device_type,
                                                  precision=p.precision, compile_mode=p.compile_mode).peak_bytes
            lines.append(f"{r.machine:<10} {r.defconfig:<20} {tier_cap:>8} {tier_peak / p.budget_bytes:>16.0%} "
                         f"{p.max_micro_batch:>11} {p.predicted_peak_bytes / p.budget_bytes:>20.0%}")
    return lines


def main() -> int:
    names = kconfig.defconfig_names()
    torch_s, rows = wall_times(names)
    print(f"{'defconfig':<20} {'cold s':>7} {'cached s':>8} {'import torch s':>14}")
    for name, cold, cached in rows:
        print(f"{name:<20} {cold:>7.2f} {cached:>8.2f} {torch_s:>14.2f}")
    print()
    for line in batch_table(names):
        print(line)
    print(f"plan: cached_overhead_s={max(c for _, _, c in rows) - torch_s:.2f} "
          f"cold_max_s={max(c for _, c, _ in rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
