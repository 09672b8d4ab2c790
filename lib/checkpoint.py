"""Atomic writes for run artifacts: a crash mid-write never damages the previous file.

Every file goes through lib.fileio.write_atomic (a temporary file beside the target, fsynced, renamed
over it, the directory fsynced). A sharded run (FSDP) saves a directory with torch.distributed.checkpoint,
every process writing its shard into a temporary directory that rank 0 renames once all have finished
(`save_sharded`): an interrupted save leaves the previous checkpoint as the newest. A full disk while
writing a run's files is one error line with the fix (`full_disk_is_an_error`), never a traceback. Before a
resume loads a checkpoint, `verify_integrity` checks its bytes (every zip member's CRC; a sharded checkpoint's
metadata and the files it names), and the resume renames one that fails aside (`set_aside`, <name>.damaged).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import stat
import shutil
import zipfile
from pathlib import Path
from typing import Callable

import torch

from .redact import shown
from . import fileio
from .errors import KfitError
from .config.typed import LADDER_RUNGS


def write_text_atomic(path: Path, text: str) -> None:
    """Run-directory files are never written through a link planted in their place (a shared OUTPUT_DIR)."""
    fileio.write_atomic(path, text.encode(), follow_symlinks=False)


write_json_atomic = fileio.write_json_atomic  # indented, sorted keys, never through a link


def save_checkpoint(path: Path, state: dict) -> None:
    """torch.save a dict of tensors and plain Python values atomically (loadable with weights_only=True)."""
    fileio.write_atomic(path, _saved(state), follow_symlinks=False)


def save_run_checkpoint(path: Path, state: dict, make_room: Callable[[int], bool] | None = None) -> None:
    """save_checkpoint for a training run. Short of room (the disk's free space below the checkpoint's size
    before writing, or a write that fails for want of room), `make_room(needed)` deletes one file that may go
    (True when it did; `room_maker`) and the write is tried again, until it fits or nothing more may go;
    still out of room, a KfitError says how much is needed and where."""
    data = _saved(state)
    with full_disk_is_an_error(path, len(data)):
        while make_room is not None and fileio.free_bytes(Path(path).parent) < len(data) and make_room(len(data)):
            pass
        while True:
            try:
                fileio.write_atomic(path, data, follow_symlinks=False)
                return
            except OSError as err:
                # a full disk or quota; a file size limit (EFBIG) is not helped by deleting anything
                if err.errno not in (errno.ENOSPC, errno.EDQUOT) or make_room is None or not make_room(len(data)):
                    raise


@contextlib.contextmanager
def full_disk_is_an_error(path: Path, needed: int | None = None):
    """Around writing a run's file: no room to write it (disk, quota or file size limit; an OSError, or one
    that torch.distributed.checkpoint wraps) becomes one KfitError naming the directory, the bytes, what
    survived and the fix."""
    try:
        yield
    except BaseException as caught:
        err = fileio.no_room(caught)
        if err is None:
            raise
        directory = Path(path).parent
        # a small file's sizes to a tenth of a MiB: "1MiB needed, 1MiB free" and "free at least 0MiB" said nothing
        decimals = 1 if needed and needed < 100 * 2**20 else 0
        try:
            free = shutil.disk_usage(directory).free
            room = f"{fileio.format_bytes(free, decimals)} free"
        except OSError:
            free, room = None, "free space unknown"
        need = f"{fileio.format_bytes(needed, decimals)} needed, " if needed else ""
        kept = periodic_checkpoints(directory) or [(0, p) for p in [finished_checkpoint(directory)] if p]
        intact = f"; the earlier checkpoints are intact (newest: {kept[0][1].name})" if kept else ""
        # the shortfall rounded up to a whole MiB, never "0MiB"
        short = -(-(needed - free) // 2**20) * 2**20 if needed and free is not None and needed > free else 0
        more = f"at least {fileio.format_bytes(short)} " if short else ""
        fix = ("raise the file size limit ('ulimit -f')" if err.errno == errno.EFBIG else
               f"free {more}space in {directory}, or set CONFIG_OUTPUT_DIR to a disk with room")
        raise KfitError(f"no room to write {Path(path).name} in {directory} ({need}{room}; {err.strerror}){intact}: "
                        f"{fix}; 'make train' then resumes") from None


def _saved(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


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
    into a temporary directory that becomes `path` only after all of them have finished. Out of room (either
    writer, on any rank): the temporary directory goes and the one error line of `full_disk_is_an_error`."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # a save a crash interrupted
        tmp.mkdir(parents=True)
    barrier()
    try:
        with full_disk_is_an_error(path):  # a rank's failure in dcp.save reaches every rank (CheckpointException)
            dcp.save(tensors, checkpoint_id=str(tmp))
            barrier()
            if is_main:
                fileio.write_atomic(tmp / EXTRA, _saved(extra), follow_symlinks=False)
                for name in os.listdir(tmp):
                    with open(tmp / name, "rb") as f:
                        os.fsync(f.fileno())
    except KfitError:
        if is_main:  # out of room: what was written goes
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if is_main:
        old = path.with_name(f".{path.name}.old")
        if path.exists():  # a directory cannot be renamed over a full one: move it aside first
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        fileio.fsync_dir(path.parent)
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
    """Delete a checkpoint file or a sharded checkpoint directory (a link in its place as a link, never followed)."""
    if Path(path).is_dir() and not Path(path).is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)


def load_checkpoint(path: Path, verify: bool = False) -> dict:
    """A checkpoint's contents; for a sharded one, everything but the sharded tensors (`load_sharded_tensors`),
    with "sharded": True. Raises when the directory lacks its metadata (an unfinished save). `verify`: its bytes
    checked first (`verify_integrity`: DamagedCheckpoint when they are not those written)."""
    path = Path(path)
    if not path.is_dir() and path.exists() and not stat.S_ISREG(os.stat(path).st_mode):
        # before any read (the integrity check's too): a FIFO would block it for ever
        raise fileio.unsafe(path, fileio.what_is(path) or "not a regular file", reading=True)
    if verify:
        verify_integrity(path)
    if path.is_dir():
        if not (path / _DCP_METADATA).is_file():
            raise FileNotFoundError(f"{path / _DCP_METADATA} is missing")
        return {**torch.load(path / EXTRA, map_location="cpu", weights_only=True), "sharded": True}
    return torch.load(path, map_location="cpu", weights_only=True)


# --------------------------------------------------------------------------
# Integrity: a checkpoint's bytes are those written, checked before anything is loaded from it on resume.
# torch.load checks no CRC: a flipped byte in a tensor loads as a wrong number (and the run ends in NaN).

class DamagedCheckpoint(Exception):
    """A checkpoint whose bytes are not those written: a zip member that fails its CRC-32, a sharded checkpoint's
    metadata naming a file that is missing or shorter than it says. The message is one phrase ("its member
    archive/data/3 fails its CRC check: ...")."""


# Files checked whole in this process, by path: (device, inode, size, mtime) then. RESUME_FROM's checkpoint is
# checked by resume_point and again by the restore: the second time costs a stat.
_INTACT: dict[str, tuple] = {}


def verify_integrity(path: Path) -> None:
    """Raise DamagedCheckpoint (or what opening it raises: OSError, zipfile.BadZipFile) unless the checkpoint's
    bytes are those written.

    A single file (torch.save's zip): every member read and compared with its CRC-32 (zipfile's testzip),
    which reads the whole file once: measured 0.41-0.51 s per GiB on a 2-core x86 VM (a 1 GiB torch.save file
    in the page cache, 2026-11, torch 2.13, Python 3.11; zlib.crc32 alone is 0.38 s/GiB there), beside
    torch.load's own 0.16-0.75 s/GiB of the same file; the file is then in the page cache for the load that
    follows. The zip fields torch's reader heeds but no CRC covers are checked too (a member marked a
    directory, a stored member with two sizes): flipping every such byte of a LeNet-5 checkpoint five ways
    found no other change that loads other numbers. A sharded directory (torch.distributed.checkpoint):
    its .metadata read, every file it names present in the directory and at least as long as the last byte
    the metadata places in it, and extra.pt's members checked as above (the shard files carry no checksums).
    """
    path = Path(path)
    if path.is_dir():
        _verify_sharded(path)
    else:
        _verify_zip(path)


def _verify_zip(path: Path) -> None:
    seen = os.stat(path)
    key = (seen.st_dev, seen.st_ino, seen.st_size, seen.st_mtime_ns)
    if _INTACT.get(str(path)) == key:
        return
    with zipfile.ZipFile(path) as archive:
        if not archive.namelist():
            raise DamagedCheckpoint("it is an empty zip, not torch.save's")
        for info in archive.infolist():
            # Fields the CRC does not cover that torch's reader (miniz) heeds and Python's does not: an entry
            # marked a directory (the DOS attribute bit) loads as nothing, so its tensor's bytes are left unread;
            # a stored entry whose sizes differ is cut or padded.
            if info.filename.endswith("/") or info.external_attr & 0x10:
                raise DamagedCheckpoint(f"its member {info.filename} is marked a directory")
            if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
                raise DamagedCheckpoint(f"its member {info.filename} gives two sizes ({info.compress_size} and "
                                        f"{info.file_size} bytes)")
        bad = archive.testzip()  # the first member whose data fails its CRC-32 or its header
    if bad is not None:
        raise DamagedCheckpoint(f"its member {bad} fails its CRC check: its bytes changed after it was written")
    _INTACT[str(path)] = key


class _MetadataUnpickler(pickle.Unpickler):
    """torch.distributed.checkpoint pickles its .metadata; dcp.load unpickles it with no restriction, so a file
    planted in a run directory could run code. kfit reads it first with only what a Metadata holds (its own
    classes and enums, torch's dtypes and Size, a few containers), and dcp.load sees only files that passed."""

    SAFE_BUILTINS = frozenset({"set", "frozenset", "slice", "complex", "bytearray", "range"})
    # the writer's record of where each item lies, and the checkpoint's own path (StorageMeta.checkpoint_id)
    SAFE_NAMES = frozenset({("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("pathlib", "PosixPath"),
                            ("pathlib", "PurePosixPath"), ("pathlib", "Path")})

    def find_class(self, module: str, name: str):
        import torch

        import torch.distributed.checkpoint.metadata as dcp_metadata

        allowed = ((module == dcp_metadata.__name__ and isinstance(getattr(dcp_metadata, name, None), type))
                   or (module, name) in self.SAFE_NAMES
                   or (module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None),
                                                                            (torch.dtype, torch.layout,
                                                                             torch.memory_format))))
                   or (module, name) == ("torch.serialization", "_get_layout")  # a layout by its name
                   or (module == "collections" and name in ("OrderedDict", "defaultdict"))
                   or (module == "builtins" and name in self.SAFE_BUILTINS))
        if not allowed:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no checkpoint's metadata holds")
        return super().find_class(module, name)


