"""Shared handling of user-supplied data paths, so every source reports problems alike."""

import gzip
import zlib
from pathlib import Path

from ..errors import DataError
from .. import fileio
from ..fileio import MISSING, what_is


def data_directory(data_dir: str | None, holding: str) -> Path:
    """Return data_dir as an existing, non-empty directory; `holding` says what belongs in it."""
    fix = f"set CONFIG_DATA_DIR to a directory holding {holding}"
    if not data_dir:
        raise DataError(f"no data directory given: {fix}")
    path = Path(data_dir).expanduser()
    kind = what_is(path)
    if kind == MISSING:
        raise DataError(f"data directory {path} does not exist: {fix}")
    if kind is not None:  # a looping or dangling link, a FIFO: what it is, not "does not exist"
        raise DataError(f"data directory {path} is {kind}; {fix}")
    if not path.is_dir():
        raise DataError(f"data directory {path} is not a directory: {fix}")
    if not any(path.iterdir()):
        raise DataError(f"data directory {path} is empty: {fix}")
    return path


def read_bytes(path: Path) -> bytes:
    """Read a whole file, gunzipping it when the name ends in .gz."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return fileio.read_bytes(path)
    except (OSError, EOFError, zlib.error) as e:  # gzip reports truncation as EOFError
        raise DataError(f"cannot read {path} ({e}): replace it with an intact copy") from e
