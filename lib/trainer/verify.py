"""A checkpoint's contents checked against what they go into, before any of its tensors is loaded on resume.

torch trusts what it loads: an optimizer state of another shape reaches the fused AdamW kernel, which reads and
writes past its tensors (a segfault, or memory growing until the kernel's OOM killer ends the run); one of
another dtype is cast without a word (int64 moments change the trajectory); an RNG state of another size is a
traceback. So a resume checks, in this order: the checkpoint's bytes (lib/checkpoint.py's `verify_integrity`:
zip CRCs, a sharded checkpoint's metadata and files), its structure (resume.py's `checkpoint_problem` and
`model_problem`: a kfit checkpoint, of this model), then here (`state_problem`) every tensor against the tensor
it will be loaded into:

- the model's: the dtype of each (names and shapes are model_problem's);
- the optimizer's: as many parameter groups, each with as many parameters, numbered as torch numbers them,
  each group's hyperparameters of the kind this optimizer's are (numbers finite); per parameter, the tensors
  shaped like it (AdamW's exp_avg, exp_avg_sq) of its shape and dtype, `step` and the other scalars a finite
  number (`step` >= 0), and for torch's own classes (OPTIMIZER_STATE) every key the class keeps;
- a sharded checkpoint's tensors, from its metadata, by the same rules (its parameter groups are pickled
  objects: only counted);
- the RNG states: torch's CPU state a uint8 tensor of torch.get_rng_state()'s size, the CUDA one (where this
  run is on CUDA) of torch.cuda.get_rng_state()'s, Python's a random.getstate() tuple (version, 624 words and
  a position, gauss); kfit saves no numpy state and loads none;
- the gradient scaler's: empty (a scaler that was off), or GradScaler's five fields with sane values;
- the values intact bytes of the right shapes may still get wrong (a field edited and re-saved, a run that had
  diverged): every floating model and optimizer-state tensor finite, the running squares (exp_avg_sq, ...) not
  below zero, `step` below 2**53, the groups' lr, weight_decay, momentum >= 0, betas in [0, 1), eps > 0
  (HYPER_RANGES), and the checkpoint's own config that of its run (resume.py's run_config_problem; its progress
  counts are resume.py's progress_range_problem). A sharded checkpoint's values are not read here.

Each function returns what is wrong as one phrase ("its optimizer state for fc.weight: exp_avg is [3, 4] int64,
the parameter [4, 3] float32"), None when the checkpoint fits. The checks read shapes, dtypes and the scalars
(microseconds per tensor), and make one pass over each tensor's values (torch.isfinite, or aminmax).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import NamedTuple

import torch

from .. import checkpoint
from .resume import COUNT_LIMIT, run_config_problem


class Meta(NamedTuple):
    """A tensor as a sharded checkpoint's metadata describes it (its values unread)."""
    shape: tuple
    dtype: torch.dtype


BYTES = object()  # a sharded checkpoint's entry that is a pickled object, not a tensor


def state_problem(state: dict, path: Path | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  scaler: torch.amp.GradScaler, device: torch.device) -> str | None:
    """What keeps a loaded checkpoint (`state`, at `path`; checkpoint_problem and model_problem accepted it) from
    going into this model, optimizer, scaler and device's RNG; None when every tensor fits."""
    if state.get("sharded"):
        wrong = sharded_problem(Path(path), model, optimizer)
    else:
        wrong = (model_dtype_problem(state["model"], model) or optimizer_problem(state["optimizer"], model, optimizer)
                 or model_values_problem(state["model"], model))
    return (wrong or scaler_problem(state["scaler"]) or rng_problem(state["rng"], device)
            or run_config_problem(state, None if path is None else Path(path)))


# -- values: what intact bytes of the right shapes may still hold -------------------------------------------------
# A checkpoint re-saved after one field was edited (or written by a run that had already diverged) passes the CRC
# and every shape: its values are checked here, as one pass over the tensors (the progress fields are
# resume.py's progress_range_problem, the config's run_config_problem).


def model_values_problem(saved: dict, model: torch.nn.Module) -> str | None:
    """A model tensor holding NaN or infinite values: INIT_FROM's check (initial.value_problem), one
    torch.isfinite pass over each of this model's floating tensors."""
    from .initial import value_problem

    wrong = value_problem(saved, model.state_dict())
    return None if wrong is None else f"its model tensor {wrong}"


