"""The measured fallback: a step's peak from real steps, where the fake-tensor trace cannot run the model.

A model may use an op with no working fake kernel (a custom CUDA or Triton
extension, a third-party kernel, an output whose shape depends on the data):
the trace fails, though the model trains. kfit then runs real steps of it on
this machine's device, in a child process (a crash or an out-of-memory there
costs the plan nothing), the same sequence the tracer traces
(trace.training_steps, or the evaluation forward), at micro-batches 1, 2, 4, ...
doubling until three points lie on one line (the step's peak is affine in the
batch once one moment holds it: curve.affine_runs), the batch asked for is
reached, the next would exceed MEMORY_SHARE of the memory free now, or
MEASURE_SECONDS have passed. Instruments:

    cpu    the CPU allocator's peak over a run that builds the model, optimizer and batch and runs the
           steps (torch.profiler's memory events; what make bench-memory prints as "allocator MiB");
           the device terms (host_heap) are added as to a trace
    cuda   torch.cuda.max_memory_reserved over the second of two runs, after resetting the peak:
           everything the caching allocator holds, so no device term is added (predict.device_overheads)

The fit (`MeasuredFit`) reads a batch between measured ones off the chord
(above a convex curve), and one past them off the line through the last two,
with the largest slope seen (a peak's slope only grows with the batch). It is
cached beside the traces, under the trace's key, so a plan measures once.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ..config import Config
from ..env import environ
from ..errors import KfitError
from ..fileio import cache_note, read_json_cache, write_cache_file

MEASURE_SECONDS = 90.0  # the series stops doubling once this much time has gone
MEMORY_SHARE = 0.5  # nor measures a batch whose extrapolated peak is over this share of the free memory
COLLINEAR = 0.005  # three points whose middle one is within this share of the chord's peak: a line
SCHEMA = 1


class MeasureError(KfitError):
    """Real steps of the model failed too: the model's own error, in one line."""


@dataclass(frozen=True)
class MeasuredFit:
    """A step's measured peaks, and what the rest of the trace's breakdown is at any batch."""

    points: dict[int, int]  # batch -> peak bytes
    fixed: dict[str, int]  # parameters, buffers, gradients, optimizer_state: the same at every batch
    batch_bytes: int  # one sample's input and target
    parameters: int
    eval_samples: int
    reason: str  # why the trace could not run: "aten.foo: what it raised"
    device_type: str
    seconds: float
    features: tuple[str, ...] = field(default=())

    def peak(self, batch: int) -> int:
        pts = sorted(self.points.items())
        if batch in self.points:
            return self.points[batch]
        if len(pts) == 1:
            return pts[0][1] * max(1, batch) // pts[0][0]
        for (b0, p0), (b1, p1) in zip(pts, pts[1:]):
            if b0 < batch < b1:
                return p0 + (p1 - p0) * (batch - b0) // (b1 - b0)
        slopes = [(p1 - p0) / (b1 - b0) for (b0, p0), (b1, p1) in zip(pts, pts[1:])]
        if batch < pts[0][0]:
            return max(0, pts[0][1] - int(slopes[0] * (pts[0][0] - batch)))
        top, peak = pts[-1]
        return peak + int(max(slopes) * (batch - top)) + 1

    def trace(self, batch: int):
        """A Trace of the fitted peak at `batch` (the "measured" feature marks it), its breakdown summing to it."""
        from .trace import CATEGORIES, Trace

        peak = self.peak(batch)
        breakdown = {k: 0 for k in CATEGORIES if k not in ("unsharded_parameters", "unsharded_gradients",
                                                           "communication")}
        breakdown.update(self.fixed)
        breakdown["batch"] = min(batch * self.batch_bytes, max(0, peak - sum(self.fixed.values())))
        breakdown["activations"] = max(0, peak - sum(breakdown.values()))
        return Trace(batch=batch, peak_bytes=sum(breakdown.values()), breakdown=breakdown,
                     parameters=self.parameters, features=(*self.features, "measured"),
                     eval_samples=self.eval_samples, seconds=self.seconds)

    def describe(self) -> str:
        batches = ", ".join(str(b) for b in sorted(self.points))
        return (f"measured by real steps on this {self.device_type} at micro-batch {batches} in "
                f"{self.seconds:.0f}s (the memory tracer could not run it: {self.reason})")

    def to_json(self) -> dict:
        return {**self.__dict__, "points": {str(b): p for b, p in self.points.items()},
                "features": list(self.features), "schema": SCHEMA}

    @classmethod
    def from_json(cls, d: dict) -> "MeasuredFit":
        """ValueError/TypeError/KeyError unless every field is there with its type."""
        points = {int(b): p for b, p in d["points"].items() if str(b).isdigit()}
        counts = [*points.values(), *d["fixed"].values(), d["batch_bytes"], d["parameters"], d["eval_samples"]]
        if (not points or len(points) != len(d["points"]) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts)
                or not isinstance(d["reason"], str) or d["device_type"] not in ("cpu", "cuda", "mps")
                or not isinstance(d["seconds"], (int, float))):
            raise ValueError("a field is missing or of the wrong type")
        return cls(points=points, fixed=dict(d["fixed"]), batch_bytes=d["batch_bytes"], parameters=d["parameters"],
                   eval_samples=d["eval_samples"], reason=d["reason"], device_type=d["device_type"],
                   seconds=float(d["seconds"]), features=tuple(d.get("features", ())))