def sharded_metadata(path: Path):
    """A sharded checkpoint's torch.distributed.checkpoint Metadata (its .metadata file), unpickled with only the
    types a Metadata holds (_MetadataUnpickler): DamagedCheckpoint for anything else."""
    from torch.distributed.checkpoint.metadata import Metadata

    where = Path(path) / _DCP_METADATA
    if not where.is_file():
        raise FileNotFoundError(f"{where} is missing")
    try:
        metadata = _MetadataUnpickler(io.BytesIO(fileio.read_bytes(where, follow_symlinks=False))).load()
    except fileio.UnsafeFileError:
        raise
    except Exception as err:  # noqa: BLE001 - any unpickling failure: not the metadata torch wrote
        raise DamagedCheckpoint(f"its .metadata cannot be read as torch's ({type(err).__name__}: "
                                f"{shown(' '.join(str(err).split()), 160)})") from None
    if not isinstance(metadata, Metadata):
        raise DamagedCheckpoint(f"its .metadata holds a {type(metadata).__name__}, not torch's Metadata")
    return metadata


def _verify_sharded(path: Path) -> None:
    metadata = sharded_metadata(path)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict) or not storage:
        raise DamagedCheckpoint("its .metadata places no data in any file")
    ends: dict[str, int] = {}
    for info in storage.values():
        name, offset, length = (getattr(info, k, None) for k in ("relative_path", "offset", "length"))
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise DamagedCheckpoint(f"its .metadata names the file {name!r}, not one in the directory")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (offset, length)):
            raise DamagedCheckpoint(f"its .metadata places data in {name} at {offset!r}+{length!r}")
        ends[name] = max(ends.get(name, 0), offset + length)
    for name, end in sorted(ends.items()):
        shard = path / name
        if shard.is_symlink() or not shard.is_file():
            raise DamagedCheckpoint(f"its shard file {name} is missing")
        size = shard.stat().st_size
        if size < end:
            raise DamagedCheckpoint(f"its shard file {name} holds {size} bytes, its .metadata {end}")
    _verify_zip(path / EXTRA)