# Per-parameter optimizer state that is never below zero: running averages of squares, sums of squares, the
# largest magnitude seen, Rprop's step sizes. A negative exp_avg_sq is a square root of a negative number in
# the next step: NaN weights, diagnosed as a learning rate too high.
NONNEGATIVE_STATE = frozenset({"exp_avg_sq", "max_exp_avg_sq", "exp_inf", "sum", "square_avg", "acc_delta",
                               "step_size"})


def _extremes(value: torch.Tensor) -> tuple[float, float]:
    """(min, max) of a floating tensor in one pass; NaN where it holds a NaN."""
    value = value.detach()
    try:
        low, high = torch.aminmax(value)
    except (RuntimeError, NotImplementedError):  # a dtype without an aminmax kernel here (float8)
        low, high = torch.aminmax(value.float())
    return low.item(), high.item()


def state_values_problem(key: str, value) -> str | None:
    """A per-parameter optimizer state tensor's values: finite where floating, not below zero for the keys
    NONNEGATIVE_STATE names. Meta (a sharded checkpoint's metadata) and empty tensors are not read."""
    if not isinstance(value, torch.Tensor) or value.numel() == 0 or not value.dtype.is_floating_point:
        return None
    low, high = _extremes(value)
    if not (math.isfinite(low) and math.isfinite(high)):
        return "holds NaN or infinite values"
    if key in NONNEGATIVE_STATE and low < 0:
        return f"holds {low:.4g}, below zero (it is never negative)"
    return None


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _describe(value) -> str:
    return f"{list(value.shape)} {_dtype(value.dtype)}"


def _tensor_like(value) -> bool:
    return isinstance(value, (torch.Tensor, Meta))


def _layout_problem(value) -> str | None:
    if isinstance(value, torch.Tensor) and (value.layout != torch.strided or value.is_quantized):
        return f"is a {'quantized' if value.is_quantized else str(value.layout).removeprefix('torch.')} tensor"
    return None


# -- the model ----------------------------------------------------------------------------------------------


def model_dtype_problem(saved: dict, model: torch.nn.Module) -> str | None:
    """A model tensor of another dtype than this model's (load_state_dict would cast it), or not a plain one."""
    for name, ours in model.state_dict().items():
        theirs = saved.get(name)
        if theirs is None:
            continue
        wrong = _layout_problem(theirs)
        if wrong is None and theirs.dtype != ours.dtype:
            wrong = f"is {_dtype(theirs.dtype)}, this model's {_dtype(ours.dtype)}"
        if wrong is not None:
            return f"its model tensor {name} {wrong}"
    return None


# -- the optimizer --------------------------------------------------------------------------------------------

# The per-parameter state of torch.optim's classes (torch 2.x): the tensors shaped like the parameter, and the
# scalars. Keys that depend on a hyperparameter are added by `expected_state`. A class not named here (a custom
# one, a subclass) is checked by the general rules alone: `step` a scalar, floating state for a floating
# parameter, a tensor with the parameter's number of elements in its shape.
OPTIMIZER_STATE = {
    "Adam": ("exp_avg exp_avg_sq", "step"), "AdamW": ("exp_avg exp_avg_sq", "step"),
    "RAdam": ("exp_avg exp_avg_sq", "step"), "NAdam": ("exp_avg exp_avg_sq", "step mu_product"),
    "Adamax": ("exp_avg exp_inf", "step"), "Adagrad": ("sum", "step"),
    "Adadelta": ("square_avg acc_delta", "step"), "Rprop": ("prev step_size", "step"),
    "ASGD": ("ax", "step eta mu"), "RMSprop": ("square_avg", "step"), "SGD": ("", ""),
}


