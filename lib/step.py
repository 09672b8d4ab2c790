"""What one training step runs, built in one place: the optimizer, autocast, backends, seeding, and the forward
and loss (compiled as one graph where the plan compiles).

The trainer, the memory tracer (lib.memory), the LR finder and the probe all
build their step from these, so a trace counts exactly the optimizer state and
the autocast casts the trainer will run. lib.memory hashes this file into its
trace-cache key: editing it invalidates the cached traces.
"""

from __future__ import annotations

import contextlib
import random

import torch

from .redact import shown
from .config import Config
from .plan import Plan


# Where kfit runs torch's fused optimizer kernels: optimizer -> the device types. One kernel per step (CUDA) or
# per parameter (CPU) updates the parameters in place, where the foreach path launches several per list and
# allocates whole lists of temporaries, and torch's CPU default loops over the parameters in Python with about
# ten ops each: on this 2-core CPU, 2026-11-26, an AdamW step took 0.63 ms fused against 2.06 ms by default for
# LeNet-5 (10 tensors) and 4.1 against 15.9 ms for GPT-2-tiny (52, one thread); a tenth of LeNet-5's step
# (docs/benchmarks.md, make bench-loop). The same classes named through CONFIG_OPTIMIZER_NAME run fused alike.
# Other optimizers run torch's default: foreach (multi-tensor) on GPUs, as SGD did in the H100 memory
# measurements the planner is checked against (docs/validation/); its fused kernel waits for a GPU to measure.
FUSED = {"adam": ("cuda", "cpu"), "adamw": ("cuda", "cpu")}
_CLASSES = {"Adam": "adam", "AdamW": "adamw"}


def fused_on(config: Config, device_type: str) -> bool:
    """Whether the trainer's optimizer runs torch's fused kernel on `device_type` (FUSED, where this torch has
    fused kernels for the device). With fp16 GradScaler it hands the kernel the scale and the inf flag without
    reading them back. The memory tracer asks the same question (lib/memory/trace.py step_optimizer)."""
    kind = _CLASSES.get(config.optimizer_name or "") if config.optimizer == "custom" else config.optimizer
    return device_type in FUSED.get(kind, ()) and device_type in _fused_devices()


def _fused_devices() -> list[str]:
    """The device types this torch has fused optimizer kernels for."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    return _get_fused_kernels_supported_devices()


def _device_type_of(parameters: list[torch.nn.Parameter]) -> str | None:
    """The one device type every parameter is on, or None (none, or several)."""
    types = {p.device.type for p in parameters}
    return types.pop() if len(types) == 1 else None


def decay_groups(config: Config, model: torch.nn.Module) -> list[dict]:
    """The optimizer's two parameter groups: weight matrices and kernels decayed by CONFIG_WEIGHT_DECAY; biases
    and norm scales (fewer than two dimensions) not regularised, nor embedding tables (and an output layer
    tied to one) with CONFIG_WEIGHT_DECAY_EMBEDDINGS=n. Both in the model's parameter order."""
    embeddings = set() if config.weight_decay_embeddings else \
        {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.dim() >= 2 and id(p) not in embeddings]
    no_decay = [p for p in trained if p.dim() < 2 or id(p) in embeddings]
    return [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(config: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    groups = decay_groups(config, model)
    decay, no_decay = groups[0]["params"], groups[1]["params"]
    lr = config.learning_rate
    # fused where every parameter is on a device it runs on (FUSED); elsewhere torch's default
    device_type = _device_type_of(decay + no_decay)
    fused = {"fused": True} if device_type is not None and fused_on(config, device_type) else {}
    if config.optimizer == "custom":
        return named_optimizer(config.optimizer_name or "")(groups, lr=lr, **fused)
    if config.optimizer == "sgd":
        momentum = config.sgd_momentum or 0.0
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=momentum > 0)
    if config.optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr, **fused)
    return torch.optim.AdamW(groups, lr=lr, **fused)


