"""Strict readers of hand-written profile JSON: each error names the key, what
it must be, and how to fix the file.  Used by profile.py's from_dict."""

from __future__ import annotations

from typing import Any

from ..errors import HardwareError
from ..redact import escaped


_FIX = "fix the value, or regenerate the file with 'make check-hardware FORMAT=json > FILE'"


def bad_key(origin: str, key: str, problem: str) -> HardwareError:
    return HardwareError(f"{origin}: key '{key}' {problem}; {_FIX}.")


def describe_value(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def check_keys(origin: str, where: str, d: Any, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """d is an object with every key of `fields` (those in `optional` may be left out) and no other."""
    if not isinstance(d, dict):
        label = f"'{where}'" if where else "the top level"
        raise HardwareError(f"{origin}: {label} must be a JSON object, got {describe_value(d)}; {_FIX}.")
    prefix = f"{where}." if where else ""
    missing = [k for k in fields if k not in d and k not in optional]
    if missing:
        raise HardwareError(
            f"{origin}: key '{prefix}{missing[0]}' is missing"
            + (f" (also missing: {', '.join(prefix + k for k in missing[1:])})" if len(missing) > 1 else "")
            + f"; {_FIX}."
        )
    extra = sorted(str(k) for k in d if k not in fields)
    if extra:
        raise HardwareError(
            f"{origin}: key '{prefix}{extra[0]}' is not a profile field"
            + (f" (nor: {', '.join(prefix + k for k in extra[1:])})" if len(extra) > 1 else "")
            + f"; valid keys here: {', '.join(fields)}; {_FIX}."
        )


def read_int(origin: str, key: str, v: Any, *, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_key(origin, key, f"must be an integer, got {describe_value(v)}")
    if v < minimum:
        raise bad_key(origin, key, f"must be >= {minimum}, got {v}")
    return v


def read_str(origin: str, key: str, v: Any, *, optional: bool = False) -> str | None:
    """A string of the file, escaped as lib/redact.py's `escaped` (its control and format characters as \\n,
    \\x1b, \\u202e...): whatever prints it later shows one line of visible characters."""
    if v is None and optional:
        return None
    if not isinstance(v, str):
        want = "a string or null" if optional else "a string"
        raise bad_key(origin, key, f"must be {want}, got {describe_value(v)}")
    return escaped(v)  # a GPU's name is printed in many lines: never a line break, a terminal's escape or a hidden character


def read_bool(origin: str, key: str, v: Any, *, optional: bool = False) -> bool | None:
    if v is None and optional:
        return None
    if not isinstance(v, bool):
        want = "true, false or null" if optional else "true or false"
        raise bad_key(origin, key, f"must be {want}, got {describe_value(v)}")
    return v


def read_number(origin: str, key: str, v: Any, *, optional: bool = False) -> float | None:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        want = "a number >= 0 or null" if optional else "a number >= 0"
        raise bad_key(origin, key, f"must be {want}, got {describe_value(v)}")
    return float(v)


def read_list(origin: str, key: str, v: Any) -> list:
    if not isinstance(v, (list, tuple)):
        raise bad_key(origin, key, f"must be a list, got {describe_value(v)}")
    return list(v)
