"""Files that are never seen half-written, and a lock that keeps a directory to one writer.

`write_atomic` is the one atomic writer (checkpoints, run files, .config, caches): a temporary file
beside the real target, fsynced, given the permissions the replaced file had, renamed over it.
`try_lock` / `lock_holder`: an flock on DIR/.lock, which the kernel drops when its process dies, so a
crashed holder's lock is simply taken over; the holder's PID is written in the file for messages.
Layer 1 (docs/architecture.md): it imports nothing from lib but lib.units, whose `format_bytes` it
re-exports for the callers that import it from here.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import IO, Callable

from .units import format_bytes  # noqa: F401  (fileio.format_bytes: lib/checkpoint.py, lib/monitor.py, the trainer)

# A write that failed for want of room: a full disk, a full quota, the file size limit (ulimit -f).
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

LOCK_NAME = ".lock"
# A lock_holder() check holds the lock (shared) for an instant: a taker retries over this long before
# concluding that a live process holds it.
LOCK_WAIT_S = 0.2


def write_atomic(path: Path | str, data: bytes | Callable[[str], None]) -> None:
    """Replace `path` with `data`, or with what `data(temporary_path)` writes there, so that readers and
    crashes see the old file or the new one, never a mix; the temporary file is removed on any failure.

    A symlink is written through (its target replaced, the link kept). The new file takes the replaced
    file's permissions, or 0666 less the umask when new: mkstemp's 0600 would shut out the other users
    of a shared directory, and silently change a .config's mode."""
    real = Path(os.path.realpath(path))
    real.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = real.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(tmp)  # it opens the same (empty) file by name: f's fsync below covers what it wrote
            else:
                f.write(data)
                f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(real.parent)


def fsync_dir(path: Path | str) -> None:
    """Make a rename in `path` durable."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def umask() -> int:
    """The process's umask, read from /proc where it can be: os.umask() can only read it by setting it,
    which another thread creating a file at that instant would see."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Remove what write_atomic calls that a kill interrupted left behind (only safe under the directory's lock)."""
    removed = []
    for path in Path(directory).glob(".*.tmp"):
        if path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def unwritable_reason(directory: Path) -> str | None:
    """Why files cannot be made in `directory` (created with its parents when missing), None when they can.
    Tried for real, with a temporary directory made and removed in its nearest existing ancestor: permission
    bits mislead root, read-only mounts and /proc."""
    directory = Path(directory)
    existing = next(p for p in (directory, *directory.parents) if os.path.exists(p))  # False where unreachable too
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kfit-check-", dir=existing))
    except OSError as err:
        return f"cannot create anything in {existing}: {err.strerror or err}"
    return None


def try_lock(directory: Path) -> IO | None:
    """An exclusive lock on `directory`, held while the returned file stays open (closing it, or the process
    dying, releases it); None while another live process holds it."""
    fd = os.open(Path(directory) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    f = os.fdopen(fd, "r+")
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                f.close()
                return None
            time.sleep(0.02)
    f.truncate(0)  # a dead holder's PID
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def lock_holder(directory: Path) -> int | None:
    """The PID of the live process holding `directory`'s lock (0 when it has not written it yet), None when free."""
    try:
        f = open(Path(directory) / LOCK_NAME)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released when f closes
            return None
        except BlockingIOError:
            text = f.read().strip()
            return int(text) if text.isdigit() else 0