def read_fit(path: Path) -> MeasuredFit | None:
    data = read_json_cache(path, SCHEMA)
    if data is None:
        return None
    try:
        return MeasuredFit.from_json(data)
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        cache_note(path, f"invalid ({type(err).__name__}: {err})", then="dropped; measured again")
        return None


def write_fit(path: Path, fit: MeasuredFit) -> None:
    try:
        write_cache_file(path, json.dumps(fit.to_json(), sort_keys=True).encode())
    except OSError:  # a read-only cache, or a link in its place: only costs time
        pass


def why_untraceable(err: BaseException) -> str:
    """The trace's failure in one short line: the op it reached, where FakeTensorMode names it, and the error."""
    op = getattr(err, "func", None)
    message = " ".join(str(err).split()).split(". ")[0] or type(err).__name__  # torch's first sentence says it
    if len(message) > 200:
        message = message[:197] + "..."
    return f"{op}: {message}" if op is not None and str(op) not in message else message


def _collinear(a: tuple[int, int], b: tuple[int, int], c: tuple[int, int]) -> bool:
    chord = a[1] + (c[1] - a[1]) * (b[0] - a[0]) / (c[0] - a[0])
    return abs(b[1] - chord) <= COLLINEAR * max(chord, 1)


def free_bytes(device_type: str) -> int | None:
    """Memory free now on the device a measurement runs on (the series stops before a batch takes half)."""
    if device_type == "cpu":
        from ..hardware.host import ram_available_bytes

        return ram_available_bytes()
    import torch

    return torch.cuda.mem_get_info()[0] if device_type == "cuda" and torch.cuda.is_available() else None


