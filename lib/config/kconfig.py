"""Strict loading of the Kconfig tree and config files, and atomic writing.

kconfiglib only warns about an unknown symbol, a malformed or out-of-range
number, or an assignment whose dependencies are unmet; `load_strict` turns
every such case into a ConfigError naming the symbol, the file and the reason.
"""

from __future__ import annotations

import ast
import io
import re
import tempfile
from pathlib import Path
from typing import Sequence

import kconfiglib

from ..errors import ConfigError
from ..fileio import MISSING, copy_file, read_text, what_is, write_atomic, write_target
from ..redact import secret_name, shown
from .. import resources
from ..resources import data_root

ROOT = data_root()  # the checkout, or the installed package's copy of the tree (lib/resources.py)
KCONFIG = ROOT / "Kconfig"


# The line of kconfigs/Kconfig.model where the entries of the families kept in one file each are added
FAMILIES_HERE = "# model families kept in one file each (lib/models/families/) are added here"


def family_entries() -> str:
    """The Kconfig entries of every model family kept in one file (resources.FAMILY_DIRS): each file's module-level
    `KCONFIG` string, read from its syntax tree without importing it (the config layer imports no model code)."""
    entries = []
    for folder in resources.FAMILY_DIRS:
        for path in sorted(folder.glob("*.py")) if folder.is_dir() else ():
            if path.name.startswith("_"):
                continue
            for node in ast.parse(read_text(path), str(path)).body:
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "KCONFIG"
                                                        for t in node.targets):
                    entries.append(f"# {path.name}\n{ast.literal_eval(node.value)}\n")
    return "".join(entries)


class _Tree(kconfiglib.Kconfig):
    """kconfiglib's Kconfig with the families' entries (family_entries) read in at FAMILIES_HERE."""

    def _open(self, filename, mode):
        if mode == "r" and Path(filename).name == "Kconfig.model":
            text = read_text(filename)
            return io.StringIO(text.replace(FAMILIES_HERE, family_entries(), 1))
        return super()._open(filename, mode)


def new_kconfig() -> kconfiglib.Kconfig:
    """The Kconfig tree: kconfigs/, and the families kept in one file each."""
    kconf = _Tree(str(KCONFIG), warn_to_stderr=False)
    if kconf.warnings:  # a broken Kconfig tree is our bug, not the user's
        raise ConfigError("Kconfig tree has problems:\n  " + "\n  ".join(kconf.warnings))
    kconf.warn_assign_undef = True
    kconf.warn_assign_override = False  # fragments override on purpose
    kconf.warn_assign_redun = False
    return kconf


_ASSIGNMENT = re.compile(r"(# )?CONFIG_[A-Za-z0-9_]")  # a config's line, well formed or not


def require_config_file(path: Path) -> None:
    """A ConfigError unless `path` is a readable UTF-8 text file (kconfiglib would raise a traceback)."""
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a config file: name a file")
    if not path.exists():
        kind = what_is(path)
        raise ConfigError(f"{path}: no such file" if kind == MISSING else f"{path} is {kind}: name a config file")
    if not path.is_file():
        raise ConfigError(f"{path} is not a regular file: name a config file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1)
        raise ConfigError(f"{path}: line {line}, byte {column + 1} of the line (offset {err.start} in the file): "
                          f"byte 0x{data[err.start]:02x} is not UTF-8 ({err.reason}): the file must be UTF-8 "
                          "text: delete or retype that character, or re-save the file as UTF-8") from None
    lines = [line.strip() for line in text.lstrip("\ufeff").splitlines()]
    if any(line and not line.startswith("#") for line in lines) and not any(_ASSIGNMENT.match(line) for line in lines):
        # not echoed: a file given by mistake (a netrc, a credentials file) must not be printed line by line
        raise ConfigError(f"{path} is not a config file: none of its {len(lines)} lines is a CONFIG_ line "
                          "(a defconfig or fragment holds lines such as CONFIG_EPOCHS=3): name a config file")


def _user_str(sym: kconfiglib.Symbol) -> str:
    if sym.orig_type in (kconfiglib.BOOL, kconfiglib.TRISTATE):
        return kconfiglib.TRI_TO_STR[sym.user_value]
    return sym.user_value


def _why_not(sym: kconfiglib.Symbol, requested: str) -> str:
    """Explain why a requested value did not take."""
    choice = sym.choice
    if choice is not None and choice.visibility == 0:
        return f"its choice is hidden: it depends on {kconfiglib.expr_str(choice.direct_dep)}, which is not met"
    if not any(node.prompt for node in sym.nodes):
        return "it has no prompt: it is derived from other options and cannot be set"
    if sym.visibility == 0:
        return f"its dependencies are not met: it depends on {kconfiglib.expr_str(sym.direct_dep)}"
    if sym.orig_type in (kconfiglib.INT, kconfiglib.HEX):
        for low, high, cond in sym.ranges:
            if kconfiglib.expr_value(cond):
                return f"it is outside the allowed range {low.str_value}..{high.str_value}"
    if choice is not None and requested == "n" and choice.selection is sym:
        return ("it is the choice's default: to deselect it, set another member of the "
                "choice to y")
    if sym.rev_dep is not sym.kconfig.n and kconfiglib.expr_value(sym.rev_dep):
        return f"it is forced by select from {kconfiglib.expr_str(sym.rev_dep)}"
    return f"kconfiglib resolved it to '{sym.str_value}'"


def assignment_line(sym: kconfiglib.Symbol, value: str) -> str:
    if sym.orig_type in (kconfiglib.BOOL, kconfiglib.TRISTATE) and value == "n":
        return f"# CONFIG_{sym.name} is not set"
    if sym.orig_type == kconfiglib.STRING:
        return f'CONFIG_{sym.name}="{value}"'
    return f"CONFIG_{sym.name}={value}"


def load_strict(files: Sequence[Path], notes: list[str] | None = None) -> kconfiglib.Kconfig:
    """Load files in order (the first replaces, the rest merge) and require every value to take.

    Each file's values must take at the point it is merged. A later fragment may
    override or hide what an earlier file set (switching to MANUAL hides the
    base's TARGET_EFFECTIVE_BATCH): that is what fragments are for, so such a
    superseded value is reported in `notes`, as the kernel's merge_config does,
    not refused.
    """
    kconf = new_kconfig()
    requested: dict[str, tuple[kconfiglib.Symbol, str, Path]] = {}
    errors: list[str] = []
    for i, path in enumerate(files):
        require_config_file(path)
        errors += _contradictions(path)
        before = {s.name: s.user_value for s in kconf.unique_defined_syms}
        kconf.load_config(str(path), replace=(i == 0))
        # set_value() warnings (a malformed number) carry no file name: add it
        errors += [w.replace("warning: ", "", 1) if w.startswith(str(path)) else
                   f"{path}: " + w.replace("warning: ", "", 1) for w in kconf.warnings]
        kconf.warnings.clear()
        for sym in kconf.unique_defined_syms:
            if sym.user_value is not None and (i == 0 or before[sym.name] != sym.user_value):
                requested[sym.name] = (sym, _user_str(sym), path)
        errors += [f"{src}: {assignment_line(sym, value)} did not take: {_why_not(sym, value)}"
                   for sym, value, src in _not_taken(requested.values()) if src == path]
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(map(_entry, errors)))
    if notes is not None:
        notes += [_entry(f"{src}: {assignment_line(sym, value)} no longer applies after the later fragments "
                         f"({_why_not(sym, value)})") for sym, value, src in _not_taken(requested.values())]
    return kconf


