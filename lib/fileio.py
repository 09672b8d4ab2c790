"""Files that are never seen half-written, never redirected by a planted link, and a lock that keeps a
directory to one writer.

`write_atomic` is the one atomic writer (checkpoints, run files, .config, caches, reports, exports, data): a
temporary file created with O_EXCL beside the target, fsynced, given the permissions the replaced file had,
renamed over it, removed on any failure. It never replaces a device, FIFO, socket or directory
(`write_target`). Symlinks are refused in the target's place by default (run directories, caches and
report directories others may share: a planted link must not redirect kfit's writes), with UnsafeFileError,
one line naming the file; `follow_symlinks=True` is for the config file the user names (a KCONFIG_CONFIG or
.config that is a link to a kept config is a feature), written through its link. `write_json_atomic`,
`write_text` and `copy_file` are its forms for JSON, text and a copy; `read_bytes` reads a regular file
without blocking on a FIFO. tests/test_write_sites.py fails on a write in lib/ that bypasses them.
`open_append` (metrics.jsonl, logs) appends with O_NOFOLLOW to a regular file only.
`try_lock` / `lock_holder`: an flock on DIR/.lock, which the kernel drops when its process dies, so a
crashed holder's lock is simply taken over; the holder's PID is written in the file for messages. The
lock is opened with O_NOFOLLOW and without O_TRUNC: a link, a directory or any other non-file there is
refused, and nothing is truncated before the lock is held.
`no_room`: whether an error (or the error it wraps) is a full disk's.
`read_json_file`: JSON read without following a link, never raising (caches, run-directory files);
`read_json_cache` / `cache_note`: the caches' reader (nothing in a cache can raise) and the one note per
damaged cache file (named) on stderr.
Layer 1 (docs/architecture.md): it imports nothing from lib but lib.errors and lib.units, whose
`format_bytes` it re-exports for the callers that import it from here.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Callable

from .errors import KfitError
from .redact import shown
from .units import format_bytes  # noqa: F401  (fileio.format_bytes: lib/checkpoint.py, lib/monitor.py, the trainer)

# A write that failed for want of room: a full disk, a full quota, the file size limit (ulimit -f).
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def no_room(err: BaseException) -> OSError | None:
    """The OSError for want of room (NO_ROOM) that `err` is or wraps (its cause, or a rank's failure in a
    torch.distributed.checkpoint CheckpointException, whose `failures` map ranks to (exception, stack)), else None."""
    pending, seen = [err], set()
    while pending:
        e = pending.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            pending += [f[0] if isinstance(f, tuple) and f else f for f in failures.values()]
        pending.append(e.__cause__)
    return None


LOCK_NAME = ".lock"
# A lock_holder() check holds the lock (shared) for an instant: a taker retries over this long before
# concluding that a live process holds it.
LOCK_WAIT_S = 0.2
# A temporary file of write_atomic older than this is a killed writer's: swept (sweep_temporaries).
STALE_TEMPORARY_S = 3600.0
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class UnsafeFileError(KfitError, OSError):
    """A file kfit will not open or write: a symlink it did not create, a directory or a device in a file's
    place. A KfitError (one `error:` line naming the file) and an OSError (a cache's writer skips it)."""


def unsafe(path: Path | str, what: str, *, reading: bool = False) -> UnsafeFileError:
    if reading:  # a FIFO would block the read, a device would never end it
        err = UnsafeFileError(f"{path} is {what}: kfit reads only regular files (a FIFO would block it, a "
                              "device never end); name one")
        err.what = what
        return err
    err = UnsafeFileError(f"{path} is {what}: kfit does not write through it (a link or other file planted "
                          f"in a run directory or cache could redirect its writes); remove it and run again")
    err.what = what  # "a symbolic link (to ...)", "a directory": for a note that names the file itself
    return err


def _describe(st: os.stat_result, path: Path | str) -> str:
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            return "a symbolic link"
    return "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"


MISSING = "missing"


def what_is(path: Path | str) -> str | None:
    """None where `path` is a regular file or a directory (through its links); else why it is neither, as a
    message says it: MISSING where nothing is there, or "a symbolic link that loops (to ...)", "a symbolic
    link to ..., which does not exist", "a FIFO", "a socket", "a device". Path.exists() and is_file() answer
    False for all of these alike, and the messages built on them called a looping link or a FIFO missing."""
    try:
        st = os.stat(path)
    except OSError as err:
        try:
            target = os.readlink(path)
        except OSError:
            return MISSING
        if err.errno == errno.ELOOP:
            return f"a symbolic link that loops (to {target})"
        return f"a symbolic link to {target}, which does not exist"
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    if stat.S_ISSOCK(st.st_mode):
        return "a socket"
    return "a device"


def refuse_link(path: Path | str) -> None:
    """UnsafeFileError when `path` exists and is not a regular file (a symlink, a directory, a FIFO...)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(st.st_mode):
        raise unsafe(path, _describe(st, path))


def refuse_linked_directory(path: Path | str) -> None:
    """UnsafeFileError when `path` is a symbolic link, or exists and is not a directory: a directory kfit
    writes its own files into (a run directory) is never one a link planted in a shared directory chose."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISDIR(st.st_mode):
        raise unsafe(path, _describe(st, path))


def refuse_linked_components(path: Path | str, root: Path | str) -> None:
    """UnsafeFileError when `path` itself, or any directory between `root` and it, is a symbolic link or not a
    directory: a directory kfit writes its own files into (an export, a cache) is never redirected by a link
    planted below a directory it owns. A `path` outside `root` has its last component checked only (the
    directories above a path the user named are the user's)."""
    path, root = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    refuse_linked_directory(path)
    if not path.is_relative_to(root):
        return
    for part in reversed(path.relative_to(root).parents):
        if part != Path("."):
            refuse_linked_directory(root / part)


def open_nofollow(path: Path | str, flags: int, mode: int = 0o666) -> int:
    """os.open with O_NOFOLLOW and O_NONBLOCK (a planted FIFO must not hang kfit), of a regular file only;
    anything else is an UnsafeFileError naming the file."""
    try:
        fd = os.open(path, flags | NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            try:
                raise unsafe(path, _describe(os.lstat(path), path)) from None
            except FileNotFoundError:
                pass
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise unsafe(path, _describe(st, path))
    os.set_blocking(fd, True)
    return fd


def open_append(path: Path | str, *, owned: bool = False) -> IO[str]:
    """`path` opened to append text (created 0666 less the umask when new), never through a symlink and only
    when it is a regular file (metrics.jsonl, logs). `owned`: also refuse a file another user owns or with
    other hard links (a log in a shared directory such as /tmp, where anyone can plant one)."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    st = os.fstat(fd)
    if owned and (st.st_uid != os.geteuid() or st.st_nlink != 1):
        os.close(fd)
        raise unsafe(path, "a file of another user or with other hard links")
    return os.fdopen(fd, "a")


def write_atomic(path: Path | str, data: bytes | Callable[[str], None], *, follow_symlinks: bool = False,
                 mode: int | None = None) -> None:
    """Replace `path` with `data`, or with what `data(temporary_path)` writes there, so that readers and
    crashes see the old file or the new one, never a mix; the temporary file (O_EXCL, beside the target)
    is removed on any failure.

    `follow_symlinks=False` (the default: run directories, caches, reports, exports, data): a symlink,
    directory or other non-file at `path`, or a symlink as its directory, is refused with UnsafeFileError, and
    the file is written where `path` names it. `follow_symlinks=True` (only the config file the user names): a symlink is written through (its
    target replaced, the link kept), to a regular file only (write_target). The new file takes the
    replaced file's permissions, or 0666 less the umask when new: mkstemp's 0600 would shut out the other
    users of a shared directory, and silently change a .config's mode. `mode` (0o700 for a script that holds a
    database's password): the file's mode whatever it replaces, from its first byte on (the temporary file is
    0600 until then), so no other user reads it even for a moment."""
    real = write_target(path, follow_symlinks=follow_symlinks)
    if not follow_symlinks:  # nor into a directory a link planted there names (a cache's, a run's, an export's)
        refuse_linked_directory(real.parent)
    real.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = (real.stat() if follow_symlinks else os.lstat(real)).st_mode & 0o7777 if mode is None else mode
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


def write_cache_file(path: Path | str, data: bytes) -> None:
    """A file of kfit's cache, as write_atomic writes it, and never below a cache root that is a link nor
    through a link between the root and the file: the directories write_atomic makes would follow one (a
    KFIT_CACHE_DIR planted as a link in a shared /tmp took the traces and timings to its target)."""
    from .env import cache_dir

    root, where = Path(os.path.abspath(cache_dir())), Path(os.path.abspath(path)).parent
    if where.is_relative_to(root):
        refuse_linked_directory(root)
        refuse_linked_components(where, root)
    write_atomic(path, data, follow_symlinks=False)


def write_target(path: Path | str, *, follow_symlinks: bool = False) -> Path:
    """The file a write of `path` replaces, checked before anything is written: never a directory, a device,
    a FIFO or a socket (replacing a device node, or blocking on a FIFO, is never what a user meant). A symlink
    at `path` is followed only with `follow_symlinks` (a .config the user linked to a kept config), and then
    only to a regular file or to nothing yet; otherwise it is refused (UnsafeFileError)."""
    if not follow_symlinks:
        refuse_link(path)
        return Path(path)
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except (FileNotFoundError, NotADirectoryError):
        if real != Path(path).absolute() and not real.parent.is_dir():  # a link never makes directories
            raise unsafe(path, f"a symbolic link to {real}, whose directory does not exist") from None
        return real
    if not stat.S_ISREG(st.st_mode):
        raise unsafe(path, _describe(st, real) + ("" if real == Path(path).absolute() else f" (through {path})"))
    return real


def write_text(path: Path | str, text: str) -> None:
    """`text` as a file kfit writes for the user (a report page, a result, a copy kept aside): atomically,
    never through a link or over anything but a regular file."""
    write_atomic(path, text.encode(), follow_symlinks=False)


def read_bytes(path: Path | str, *, follow_symlinks: bool = True) -> bytes:
    """A regular file's bytes, never blocking on a FIFO or reading a device (UnsafeFileError); a symlink is
    followed only with `follow_symlinks` (a file the user named)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        return _read_all(open_nofollow(path, os.O_RDONLY))
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:
        raise unsafe(path, "a directory", reading=True) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise unsafe(path, _describe(st, path), reading=True)
    os.set_blocking(fd, True)
    return _read_all(fd)


def read_text(path: Path | str, *, follow_symlinks: bool = True, errors: str = "strict") -> str:
    """A regular file's text (UTF-8), as read_bytes reads it: never blocking on a FIFO or reading a device."""
    return read_bytes(path, follow_symlinks=follow_symlinks).decode("utf-8", errors)


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()


def copy_file(source: Path | str, target: Path | str, *, follow_source: bool = True) -> None:
    """A copy of the regular file `source` (through a link only with `follow_source`) as `target`, written as
    write_text writes (a config's .old backup, an edit's working copy)."""
    write_atomic(target, read_bytes(source, follow_symlinks=follow_source), follow_symlinks=False)


def write_json_atomic(path: Path | str, obj: Any, *, indent: int | None = 2) -> None:
    """`obj` as JSON (sorted keys), atomically, never through a symlink (run directories, caches)."""
    text = json.dumps(obj, indent=indent, sort_keys=True) + ("\n" if indent is not None else "")
    write_atomic(path, text.encode(), follow_symlinks=False)


def fsync_dir(path: Path | str) -> None:
    """Make a rename in `path` durable."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def content_hash(path: Path | str | None) -> str | None:
    """The first 16 hex digits of a file's SHA-256 (a cache key's part), or None where there is no such file."""
    import hashlib

    if not path or not os.path.isfile(path):
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


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


def remove_stale_temporaries(directory: Path, older_than_s: float = 0.0) -> list[Path]:
    """Remove what write_atomic calls that a kill interrupted left behind: all of them (only safe under the
    directory's lock), or those older than `older_than_s` (a shared cache, where another process may be
    writing one now). A link of that name is removed as a link, never followed."""
    removed = []
    now = time.time()
    try:
        paths = list(Path(directory).glob(".*.tmp"))
    except OSError:
        return removed
    for path in paths:
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) or (older_than_s and now - st.st_mtime < older_than_s):
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def sweep_temporaries(directory: Path) -> list[Path]:
    """A shared cache's stale temporaries (older than STALE_TEMPORARY_S), removed; nothing fails."""
    return remove_stale_temporaries(directory, STALE_TEMPORARY_S)


# --------------------------------------------------------------------------
# Caches: read without ever raising, one note per damaged file

_NOTED: set[str] = set()


def cache_note(path: Path | str, reason: str, *, then: str = "dropped; measured again when needed") -> str:
    """Say once per process and file, on stderr, that a cache file (named) was damaged or foreign; the line."""
    # a link's target or a path may hold a line break: never a forged line
    line = f"note: cache file {shown(path)}: {shown(reason, 300)}: {then}"
    if str(path) not in _NOTED:
        _NOTED.add(str(path))
        print(line, file=sys.stderr, flush=True)
    return line


def reset_cache_notes() -> None:
    """Let cache_note say again what it said (a new plan in a long-lived process; tests)."""
    _NOTED.clear()


CACHE_MAX_BYTES = 64 << 20  # a cache file larger than this is not kfit's


MISSING = "missing"  # read_json_file's problem when there is no file


def read_json_file(path: Path | str, max_bytes: int = CACHE_MAX_BYTES) -> tuple[Any, str | None]:
    """(`path`'s JSON, None), or (None, what is wrong): MISSING; a link, directory or other non-file (never
    followed); unreadable; over `max_bytes`; not UTF-8 JSON. Never raises: for caches and run-directory files."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None, MISSING
    except OSError as err:
        return None, getattr(err, "what", None) or f"unreadable ({err.strerror or err})"
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise ValueError(f"over {format_bytes(max_bytes)}")
        return json.loads(raw.decode()), None
    except (OSError, ValueError, RecursionError) as err:
        return None, f"not JSON ({type(err).__name__}: {shown(' '.join(str(err).split()), 80)})"


def read_json_cache(path: Path | str, schema: int) -> dict | None:
    """A cache file's JSON object, None when missing (silently) or damaged, foreign or of another schema (with
    a cache_note naming it). Never follows a symlink, never raises. A file without "schema" is taken as
    this schema (written before caches carried one); its fields are the caller's to check."""
    data, problem = read_json_file(path)
    if problem == MISSING:
        return None
    if problem is not None:
        cache_note(path, problem)
        return None
    if not isinstance(data, dict):
        cache_note(path, f"a JSON {type(data).__name__}, not an object")
        return None
    if data.get("schema", schema) != schema:
        cache_note(path, f"schema {data.get('schema')!r}, not {schema} (another kfit version's)")
        return None
    return data


