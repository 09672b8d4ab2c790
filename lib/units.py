"""Bytes as kfit prints them, in binary units: GiB is 2**30 bytes, MiB 2**20 (the unit names say so: kfit
never prints a decimal GB or MB for memory). Layer 1 (docs/architecture.md): it imports nothing from lib.

`format_bytes` is kfit's one byte formatter; `gib` the figure kfit prints and reads back (FREE_GB=, the
hardware profile's *_gb arguments) in GiB.
"""

from __future__ import annotations

MiB = 2**20
GiB = 2**30


def gib(n_bytes: int | float) -> float:
    """Bytes as GiB (2**30), the unit kfit prints and reads."""
    return n_bytes / GiB


def format_bytes(n_bytes: int | float, mib_decimals: int = 0, *, sep: str = "") -> str:
    """'1.23GiB' from a GiB up (two decimals), else '37MiB' with `mib_decimals` decimals ('37.1MiB' at 1);
    `sep` goes between the figure and the unit ('1.23 GiB' with sep=" ", as the HTML reports print).

    The GiB threshold is on the signed value: a negative figure prints in MiB ('-3072MiB')."""
    if n_bytes >= GiB:
        return f"{n_bytes / GiB:.2f}{sep}GiB"
    return f"{n_bytes / MiB:.{mib_decimals}f}{sep}MiB"
