"""Strict readers of hand-written profile JSON: each error names the key, what
it must be, and how to fix the file.  Used by profile.py's from_dict.

Every number and string a profile gives is read here, and each has a range (the bounds below, stated once):
a value outside it is one HardwareError naming the key, showing the value escaped and cut, and saying what is
accepted - never a traceback (a 5,000-digit integer, NaN, Infinity) nor an absurd plan (10**40 bytes of RAM,
a 200,000-character GPU name echoed in every line that names the GPU)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import HardwareError
from ..redact import escaped, shown


_FIX = "fix the value, or regenerate the file with 'make check-hardware FORMAT=json > FILE'"

# --------------------------------------------------------------------------
# The bounds of a profile's values. Each is far above any machine that exists (so no real profile is refused)
# and far below what would make a plan absurd (a budget of 10**31 GiB, a float overflow, a line of megabytes).

# GPU memory and RAM, bytes: the largest GPU has 288 GB, the largest single machines 32-64 TiB of RAM.
MAX_MEMORY_BYTES = 4 * 2**50  # 4 PiB
# Free disk space, bytes: a parallel file system (Lustre, GPFS) mounted on a node reports hundreds of PB free.
MAX_DISK_BYTES = 2**60  # 1 EiB
# CPU cores and threads, and idle cores: the largest single-image machines have a few thousand.
MAX_CORES = 100_000
# GPUs in one machine (the profile's "gpus" list, GPUS=): servers hold 8 to 16, a rack-scale NVLink domain 72.
MAX_GPUS = 1024
# An NVIDIA compute capability's major and minor: 3.5 ... 12.0 so far.
MAX_CC_PART = 99
# A name, an architecture, a vendor, a version: "NVIDIA H100 80GB HBM3" is 21 characters.
MAX_NAME_CHARS = 200
# A note (a sentence naming GPUs and the fix) and the profile's source ("file:<path>", a path up to PATH_MAX).
MAX_TEXT_CHARS = 4200
# Notes: detection writes at most two per GPU and a few about the machine.
MAX_NOTES = 4 * MAX_GPUS
# What a profile's GPU speed figures may be at most: no GPU comes within a factor of ten of these (a B200's dense
# bf16 is 2,250 TFLOP/s, its HBM 7,700 GB/s, its power 1,000 W); a larger number is a typo, refused.
SPEED_LIMITS = {"fp32_tflops": 1e4, "tf32_tflops": 1e5, "half_tflops": 1e5, "fp8_tflops": 2e5, "bandwidth_gbs": 1e5,
                "link_gbs": 1e5, "tdp_watts": 1e4}

# Digits in the JSON text beyond which an integer is not made an int: no bound above has 20 digits, and Python
# refuses to convert more than 4,300 (a ValueError, not a JSON error); such a number is read as a LongNumber,
# which every reader refuses with the key's name.
MAX_INT_DIGITS = 100


class LongNumber:
    """An integer of more than MAX_INT_DIGITS digits in a profile's JSON text (json.loads' parse_int): out of
    range wherever it stands, refused by the reader of its key."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"<a {len(self.text.lstrip('-')):,}-digit integer>"


def parse_int(text: str) -> int | LongNumber:
    """json.loads' parse_int: an int, or a LongNumber where the digits are too many to be any profile's value."""
    return int(text) if len(text) <= MAX_INT_DIGITS else LongNumber(text)


def bad_key(origin: str, key: str, problem: str) -> HardwareError:
    return HardwareError(f"{origin}: key '{key}' {problem}; {_FIX}.")


def _int_text(v: int) -> str:
    """An int as text without converting an enormous one (Python refuses more than 4,300 digits)."""
    if v.bit_length() <= 200:  # up to 60 digits
        return f"{v:,}" if abs(v) >= 10**6 else str(v)
    digits = int(v.bit_length() * math.log10(2)) + 1  # within one of the exact count
    return f"{'a negative' if v < 0 else 'an'} integer of about {digits:,} digits"