DAMAGED_SUFFIX = ".damaged"


def set_aside(path: Path) -> Path:
    """Rename a checkpoint the resume passes by (damaged, unreadable or not this run's) to <name>.damaged
    (.damaged-2, ... when that is taken): out of the resume search and the rotation, never deleted (a person
    may still want it); returns the new path. Raises OSError where it cannot be renamed."""
    path = Path(path)
    target, n = path.with_name(path.name + DAMAGED_SUFFIX), 1
    while os.path.lexists(target):
        n += 1
        target = path.with_name(f"{path.name}{DAMAGED_SUFFIX}-{n}")
    os.rename(path, target)
    with contextlib.suppress(OSError):
        fileio.fsync_dir(path.parent)
    return target


# --------------------------------------------------------------------------
# Periodic checkpoints and resume: a run directory holds checkpoint-<step>.pt while training (the newest
# CONFIG_CHECKPOINT_KEEP of them; checkpoint-<step>.dcp/ directories when sharded) and checkpoint.pt
# (checkpoint.dcp/) when it has finished: a directory without either is an interrupted run that can be resumed.

FINAL = "checkpoint.pt"
FINAL_SHARDED = "checkpoint" + SHARDED_SUFFIX
# A sharded run that ran out of memory: the micro-batch its relaunch takes (lib/trainer/recovery.py). FSDP's
# collectives run inside every forward and backward, so one rank cannot redo a step alone as DDP's can.
OOM_MARKER = "oom.json"
# A run started from trained weights (INIT_FROM): where they came from. The resume search passes such a run
# by, since a fresh run of the same config starts elsewhere; RESUME_FROM=<its directory> continues it.
INIT_RECORD = "init_from.json"



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


