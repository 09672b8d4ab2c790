"""Check results, running checks under a time budget, and what is written: table, summary line, JSON.

A check is a function of a Context that returns a Result: pass, fail or skip,
a one-line reason with the key figures, and every figure in `figures`. A check
that raises is recorded as failed with the error; the next check still runs.
Budgets are cooperative: a check looks at `ctx.out_of_time()` between its cases
and reports the cases it left out, so the whole run keeps to its budget.
"""

from __future__ import annotations

import gc
import math
import platform
import re
import subprocess
import time
import traceback
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Callable

from ..redact import shown
from ..fileio import write_text

PASS, FAIL, SKIP = "pass", "fail", "skip"
FORMAT = 1  # of the JSON document
INDEX_BEGIN, INDEX_END = "<!-- validations:begin -->", "<!-- validations:end -->"
INDEX_HEADER = ("| GPU | date | torch | CUDA | driver | checks | file |\n"
                "|---|---|---|---|---|---|---|")


@dataclass
class Result:
    status: str  # pass | fail | skip
    reason: str
    figures: dict = field(default_factory=dict)
    name: str = ""
    seconds: float = 0.0
    budget_s: float = 0.0

    def to_dict(self) -> dict:
        return {"status": self.status, "reason": self.reason, "seconds": round(self.seconds, 2),
                "budget_s": self.budget_s, "figures": self.figures}


def passed(reason: str, **figures: Any) -> Result:
    return Result(PASS, reason, figures)


def failed(reason: str, **figures: Any) -> Result:
    return Result(FAIL, reason, figures)


def skipped(reason: str, **figures: Any) -> Result:
    return Result(SKIP, reason, figures)


@dataclass
class Context:
    """What every check is given: the device, the mode, a scratch directory and the clock."""

    device: str  # cpu | cuda
    quick: bool
    workdir: Path
    log: Callable[[str], None] = print
    cuda: Any = None  # a measure.CudaDevice on CUDA (tests hand over one around a fake torch.cuda)
    deadline: float = math.inf  # time.monotonic() at which this check's budget ends
    # what one check measured that a later one may reuse instead of measuring again (the compile check's
    # compiled GPT-2 throughput for mfu): a later check measures itself where the entry is missing
    shared: dict = field(default_factory=dict)

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def out_of_time(self) -> bool:
        return self.seconds_left() <= 0


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Context], Result]
    budget_s: float


def run_checks(checks: list[Check], ctx: Context, on_result: Callable[[Result], None] | None = None) -> list[Result]:
    results = []
    for check in checks:
        start = time.monotonic()
        ctx.deadline = start + check.budget_s
        try:
            result = check.run(ctx)
        except Exception as err:  # noqa: BLE001 - a failing check never stops the others
            text = shown(" ".join(str(err).split()), 300)
            result = failed(f"{type(err).__name__}: {text}", traceback=traceback.format_exc(limit=-6))
        finally:
            gc.collect()  # what a failed check held must not squeeze the next one
            if ctx.cuda is not None:
                ctx.cuda.release()
        result.name, result.budget_s = check.name, check.budget_s
        result.seconds = time.monotonic() - start
        if result.seconds > check.budget_s:
            result.figures["over_budget_s"] = round(result.seconds - check.budget_s, 1)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


# --------------------------------------------------------------------------
# The table and the summary line


def header() -> str:
    return f"{'check':<16} {'status':<6} {'seconds':>7}  result"


def row(result: Result) -> str:
    return f"{result.name:<16} {result.status:<6} {result.seconds:>7.1f}  {result.reason}"


def counts(results: list[Result]) -> dict[str, int]:
    return {"checks": len(results), "passed": sum(r.status == PASS for r in results),
            "failed": sum(r.status == FAIL for r in results), "skipped": sum(r.status == SKIP for r in results)}


def summary_line(device: str, results: list[Result], seconds: float, path: Path | None) -> str:
    c = counts(results)
    return (f"validate-gpu: device={device} checks={c['checks']} passed={c['passed']} failed={c['failed']} "
            f"skipped={c['skipped']} seconds={seconds:.1f}" + (f" json={path}" if path else ""))