def expected_state(optimizer: torch.optim.Optimizer, group: dict) -> tuple[list[str], list[str]] | None:
    """(keys shaped like the parameter, scalar keys) a torch.optim class keeps per parameter with the
    hyperparameters of `group`; None for a class OPTIMIZER_STATE does not name."""
    kind = type(optimizer)
    if getattr(torch.optim, kind.__name__, None) is not kind or kind.__name__ not in OPTIMIZER_STATE:
        return None
    like, scalars = (s.split() for s in OPTIMIZER_STATE[kind.__name__])
    if kind.__name__ in ("Adam", "AdamW") and group.get("amsgrad"):
        like.append("max_exp_avg_sq")
    if kind.__name__ == "RMSprop":
        like += ["momentum_buffer"] * bool(group.get("momentum")) + ["grad_avg"] * bool(group.get("centered"))
    if kind.__name__ == "SGD" and group.get("momentum"):
        like.append("momentum_buffer")
    return like, scalars


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _kind_problem(theirs, ours) -> str | None:
    """Whether a saved hyperparameter is of the kind of this optimizer's (numbers finite); None when it is."""
    if isinstance(ours, bool) or ours is None:  # a flag: torch fills one that is missing
        return None if isinstance(theirs, bool) or theirs is None else "not a flag"
    if isinstance(ours, (int, float)):
        return None if _real(theirs) else "not a finite number"
    if isinstance(ours, (tuple, list)):
        if not isinstance(theirs, (tuple, list)) or len(theirs) != len(ours):
            return f"not {len(ours)} values"
        return next((w for w in map(_kind_problem, theirs, ours) if w is not None), None)
    if isinstance(ours, torch.Tensor):
        ok = isinstance(theirs, torch.Tensor) and theirs.numel() == 1 and bool(torch.isfinite(theirs).all())
        return None if ok else "not a finite scalar tensor"
    if isinstance(ours, str):
        return None if isinstance(theirs, str) else "not a string"
    return None


def group_problem(theirs: dict, ours: dict) -> str | None:
    """A saved parameter group's hyperparameters against the live group's: torch takes the saved ones."""
    for key, value in ours.items():
        if key in ("params", "param_names"):
            continue
        if key not in theirs:
            if isinstance(value, bool) or value is None:
                continue  # a flag a newer torch added: its __setstate__ fills it
            return f"lacks {key}"
        wrong = _kind_problem(theirs[key], value) or _range_problem(key, theirs[key], value)
        if wrong is not None:
            return f"{key} is {str(theirs[key])[:40]!r}, {wrong}"
    return None


# The ranges torch.optim's constructors hold their hyperparameters to (and kfit's config its own: a learning rate
# and weight decay >= 0, a momentum in [0, 1)), by name, for any optimizer: (lowest, highest, whether the lowest
# is allowed, whether the highest is). A saved group takes the place of the constructor's check: torch's
# load_state_dict checks nothing, and a negative learning rate or a beta of 2 trains on into NaN.
# a learning rate past a million trains nothing (the audit's 1e30 was accepted): the run's own passes anyway
MAX_LEARNING_RATE = 1e6
HYPER_RANGES = {
    "lr": (0.0, MAX_LEARNING_RATE, True, True), "initial_lr": (0.0, MAX_LEARNING_RATE, True, True),
    "weight_decay": (0.0, math.inf, True, False), "momentum": (0.0, math.inf, True, False),
    "eps": (0.0, math.inf, False, False), "betas": (0.0, 1.0, True, False),
    "alpha": (0.0, math.inf, True, False), "lr_decay": (0.0, math.inf, True, False),
    "initial_accumulator_value": (0.0, math.inf, True, False), "rho": (0.0, 1.0, True, True),
    "momentum_decay": (0.0, math.inf, True, False), "lambd": (0.0, math.inf, True, False),
}


def _numbers(value) -> list[float]:
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in _numbers(v)]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return [value.double().item()]
    return [float(value)] if _real(value) else []


def _range_problem(key: str, theirs, ours) -> str | None:
    """A saved hyperparameter (of the right kind) outside HYPER_RANGES; the value this run's own optimizer was
    built with always passes (a user's custom optimizer may take an eps of 0)."""
    if key not in HYPER_RANGES:
        return None
    low, high, low_ok, high_ok = HYPER_RANGES[key]
    ours_numbers = _numbers(ours)
    for i, n in enumerate(_numbers(theirs)):
        if (n > low or (low_ok and n == low)) and (n < high or (high_ok and n == high)):
            continue
        if i < len(ours_numbers) and n == ours_numbers[i]:
            continue
        interval = f"{'[' if low_ok else '('}{low:g}, {high:g}{']' if high_ok else ')'}"
        return f"outside {interval}"
    return None


def scalar_problem(key: str, value) -> str | None:
    """A per-parameter scalar (`step`, NAdam's mu_product): a finite number, or a tensor of one element; `step`
    not below zero."""
    if value is BYTES:
        return None
    if _real(value):
        number = value
    elif _tensor_like(value):
        if math.prod(value.shape) != 1 or value.dtype.is_complex or value.dtype == torch.bool:
            return f"is {_describe(value)}, not a scalar"
        if not isinstance(value, torch.Tensor):
            return None
        number = value.double().item()
        if not math.isfinite(number):
            return f"is {number}, not a finite number"
    else:
        return f"is a {type(value).__name__}, not a scalar"
    if key == "step" and number < 0:
        return f"is {number}, below zero"
    if key == "step" and number >= COUNT_LIMIT:
        return f"is {number:.4g}, beyond any run (2**53 steps)"
    return None


