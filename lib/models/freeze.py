"""Freezing parameters by name (CONFIG_FREEZE): a frozen parameter gets requires_grad=False.

So it gets no gradient, lib/step.py's optimizer (trainable parameters only) keeps no state for it, and
the memory tracer, which builds the model through the same Task, counts exactly that. Patterns match
parameter names fnmatch-style ("encoder.*", "*.bias"); a tied weight is matched under each of its names.
"""

from __future__ import annotations

import difflib
from fnmatch import fnmatchcase

from torch import nn

from ..errors import ConfigError

_WRAPPED = "_checkpoint_wrapped_module."  # PyTorch's checkpoint wrapper's prefix: not part of the model's names


def parameter_names(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) under every name a parameter has (tied weights twice), as the state_dict names it."""
    return [(name.replace(_WRAPPED, ""), p) for name, p in model.named_parameters(remove_duplicate=False)]


def _examples(pattern: str, names: list[str]) -> str:
    """A few real names near `pattern`, for the error."""
    near = difflib.get_close_matches(pattern, names, n=3, cutoff=0.3)
    picks = list(dict.fromkeys([*near, *names[:2], *names[-1:]]))[:5]
    return ", ".join(picks) + (f" ({len(names)} names in all)" if len(names) > len(picks) else "")


def freeze(model: nn.Module, patterns: tuple[str, ...], symbol: str = "CONFIG_FREEZE") -> int:
    """Freeze the parameters whose names match any of `patterns`; returns the number of scalars frozen.
    A pattern that matches no parameter, or patterns that leave nothing to train, are a ConfigError."""
    if not patterns:
        return 0
    named = parameter_names(model)
    names = list(dict.fromkeys(n for n, _ in named))
    text = f'{symbol}="{" ".join(patterns)}"'
    for pattern in patterns:
        if not any(fnmatchcase(n, pattern) for n in names):
            hint = (f" (a module's parameters: {pattern}.*)" if any(n.startswith(pattern + ".") for n in names)
                    else "")
            raise ConfigError(f"{text}: {pattern!r} matches no parameter of the model ({type(model).__name__}){hint}; "
                              f"its parameters are named like {_examples(pattern, names)}")
    frozen: dict[int, nn.Parameter] = {}
    for name, p in named:
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            p.requires_grad_(False)
            frozen[id(p)] = p
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"{text} freezes every parameter of the model ({type(model).__name__}), so there is "
                          "nothing to train: leave some parameters out of the patterns")
    return sum(p.numel() for p in frozen.values())


def trainable_parameters(model: nn.Module) -> int:
    """Scalars that train (a tied weight once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