# --------------------------------------------------------------------------
# The JSON document and where it goes


def slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def output_path(out: str | None, *, device: str, device_name: str, day: date, root: Path, cwd: Path) -> Path:
    """OUT= (a .json file, or a directory) when given; else docs/validation/<gpu>-<date>.json on a GPU
    and runs/validation/cpu-<date>.json on a CPU, so a CPU run never touches the repository's docs. A file
    of that name already there is kept: the new one is <name>-2.json, -3, ... (an earlier run of the day is
    a record the index links to)."""
    stem = f"{slug(device_name) if device == 'cuda' else 'cpu'}-{day.isoformat()}"
    if out and Path(out).suffix == ".json":
        return Path(out)
    directory = Path(out) if out else (root / "docs" / "validation" if device == "cuda" else cwd / "runs" / "validation")
    path, n = directory / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = directory / f"{stem}-{n}.json"
    return path


def in_run_order(paths) -> list[Path]:
    """Validation JSONs oldest first: by the date in the name, then the run's number that day (`output_path`
    names the second run <name>-2.json, which sorts before <name>.json by name alone)."""
    def key(path: Path):
        found = re.search(r"(\d{4}-\d{2}-\d{2})(?:-(\d+))?(?=\.json$|-)", path.name)
        return (found.group(1), int(found.group(2) or 1), path.name) if found else ("", 0, path.name)

    return sorted((Path(p) for p in paths), key=key)


def _git_commit(root: Path) -> str | None:
    """HEAD's short hash, with "-dirty" when tracked files differ from it (the figures are of that code)."""
    def git(*args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "--short", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    dirty = status is not None and status.returncode == 0 and bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")


def environment(device: str, device_name: str, *, quick: bool, root: Path, driver: str | None = None) -> dict:
    import torch

    cudnn = torch.backends.cudnn.version() if device == "cuda" and torch.backends.cudnn.is_available() else None
    return {"date": date.today().isoformat(), "device": device, "device_name": device_name,
            "torch": str(torch.__version__), "cuda": torch.version.cuda, "cudnn": cudnn, "driver": driver,
            "python": platform.python_version(), "kfit_commit": _git_commit(root),
            "mode": "quick" if quick else "full"}


def document(results: list[Result], env: dict, seconds: float) -> dict:
    """The JSON written per run: the environment, every check's record, and the constants the
    figures suggest (each check may put a `suggested` dict among its figures)."""
    suggested = {}
    for r in results:
        suggested.update(r.figures.get("suggested") or {})
    return {"format": FORMAT, "tool": "make validate-gpu", "environment": env,
            "summary": {**counts(results), "seconds": round(seconds, 1)},
            "checks": {r.name: r.to_dict() for r in results}, "suggested_constants": suggested}


def index_row(doc: dict, filename: str) -> str:
    env, s = doc["environment"], doc["summary"]
    return (f"| {env['device_name']} | {env['date']} | {env['torch']} | {env.get('cuda') or '-'} | "
            f"{env.get('driver') or '-'} | {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped | "
            f"[{filename}]({filename}) |")


def update_index(readme: Path, doc: dict, filename: str) -> bool:
    """Add (or replace) this file's row in the table between the index markers; False without markers."""
    text = readme.read_text()
    if INDEX_BEGIN not in text or INDEX_END not in text:
        return False
    head, rest = text.split(INDEX_BEGIN, 1)
    body, tail = rest.split(INDEX_END, 1)
    rows = [line for line in body.splitlines()
            if line.startswith("| ") and not line.startswith("| GPU |") and f"({filename})" not in line
            and "none yet" not in line]
    rows = sorted(rows + [index_row(doc, filename)], key=lambda line: line.split("|")[2])
    write_text(readme, f"{head}{INDEX_BEGIN}\n{INDEX_HEADER}\n" + "\n".join(rows) + f"\n{INDEX_END}{tail}")
    return True