def moment_problem(value, param: torch.Tensor, strict: bool) -> str | None:
    """A per-parameter state tensor against its parameter: `strict` (a key torch's class keeps shaped like the
    parameter) its shape and dtype; otherwise floating where the parameter is, and a tensor with the parameter's
    number of elements in its shape (a factored state, Adafactor's, has fewer)."""
    if value is BYTES:
        return None
    if not _tensor_like(value):
        return f"is a {type(value).__name__}, not a tensor" if strict else None
    wrong = _layout_problem(value)
    if wrong is not None:
        return wrong
    same = tuple(value.shape) == tuple(param.shape)
    if strict:
        fits = same and value.dtype == param.dtype
    else:
        fits = ((value.dtype.is_floating_point or not param.dtype.is_floating_point)
                and (same or math.prod(value.shape) != math.prod(param.shape)))
    return None if fits else f"is {_describe(value)}, the parameter {_describe(param)}"


def param_state_problem(entry: dict, param: torch.Tensor, group: dict, optimizer: torch.optim.Optimizer
                        ) -> str | None:
    """One parameter's optimizer state (values: tensors, or Meta from a sharded checkpoint's metadata)."""
    expected = expected_state(optimizer, group)
    like, scalars = expected if expected is not None else ([], ["step"])
    missing = [k for k in (*like, *scalars) if k not in entry]
    if missing:
        return f"lacks {', '.join(missing)}"
    for key, value in entry.items():
        if not isinstance(key, str):
            return f"has the key {key!r}"
        if key in scalars or key == "step":
            wrong = scalar_problem(key, value)
        else:
            wrong = moment_problem(value, param, strict=key in like) or state_values_problem(key, value)
        if wrong is not None:
            return f"{key} {wrong}"
    return None


def _flat_params(optimizer: torch.optim.Optimizer) -> list[tuple[torch.Tensor, dict]]:
    return [(p, group) for group in optimizer.param_groups for p in group["params"]]


def optimizer_problem(saved, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """optimizer.state_dict() of a single-file checkpoint against this run's optimizer, before
    optimizer.load_state_dict (or set_state_dict) sees it."""
    if not (isinstance(saved.get("state"), dict) and isinstance(saved.get("param_groups"), list)):
        return "its optimizer state is not torch's (a dict of state and param_groups)"
    ours, theirs = optimizer.param_groups, saved["param_groups"]
    if len(theirs) != len(ours):
        return f"its optimizer has {len(theirs)} parameter group(s), this run's {len(ours)}"
    order = getattr(model, "pipeline_optimizer_order", None)
    if order is not None:  # a pipeline stage: the file holds the whole model's optimizer, this run part of it
        return _stage_optimizer_problem(saved, model, optimizer, order)
    numbered: list = []
    for i, (group, live) in enumerate(zip(theirs, ours)):
        if not isinstance(group, dict) or not isinstance(group.get("params"), list):
            return f"its optimizer's parameter group {i} is not a dict with params"
        if len(group["params"]) != len(live["params"]):
            return (f"its optimizer's parameter group {i} holds {len(group['params'])} parameters, this run's "
                    f"{len(live['params'])}")
        wrong = group_problem(group, live)
        if wrong is not None:
            return f"its optimizer's parameter group {i}: {wrong}"
        numbered += group["params"]
    params = _flat_params(optimizer)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in numbered) or numbered != list(range(len(params))):
        return "its optimizer numbers its parameters otherwise than torch does (0, 1, ... in group order)"
    names = {id(p): n for n, p in model.named_parameters()}
    for key, entry in saved["state"].items():
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < len(params):
            return f"its optimizer state is for parameter {str(key)[:20]!r}, not one of 0-{len(params) - 1}"
        param, _ = params[key]
        name = names.get(id(param), f"parameter {key}")
        if not isinstance(entry, dict):
            return f"its optimizer state for {name} is a {type(entry).__name__}, not a dict"
        wrong = param_state_problem(entry, param, theirs[_group_of(key, ours)], optimizer)
        if wrong is not None:
            return f"its optimizer state for {name}: {wrong}"
    return None


