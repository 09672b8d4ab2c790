"""What every command reads from the environment (or its flags): the machine (HW=, GPU=, ...) and the config.

A command parses its variables once, at its start (`Invocation.from_environment()`), and hands that `run` to
each helper here; a helper given none parses them itself (a command that has not been changed to pass it)."""

from __future__ import annotations

import errno
import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import config as kconfig
from ..env import env_number  # noqa: F401  (re-exported: the commands read their counts through common)
from ..errors import MESSAGE_LIMIT, KfitError, cut_middle
from ..redact import shown as escape_value

if TYPE_CHECKING:
    from .invocation import Invocation


# What the OS refuses about a path the user gave (a name too long, a loop of links, a file where a directory
# must be...), and the fix: one error line at the command's boundary, wherever in kfit the path was opened.
OS_REFUSALS = {
    errno.ENAMETOOLONG: "a name in a path is at most 255 bytes and a path at most 4096: choose a shorter one",
    errno.ELOOP: "its symbolic links form a loop: remove or fix the link",
    errno.ENOTDIR: "a part of the path is a file, not a directory: fix the path",
    errno.EISDIR: "it is a directory where a file is needed: name a file",
    errno.EACCES: "permission denied: choose a path you may write and read, or fix its permissions",
    errno.EPERM: "the operation is not permitted there: choose another path",
    errno.EROFS: "the file system is read-only: choose a path on a writable disk",
    errno.ENOENT: "no such file or directory (a dangling link?): fix the path",
    errno.EEXIST: "something is in the way there (a file, or a link to nothing): remove it or choose another path",
    errno.EINVAL: "the OS refuses that path (a character it does not allow?): choose another name",
}


def os_refusal(err: OSError) -> str:
    """An OSError about a path as one line: the path (escaped, cut), the OS's reason, the fix."""
    from ..redact import shown

    return f"{shown(err.filename, 160)}: {err.strerror or 'refused'}; {OS_REFUSALS[err.errno]}"


ERROR_LINE_LIMIT = MESSAGE_LIMIT


def error_line(message: str, limit: int = ERROR_LINE_LIMIT) -> str:
    """`message` as one line: cut in its middle past `limit` characters (errors.cut_middle), then escaped and
    redacted (redact.shown's treatment: never an extra line, an escape code or a secret)."""
    from ..redact import escaped, redact

    return redact(escaped(cut_middle(message, limit)))


