"""Which checks run, in which order, with what time budget; the run that writes the JSON.

The budgets (seconds, a GPU in full mode) add up to BUDGET_S (515 s), under
the 9 minutes one H100-class GPU is allowed, with room for start-up; a check past its budget stops taking new
cases and says which it left out. Each budget is the most its check took in the H100 runs of
2026-11-23 and 2026-11-26 (docs/validation/*.json) with some room; the run of 2026-11-26 took 398 s
in all. With DEVICE=cpu the checks a CPU can run run their short version and finish in well under a
minute.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable

from .budget import check_oom_recovery, check_squeezed
from .compile_check import check_compile
from .detection import check_detection, check_telemetry
from .fsdp_check import check_fsdp
from .loop_check import check_loop, check_loop_124m
from .memory_check import check_memory
from .mfu_check import check_mfu
from .report import (FAIL, Check, Context, document, environment, header, output_path, row, run_checks, summary_line,
                     update_index)
from .scale_check import check_scale
from .steptime_check import check_step_time
from .sweep_check import check_sweep
from .torchrun import check_torchrun


CHECKS = [
    # budgets: each check's seconds on the H100 runs of 2026-11-23 and -26 (docs/validation/*.json), with room
    Check("detection", check_detection, 5),  # 0.1-0.2 s
    Check("telemetry", check_telemetry, 10),  # 8 s of sampling: 8.3-8.4 s
    Check("memory", check_memory, 120),  # 35 cases, three of them GPT-2 on 50,257 tokens: 117 s (2026-11-26)
    Check("compile", check_compile, 40),  # 30-39 s
    # the compile check's compiled GPT-2 reused (a plan and a FLOP count: 3.5 s), the head eager (7 s), and a
    # run of kfit's trainer compiled (a compile, 23-30 s for this model, and 3 s of timed steps)
    Check("mfu", check_mfu, 45),  # 10.5 s on 2026-11-26 (its third run)
    Check("squeezed-budget", check_squeezed, 30),  # 16-23 s
    Check("oom-recovery", check_oom_recovery, 35),  # 23-30 s
    Check("step-time", check_step_time, 55),  # two short eager runs of each of 3 models: 53 s
    Check("micro-batch", check_sweep, 35),  # a plan of GPT-2 124M, 3 sizes x 3 steps of 512 sequences: 29 s
    Check("loop", check_loop, 35),  # 2 x 2 runs of 110 GPT-2-tiny steps: 32 s
    Check("torchrun", check_torchrun, 30),  # 13-20 s; its budget is its subprocess's timeout
    # one process: memory of 8 sharded steps (2 of them checkpointed, 56 s for 6), sharded = plain
    Check("fsdp", check_fsdp, 75),
]
BUDGET_S = sum(c.budget_s for c in CHECKS)
# Checks a full run leaves out for its time limit: each runs when CHECKS= names it.
OPTIONAL = [
    # GPT-2 124M compiled at the planner's micro-batch, kfit's loop and nanoGPT's recipe: a plan, then two rounds
    # of two compiles and 2 x 30 steps
    Check("loop-124m", check_loop_124m, 150),
    # Llama 3.2 1B at 8k context: five short trainer runs (selective, full and no checkpointing eager; selective
    # compiled with and without float8): a cold plan and a model of 1.2B parameters each, two compiles. The
    # first three took 398 s on an H200 (2026-11-27): alone in a run of the machine's 10 minutes
    Check("scale", check_scale, 500),
]


def selected(names: str) -> list[Check]:
    """The checks named in `names` (comma- or space-separated), in that order; every check but the OPTIONAL
    ones where it is empty. An unknown name is a ValueError that lists the known ones."""
    wanted = names.replace(",", " ").split()
    if not wanted:
        return list(CHECKS)
    by_name = {c.name: c for c in CHECKS + OPTIONAL}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(f"no check named {', '.join(unknown)}: CHECKS= takes {', '.join(by_name)}")
    return [by_name[n] for n in dict.fromkeys(wanted)]


def device_name(device: str, cuda) -> str:
    if cuda is not None:
        return cuda.name()
    from ..hardware import detect_cpu

    return detect_cpu().name


def run_suite(device: str, *, quick: bool, out: str | None, root: Path, cwd: Path,
              log: Callable[[str], None] = print, checks: list[Check] | None = None, cuda=None) -> tuple[int, Path]:
    """Run every check, write the JSON (and, in docs/validation, its index row); (exit status, JSON path)."""
    from datetime import date

    from ..checkpoint import write_json_atomic

    start = time.monotonic()
    if device == "cpu":  # tiny steps: beside other work, spinning OpenMP threads made them up to 30x slower
        import torch

        torch.set_num_threads(1)
    if device == "cuda" and cuda is None:
        from .measure import CudaDevice

        cuda = CudaDevice()
    name = device_name(device, cuda)
    log(f"validate-gpu: {name} ({device}, {'quick' if quick else 'full'} mode)")
    log(header())
    path = output_path(out, device=device, device_name=name, day=date.today(), root=root, cwd=cwd)
    path.parent.mkdir(parents=True, exist_ok=True)
    done: list = []

    def record(results: list) -> dict:
        driver = next((r.figures.get("driver") for r in results if r.figures.get("driver")), None)
        doc = document(results, environment(device, name, quick=quick, root=root, driver=driver),
                       time.monotonic() - start)
        write_json_atomic(path, doc)
        return doc

    def on_result(result) -> None:
        # the JSON is rewritten after every check: a run killed by a machine's time limit keeps what it measured
        log(row(result))
        done.append(result)
        record(done)

    with tempfile.TemporaryDirectory(prefix="kfit-validate-") as tmp:
        ctx = Context(device=device, quick=quick, workdir=Path(tmp), log=log, cuda=cuda)
        results = run_checks(CHECKS if checks is None else checks, ctx, on_result=on_result)
    seconds = time.monotonic() - start
    doc = record(results)
    readme = path.parent / "README.md"
    if path.parent.resolve() == (root / "docs" / "validation").resolve() and readme.exists():
        update_index(readme, doc, path.name)
    log(summary_line(device, results, seconds, path))
    return (1 if any(r.status == FAIL for r in results) else 0), path
