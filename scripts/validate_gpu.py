#!/usr/bin/env python3
"""Validate kfit on this machine's GPU (make validate-gpu): detection, telemetry, memory prediction,
a squeezed budget, out-of-memory recovery, compile throughput, torchrun; one JSON file.

DEVICE=auto|cuda|cpu (cpu: the short version of every check a CPU can run, as the test suite runs it),
QUICK=1|0 (default: 1 on the CPU, 0 on a GPU), OUT=file.json or a directory (default: on a GPU
docs/validation/<gpu>-<date>.json, whose row is added to docs/validation/README.md; on the CPU
runs/validation/cpu-<date>.json), CHECKS=memory,fsdp,... (default: every check, in the suite's order; named
ones run in the order given). Prints a table, then one line:
validate-gpu: device=<cpu|cuda> checks=N passed=P failed=F skipped=S seconds=T json=PATH
Exit status 1 when a check failed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from lib.env import env_choice
    from lib.errors import KfitError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    try:  # argparse never checks a default against its choices: DEVICE=nosuch ran the whole validation
        device, quick = env_choice("DEVICE", ("auto", "cuda", "cpu"), "auto"), env_choice("QUICK", ("0", "1"), "")
    except KfitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default=device)
    parser.add_argument("--quick", choices=("", "0", "1"), default=quick)
    parser.add_argument("--out", default=os.environ.get("OUT") or None)
    parser.add_argument("--checks", default=os.environ.get("CHECKS", ""))
    args = parser.parse_args()

    import lib.hardware  # noqa: F401 - sets the CUDA allocator as kfit's runs have it, before CUDA starts
    import torch

    from lib.validation.suite import run_suite, selected

    try:
        checks = selected(args.checks)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("error: DEVICE=cuda but this torch sees no CUDA GPU (torch "
              f"{torch.__version__}, CUDA {torch.version.cuda})", file=sys.stderr)
        return 2
    quick = device == "cpu" if args.quick == "" else args.quick == "1"
    status, _ = run_suite(device, quick=quick, out=args.out, root=ROOT, cwd=Path.cwd(),
                          log=lambda line: print(line, flush=True), checks=checks)
    return status


if __name__ == "__main__":
    sys.exit(main())