# torch.optim classes kfit's loop cannot run, and why
NOT_RUNNABLE = {"LBFGS": "needs a closure that computes the loss again at every step, which kfit's training loop "
                         "does not give",
                "SparseAdam": "takes sparse gradients only, and kfit's models give dense ones"}


def named_optimizer(name: str):
    """CONFIG_OPTIMIZER_NAME as a callable (param_groups, lr=...) -> Optimizer: a torch.optim class by name, or
    package.module:function; anything else is a ConfigError naming the setting."""
    import importlib

    from .errors import ConfigError

    where = f'CONFIG_OPTIMIZER_NAME="{name}"'
    if ":" not in name:
        found = getattr(torch.optim, name, None)
        if name in NOT_RUNNABLE:
            raise ConfigError(f"{where}: {name} {NOT_RUNNABLE[name]}: choose another optimizer")
        if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
            known = sorted(n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)
                           and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
                           and n != "Optimizer" and n not in NOT_RUNNABLE)
            raise ConfigError(f"{where} is not a torch.optim optimizer: use one of {', '.join(known)}, or "
                              "package.module:function for one of your own")
    else:
        module, function = name.split(":", 1)
        try:
            found = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"{where} cannot be loaded ({type(err).__name__}: {err}): put the module on "
                              "Python's path (e.g. beside the config) and name a function in it") from None
        if not callable(found):
            raise ConfigError(f"{where} is not a function: name one that takes the parameter groups and lr=")

    def build(groups, lr, **fused):  # fused=True only for the torch classes FUSED names
        try:
            optimizer = found(groups, lr=lr, **fused)
        except (TypeError, ValueError, RuntimeError) as err:  # it refuses these parameters (Muon: matrices only)
            raise ConfigError(f"{where} refused the model's parameters ({type(err).__name__}: "
                              f"{shown(' '.join(str(err).split()), 200)}): choose another optimizer") from None
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"{where} returned {type(optimizer).__name__}, not a torch.optim.Optimizer")
        return optimizer
    return build


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def configure_backends(plan: Plan) -> None:
    torch.set_num_threads(plan.cpu_threads)  # lib.threads: idle cores / processes; more made steps 1.2-12x slower
    if plan.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = plan.tf32
        torch.backends.cudnn.allow_tf32 = plan.tf32
        torch.backends.cudnn.benchmark = plan.cudnn_benchmark


def autocast_for(plan: Plan):
    """The autocast context of the plan's precision (a no-op for fp32)."""
    if plan.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if plan.precision == "bf16" else torch.float16
    return torch.autocast(plan.device_type, dtype=dtype)


def forward_loss(model, loss_fn, plan: Plan):
    """x, y -> the loss of `model(x)` against y, compiled as one graph with the model where the plan compiles.

    Compiling the model alone leaves the loss eager: for a language model's cross-entropy that is the
    log-softmax of every logit in fp32 and its gradient, each a round trip through memory. Inductor fuses it
    with the head's output instead: GPT-2 124M on 50,304 tokens, bf16, an H100 (2026-11-26, docs/validation/
    diagnostics-2026-11-26/batch_sweep_loss.jsonl), a step at micro-batch 16 took 49.8 ms with the model
    compiled alone and 38.6 with its loss (8: 28.2 -> 24.2, 32: 91.6 -> 70.2).

    Compiling starts from no compiled state (torch.compiler.reset): dynamo keeps its graphs on this function's
    code, shared by every call, and once 8 models or shapes had been compiled there in one process (an HPO
    study's trials, the validation checks) it ran the 9th eager, with a logged warning and no error. So a
    run that probes (lib/probe.py, its own dynamic-batch graph) compiles once more for the trainer, which
    then runs a graph made for its micro-batch, as the step-time model's compiled figures were measured."""
    def step(x, y):
        return loss_fn(model(x), y)

    if not plan.compile:
        return step
    torch.compiler.reset()
    return torch.compile(step, mode=plan.compile_mode)
