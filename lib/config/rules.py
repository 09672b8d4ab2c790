"""The registry of option validators (lib/config/validators.py registers them, lib/config/options.py runs them):
the rules a Kconfig option has that Kconfig cannot state, and the numbers string symbols hold (Kconfig has no
float type)."""

from __future__ import annotations

import math
from typing import Any, Callable

# option name -> (value, the config's options) -> None, or a ConfigError naming the option and the fix
VALIDATORS: dict[str, Callable[[Any, Any], None]] = {}


def validator(name: str) -> Callable:
    """Register the function below as option `name`'s validator (run whenever a config is read)."""
    def register(check: Callable[[Any, Any], None]) -> Callable:
        VALIDATORS[name] = check
        return check
    return register


# option name -> its text -> its value: an option that holds a number in a string symbol reads as a float
CONVERTERS: dict[str, Callable[[str], float]] = {}


def number(name: str, *, low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False) -> None:
    """Option `name` (a string symbol) holds a number within these bounds: it reads as a float, and a value
    that is no number, not finite or out of the bounds is a ConfigError naming it and the range."""
    from .symbols import parse_number

    def convert(text: str) -> float:
        return parse_number(name.upper(), text, low=low, high=high, low_open=low_open, high_open=high_open)
    CONVERTERS[name] = convert
