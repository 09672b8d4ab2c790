"""Atomic writes for run artifacts: a crash mid-write never damages the previous file.

Write to a temporary file in the same directory, fsync it, rename it over the
target (atomic on POSIX), then fsync the directory so the rename is durable.
A sharded run (FSDP) saves a directory with torch.distributed.checkpoint, every
process writing its shard into a temporary directory that rank 0 renames once
all have finished (`save_sharded`): an interrupted save leaves the previous
checkpoint as the newest.
"""

from __future__ import annotations

import io
import json
import os
import shutil
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
    _fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save a dict of tensors and plain Python values atomically (loadable with weights_only=True)."""
    write_bytes_atomic(path, _saved(state))


def _saved(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _fsync_dir(path: Path) -> None:
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# --------------------------------------------------------------------------
# Sharded checkpoints: a directory of torch.distributed.checkpoint files plus EXTRA, rank 0's
# torch.save of everything that is not sharded (progress, RNG, scaler, config, plan).

SHARDED_SUFFIX = ".dcp"
EXTRA = "extra.pt"
_DCP_METADATA = ".metadata"


def is_sharded_checkpoint(path: Path) -> bool:
    return Path(path).suffix == SHARDED_SUFFIX


def save_sharded(path: Path, tensors: dict, extra: dict, *, is_main: bool, barrier) -> None:
    """Every process writes its shards of `tensors` (torch.distributed.checkpoint) and rank 0 `extra`,
    into a temporary directory that becomes `path` only after all of them have finished."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # a save a crash interrupted
        tmp.mkdir(parents=True)
    barrier()
    dcp.save(tensors, checkpoint_id=str(tmp))
    barrier()
    if is_main:
        write_bytes_atomic(tmp / EXTRA, _saved(extra))
        for name in os.listdir(tmp):
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        old = path.with_name(f".{path.name}.old")
        if path.exists():  # a directory cannot be renamed over a full one: move it aside first
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        shutil.rmtree(old, ignore_errors=True)
    barrier()


def load_sharded_tensors(path: Path, tensors: dict) -> None:
    """Fill `tensors` (state dicts as torch.distributed.checkpoint.state_dict.get_state_dict gives them:
    sharded, or whole in a single process) from a sharded checkpoint, resharding to this world size."""
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(tensors, checkpoint_id=str(path))


def remove(path: Path) -> None:
    """Delete a checkpoint file or a sharded checkpoint directory."""
    if Path(path).is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict:
    """A checkpoint's contents; for a sharded one, everything but the sharded tensors (`load_sharded_tensors`),
    with "sharded": True. Raises when the directory lacks its metadata (an unfinished save)."""
    path = Path(path)
    if path.is_dir():
        if not (path / _DCP_METADATA).is_file():
            raise FileNotFoundError(f"{path / _DCP_METADATA} is missing")
        return {**torch.load(path / EXTRA, map_location="cpu", weights_only=True), "sharded": True}
    return torch.load(path, map_location="cpu", weights_only=True)


# --------------------------------------------------------------------------
# Periodic checkpoints and resume
#
# A run directory holds checkpoint-<step>.pt while training (the newest
# CONFIG_CHECKPOINT_KEEP of them; checkpoint-<step>.dcp/ directories when
# sharded) and checkpoint.pt (checkpoint.dcp/) when it has finished: a
# directory without either is an interrupted run that can be resumed.

FINAL = "checkpoint.pt"
FINAL_SHARDED = "checkpoint" + SHARDED_SUFFIX
# A sharded run that ran out of memory: the micro-batch its relaunch takes (lib/trainer/stepper.py). FSDP's
# collectives run inside every forward and backward, so one rank cannot redo a step alone as DDP's can.
OOM_MARKER = "oom.json"

# Symbols that do not change what is computed: a run may be resumed with other values of these.
# (The micro-batch policy and memory share only split the same effective batch differently; the
# effective batch itself is compared separately.)
NOT_TRAINING_MATH = ("RESUME", "MONITOR", "CHECKPOINT_", "PROBE_", "OOM_", "NPROC", "CPU_FALLBACK",
                     "LOG_INTERVAL", "EVAL_INTERVAL", "DATALOADER_WORKERS", "TIME_LIMIT", "OUTPUT_DIR",
                     "RUN_NAME", "MEMORY_PROFILE", "HYPER_PARAM_POLICY", "LR_FINDER_", "HPO_",
                     "PARALLEL_", "FSDP_")  # sharding changes where tensors live, not the math


def periodic_path(run_dir: Path, step: int, sharded: bool = False) -> Path:
    return Path(run_dir) / f"checkpoint-{step}{SHARDED_SUFFIX if sharded else '.pt'}"


def final_path(run_dir: Path, sharded: bool = False) -> Path:
    return Path(run_dir) / (FINAL_SHARDED if sharded else FINAL)


def finished_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint of a finished run (either format), None while it is unfinished."""
    return next((p for p in (final_path(run_dir), final_path(run_dir, True)) if p.exists()), None)


def periodic_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of a run directory's periodic checkpoints (files and sharded directories), newest first.
    A run resumed on another number of processes may hold both kinds."""
    found = []
    for path in [*Path(run_dir).glob("checkpoint-*.pt"), *Path(run_dir).glob("checkpoint-*" + SHARDED_SUFFIX)]:
        step = path.stem.removeprefix("checkpoint-")
        if step.isdigit():
            found.append((int(step), path))
    return sorted(found, reverse=True)


def prune(run_dir: Path, keep: int) -> None:
    for _, path in periodic_checkpoints(run_dir)[keep:]:
        remove(path)


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
        marker = run_dir / OOM_MARKER  # out of memory before its first checkpoint: restarts in place
        if (not newest and not marker.is_file()) or finished_checkpoint(run_dir) or not (run_dir / "config").is_file():
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
        candidates.append(((newest[0][1] if newest else marker).stat().st_mtime, run_dir))
    return max(candidates)[1] if candidates else None


def oom_marker_since(output_dir: Path, since: float) -> dict | None:
    """The out-of-memory marker a sharded run wrote in output_dir at or after `since` (a time.time())."""
    base = Path(output_dir)
    found = [m for m in base.glob(f"*/{OOM_MARKER}") if m.stat().st_mtime >= since] if base.is_dir() else []
    if not found:
        return None
    try:
        return json.loads(max(found, key=lambda m: m.stat().st_mtime).read_text())
    except (OSError, ValueError):
        return None