_QUOTED = re.compile(r"['\"].*['\"]", re.S)  # from a message's first quote to its last: the values kconfiglib quotes


def _entry(text: str) -> str:
    """One entry of a config's problems or notes as it may be shown: the values a file assigned to a secret's
    name (CONFIG_NOSUCH_TOKEN="...", kconfiglib quoting them in its "undefined symbol", "set more than once" or
    "malformed line" warning) hidden as ***, and a malformed line's text not shown at all; escaped (a value's control and format characters as \\x1b,
    \\u202e: never a forged entry or line); cut to 300 characters."""
    if _BOM.search(text):  # an editor's invisible byte-order mark before a setting: named, as is the fix
        return shown(_BOM.sub("line starting with an invisible byte-order mark (U+FEFF) before its CONFIG_ setting, "
                              "which is therefore ignored: delete the mark (save the file as UTF-8 without BOM)",
                              text), 300)
    if _MALFORMED.search(text):  # a line that is no assignment is never echoed: it may be any file's (a netrc)
        text = _MALFORMED.sub("ignoring malformed line (neither a CONFIG_ assignment nor a comment; its text is "
                              "not shown)", text)
    elif "undefined symbol" in text or any(secret_name(word) for word in re.findall(r"\w+", text)):
        text = _QUOTED.sub("'***'", text, count=1)  # an unknown symbol's name is the problem: its value not shown
    return shown(text, 300)


# kconfiglib's warning about a line that is no assignment, unless the line starts as one (a typo to show)
_MALFORMED = re.compile(r"ignoring malformed line '(?!(?:# )?CONFIG_).*'$", re.S)
# the same about a setting behind a byte-order mark (a file saved as "UTF-8 with BOM", a line pasted from one)
_BOM = re.compile("ignoring malformed line '\ufeff+(?:# )?CONFIG_.*'$", re.S)


def _contradictions(path: Path) -> list[str]:
    """Assignments within one file that contradict each other (only the last would silently win)."""
    kconf = new_kconfig()
    kconf.warn_assign_override = True
    kconf.load_config(str(path))
    found = [w.replace("warning: ", "", 1) for w in kconf.warnings if "set more than once" in w]
    for choice in kconf.unique_choices:
        chosen = [sym.name for sym in choice.syms if sym.user_value == 2]
        if len(chosen) > 1:
            found.append(f"{path}: sets {' and '.join('CONFIG_' + n + '=y' for n in chosen)}, but they are "
                         "members of one choice: keep one")
    return found


def _not_taken(requests):
    for sym, value, path in requests:
        choice = sym.choice
        if choice is not None and value == "y" and choice.user_selection is not sym:
            continue  # a later assignment selected another member of the same choice
        if value != sym.str_value:
            yield sym, value, path


# --------------------------------------------------------------------------
# Writing


def config_text(kconf: kconfiglib.Kconfig) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config"
        kconf.write_config(str(path), save_old=False)
        return path.read_text()


def write_config(kconf: kconfiglib.Kconfig, out: Path, *, minimal: bool = False) -> None:
    """Write atomically (lib.fileio.write_atomic: through a symlinked .config, keeping its permissions; never
    over a device, FIFO or directory), keeping the previous file as <out>.old like the kernel (never through a
    link at <out>.old). The minimal config (savedefconfig's ./defconfig) is kfit's own file beside the config:
    never written through a link either."""
    follow = not minimal
    write_target(out, follow_symlinks=follow)  # a device or FIFO named as the config: refused before the .old
    if out.exists() and not minimal:  # the backup is kfit's own file: never written through a link
        copy_file(out, out.with_name(out.name + ".old"))
    write_atomic(out, kconf.write_min_config if minimal else lambda tmp: kconf.write_config(tmp, save_old=False),
                 follow_symlinks=follow)
