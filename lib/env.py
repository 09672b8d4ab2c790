"""Variables from the environment, as make passes command-line variables (GPUS=, FREE_GB=, NNODES=, RESUME=,
DEVICE=): every one is parsed here, and a bad value is a KfitError naming the variable, the value and what
is accepted."""

from __future__ import annotations

import os
import re
from typing import Mapping, MutableMapping, Sequence

from .errors import KfitError
from .units import MAXIMA  # noqa: F401  (lib.env.MAXIMA: the bounds env_number checks)

TRUE = ("1", "y", "yes", "true", "on")
FALSE = ("0", "n", "no", "false", "off")


def environ() -> MutableMapping[str, str]:
    """This process's environment: the one place in lib/ outside the command line that reads it (what torchrun
    tells a rank, the cache directory, fault injection, the variables the command line passes down, and the C
    allocators' own variables, which lib/hardware/allocator.py reads and sets: PYTORCH_CUDA_ALLOC_CONF,
    MALLOC_*, KFIT_KEEP_MALLOC). It is os.environ itself: what is set in it, this process's libraries and
    children see."""
    return os.environ


def _get(name: str, env: Mapping[str, str] | None) -> str | None:
    value = (environ() if env is None else env).get(name)
    return value.strip() if value and value.strip() else None




_WHOLE = re.compile(r"[+-]?\d[\d_]*", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?", re.ASCII)


def out_of_range(text: str, kind: type[int] | type[float] = int) -> bool:
    """Whether `text`, which `kind` refused or took as infinite, is a numeral all the same: one of more digits
    than Python converts (4,300) or beyond a float, to be called out of range, not "not a number"."""
    return (_WHOLE if kind is int else _DECIMAL).fullmatch(text.strip()) is not None


def _digits(value: str) -> str:
    digits = sum(c.isdigit() for c in value)
    return f"{digits:,} digits" if "e" not in value.lower() else "beyond any number a float holds"


def env_number(name: str, kind: type[int] | type[float] = int, default=None, env: Mapping[str, str] | None = None,
               minimum: int | float | None = None, maximum: int | float | None = None):
    """The variable as a number, or `default` when unset or empty; a clear error when it is not a number, or
    lies below `minimum` or above `maximum` (default MAXIMA's bound for the name)."""
    from .redact import shown

    value = _get(name, env)
    if value is None:
        return default
    maximum = MAXIMA.get(name) if maximum is None else maximum
    whole = "a whole number" if kind is int else "a number"
    bounds = (f" from {minimum} to {maximum:,}" if minimum is not None and maximum is not None else
              f" >= {minimum}" if minimum is not None else f" <= {maximum:,}" if maximum is not None else "")
    quoted = f"'{shown(value, 40)}'"  # escaped and cut: a value never forges a line of output
    try:
        # ASCII only: Python reads Arabic-Indic and other digits as numbers too (GPUS=٣ planned 3 processes)
        number = kind(value) if value.isascii() else None
    except ValueError:
        number = None  # not a number, or a whole number of more digits than Python converts (4,300)
    if number is None or number in (float("inf"), float("-inf")):
        if out_of_range(value, kind):  # a numeral too long or too large to hold
            raise KfitError(f"{name}={quoted} is out of range ({_digits(value)}): give {whole}{bounds}")
        if number is None:
            raise KfitError(f"{name}={quoted} is not a number: give {whole}{bounds}")
    if number != number or number in (float("inf"), float("-inf")):
        raise KfitError(f"{name}={quoted} is not a finite number: give {whole}{bounds}")
    if minimum is not None and number < minimum:
        raise KfitError(f"{name}={quoted} is too small: give {whole}{bounds}")
    if maximum is not None and number > maximum:
        raise KfitError(f"{name}={quoted} is too large: give {whole}{bounds}")
    return number


def env_text(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable's text, stripped, or None when unset or empty."""
    return _get(name, env)


def env_utf8(name: str, default: str = "", env: Mapping[str, str] | None = None) -> str:
    """The variable as text kfit encodes (a prompt, not a path): unstripped, `default` when unset; a value that
    holds bytes that are not UTF-8 (Python keeps them as lone surrogates) is one clear error, not a traceback
    where it is encoded."""
    value = (environ() if env is None else env).get(name)
    if value is None:
        return default
    require_utf8(name, value)
    return value


def require_utf8(name: str, value: str) -> None:
    """A KfitError where `value` holds bytes that are not UTF-8 (Python keeps them as lone surrogates): text
    kfit writes into a config, a database or a prompt must be UTF-8 (a path need not be)."""
    from .redact import shown

    bad = next((i for i, c in enumerate(value) if "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        raise KfitError(f"{name}='{shown(value, 40)}' is not UTF-8 text (byte 0x{ord(value[bad]) & 0xff:02x} at "
                        f"character {bad + 1}): give it as UTF-8 (check the terminal's or the file's encoding)")


def env_choice(name: str, choices: Sequence[str], default: str, env: Mapping[str, str] | None = None) -> str:
    """The variable as one of `choices` (case-insensitive), or `default` when unset or empty."""
    value = _get(name, env)
    if value is None:
        return default
    if value.lower() not in choices:
        from .redact import shown

        raise KfitError(f"{name}='{shown(value, 40)}' is not accepted: choose one of {', '.join(choices)}")
    return value.lower()


def env_bool(name: str, default: bool | None = None, env: Mapping[str, str] | None = None) -> bool | None:
    """The variable as yes/no (1/0, y/n, yes/no, true/false, on/off), or `default` when unset or empty."""
    value = _get(name, env)
    if value is None:
        return default
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise KfitError(f"{name}={value!r} is neither yes nor no: give 1 (or y, yes, true, on) or 0 "
                    "(or n, no, false, off)")


def cache_dir() -> "Path":
    """kfit's cache: $KFIT_CACHE_DIR, else $XDG_CACHE_HOME/kfit, else ~/.cache/kfit (traces, measurements)."""
    from pathlib import Path

    if env_text("KFIT_CACHE_DIR"):
        return Path(env_text("KFIT_CACHE_DIR"))
    base = env_text("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kfit"