def is_number(value: Any, *, positive: bool = False) -> bool:
    """A finite int or float (not a bool); > 0 when `positive`: what a cache's numeric fields must be."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if value != value or value in (float("inf"), float("-inf")):
        return False
    return value > 0 if positive else True


def free_bytes(directory: Path | str) -> int:
    """The free bytes where `directory` is (a very large number when the OS cannot say: nothing is deleted)."""
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return 1 << 62


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
    dying, releases it); None while another live process holds it.

    The lock file is opened with O_NOFOLLOW|O_CREAT and no O_TRUNC: a symlink, directory or other non-file
    (or a file with other hard links) at DIR/.lock is an UnsafeFileError naming it, and the file is emptied
    for this PID only once the lock is held."""
    path = Path(directory) / LOCK_NAME
    fd = open_nofollow(path, os.O_RDWR | os.O_CREAT)
    if os.fstat(fd).st_nlink != 1:
        os.close(fd)
        raise unsafe(path, "a file with other hard links")
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
        f = os.fdopen(open_nofollow(Path(directory) / LOCK_NAME, os.O_RDONLY), "r")
    except OSError:  # missing; a link, directory or unreadable file: no kfit holds it (try_lock refuses it)
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released when f closes
            return None
        except BlockingIOError:
            try:
                text = f.read(32).strip()  # a PID is a few ASCII digits; anything else is no PID
            except (UnicodeDecodeError, OSError):
                return 0
            return int(text) if text.isascii() and text.isdigit() else 0