def fit_step(config: Config, *, batch: int, precision: str, device_type: str, gradient_checkpointing: bool,
             train: bool, reason: str) -> MeasuredFit:
    """Measure the step at 1, 2, 4, ... in a child process (module docstring) and fit it; MeasureError when
    real steps fail too, KfitError when the plan's device is not here to measure on."""
    import torch

    if device_type == "cuda" and not torch.cuda.is_available() or device_type == "mps" and not (
            torch.backends.mps.is_available()):
        raise KfitError(f"the memory tracer cannot run this model ({reason}), and the plan is for a {device_type} "
                        f"device, which this machine does not have to measure real steps on: run 'make plan' on "
                        "a machine with that GPU (kfit then measures the step there)")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kfit-measure-") as tmp:
        case, out = Path(tmp) / "case.json", Path(tmp) / "result.json"
        (Path(tmp) / "case.config").write_text(config.text)
        case.write_text(json.dumps({"config": str(Path(tmp) / "case.config"), "batch": batch, "precision": precision,
                                    "device": device_type, "train": train, "free_bytes": free_bytes(device_type),
                                    "gradient_checkpointing": gradient_checkpointing, "deadline": MEASURE_SECONDS}))
        env = {**environ(), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        run = subprocess.run([sys.executable, "-m", "lib.memory.measured", str(case), str(out)], env=env,
                             capture_output=True, text=True)
        result = _read_result(out)
    if not result.get("points"):  # the model's own error at micro-batch 1, or the process died there
        tail = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
        raise MeasureError(f"the memory tracer cannot run this model ({reason}), and a real step at micro-batch 1 "
                           f"failed too: {result.get('error') or f'the measuring process died ({tail})'}")
    return MeasuredFit(points={int(b): p for b, p in result["points"].items()}, fixed=result["fixed"],
                       batch_bytes=result["batch_bytes"], parameters=result["parameters"],
                       eval_samples=result["eval_samples"], reason=reason, device_type=device_type,
                       seconds=round(time.perf_counter() - start, 2), features=tuple(result["features"]))


def _read_result(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _done(case: dict, points: dict[int, int], elapsed: float) -> bool:
    """Whether the series stops after its last point (module docstring)."""
    pts = sorted(points.items())
    b = pts[-1][0]
    if b >= case["batch"] or (len(pts) >= 3 and _collinear(*pts[-3:]) and b >= min(case["batch"], 4)):
        return True
    slope = (pts[-1][1] - pts[-2][1]) / (pts[-1][0] - pts[-2][0]) if len(pts) > 1 else pts[-1][1]
    nxt = pts[-1][1] + slope * b  # the peak at 2b, on the line through the last two points
    free = case.get("free_bytes")
    return elapsed * 3 > case["deadline"] or bool(free and nxt > MEMORY_SHARE * free)


def measure_series(case: dict, out: Path) -> None:
    """The child: measure_case at 1, 2, 4, ..., rewriting `out` after every point, so that what was measured
    before an out-of-memory kill is kept; a step that raises ends the series with its error."""
    start, points, batch = time.perf_counter(), {}, 1
    while True:
        try:
            facts = measure_case({**case, "batch": batch})
        except Exception as err:  # noqa: BLE001 - the model's own error, or out of memory: the parent decides
            from ..models.custom import describe

            out.write_text(json.dumps({**_read_result(out), "error": describe(err)}))
            return
        points[batch] = facts.pop("peak")
        out.write_text(json.dumps({**facts, "points": {str(b): p for b, p in points.items()}}))
        if _done(case, points, time.perf_counter() - start):
            return
        batch *= 2


# --------------------------------------------------------------------------
# The child: real steps


@contextlib.contextmanager
def quiet_stderr():
    """Kineto writes profiler start/stop lines straight to fd 2; they would drown a table or a plan."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def allocator_peak(run) -> int:
    """torch.profiler's memory events around run(), which builds everything it uses: the CPU allocator's peak."""
    import torch
    from torch._C._profiler import _EventType

    with quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                profile_memory=True) as prof:
        run()
    allocations, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            allocations.append((node.start_time_ns, node.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak


def measure_case(case: dict) -> dict:
    """The peak of the traced sequence, run for real at case["batch"], and the step's fixed sizes."""
    import torch

    from .. import config as kconfig
    from ..step import autocast_for
    from ..models.registry import spec_for
    from ..task import load_task
    from .fake import model_features
    from .trace import evaluation_pass, step_optimizer, training_steps

    config = kconfig.read_config(case["config"])
    device, batch, train = case["device"], case["batch"], case["train"]
    task = load_task(config)
    if spec_for(config.model).builder is None:  # a factory's model (CONFIG_MODEL_CUSTOM)
        task.build(False)  # the factory's first model was built at load, outside the instrument: build afresh
    autocast = autocast_for(SimpleNamespace(precision=case["precision"], device_type=device))
    facts: dict = {}

    def run() -> None:
        model = task.build(case["gradient_checkpointing"] and train).to(device)
        x, y = (t.to(device) for t in task.example_batch(batch))
        if not train:
            model.eval()
            with torch.no_grad(), autocast:
                evaluation_pass(model, task, x, y)
        else:
            model.train()
            optimizer = step_optimizer(config, model, device)
            training_steps(model, optimizer, task.loss, x, y, autocast=autocast, grad_clip=config.grad_clip,
                           foreach=device == "cuda")
            facts["optimizer_state"] = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                                           for t in s.values() if isinstance(t, torch.Tensor))
        size = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
        facts.update(parameters=size(model.parameters()), buffers=size(model.buffers()),
                     gradients=size(p for p in model.parameters() if p.requires_grad) if train else 0,
                     count=sum(p.numel() for p in model.parameters()), features=list(model_features(model)))
        facts["batch_bytes"] = (x[0].numel() * x.element_size() + y[0].numel() * y.element_size())
        if device == "cuda":
            torch.cuda.synchronize()

    if device == "cuda":
        run()  # warm-up: cuBLAS workspaces, cuDNN's choices
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        run()
        peak = torch.cuda.max_memory_reserved()
    else:
        peak = allocator_peak(run)
    fixed = {k: facts[k] for k in ("parameters", "buffers", "gradients")}
    fixed["optimizer_state"] = facts.get("optimizer_state", 0)
    return {"peak": int(peak), "fixed": fixed, "batch_bytes": facts["batch_bytes"], "parameters": facts["count"],
            "eval_samples": len(task.eval), "features": facts["features"]}


if __name__ == "__main__":
    measure_series(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
