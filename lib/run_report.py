"""make report: one self-contained HTML page of a run, from the files the run wrote.

The page reads the run directory only (metrics.jsonl, plan.json): training loss with the evaluations' loss,
the evaluation metrics, the learning rate, throughput and step time against the plan's predictions, memory
against the predicted peak, and the run's events (checkpoints, the step-time calibration, out-of-memory
rungs, resumes, stops) in a table and as marks on the charts. Charts are inline SVG drawn at the column's
width: no script, no download, readable offline and in a CI artifact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from . import fileio
from .errors import KfitError
from .report import TEMPLATES, nice_ticks
from .units import MiB

REPORT_FILE = "report.html"
# What an evaluation row holds beside its metrics
NOT_A_METRIC = ("step", "epoch", "final", "time", "mem_bytes", "mem_peak_bytes", "eval_loss")
# Events that change the plan or the run's course: marked on every chart
MARKED = ("oom_rung", "oom_recovery", "step_time", "resume", "interrupted", "early_stop", "device_lost",
          "thermal_pause", "battery_stop")
# What the monitor's memory figure is on each device (lib.hardware.runtime.device_memory): a GPU's allocated
# peak compares with the plan's step peak; a CPU's is the process's resident memory, the interpreter, libraries
# and data included, which the step's peak is only part of
MEMORY_READ = {"cuda": "the allocator's peak (allocated)", "mps": "Metal's allocated peak",
               "cpu": "the process's resident memory, the interpreter, libraries and data included"}
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f")
WIDTH, HEIGHT, MARGIN = 640, 230, (14, 16, 44, 70)  # top, right, bottom, left


@dataclass
class RunHistory:
    """What metrics.jsonl holds, by kind: logged training intervals, evaluations and events."""

    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    unreadable: int = 0  # lines that were not JSON objects (a line cut short by a kill, say)


def read_history(run_dir: Path) -> RunHistory:
    history = RunHistory()
    path = run_dir / "metrics.jsonl"
    try:  # never blocking on a FIFO planted as the file
        lines = fileio.read_bytes(path, follow_symlinks=False).decode(errors="replace").splitlines()
    except OSError as err:
        raise KfitError(f"{path} cannot be read ({err.strerror or err}): name a run directory with RUN=") from None
    for line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            history.unreadable += bool(line.strip())
            continue
        if not isinstance(row, dict):
            history.unreadable += 1
        elif "event" in row:
            history.events.append(row)
        elif "eval_loss" in row:
            history.evals.append(row)
        elif "loss" in row and "step" in row:
            history.train.append(row)
    return history


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and abs(value) != float("inf") else None


def _points(rows: list[dict], key: str, scale: float = 1.0) -> list[tuple[float, float]]:
    return [(float(r["step"]), v * scale) for r in rows
            if _number(r.get("step")) is not None and (v := _number(r.get(key))) is not None]


def _label(value: float) -> str:
    return f"{value:.3g}" if value and (abs(value) < 0.01 or abs(value) >= 1e5) else f"{value:g}"


def chart(title: str, unit: str, series: list[dict], x_max: float, marks: list[tuple[float, str]]) -> dict | None:
    """An SVG chart's geometry: `series` of {name, points, dashed}; None when no series has a point."""
    series = [s for s in series if s["points"]]
    if not series:
        return None
    values = [y for s in series for _, y in s["points"]]
    low, high = min(0.0, min(values)), max(values)
    top = high * 1.08 if high > 0 else 1.0
    ticks = [t for t in nice_ticks(top - low) if t + low <= top * 1.0001]
    x_max = max(x_max, 1.0)
    left, right = MARGIN[3], WIDTH - MARGIN[1]
    bottom, upper = HEIGHT - MARGIN[2], MARGIN[0]

    def x(step: float) -> float:
        return left + (right - left) * step / x_max

    def y(value: float) -> float:
        return bottom - (bottom - upper) * (value - low) / (top - low)

    lines = []
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        points = s["points"]
        if len(points) == 1:  # one point: a dot, and a flat line for a constant such as a prediction
            (px, py), = points
            points = [(0.0, py), (x_max, py)] if s.get("dashed") else points
        lines.append({"name": s["name"], "color": color, "dashed": bool(s.get("dashed")),
                      "points": " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in points),
                      "dots": [(round(x(px), 1), round(y(py), 1)) for px, py in points]
                      if len(points) < 40 and not s.get("dashed") else []})
    x_ticks = [t for t in nice_ticks(x_max, 5) if t <= x_max]
    return {"title": title, "unit": unit, "width": WIDTH, "height": HEIGHT, "margin": MARGIN,
            "lines": lines, "y_ticks": [(round(y(t + low), 1), _label(t + low)) for t in ticks],
            "x_ticks": [(round(x(t), 1), f"{t:g}") for t in x_ticks],
            "marks": [(round(x(step), 1), what) for step, what in marks if 0 <= step <= x_max]}