def run_main(main: Callable[[], int | None]) -> int:
    """A command's main() under kfit's convention: a user error is one 'error:' line on stderr and exit status
    2, never a traceback; Ctrl-C is 'interrupted' and 130. Everything the command prints from this process,
    kfit's lines and its libraries' (a tracker's, a database driver's), passes through lib/redact.py."""
    from ..redact import RedactingStream, shown

    out, err_stream = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(out), RedactingStream(err_stream)
    try:
        return main() or 0
    except KfitError as err:
        print(f"error: {error_line(str(err))}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):  # a full disk or quota, wherever the write was
            where = f" writing {shown(err.filename, 160)}" if err.filename else ""
            print(f"error: no space left on the device{where} ({err.strerror}): free space there, or choose "
                  "another path (the files kfit writes are replaced whole or not at all)", file=sys.stderr)
            return 2
        if err.filename is None or err.errno not in OS_REFUSALS:
            raise  # not a path the OS refused: a bug to show with its traceback
        print(f"error: {os_refusal(err)}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if "home directory" not in str(err):
            raise  # not pathlib's "~user" of no known user: a bug to show with its traceback
        print("error: a path starts with ~ of a user this machine does not know: write the path out in full",
              file=sys.stderr)
        return 2
    except RecursionError:  # only a pathological input (JSON nested thousands deep) recurses this far
        print("error: an input file nests too deeply to be read (thousands of levels): check the files the "
              "command reads (HW=, a run's plan.json or metrics.jsonl)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (make plan | head): nothing more to show
                pass
        sys.stdout, sys.stderr = out, err_stream


def parsed(run: Invocation | None) -> Invocation:
    """The command's variables: `run` as its start parsed them, else parsed now."""
    from .invocation import Invocation

    return Invocation.from_environment() if run is None else run


def hardware_from_env(allow_simulated: bool = True, run: Invocation | None = None):
    """The machine to plan for. For training (allow_simulated=False) it is this one, as detected:
    GPUS= then means the number of training processes (see lib.distributed), not simulated GPUs."""
    from ..hardware import resolve_hardware

    run = parsed(run)
    hw, gpu = run.hw, run.gpu
    if not allow_simulated and (hw or gpu):
        raise KfitError("HW= and GPU= describe another machine, but training runs on this one: unset them "
                        "(use 'make plan HW=... / GPU=...' to see another machine's plan)")
    # GPUS=N is N training processes everywhere (lib.planning.process_count); on a simulated machine
    # (GPU=) it also gives that machine N of its GPU
    hardware = resolve_hardware(hw=hw, gpu=gpu, free_gb=run.free_gb, gpus=run.gpus if allow_simulated and gpu else None)
    # torch is imported by now: its ~170k objects never become garbage, so the collector stops walking
    # them (a collection falls due at once after the import, and exit walks them again: ~0.1 s and
    # ~0.3 s of a cached plan, measured by make bench-plan). A command's own process only.
    gc.freeze()
    return hardware


def new_defconfig_dir() -> Path:
    """Where a bare DEFCONFIG= / recommend --write name goes: the checkout's defconfigs/, which 'make <name>-defconfig'
    reads; installed, ./defconfigs (never into site-packages), which 'kfit defconfig defconfigs/<name>' reads."""
    from ..resources import CHECKOUT

    return kconfig.DEFCONFIG_DIR if CHECKOUT else Path("defconfigs")


def apply_hint(path: Path) -> str:
    """How to apply a defconfig written to `path`: make from a checkout (a name, or a path), else kfit."""
    from ..resources import CHECKOUT

    from ..redact import shown

    if CHECKOUT is None:
        return f"'kfit defconfig {shown(path)}' applies it"
    return f"'make {shown(path.name if path.parent == kconfig.DEFCONFIG_DIR else path)}-defconfig' applies it"


def ensure_config(run: Invocation | None = None) -> "kconfig.Config":
    """Read the .config; on a fresh clone with none, apply the default defconfig and say so. The command line's
    overrides (make's NAME=value, --set) apply on top, for this command only: the file is never changed."""
    path = kconfig.config_path()
    if not path.exists():
        print(f"No {escape_value(path)} found: applying the default defconfig '{kconfig.DEFAULT_DEFCONFIG}' "
              f"(as 'make {kconfig.DEFAULT_DEFCONFIG}-defconfig' would)")
        config = kconfig.make_defconfig(kconfig.DEFAULT_DEFCONFIG, out=path)
    else:
        config = kconfig.read_config(path)
    config, shown = _overridden(config, parsed(run))
    if shown:
        from .. import distributed

        if distributed.current().is_main:
            print(shown)
    return config


def config_to_plan(run: Invocation | None = None) -> tuple["kconfig.Config", str | None]:
    """The .config, or without one the default defconfig built in memory and a note saying so:
    showing a plan must not create the config. The overrides apply as in ensure_config, said in the note."""
    path = kconfig.config_path()
    if path.exists():
        config, note = kconfig.read_config(path), None
    else:
        name = kconfig.DEFAULT_DEFCONFIG
        from ..redact import shown

        config, note = kconfig.defconfig_config(name), (f"no {shown(path, 160)}: this plans the default defconfig '{name}' in "
                                                        f"memory and writes nothing ('make {name}-defconfig' writes it)")
    config, shown = _overridden(config, parsed(run))
    return config, "; ".join(n for n in (shown, note) if n) or None


def _overridden(config: "kconfig.Config", run: Invocation) -> tuple["kconfig.Config", str | None]:
    """(config with the command's overrides, the line that shows them) - (config, None) without any. A value that
    does not take is one error naming the symbol, as in a fragment."""
    overrides = run.overrides
    if not overrides:
        return config, None
    changes = dict(overrides)  # a symbol given twice: the last wins, as in make
    # each value escaped and cut (a 5,000-byte OUTPUT_DIR, a path holding ESC): never a long or forged line
    shown = " ".join(f"CONFIG_{name}={escape_value(value, 200)}" for name, value in changes.items())
    try:
        config = kconfig.derive(config, changes)
    except KfitError as err:
        reason = " ".join(str(err).replace("invalid configuration:", "").replace("requested change: ", "").split())
        raise KfitError(f"command-line override {reason} (overrides: {shown})") from None
    return config, f"overrides: {shown} (command line; {escape_value(config.source)} unchanged)"