def _stage_optimizer_problem(saved: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                             order: list[str]) -> str | None:
    """A whole model's optimizer.state_dict() against a pipeline stage's optimizer: numbered as the whole
    model's optimizer listed its parameters (`order`, lib/pipeline.py keep_stages kept it), each entry of this
    stage's parameters checked as the single-file rules check it; the other stages' entries are theirs."""
    numbered = [n for group in saved["param_groups"] if isinstance(group, dict)
                for n in (group.get("params") if isinstance(group.get("params"), list) else [None])]
    if any(isinstance(n, bool) or not isinstance(n, int) for n in numbered) or numbered != list(range(len(order))):
        return (f"its optimizer numbers {len(numbered)} parameters otherwise than the whole model's "
                f"{len(order)} (0, 1, ... in group order)")
    mine = {name: (p, group) for group in optimizer.param_groups for p in group["params"]
            for name in [n for n, q in model.named_parameters() if q is p][:1]}
    for key, entry in saved["state"].items():
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < len(order):
            return f"its optimizer state is for parameter {str(key)[:20]!r}, not one of 0-{len(order) - 1}"
        if order[key] not in mine:
            continue
        if not isinstance(entry, dict):
            return f"its optimizer state for {order[key]} is a {type(entry).__name__}, not a dict"
        param, group = mine[order[key]]
        wrong = param_state_problem(entry, param, group, optimizer)
        if wrong is not None:
            return f"its optimizer state for {order[key]}: {wrong}"
    return None


def _group_of(index: int, groups: list[dict]) -> int:
    for i, group in enumerate(groups):
        if index < len(group["params"]):
            return i
        index -= len(group["params"])
    raise IndexError(index)


# -- a sharded checkpoint, by its metadata -----------------------------------------------------------------------


