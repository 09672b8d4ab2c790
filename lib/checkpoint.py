"""Atomic writes for run artifacts: a crash mid-write never damages the previous file.

Write to a temporary file in the same directory, fsync it, rename it over the
target (atomic on POSIX), then fsync the directory so the rename is durable.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import torch


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save a dict of tensors and plain Python values atomically (loadable with weights_only=True)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_bytes_atomic(path, buffer.getvalue())


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)