def best_path(run_dir: Path, step: int, sharded: bool = False) -> Path:
    """A best-k checkpoint (CONFIG_CHECKPOINT_BEST_KEEP): named apart from checkpoint-<step>, so neither the
    periodic rotation nor the resume search ever takes one."""
    return Path(run_dir) / f"best-{step}{SHARDED_SUFFIX if sharded else '.pt'}"


def prune_best(run_dir: Path, steps: list[int]) -> list[Path]:
    """Delete the best-<step> checkpoints whose step is not in `steps` (the run's best k); returns them."""
    removed = []
    for path in [*Path(run_dir).glob("best-*.pt"), *Path(run_dir).glob("best-*" + SHARDED_SUFFIX)]:
        step = path.stem.removeprefix("best-")
        if step.isdigit() and int(step) not in steps:
            remove(path)
            removed.append(path)
    return removed


def prune(run_dir: Path, keep: int, writing: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep` periodic checkpoints, not counting (nor deleting) `writing`, one being
    rewritten; returns the deleted ones."""
    removed = [path for _, path in periodic_checkpoints(run_dir) if path != writing][keep:]
    for path in removed:
        remove(path)
    return removed


def latest_valid(run_dir: Path, log=print, check: Callable[[dict, Path], str | None] | None = None,
                 aside: bool = False) -> tuple[Path, dict] | None:
    """The newest periodic checkpoint whose bytes are intact (`verify_integrity`), that loads, and that
    `check(state, path)` (what is wrong with it, or None) accepts. One that is not is named in one warning
    line and skipped; `aside`: also renamed to <name>.damaged (`set_aside`), kept but out of the way."""
    for _, path in periodic_checkpoints(run_dir):
        try:
            if path.is_symlink():  # kfit writes its checkpoints in place: a link was planted, never followed
                raise DamagedCheckpoint(f"it is a symbolic link (to {os.readlink(path)}), not a checkpoint kfit wrote")
            state = load_checkpoint(path, verify=True)
        except DamagedCheckpoint as err:
            problem = f"is damaged ({err})"
        except fileio.UnsafeFileError as err:  # a FIFO or device planted under a checkpoint's name
            problem = f"is {getattr(err, 'what', 'not a regular file')}, not a checkpoint kfit wrote"
        except Exception as err:  # noqa: BLE001 - any unreadable file means "use the previous one"
            problem = (f"is unreadable ({type(err).__name__}: {shown(' '.join(str(err).split()), 160)}); "
                       "it was probably cut short by a crash or a full disk")
        else:
            wrong = check(state, path) if check is not None else None
            if wrong is None:
                return path, state
            problem = f"is not a usable checkpoint ({wrong})"
        kept = ""
        if aside:
            try:
                kept = f"kept as {set_aside(path).name}, "
            except OSError as err:
                kept = f"it could not be renamed aside ({err.strerror or err}), "
        log(f"warning: {path} {problem}: {kept}using the previous checkpoint")
    return None


def run_of(path: Path) -> Path:
    """The run directory of a checkpoint (file or sharded directory), or `path` when it is one."""
    path = Path(path)
    return path.parent if path.is_file() or is_sharded_checkpoint(path) else path


def holder_name(pid: int) -> str:
    """A lock holder for messages (fileio.lock_holder's 0: it has not written its PID yet)."""
    return f"process {pid}" if pid else "another process"


def in_use_error(run_dir: Path, pid: int) -> KfitError:
    """A run directory another live `make train` holds (fileio.lock_holder): refused, never shared."""
    return KfitError(f"{run_dir} is in use by {holder_name(pid)}, a training run still going: wait for it to finish, "
                     f"stop it with 'kill {pid or '<pid>'}' (it saves a checkpoint; 'make train' then resumes it), "
                     "or set CONFIG_RUN_NAME to another name for a separate run")


def oom_marker_problem(marker) -> str | None:
    """What keeps a parsed oom.json from being the marker a sharded run's rank wrote (lib/trainer/recovery.py's
    `mark`: micro_batch, halvings, rungs, step, reason), None when it is one."""
    if not isinstance(marker, dict):
        return f"a JSON {type(marker).__name__}, not an object"
    bad = [k for k, least in (("micro_batch", 1), ("halvings", 0), ("step", 0))
           if isinstance(marker.get(k), bool) or not isinstance(marker.get(k), int) or marker[k] < least]
    bad += [] if isinstance(marker.get("rungs"), list) and all(r in LADDER_RUNGS for r in marker["rungs"]) else ["rungs"]
    bad += [] if isinstance(marker.get("reason"), str) else ["reason"]
    return f"missing or invalid {', '.join(bad)}" if bad else None


def read_oom_marker(run_dir: Path, log=print) -> dict | None:
    """The out-of-memory marker in a run directory; None without one, or with one note naming the file when it
    is not one (damaged, of another shape, a link: never followed): the run continues without it."""
    path = Path(run_dir) / OOM_MARKER
    marker, problem = fileio.read_json_file(path)
    problem = problem or oom_marker_problem(marker)
    if problem is None or problem == fileio.MISSING:
        return marker
    log(f"note: {path} is not an out-of-memory marker ({problem}): ignored, the run "
        "continues from its checkpoint as planned")
    return None


def oom_marker_since(output_dir: Path, since: float, log=print) -> dict | None:
    """The out-of-memory marker a sharded run wrote in output_dir at or after `since` (a time.time())."""
    base = Path(output_dir).expanduser()
    found = []
    for marker in base.glob(f"*/{OOM_MARKER}") if base.is_dir() else []:
        with contextlib.suppress(OSError):  # gone meanwhile; a link's own time, never its target's
            found.append((marker.lstat().st_mtime, marker))
    newest = max((f for f in found if f[0] >= since), default=None)
    return read_oom_marker(newest[1].parent, log) if newest else None
