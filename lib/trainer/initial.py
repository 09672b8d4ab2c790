"""INIT_FROM: a new run that starts from trained weights (fine-tuning, nanoGPT's init_from).

Only the model's weights are taken, strictly by name and shape; the run is new in every other way (its own
directory, step 0, a fresh optimizer and LR schedule). The weights are checked against the model the config
builds (on the meta device: no memory) before the run directory exists, so a mismatch changes nothing. The
run records where they came from: <run>/init_from.json and an `init_from` event in metrics.jsonl.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import KfitError
from ..export import weights_of
from ..task import Task


@dataclass
class InitialWeights:
    weights: dict[str, torch.Tensor] | None  # dropped once loaded
    path: Path  # the file they came from
    step: int | None  # its training step, where known
    source: Path  # INIT_FROM as given
    casts: list[str] = field(default_factory=list)  # "float16 -> float32 (N tensors)": floating casts, said

    def record(self) -> dict:
        return {"init_from": str(self.source), "path": str(self.path.resolve()), "source_step": self.step,
                "tensors": len(self.weights or {})}

    def message(self) -> str:
        at = f" (step {self.step})" if self.step is not None else ""
        cast = f"; cast {', '.join(self.casts)}" if self.casts else ""
        return (f"Initialised from {self.path}{at}: {len(self.weights or {})} tensors by name{cast}; a new run from "
                "step 0 with a fresh optimizer and schedule")


def mismatches(weights: dict[str, torch.Tensor], shapes: dict[str, torch.Size]) -> list[str]:
    """What keeps `weights` from loading strictly into a model whose state_dict has these shapes."""
    problems = [f"{name}: checkpoint {list(weights[name].shape)}, this model {list(shape)}"
                for name, shape in shapes.items() if name in weights and tuple(weights[name].shape) != tuple(shape)]
    problems += [f"{name}: in this model, not in the checkpoint" for name in shapes if name not in weights]
    problems += [f"{name}: in the checkpoint, not in this model" for name in weights if name not in shapes]
    return problems


def model_tensors(task: Task) -> dict[str, torch.Tensor]:
    """The config's model's state_dict, built on the meta device (a factory that cannot: on the CPU)."""
    try:
        with torch.device("meta"):
            model = task.build(False)
    except Exception:  # noqa: BLE001 - a custom factory that makes real tensors itself
        model = task.build(False)
    return dict(model.state_dict())


def model_shapes(task: Task) -> dict[str, torch.Size]:
    """The config's model's state_dict shapes."""
    return {name: tensor.shape for name, tensor in model_tensors(task).items()}


def value_problem(weights: dict, ours: dict[str, torch.Tensor]) -> str | None:
    """The first of `weights` (names and shapes checked) that must not load into this model: not a tensor,
    an integer or bool tensor where the model has floating point (cast silently it diverges), a dtype of
    another kind, or NaN or infinite values."""
    for name, value in weights.items():
        if not isinstance(value, torch.Tensor):
            return f"{name} is a {type(value).__name__}, not a tensor"
    for name, mine in ours.items():
        theirs = weights[name]
        if mine.dtype.is_floating_point != theirs.dtype.is_floating_point or theirs.dtype.is_complex:
            return (f"{name} is {str(theirs.dtype).removeprefix('torch.')} there, "
                    f"{str(mine.dtype).removeprefix('torch.')} in this model (integer, bool or complex weights are "
                    "not this model's trained weights)")
        if theirs.dtype.is_floating_point and not bool(torch.isfinite(theirs).all()):
            return f"{name} holds NaN or infinite values (the run that saved it diverged)"
    return None


def casts(weights: dict[str, torch.Tensor], ours: dict[str, torch.Tensor]) -> list[str]:
    """The floating-point casts loading makes, as "float16 -> float32 (N tensors)"."""
    counts: dict[str, int] = {}
    for name, mine in ours.items():
        if weights[name].dtype != mine.dtype:
            key = f"{str(weights[name].dtype).removeprefix('torch.')} -> {str(mine.dtype).removeprefix('torch.')}"
            counts[key] = counts.get(key, 0) + 1
    return [f"{key} ({n} tensor{'s' if n > 1 else ''})" for key, n in sorted(counts.items())]


def not_both(resume, init_from) -> None:
    """A resumed run keeps its own weights: RESUME_FROM (or a run to resume) and INIT_FROM are refused together."""
    if resume is not None and init_from is not None:
        raise KfitError("RESUME_FROM and INIT_FROM exclude each other: a resumed run keeps its own weights; "
                        "give one of them")


def initial_source(source: Path) -> Path:
    """INIT_FROM as a path that exists (checked again before planning: a typo costs no time)."""
    source = Path(source).expanduser()
    if not source.exists():
        raise KfitError(f"INIT_FROM={source}: no such run directory, checkpoint or model.safetensors: name one "
                        "(e.g. INIT_FROM=runs/<run>/checkpoint.pt)")
    return source


def load_initial(source: Path, task: Task) -> InitialWeights:
    """INIT_FROM's weights, checked against this config's model: a KfitError naming the first tensor that
    does not fit, with both shapes."""
    source = initial_source(source)
    try:
        weights, path, step = weights_of(source)
    except KfitError as err:
        raise KfitError(f"INIT_FROM={source}: {err}") from None
    ours = model_tensors(task)
    wrong = [name for name, value in weights.items() if not isinstance(value, torch.Tensor)]
    problems = [f"{wrong[0]} is a {type(weights[wrong[0]]).__name__}, not a tensor"] if wrong else \
        mismatches(weights, {name: t.shape for name, t in ours.items()})
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise KfitError(f"INIT_FROM={source}: its weights do not fit this model: {problems[0]}{more}: INIT_FROM "
                        "needs weights of the same architecture (the model, its preset, vocabulary and block size; "
                        "CONFIG_PAD_VOCAB as that run had it)")
    problem = value_problem(weights, ours)
    if problem is not None:
        raise KfitError(f"INIT_FROM={source}: its weights cannot start this run: {problem}: start from weights "
                        "a run of this model trained (an earlier checkpoint of that run, say)")
    return InitialWeights(weights, path, step, source, casts(weights, ours))
