"""Gradient checkpointing for any model: how a built model recomputes its activations, and the switch.

kfit's own models carry a `grad_checkpointing` attribute (GPT-2 and Llama per block, ResNet per stage).
A model from a factory (CONFIG_MODEL_CUSTOM) checkpoints, in this order of preference:

  own      it has a `grad_checkpointing` attribute too (kfit's convention): set it
  hf       a Hugging Face model with `supports_gradient_checkpointing`: its own switch, non-reentrant
  blocks   PyTorch's activation-checkpoint wrapper (non-reentrant) around its repeated blocks: the classes
           named in CONFIG_CHECKPOINT_MODULES, else the layers that a ModuleList or Sequential holds two or
           more of (the outermost such classes: a transformer's layers, not the attention inside them)

Naming classes in CONFIG_CHECKPOINT_MODULES chooses `blocks` over the model's own switch. A model with none
of these cannot checkpoint (a plain MLP: its layers are leaves, and recomputing a leaf saves nothing).
`find` answers from the model's structure only, so a model built under `torch.device("meta")` gives the
answer a real one does; lib/models/registry.py's `can_checkpoint` is the one place the rest of kfit asks.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from torch import nn

from ..errors import ConfigError

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)  # hold blocks; no computation of their own


@dataclass(frozen=True)
class Checkpointing:
    """How a model checkpoints: `kind` own | hf | blocks; `classes` the wrapped blocks' class names, with
    `count` instances in all (blocks only)."""

    kind: str
    classes: tuple[str, ...] = ()
    count: int = 0

    def describe(self) -> str:
        if self.kind == "own":
            return "the model's own grad_checkpointing switch"
        if self.kind == "hf":
            return "the Hugging Face model's own gradient checkpointing (non-reentrant)"
        return f"activation checkpointing around {self.count} blocks ({', '.join(self.classes)})"


def _wrapper_type():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    return ActivationWrapper


def _unwrapped(model: nn.Module):
    """(module, its parent's ModuleList/Sequential or None) for every module, the checkpoint wrappers
    seen through (a block inside one counts as the wrapper's place)."""
    wrapper = _wrapper_type()
    out = []

    def walk(module: nn.Module, container: nn.Module | None) -> None:
        if isinstance(module, wrapper):
            walk(module._checkpoint_wrapped_module, container)
            return
        out.append((module, container))
        for child in module.children():
            walk(child, module if isinstance(module, (nn.ModuleList, nn.Sequential)) else None)

    walk(model, None)
    return out


def repeated_blocks(model: nn.Module) -> tuple[str, ...]:
    """The classes of the outermost repeated blocks: a non-leaf, non-container class of which one ModuleList
    or Sequential holds two or more, not (every instance) inside another such block."""
    modules = _unwrapped(model)
    siblings = Counter((id(container), type(m)) for m, container in modules
                       if container is not None and not isinstance(m, _CONTAINERS) and any(True for _ in m.children())
                       and any(True for _ in m.parameters()))
    candidates = {cls for (_, cls), n in siblings.items() if n >= 2}
    if not candidates:
        return ()
    instances = [m for m, _ in modules if type(m) in candidates]
    inner = set()
    for block in instances:  # everything strictly inside a candidate block
        inner.update(id(m) for m, _ in _unwrapped(block)[1:])
    outer = {type(m) for m in instances if id(m) not in inner}
    return tuple(sorted({cls.__name__ for cls in outer}))


def module_classes(model: nn.Module) -> list[str]:
    """The model's module class names that could be checkpointed (non-leaf ones first), most frequent first."""
    counts = Counter((type(m).__name__, not any(True for _ in m.children())) for m, _ in _unwrapped(model)[1:]
                     if not isinstance(m, _CONTAINERS))
    return [name for (name, _leaf), _ in sorted(counts.items(), key=lambda kv: (kv[0][1], -kv[1], kv[0][0]))]


def find(model, classes: tuple[str, ...] = (), symbol: str = "CONFIG_CHECKPOINT_MODULES") -> Checkpointing | None:
    """How `model` checkpoints (module docstring), or None where it cannot. `classes`: the class names a
    config named; one that matches no module of the model is a ConfigError naming the classes it has."""
    if classes:
        have = Counter(type(m).__name__ for m, _ in _unwrapped(model)[1:])
        missing = [c for c in classes if c not in have]
        if missing:
            listed = module_classes(model)
            shown = ", ".join(listed[:12]) + (f" and {len(listed) - 12} more" if len(listed) > 12 else "")
            raise ConfigError(f'{symbol}="{" ".join(classes)}": the model ({type(model).__name__}) has no module of '
                              f"class {', '.join(missing)}: name classes it has: {shown or 'none'}")
        return Checkpointing("blocks", tuple(classes), sum(have[c] for c in classes))
    if hasattr(model, "grad_checkpointing"):
        return Checkpointing("own")
    if getattr(model, "supports_gradient_checkpointing", False) and (
            callable(getattr(model, "activation_checkpointing_enable", None))
            or callable(getattr(model, "gradient_checkpointing_enable", None))):
        return Checkpointing("hf")
    if not isinstance(model, nn.Module):
        return None
    blocks = repeated_blocks(model)
    if not blocks:
        return None
    count = sum(1 for m, _ in _unwrapped(model) if type(m).__name__ in blocks)
    return Checkpointing("blocks", blocks, count)


def switch(model: nn.Module, how: Checkpointing, on: bool) -> None:
    """Turn `model`'s checkpointing (as `find` said) on or off, in place. The parameters stay the same
    objects (an optimizer made before keeps them) and the state_dict's names stay the model's own."""
    if how.kind == "own":
        model.grad_checkpointing = on
    elif how.kind == "hf":
        _switch_hf(model, on)
    elif on:
        _wrap(model, set(how.classes))
    else:
        _unwrap(model)


def _switch_hf(model, on: bool) -> None:
    # transformers 5 renamed the switch (activation_checkpointing_*); the old names warn there
    new = hasattr(model, "activation_checkpointing_enable")
    if on:
        kwargs = {"use_reentrant": False}
        if new:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif new:
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def _wrap(model: nn.Module, classes: set[str]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

    wrapper = _wrapper_type()
    if any(isinstance(m, wrapper) for m in model.modules()):
        return  # on already
    wrap = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap,
                                   check_fn=lambda m: type(m).__name__ in classes and m is not model)


def _unwrap(model: nn.Module) -> None:
    wrapper = _wrapper_type()
    for module in list(model.modules()):
        for name, child in list(module._modules.items()):
            while isinstance(child, wrapper):
                child = child._checkpoint_wrapped_module
            if child is not module._modules[name]:
                module._modules[name] = child


def is_on(model: nn.Module, how: Checkpointing) -> bool:
    """Whether `model`'s checkpointing is on now."""
    if how.kind == "own":
        return bool(model.grad_checkpointing)
    if how.kind == "hf":
        return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
    wrapper = _wrapper_type()
    return any(isinstance(m, wrapper) for m in model.modules())



# --------------------------------------------------------------------------
# What a checkpointed built-in transformer recomputes (CONFIG_ACTIVATION_CHECKPOINT_*)

RECOMPUTE_POLICIES = ("full", "selective_op", "selective_layer")


@dataclass(frozen=True)
class Recompute:
    """How GPT-2's and Llama's blocks are checkpointed when checkpointing is on:

      full             every block recomputed in backward: only its input is kept
      selective_op     every block, but the outputs of the costly ops are kept (selective activation
                       checkpointing, torch.utils.checkpoint's policy contexts): every other matmul's and
                       every attention's, so backward recomputes the cheap ops and half the matmuls
      selective_layer  every `every`-th block recomputed in full, the others keep all they save
    """

    policy: str = "full"
    every: int = 2

    def __post_init__(self) -> None:
        if self.policy not in RECOMPUTE_POLICIES:
            raise ValueError(f"recompute policy {self.policy!r}: one of {', '.join(RECOMPUTE_POLICIES)}")
        if self.every < 1:
            raise ValueError(f"every {self.every}: at least 1")

    def checkpointed(self, index: int) -> bool:
        """Whether block `index` (from 0) is checkpointed at all."""
        return self.policy != "selective_layer" or (index + 1) % self.every == 0


def _kept_ops() -> frozenset:
    """The ops whose outputs selective_op keeps: the matmuls and every attention kernel torch may pick."""
    import torch

    aten = torch.ops.aten
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    return frozenset([*_matmuls(), *(getattr(aten, n).default for n in names if hasattr(aten, n))])


def _matmuls() -> tuple:
    """A Linear's matmul as autograd dispatches it: mm without a bias (Llama), addmm with one (GPT-2)."""
    import torch

    return torch.ops.aten.mm.default, torch.ops.aten.addmm.default


def _op_contexts():
    """A fresh policy for one checkpointed call: keep every attention's output and the matmuls' except every
    second one, counted from the block's start in forward and in the recompute alike (so the two agree)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    kept, mm = _kept_ops(), _matmuls()
    counts = {False: 0, True: 0}

    def policy(ctx, func, *args, **kwargs):
        if func in mm:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in kept else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def run_block(block, index: int, recompute: Recompute, *args):
    """Block `index` of a checkpointed transformer on `args`, as `recompute` says."""
    from torch.utils.checkpoint import checkpoint

    if not recompute.checkpointed(index):
        return block(*args)
    if recompute.policy == "selective_op":
        return checkpoint(block, *args, use_reentrant=False, context_fn=_op_contexts)
    return checkpoint(block, *args, use_reentrant=False)


__all__ = ["RECOMPUTE_POLICIES", "Checkpointing", "Recompute", "find", "is_on", "module_classes", "repeated_blocks", "run_block", "switch"]
