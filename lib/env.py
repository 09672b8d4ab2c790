"""Numbers from the environment, as make passes command-line variables (GPUS=, FREE_GB=, NNODES=)."""

from __future__ import annotations

import os
from typing import Mapping

from .errors import KfitError


def env_number(name: str, kind: type[int] | type[float] = int, default=None, env: Mapping[str, str] | None = None):
    """The variable as a number, or `default` when unset or empty; a clear error when it is not a number."""
    value = (os.environ if env is None else env).get(name)
    if not value:
        return default
    try:
        return kind(value)
    except ValueError:
        raise KfitError(f"{name}={value!r} is not a {'whole ' if kind is int else ''}number") from None