def charts(history: RunHistory, plan: dict) -> list[dict]:
    steps = [p for rows in (history.train, history.evals, history.events) for p, _ in _points(rows, "step")]
    x_max = max(steps, default=1.0)
    marks = [(float(e["step"]), e["event"]) for e in history.events
             if e.get("event") in MARKED and _number(e.get("step")) is not None]
    effective = _number(plan.get("effective_batch"))
    step_ms = [(s, effective / v * 1e3) for s, v in _points(history.train, "samples_per_s") if v > 0] \
        if effective else []
    metrics = sorted({k for e in history.evals for k, v in e.items() if k not in NOT_A_METRIC and _number(v) is not None})
    predicted = {k: _number(plan.get(k)) for k in ("predicted_samples_per_second", "predicted_step_seconds",
                                                   "predicted_peak_bytes")}

    def constant(name: str, value: float | None, scale: float = 1.0) -> dict:
        return {"name": name, "points": [(0.0, value * scale)] if value is not None else [], "dashed": True}

    out = [
        chart("Loss", "", [{"name": "training loss", "points": _points(history.train, "loss")},
                           {"name": "evaluation loss", "points": _points(history.evals, "eval_loss")}], x_max, marks),
        chart("Evaluation metrics", "", [{"name": m, "points": _points(history.evals, m)} for m in metrics],
              x_max, marks),
        chart("Learning rate", "", [{"name": "learning rate", "points": _points(history.train, "lr")}], x_max, marks),
        chart("Throughput", "samples/s", [
            {"name": "measured", "points": _points(history.train, "samples_per_s")},
            constant("predicted by the plan", predicted["predicted_samples_per_second"])], x_max, marks),
        chart("Step time", "ms", [
            {"name": "measured (effective batch / samples/s)", "points": step_ms},
            {"name": "the step timer's window", "points": _points(
                [e for e in history.events if e.get("event") == "step_time"], "measured_step_seconds", 1e3)},
            constant("predicted by the plan", predicted["predicted_step_seconds"], 1e3)], x_max, marks),
        chart("Memory", "MiB", [
            {"name": MEMORY_READ.get(plan.get("device_type"), MEMORY_READ["cuda"]),
             "points": _points(history.train, "mem_peak_bytes", 1 / MiB)},
            constant("a step's predicted peak", predicted["predicted_peak_bytes"], 1 / MiB)], x_max, marks),
    ]
    return [c for c in out if c is not None]


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the run's page (default <run>/report.html); returns its path."""
    import jinja2

    from .fileio import write_atomic
    from .report import check_writable

    run_dir = Path(run_dir)
    if (kind := fileio.what_is(run_dir / "metrics.jsonl")) not in (None, fileio.MISSING):
        reads = "" if kind.startswith("a symbolic link") else ": kfit reads only regular files"
        raise KfitError(f"{run_dir / 'metrics.jsonl'} is {kind}{reads}; name a training run's directory with RUN=")
    if not (run_dir / "metrics.jsonl").is_file():
        raise KfitError(f"{run_dir} holds no metrics.jsonl: name a training run's directory with RUN=")
    history = read_history(run_dir)
    try:
        plan = json.loads(fileio.read_bytes(run_dir / "plan.json", follow_symlinks=False))
        plan = plan if isinstance(plan, dict) else {}
    except (OSError, ValueError, RecursionError):
        plan = {}
    out = Path(out) if out else run_dir / REPORT_FILE
    check_writable(out)
    last = history.train[-1] if history.train else {}
    final = next((e for e in reversed(history.evals) if e.get("final")), history.evals[-1] if history.evals else {})
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True)
    page = env.get_template("run_report.html.j2").render(
        run=run_dir.name, path=str(run_dir.resolve()), plan=plan, charts=charts(history, plan),
        events=history.events, unreadable=history.unreadable, last=last,
        final={k: v for k, v in final.items() if k not in ("step", "epoch", "final", "time", "mem_bytes",
                                                           "mem_peak_bytes") and _number(v) is not None},
        generated=datetime.now().strftime("%Y-%m-%d %H:%M"), mib=lambda b: f"{b / MiB:,.1f} MiB")
    try:
        write_atomic(out, page.encode())
    except OSError as err:
        raise KfitError(f"cannot write the report to {out} ({err.strerror}): free space or choose another "
                        "OUT=") from None
    return out
