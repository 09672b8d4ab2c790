"""Bring your own model: CONFIG_CUSTOM_MODEL_FACTORY="package.module:function".

The factory takes no arguments and returns (model, data, loss_fn), or (model, data, loss_fn, metrics):

    model       a torch.nn.Module; model(inputs) -> outputs
    data        either make_batch(batch_size, generator) -> (inputs, targets), CPU tensors
                with the sample in dimension 0, drawn with the given torch.Generator;
                or a map-style dataset (a torch.utils.data.Dataset, a Hugging Face
                datasets.Dataset: anything with __len__ and __getitem__(int)) whose items
                are (input, target) pairs or dicts with one input and one target key
                ("labels", "label", "targets", "target" or "y"), or a pair of them
                (train, eval); a single one gives its last EVAL_FRACTION to evaluation;
                or a stream (a torch IterableDataset, a Hugging Face IterableDataset) with the
                same items, or a (train stream, eval stream or dataset) pair
    loss_fn     loss_fn(outputs, targets) -> scalar mean loss over the batch
    metrics     optional: torchmetrics Metric objects the evaluation updates with (outputs, targets):
                one (named after its class: accuracy, f1_score), a {name: Metric} mapping or a
                MetricCollection (lib/metrics.py)

kfit draws the training and evaluation sets from make_batch once (seeded); a
dataset is read item by item as batches need it (in the data loader's workers
when the plan has them), so it may be larger than memory. Either way batches,
accumulation, out-of-memory recovery and resume treat them exactly like a
built-in data set; the memory planner traces model + loss_fn on an example
batch of any size.

A stream (lib/data/stream.py) is read in order, in the training process (no
loader workers), one optimizer step's items at a time; every rank reads it and
keeps its own slice of each step's items. It has no length, so CONFIG_MAX_STEPS
is required (the run's step budget, which the LR schedule spans); a pass ends
where the stream does (an epoch), CONFIG_EPOCHS passes at most. Evaluation takes
the first CONFIG_CUSTOM_EVAL_SAMPLES items of the eval stream, or of the one
stream (then held out from training), read once. Resume is exact: a stream with
state_dict()/load_state_dict() continues from its saved state; any other is
read again from its start, skipping the items already trained on (the run warns
that this is what resume does). Planning reads the stream's first items.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from ..data.stream import is_stream
from ..errors import ConfigError, KfitError
from ..metrics import named
from ..resources import CHECKOUT, PACKAGE

MakeBatch = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


EVAL_FRACTION = 0.1  # of a single dataset, its tail, as text corpora are split


@dataclass(frozen=True)
class CustomModel:
    model: torch.nn.Module
    make_batch: MakeBatch | None
    loss_fn: LossFn
    datasets: tuple | None = None  # (train, eval) datasets or streams, where data is not make_batch
    metrics: dict | None = None  # {name: torchmetrics Metric}, where the factory returned some


def is_dataset(value) -> bool:
    """A map-style dataset: sized and indexable, not a function."""
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and not callable(value)


def datasets_of(data, spec: str) -> tuple | None:
    """(train, eval) from what the factory returned as data; None for make_batch. A single stream's eval is
    None: its first items are held out (lib/task.py)."""
    pair = data if isinstance(data, (tuple, list)) and len(data) == 2 else None
    if pair and all(is_dataset(v) or is_stream(v) for v in pair):
        train, evaluation = pair
        if is_stream(train) or is_stream(evaluation):
            return train, evaluation
    elif is_stream(data):
        return data, None
    elif is_dataset(data):
        cut = len(data) - max(1, int(len(data) * EVAL_FRACTION))
        train, evaluation = (data, range(cut)), (data, range(cut, len(data)))
    else:
        return None
    for name, part in (("training", train), ("evaluation", evaluation)):
        size = len(part[1]) if isinstance(part, tuple) else len(part)
        if size < 1:
            raise ConfigError(f"{symbol(spec)}: the {name} dataset is empty: return one with samples")
    return train, evaluation


def symbol(spec: str) -> str:
    """How every error about the factory starts: the config line that names it."""
    return f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}"'


_NOT_THE_USERS = (str(PACKAGE) + os.sep,  # kfit's own code, Python's and installed packages'
                  *{sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})
_PACKAGES = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")  # a user site, a distro's


def _user_site(err: BaseException) -> str | None:
    """file:line of the innermost frame of the user's own code in err's traceback (not kfit's, not Python's
    or an installed package's), or None."""
    if isinstance(err, SyntaxError) and err.filename:
        return f"{err.filename}:{err.lineno}"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith((*_NOT_THE_USERS, "<"))
              and not any(part in f.filename for part in _PACKAGES)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def describe(err: BaseException) -> str:
    """An exception as one short line: its type, message and where in the user's code."""
    message = err.msg if isinstance(err, SyntaxError) and err.msg else str(err)
    message = " ".join(message.split())
    if len(message) > 300:
        message = message[:297] + "..."
    site = _user_site(err)
    return f"{type(err).__name__}: {message}" + (f" (at {site})" if site else "")


@contextlib.contextmanager
def calling(spec: str, what: str, fix: str):
    """Run the user's code: an exception it raises becomes one ConfigError naming the factory, what ran,
    the error with its place in the user's code, and the fix (not a traceback from deep in kfit or torch)."""
    try:
        yield
    except KfitError:
        raise
    except Exception as err:  # noqa: BLE001 - anything the user's code raises is the user's to fix
        raise ConfigError(f"{symbol(spec)}: {what} raised {describe(err)}: {fix}") from None


def load_factory(spec: str) -> Callable[[], object]:
    """Import `package.module:function`, with the current directory and the kfit checkout importable."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{symbol(spec)} must look like package.module:function")
    for path in (os.getcwd(), *([str(CHECKOUT)] if CHECKOUT else [])):  # the checkout: scripts/'s examples
        if path not in sys.path:
            sys.path.append(path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):  # the module itself (or its package) is not found
            raise ConfigError(f"{symbol(spec)}: cannot import {module_name}: {err}. "
                              "Put the module in the directory you run make from, or on PYTHONPATH") from None
        raise ConfigError(f"{symbol(spec)}: importing {module_name} raised {describe(err)}: install the missing "
                          "module, or fix the import") from None
    except Exception as err:  # noqa: BLE001 - a SyntaxError, or whatever the module runs on import
        raise ConfigError(f"{symbol(spec)}: importing {module_name} raised {describe(err)}: fix the module") from None
    target = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ConfigError(f"{symbol(spec)}: {module_name} has no {attr}")
    if not callable(target):
        raise ConfigError(f"{symbol(spec)}: {attr} is not callable")
    if source_file(target) is None:
        raise ConfigError(f"{symbol(spec)}: {spec} is built into Python or a compiled extension, not a model "
                          "factory: point it at a Python function of yours that takes no arguments and returns "
                          "(model, make_batch, loss_fn) (see scripts/custom_model_example.py)")
    return target


def source_file(factory) -> str | None:
    """The Python source file that defines the factory (its traces depend on it), or None."""
    try:
        return inspect.getsourcefile(inspect.getmodule(factory) or factory)
    except TypeError:  # built in, or compiled
        return None


def build_custom(spec: str) -> CustomModel:
    """Call the factory and check what it returned."""
    factory = load_factory(spec)
    with calling(spec, f"calling {spec}()", "fix the factory so that it takes no arguments and returns "
                 "(model, make_batch, loss_fn)"):
        result = factory()
    if isinstance(result, CustomModel):
        return result
    if not (isinstance(result, (tuple, list)) and len(result) in (3, 4)):
        raise ConfigError(f"{symbol(spec)} must return (model, make_batch or dataset, loss_fn) or (model, "
                          f"make_batch or dataset, loss_fn, metrics); it returned {type(result).__name__}"
                          + (f" of {len(result)}" if isinstance(result, (tuple, list)) else ""))
    model, data, loss_fn = result[:3]
    metrics = named(result[3], symbol(spec)) if len(result) == 4 else None
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{symbol(spec)}: the first value returned must be a "
                          f"torch.nn.Module, not {type(model).__name__}")
    datasets = datasets_of(data, spec)
    if datasets is None and not callable(data):
        raise ConfigError(f"{symbol(spec)}: the second value returned must be make_batch (a function), a "
                          f"map-style dataset or an IterableDataset (or a (train, eval) pair of them), not "
                          f"{type(data).__name__}")
    if not callable(loss_fn):
        raise ConfigError(f"{symbol(spec)}: loss_fn is not callable")
    return CustomModel(model, None if datasets else data, loss_fn, datasets, metrics)


_HOW: dict[tuple, object] = {}  # checkpointing_of's answers, by factory, its source and the class names


def checkpointing_of(config, model: torch.nn.Module | None = None):
    """How the factory's model checkpoints (lib/models/checkpointing.py's `find`, with the classes
    CONFIG_CHECKPOINT_MODULES names), or None where it cannot: found once per factory, its source file and
    those names. `model`: one the factory built already; else one is built under torch.device("meta")
    (a factory that cannot build there is called for real)."""
    from .checkpointing import find

    spec = config.custom_model_factory
    path = source_file(load_factory(spec))
    try:
        with open(path, "rb") as source:
            digest = hash(source.read())
    except (OSError, TypeError):
        digest = None
    key = (spec, digest, tuple(config.checkpoint_modules))
    if key not in _HOW:
        if model is None:
            try:
                with torch.device("meta"):
                    model = build_custom(spec).model
            except ConfigError:
                model = build_custom(spec).model
        _HOW[key] = find(model, tuple(config.checkpoint_modules))
    return _HOW[key]


CHECK_SAMPLES = 2  # a forward pass on two real samples: BatchNorm in training mode needs more than one


def check(custom: CustomModel, inputs: torch.Tensor, targets: torch.Tensor, spec: str) -> None:
    """One forward pass and loss on a few real samples, before anything is planned or trained: a mistake in
    the user's model or loss is one error line here, not a traceback from the fake-tensor tracer or the
    training loop. Changes nothing: the random state, the parameters and buffers are as they were."""
    model = custom.model
    name = type(model).__name__
    source = "make_batch" if custom.make_batch is not None else "the dataset"
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ConfigError(f"{symbol(spec)}: the model ({name}) has no trainable parameters, so there is nothing "
                          "to train: return a model with parameters (requires_grad=True)")
    x, y = inputs[:CHECK_SAMPLES].to(trainable[0].device), targets[:CHECK_SAMPLES].to(trainable[0].device)
    shape = f"inputs of shape {list(x.shape)} ({str(x.dtype).removeprefix('torch.')})"
    # buffers are copied: a BatchNorm's running statistics must not see the check's samples
    state = {**dict(model.named_parameters()), **{k: b.clone() for k, b in model.named_buffers()}}
    with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad():
        with calling(spec, f"the model's forward ({name}) on {shape} from {source}",
                     f"make the model accept {source}'s inputs (sample in dimension 0)"):
            outputs = torch.func.functional_call(model, state, (x,))
        with calling(spec, "loss_fn(outputs, targets)", "make loss_fn accept the model's outputs and "
                     f"{source}'s targets"):
            loss = custom.loss_fn(outputs, y)
    if not isinstance(loss, torch.Tensor):
        raise ConfigError(f"{symbol(spec)}: loss_fn returned {type(loss).__name__}, not a tensor: return the "
                          "loss as a scalar tensor (e.g. F.cross_entropy(outputs, targets))")
    if loss.dim() != 0:
        raise ConfigError(f"{symbol(spec)}: loss_fn returned a tensor of shape {list(loss.shape)}, not a scalar: "
                          "return the mean over the batch (e.g. .mean(), or reduction='mean')")
    if not loss.requires_grad:
        raise ConfigError(f"{symbol(spec)}: the loss does not depend on the model's parameters (it has no "
                          "gradient): compute it from the model's outputs, without .detach() or .item()")


def draw(make_batch: MakeBatch, samples: int, seed: int, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`samples` examples from make_batch with a generator seeded by `seed`, checked for shape."""
    with calling(spec, f"make_batch({samples}, generator)", "fix make_batch so that it returns (inputs, "
                 "targets) tensors with the sample in dimension 0"):
        batch = make_batch(samples, torch.Generator().manual_seed(seed))
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2
            and all(isinstance(t, torch.Tensor) for t in batch)):
        raise ConfigError(f"{symbol(spec)}: make_batch must return (inputs, targets) tensors")
    inputs, targets = batch
    if len(inputs) != samples or len(targets) != samples:
        raise ConfigError(f"{symbol(spec)}: make_batch({samples}, generator) returned "
                          f"{len(inputs)} inputs and {len(targets)} targets; both need {samples} in dimension 0")
    return inputs.cpu(), targets.cpu()


def first_batch(split, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The first CHECK_SAMPLES items of a dataset split, collated: an item kfit cannot batch is one error."""
    with calling(spec, f"collating the dataset's first {CHECK_SAMPLES} items", "return items that are "
                 "(input, target) tensor pairs of one shape, or dicts with one input and one target key"):
        inputs, targets = split[list(range(min(CHECK_SAMPLES, len(split))))]
    if not (isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor)):
        raise ConfigError(f"{symbol(spec)}: the dataset's items collate to {type(inputs).__name__} and "
                          f"{type(targets).__name__}, not tensors: return tensors (a Hugging Face dataset: "
                          "ds.with_format('torch'))")
    return inputs, targets
