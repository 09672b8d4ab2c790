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


# --------------------------------------------------------------------------
# Periodic checkpoints and resume
#
# A run directory holds checkpoint-<step>.pt while training (the newest
# CONFIG_CHECKPOINT_KEEP of them) and checkpoint.pt when it has finished: a
# directory without checkpoint.pt is an interrupted run that can be resumed.

FINAL = "checkpoint.pt"

# Symbols that do not change what is computed: a run may be resumed with other values of these.
# (The micro-batch policy and memory share only split the same effective batch differently; the
# effective batch itself is compared separately.)
NOT_TRAINING_MATH = ("RESUME", "MONITOR", "CHECKPOINT_", "PROBE_", "OOM_", "NPROC", "CPU_FALLBACK",
                     "LOG_INTERVAL", "EVAL_INTERVAL", "DATALOADER_WORKERS", "TIME_LIMIT", "OUTPUT_DIR",
                     "RUN_NAME", "MEMORY_PROFILE", "HYPER_PARAM_POLICY", "LR_FINDER_", "HPO_")


def periodic_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"checkpoint-{step}.pt"


def periodic_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of a run directory's periodic checkpoints, newest first."""
    found = []
    for path in Path(run_dir).glob("checkpoint-*.pt"):
        step = path.stem.removeprefix("checkpoint-")
        if step.isdigit():
            found.append((int(step), path))
    return sorted(found, reverse=True)


def prune(run_dir: Path, keep: int) -> None:
    for _, path in periodic_checkpoints(run_dir)[keep:]:
        path.unlink(missing_ok=True)


def latest_valid(run_dir: Path, log=print) -> tuple[Path, dict] | None:
    """The newest periodic checkpoint that loads; a truncated or corrupt one is reported and skipped."""
    for _, path in periodic_checkpoints(run_dir):
        try:
            return path, load_checkpoint(path)
        except Exception as err:  # noqa: BLE001 - any unreadable file means "use the previous one"
            log(f"warning: {path} is unreadable ({type(err).__name__}: {' '.join(str(err).split())[:160]}); "
                "it was probably cut short by a crash or a full disk: using the previous checkpoint")
    return None


def training_identity(config_text: str) -> list[str]:
    """The .config lines that decide the training math (comments and NOT_TRAINING_MATH symbols left out)."""
    lines = []
    for line in config_text.splitlines():
        line = line.strip()
        if line.startswith("# CONFIG_") and line.endswith(" is not set"):
            name = line[len("# CONFIG_"):-len(" is not set")]
        elif line.startswith("CONFIG_"):
            name = line[len("CONFIG_"):].split("=", 1)[0]
        else:
            continue
        if not name.startswith(NOT_TRAINING_MATH):
            lines.append(line)
    return sorted(lines)


def find_resumable(output_dir: Path, config_text: str, effective_batch: int, run_name: str = "",
                   log=print) -> Path | None:
    """The run directory of the latest unfinished run in output_dir (only RUN_NAME when that is set)
    whose config matches and whose effective batch is the same (as plan.json records it)."""
    base = Path(output_dir)
    runs = [base / run_name] if run_name else (sorted(base.iterdir()) if base.is_dir() else [])
    identity = training_identity(config_text)
    candidates = []
    for run_dir in runs:
        newest = periodic_checkpoints(run_dir) if run_dir.is_dir() else []
        if not newest or (run_dir / FINAL).exists() or not (run_dir / "config").is_file():
            continue
        if training_identity((run_dir / "config").read_text()) != identity:
            continue
        try:
            effective = json.loads((run_dir / "plan.json").read_text())["effective_batch"]
        except (OSError, ValueError, KeyError):
            continue
        if effective != effective_batch:
            log(f"note: not resuming {run_dir}: its effective batch was {effective}, this run's is "
                f"{effective_batch}")
            continue
        candidates.append((newest[0][1].stat().st_mtime, run_dir))
    return max(candidates)[1] if candidates else None
