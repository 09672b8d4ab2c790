#!/usr/bin/env python3
"""How long the memory planner takes, and what it chooses next to the tier policy (make bench-plan).

Part 1, per shipped defconfig, each plan a fresh `kfit plan` process:
  cold      an empty trace cache: on an H100 profile, then on this machine's CPU
  cached    the cache filled: the H100 again, and the CPU with its budget moved
            (memory profile 70%, 80%, 65%, 85%, 60% instead of 75%, as RAM available moves
            between runs); each the fastest of REPEATS runs
  torch     `python -c "import gc, torch; gc.freeze()"`, which every plan pays, timed REPEATS
            times in the same moments
  overhead  the slower cached plan minus `import torch`, in CPU seconds (user +
            system) so that other load on a shared machine does not count;
            on an idle machine these processes use one core, and wall = CPU
  traced    whether a cached run traced anything (the cache changed)
Every process runs with Python's default bytecode cache (PYTHONDONTWRITEBYTECODE
dropped from the environment): the cold plan writes kfit's compiled modules, as
the first `make plan` of a checkout does, so a cached plan does not pay for
compiling kfit's source again (about 0.1 s here), which no user's second plan pays.
The Llama 3 defconfigs (SCALE) are left out of part 1, which plans each for this CPU: they are planned for
the clusters they are rented on instead, cold and cached, as `make plan GPU=... GPUS=...` (SCALE_CASES).
Part 2, per catalog GPU: the micro-batch cap of the tier policy and of the
planner for each defconfig, each with its predicted peak as a share of the
planner's budget (the tier batch is traced too, to show what it would use).
Last line: plan: cached_overhead_s=X cold_max_s=Y scale_cold_max_s=Z scale_cached_overhead_s=W
(X: the largest overhead over the shipped defconfigs; Y: the slowest cold plan, wall seconds; Z and W the
same for the scale cases.)
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib import config as kconfig  # noqa: E402


# Five runs each: the fastest of three moved by 0.1-0.2 s with other jobs on two cores, and the
# overhead is a difference of two such minima.
REPEATS = 5
MOVED_PROFILES = (70, 80, 65, 85, 60)  # percent of RAM available, one per cached CPU run


# What every plan pays before planning: torch's import, with its objects frozen out of the garbage
# collector as kfit's command line does (lib/cli/common.py), so that freezing does not count as planning.
TORCH_BASELINE = "import gc, torch; gc.freeze()"

def timed_run(args: list[str], env: dict, cwd: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one process."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(args, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _cache_state(cache: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(cache.rglob("*.json"))}


# The published Llama 3 shapes, planned for clusters (not this CPU): (defconfig, make variables) per case.
SCALE = ("llama3.2-1b", "llama3.2-3b", "llama3-8b", "llama3-70b", "llama3-405b")
SCALE_CASES = (("llama3-8b", {"GPU": "h100-96gb", "GPUS": "8"}),
               ("llama3-8b", {"GPU": "h100-96gb", "GPUS": "8", "NNODES": "16", "NET_GBPS": "50"}))


def scale_times() -> list[dict]:
    """Each SCALE_CASES plan cold (an empty cache), then cached (the fastest of REPEATS), with import torch
    timed beside it."""
    kfit = [sys.executable, str(ROOT / "scripts" / "kfit.py"), "plan"]
    rows = []
    for name, variables in SCALE_CASES:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "KFIT_CACHE_DIR": str(Path(tmp) / "cache"), **variables}
            for drop in ("HW", "PYTHONDONTWRITEBYTECODE"):
                env.pop(drop, None)
            config = Path(tmp) / f"{name}.config"
            kconfig.make_defconfig(name, out=config)
            env["KCONFIG_CONFIG"] = str(config)
            cold = timed_run(kfit, env, tmp)[0]
            torch_runs = [timed_run([sys.executable, "-c", TORCH_BASELINE], env, tmp) for _ in range(REPEATS)]
            cached = [timed_run(kfit, env, tmp) for _ in range(REPEATS)]
            rows.append({"case": f"{name} " + " ".join(f"{k}={v}" for k, v in variables.items()), "cold": cold,
                         "cached": min(w for w, _ in cached), "torch": min(w for w, _ in torch_runs),
                         "overhead": min(c for _, c in cached) - min(c for _, c in torch_runs)})
    return rows


def wall_times(names: list[str]) -> list[dict]:
    kfit = [sys.executable, str(ROOT / "scripts" / "kfit.py"), "plan"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        env = {**os.environ, "KFIT_CACHE_DIR": str(cache)}
        for name in ("HW", "PYTHONDONTWRITEBYTECODE"):
            env.pop(name, None)
        h100, cpu = {**env, "GPU": "h100"}, {**env, "GPU": "cpu"}
        for name in names:
            config = Path(tmp) / f"{name}.config"
            kconfig.make_defconfig(name, out=config)
            h100["KCONFIG_CONFIG"] = cpu["KCONFIG_CONFIG"] = str(config)
            row = {"name": name, "cold_h100": timed_run(kfit, h100, tmp)[0], "cold_cpu": timed_run(kfit, cpu, tmp)[0]}
            before = _cache_state(cache)
            runs: dict[str, list[tuple[float, float]]] = {"torch": [], "h100": [], "cpu": []}
            for percent in MOVED_PROFILES[:REPEATS]:
                runs["torch"].append(timed_run([sys.executable, "-c", TORCH_BASELINE], env, tmp))
                runs["h100"].append(timed_run(kfit, h100, tmp))
                kconfig.apply_assignments(config, {"MEMORY_PROFILE_CUSTOM": True, "MEMORY_PROFILE_PERCENT": percent})
                runs["cpu"].append(timed_run(kfit, cpu, tmp))
                kconfig.make_defconfig(name, out=config)
            fastest = {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in runs.items()}
            row.update(torch=fastest["torch"][0], cached_h100=fastest["h100"][0], cached_cpu=fastest["cpu"][0],
                       overhead=max(fastest["h100"][1], fastest["cpu"][1]) - fastest["torch"][1],
                       traced=_cache_state(cache) != before)
            rows.append(row)
    return rows


def batch_table(names: list[str]) -> list[str]:
    from lib.hyperparams import ModelDescription, TierPolicy
    from lib.planning.memory_policy import PLANNER
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
    names = [n for n in kconfig.defconfig_names() if n not in SCALE]
    rows = wall_times(names)
    print(f"{'defconfig':<20} {'cold h100 s':>11} {'cold cpu s':>10} {'cached h100 s':>13} {'cached cpu s':>12} "
          f"{'import torch s':>14} {'overhead cpu s':>14} {'traced':>6}")
    for r in rows:
        traced = "yes" if r["traced"] else "no"
        print(f"{r['name']:<20} {r['cold_h100']:>11.2f} {r['cold_cpu']:>10.2f} {r['cached_h100']:>13.2f} "
              f"{r['cached_cpu']:>12.2f} {r['torch']:>14.2f} {r['overhead']:>14.2f} {traced:>6}")
    print()
    for line in batch_table(names):
        print(line)
    print()
    scale = scale_times()
    print(f"{'scale case':<52} {'cold s':>7} {'cached s':>8} {'import torch s':>14} {'overhead cpu s':>14}")
    for r in scale:
        print(f"{r['case']:<52} {r['cold']:>7.2f} {r['cached']:>8.2f} {r['torch']:>14.2f} {r['overhead']:>14.2f}")
    print(f"plan: cached_overhead_s={max(r['overhead'] for r in rows):.2f} "
          f"cold_max_s={max(max(r['cold_h100'], r['cold_cpu']) for r in rows):.2f} "
          f"scale_cold_max_s={max(r['cold'] for r in scale):.2f} "
          f"scale_cached_overhead_s={max(r['overhead'] for r in scale):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