def sharded_problem(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """A sharded checkpoint's tensors as its metadata describes them (torch.distributed.checkpoint's key paths:
    ("model", name), ("optimizer", "state", name, key), ("optimizer", "param_groups", i, key)) against this
    model and optimizer, by the rules of the single file's; dcp.load would refuse a missing key or reshard a
    tensor of another size with a traceback, and cast one of another dtype."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = checkpoint.sharded_metadata(path)
    paths, entries = getattr(metadata, "planner_data", None), getattr(metadata, "state_dict_metadata", None)
    if not isinstance(paths, dict) or not isinstance(entries, dict):
        return "its .metadata is not torch.distributed.checkpoint's default planner's"
    saved: dict[tuple, object] = {}
    for key, entry in entries.items():
        where = paths.get(key)
        if not isinstance(where, tuple) or not where:
            return f"its .metadata gives {str(key)[:60]} no key path"
        tensor = isinstance(entry, TensorStorageMetadata)
        saved[where] = Meta(tuple(entry.size), entry.properties.dtype) if tensor else BYTES
    model_saved = {where[1]: value for where, value in saved.items() if where[0] == "model" and len(where) == 2}
    wrong = _sharded_model_problem(model_saved, model)
    if wrong is not None:
        return wrong
    flat = any(where[0] == "optimizer" and len(where) == 2 for where in saved)  # resume.sharded_tensors' `flat`
    groups = {where[2] for where in saved if where[:2] == ("optimizer", "param_groups") and len(where) > 2}
    if not flat and len(groups) != len(optimizer.param_groups):
        return f"its optimizer has {len(groups)} parameter group(s), this run's {len(optimizer.param_groups)}"
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    state: dict[str, dict] = {}
    for where, value in saved.items():
        if where[:2] == ("optimizer", "state") and len(where) == 4:
            state.setdefault(where[2], {})[where[3]] = value
        elif where[0] == "optimizer" and len(where) == 2 and str(where[1]).startswith("state."):
            name, _, key = str(where[1]).removeprefix("state.").rpartition(".")  # "state.<name>.<key>"
            state.setdefault(name, {})[key] = value
    for param, group in _flat_params(optimizer):
        names = aliases.get(id(param), [])
        entry = next((state[n] for n in names if n in state), None)
        name = names[0] if names else "a parameter"
        if entry is None:  # get_state_dict gives every trained parameter a state, and dcp.load wants it
            return f"its optimizer state lacks {name}"
        wrong = param_state_problem(entry, param, group, optimizer)
        if wrong is not None:
            return f"its optimizer state for {name}: {wrong}"
    return None


def _sharded_model_problem(saved: dict, model: torch.nn.Module) -> str | None:
    ours = model.state_dict(keep_vars=True)
    first: dict[int, str] = {}
    for name, t in ours.items():  # tied tensors (a shared embedding) may be saved under one of their names
        first.setdefault(id(t), name)
    elsewhere = getattr(model, "pipeline_elsewhere", frozenset())  # the other pipeline stages' tensors
    differences = [f"{name}: there, not in this model" for name in saved if name not in ours
                   and name not in elsewhere]
    for name, t in ours.items():
        theirs = saved.get(name, saved.get(first[id(t)]))
        if theirs is None:
            differences.append(f"{name}: in this model, not there")
        elif theirs is BYTES:
            differences.append(f"{name}: not a tensor there")
        elif tuple(theirs.shape) != tuple(t.shape):
            differences.append(f"{name}: {list(theirs.shape)} there, {list(t.shape)} here")
        elif theirs.dtype != t.dtype:
            return f"its model tensor {name} is {_dtype(theirs.dtype)}, this model's {_dtype(t.dtype)}"
    if not differences:
        return None
    more = f"; {len(differences) - 1} more" if len(differences) > 1 else ""
    return f"it is a checkpoint of another model ({differences[0]}{more})"


# -- RNG and scaler -----------------------------------------------------------------------------------------


def _byte_state_problem(value, size: int) -> str | None:
    if not isinstance(value, torch.Tensor):
        return f"is a {type(value).__name__}, not a tensor"
    if value.dtype != torch.uint8 or value.dim() != 1 or value.numel() != size:
        return f"is {_describe(value)}, this torch's [{size}] uint8"
    return None


def python_rng_problem(state) -> str | None:
    """random.getstate()'s shape: (version, 625 integers: 624 32-bit words and a position <= 624, gauss or None).
    random.setstate refuses some others with a traceback, and takes words beyond 32 bits cut short."""
    version = random.getstate()[0]
    if not (isinstance(state, tuple) and len(state) == 3):
        return "is not random.getstate()'s (version, state, gauss)"
    if state[0] != version:
        return f"is of version {str(state[0])[:20]}, this Python's {version}"
    words = state[1]
    if not (isinstance(words, tuple) and len(words) == 625 and all(type(w) is int for w in words)):
        return "does not hold 625 integers"
    if not (all(0 <= w < 2 ** 32 for w in words[:624]) and 0 <= words[624] <= 624):
        return "holds a word beyond 32 bits or a position beyond 624"
    if state[2] is not None and not isinstance(state[2], float):
        return f"holds a gauss of {type(state[2]).__name__}"
    return None


def rng_problem(rng: dict, device: torch.device) -> str | None:
    """The RNG states set_rng_state puts back: torch's CPU state, the CUDA one where this run is on CUDA, Python's."""
    wrong = _byte_state_problem(rng["torch"], torch.get_rng_state().numel())
    if wrong is not None:
        return f"its torch RNG state {wrong}"
    if device.type == "cuda" and "cuda" in rng:
        wrong = _byte_state_problem(rng["cuda"], torch.cuda.get_rng_state(device).numel())
        if wrong is not None:
            return f"its CUDA RNG state {wrong}"
    wrong = python_rng_problem(rng["python"])
    return None if wrong is None else f"its Python RNG state {wrong}"


SCALER_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def scaler_problem(saved: dict) -> str | None:
    """torch.amp.GradScaler.state_dict(): empty (a scaler that was off: nothing is loaded), or its five fields:
    a finite scale above zero, growth above 1, backoff between 0 and 1, a whole interval above zero and a whole
    tracker not below zero."""
    if not saved:
        return None
    if set(saved) != set(SCALER_KEYS):
        return f"its gradient scaler state has the keys {sorted(str(k) for k in saved)[:6]}, not GradScaler's"
    scale, growth, backoff, interval, tracker = (saved[k] for k in SCALER_KEYS)

    def whole(n) -> bool:
        return isinstance(n, int) and not isinstance(n, bool)
    if not (_real(scale) and scale > 0 and _real(growth) and growth > 1 and _real(backoff) and 0 < backoff < 1
            and whole(interval) and interval > 0 and whole(tracker) and tracker >= 0):
        shown = ", ".join(f"{k} {str(saved[k])[:20]}" for k in SCALER_KEYS)
        return f"its gradient scaler state is not a GradScaler's ({shown})"
    return None