def describe_value(value: Any) -> str:
    """A value of the file for a message: its type, and the value escaped and cut (never a traceback: not for a
    5,000-digit integer nor for a deeply nested list)."""
    if isinstance(value, LongNumber):
        return f"an integer of {len(value.text.lstrip('-')):,} digits ({shown(value.text, 20)})"
    if isinstance(value, bool) or value is None:
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, int):
        return f"int {_int_text(value)}"
    if isinstance(value, str):
        return f"str '{shown(value, 60)}'"
    if isinstance(value, float):
        return f"float {value!r}"  # nan, inf, 1e+40: short
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an enormous int inside, or nested too deeply
        text = f"of {len(value)} items" if hasattr(value, "__len__") else "?"
    return f"{type(value).__name__} {shown(text, 60)}"


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
        named = [prefix + shown(k, 40) for k in extra[:4]]  # a key of the file: escaped, cut, a few of them
        more = f" and {len(extra) - 4:,} more" if len(extra) > 4 else ""
        raise HardwareError(
            f"{origin}: key '{named[0]}' is not a profile field"
            + (f" (nor: {', '.join(named[1:])}{more})" if len(extra) > 1 else "")
            + f"; valid keys here: {', '.join(fields)}; {_FIX}."
        )


def _range(minimum: float, maximum: float, unit: str, above: bool = False) -> str:
    def text(n: float) -> str:
        return f"{n:,}" if isinstance(n, int) else f"{n:g}"

    low = f"above {text(minimum)}" if above else f"at least {text(minimum)}"
    return f"{low} and at most {text(maximum)}" + (f" ({unit})" if unit else "")


def read_int(origin: str, key: str, v: Any, *, minimum: int = 0, maximum: int, unit: str = "") -> int:
    """An integer from `minimum` to `maximum`; `unit` says what the bound is in words ("bytes, 4 PiB")."""
    if isinstance(v, LongNumber):
        raise bad_key(origin, key, f"must be {_range(minimum, maximum, unit)}, got {describe_value(v)}")
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_key(origin, key, f"must be an integer, got {describe_value(v)}")
    if not minimum <= v <= maximum:
        raise bad_key(origin, key, f"must be {_range(minimum, maximum, unit)}, got {_int_text(v)}")
    return v


def read_str(origin: str, key: str, v: Any, *, optional: bool = False,
             max_chars: int = MAX_NAME_CHARS) -> str | None:
    """A string of the file of at most `max_chars` characters, escaped as lib/redact.py's `escaped` (its control
    and format characters as \\n, \\x1b, \\u202e...): whatever prints it later shows one line of visible
    characters, of a bounded length."""
    if v is None and optional:
        return None
    if not isinstance(v, str):
        want = "a string or null" if optional else "a string"
        raise bad_key(origin, key, f"must be {want}, got {describe_value(v)}")
    if len(v) > max_chars:
        raise bad_key(origin, key, f"must be at most {max_chars:,} characters, got {len(v):,}: "
                      f"'{shown(v, 60)}'")
    return escaped(v)  # a GPU's name is printed in many lines: never a line break, a terminal's escape or a hidden character


def read_bool(origin: str, key: str, v: Any, *, optional: bool = False) -> bool | None:
    if v is None and optional:
        return None
    if not isinstance(v, bool):
        want = "true, false or null" if optional else "true or false"
        raise bad_key(origin, key, f"must be {want}, got {describe_value(v)}")
    return v


def read_number(origin: str, key: str, v: Any, *, optional: bool = False, maximum: float, minimum: float = 0.0,
                above: bool = False, unit: str = "") -> float | None:
    """A finite number from `minimum` (or `above` it) to `maximum`: NaN, Infinity and -Infinity (which JSON as
    Python reads it allows) are refused like any other value out of range."""
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, LongNumber)):
        want = "a number or null" if optional else "a number"
        raise bad_key(origin, key, f"must be {want}, got {describe_value(v)}")
    if isinstance(v, LongNumber) or (isinstance(v, float) and not math.isfinite(v)) \
            or not (minimum < v if above else minimum <= v) or v > maximum:
        what = _range(minimum, maximum, unit, above) + (", or null" if optional else "")
        raise bad_key(origin, key, f"must be {what}, got {describe_value(v)}")
    return float(v)


def read_list(origin: str, key: str, v: Any, *, max_items: int) -> list:
    if not isinstance(v, (list, tuple)):
        raise bad_key(origin, key, f"must be a list, got {describe_value(v)}")
    if len(v) > max_items:
        raise bad_key(origin, key, f"must have at most {max_items:,} items, got {len(v):,}")
    return list(v)
