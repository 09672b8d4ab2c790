"""The registry of option validators (lib/config/validators.py registers them, lib/config/options.py runs them):
the rules a Kconfig option has that Kconfig cannot state."""

from __future__ import annotations

from typing import Any, Callable

# option name -> (value, the config's options) -> None, or a ConfigError naming the option and the fix
VALIDATORS: dict[str, Callable[[Any, Any], None]] = {}


def validator(name: str) -> Callable:
    """Register the function below as option `name`'s validator (run whenever a config is read)."""
    def register(check: Callable[[Any, Any], None]) -> Callable:
        VALIDATORS[name] = check
        return check
    return register
