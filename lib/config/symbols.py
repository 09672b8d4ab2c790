"""Readers of one symbol of a loaded Kconfig tree as a typed value: text, integer, bool, a choice's member;
and a number kept in a string symbol's text (Kconfig has no float type) with its range checked (parse_number). A value that does not take
is a ConfigError naming the symbol; a symbol that is hidden reads as None."""

from __future__ import annotations

import math
from typing import Mapping

import kconfiglib

from ..errors import ConfigError


def str_of(kconf, name: str) -> str | None:
    sym = kconf.syms[name]
    return sym.str_value if sym.visibility or sym.str_value else None


def int_of(kconf, name: str) -> int | None:
    sym = kconf.syms[name]
    # Base 10 as the C tools read it: "040" is forty, not an octal literal.
    return int(sym.str_value, 16 if sym.orig_type == kconfiglib.HEX else 10) if sym.str_value else None


def bool_of(kconf, name: str) -> bool:
    return kconf.syms[name].str_value == "y"


def choice_of(kconf, prefix: str, options: Mapping[str, str]) -> str | None:
    """The selected member of a choice, mapped to a short name; None if hidden."""
    for suffix, value in options.items():
        if bool_of(kconf, prefix + suffix):
            return value
    return None


def member_of(kconf, prefix: str) -> str | None:
    """The selected member of the choice whose members are all named PREFIX<NAME>, as <name> in lower case
    (CONFIG_MODEL_RESNET18 -> "resnet18"); None if hidden. The menu holds the names: the model choice's
    members are lib/models/registry.py's models, which tests/test_hygiene.py checks."""
    for choice in kconf.choices:
        if choice.syms and all(sym.name.startswith(prefix) for sym in choice.syms):
            return next((sym.name[len(prefix):].lower() for sym in choice.syms if sym.str_value == "y"), None)
    raise ConfigError(f"the Kconfig tree has no choice of {prefix}* symbols")


def parse_number(name: str, text: str, *, low: float, high: float = math.inf, low_open: bool = False,
                 high_open: bool = False) -> float:
    """CONFIG_<name>'s text as a finite number within its bounds, else a ConfigError naming it and the range."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f'CONFIG_{name}="{text}" is not a number: write it like 3e-4 or 0.1') from None
    if not math.isfinite(value):
        raise ConfigError(f'CONFIG_{name}="{text}" must be a finite number')
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if below or above:
        bound = f"{'>' if low_open else '>='} {low:g}"
        if high != math.inf:
            bound = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ConfigError(f'CONFIG_{name}="{text}" is out of range: it must be {bound}')
    return value
