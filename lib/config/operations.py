"""The operations behind the make targets, and changing values programmatically.

Every operation loads through `load_strict` and builds the typed Config before
it writes anything, so nothing reaches disk unless the whole result is valid.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

import kconfiglib

from ..errors import ConfigError
from ..fileio import copy_file, refuse_link, what_is
from ..redact import shown
from .kconfig import ROOT, assignment_line, load_strict, new_kconfig, require_config_file, write_config
from .typed import Config, typed_config
from ..env import env_text, require_utf8

DEFCONFIG_DIR = ROOT / "defconfigs"
FRAGMENT_DIR = DEFCONFIG_DIR / "fragments"
DEFAULT_DEFCONFIG = "lenet5"


def config_path() -> Path:
    """The .config in use: $KCONFIG_CONFIG as in the kernel, else ./.config."""
    path = Path(env_text("KCONFIG_CONFIG") or ".config")
    if (kind := what_is(path)) is not None and kind.startswith("a symbolic link that loops"):
        # exists() says False of it: a command would plan the default defconfig, or write through it
        raise ConfigError(f"KCONFIG_CONFIG={path} is {kind}: point it at a config file, or remove it")
    if path.is_dir():  # refused before any command reads it, or moves the directory aside to write it
        raise ConfigError(f"KCONFIG_CONFIG={path} is a directory, not a config file: name a file in it, "
                          f"e.g. KCONFIG_CONFIG={path / '.config'}")
    return path


def load_existing(path: Path) -> kconfiglib.Kconfig:
    if not path.exists():
        raise ConfigError(f"{path}: no such file: run 'make <name>-defconfig' or 'make menuconfig' first "
                          "(see 'make help' for the defconfigs)")
    return load_strict([path])


def read_config(path: Path | str | None = None) -> Config:
    """Read and validate a .config (or any config file) into a Config. Changes nothing on disk."""
    path = Path(path) if path is not None else config_path()
    return typed_config(load_existing(path), str(path))


def defconfig_names() -> list[str]:
    return sorted(p.name for p in DEFCONFIG_DIR.iterdir() if p.is_file())


def fragment_names() -> list[str]:
    return sorted(p.name for p in FRAGMENT_DIR.iterdir() if p.is_file()) if FRAGMENT_DIR.is_dir() else []


def _named(name: str, directory: Path, names: list[str], what: str) -> Path:
    path = Path(name)
    if path.is_file() and (os.sep in name or not (directory / name).is_file()):
        return path  # an explicit path to a file of the user's
    if (directory / name).is_file():
        return directory / name
    raise ConfigError(f"unknown {what} '{name}': choose one of {', '.join(names) or '(none)'} "
                      f"(files in {directory.relative_to(ROOT)}/), or give a path to a file")


def defconfig_file(name: str) -> Path:
    return _named(name, DEFCONFIG_DIR, defconfig_names(), "defconfig")


def fragment_file(name: str) -> Path:
    return _named(name, FRAGMENT_DIR, fragment_names(), "fragment")


def make_defconfig(name: str, fragments: Sequence[str] = (), out: Path | None = None,
                   notes: list[str] | None = None) -> Config:
    """Base defconfig + fragments -> a full, validated .config written atomically.

    Values of the base that a fragment supersedes are appended to `notes`.
    """
    out = out or config_path()
    files = [defconfig_file(name)] + [fragment_file(f) for f in fragments]
    kconf = load_strict(files, notes)
    config = typed_config(kconf, str(out))
    write_config(kconf, out)
    return config


def defconfig_config(name: str) -> Config:
    """The Config a defconfig would write, built in memory (its source is the defconfig file). Writes nothing."""
    path = defconfig_file(name)
    return typed_config(load_strict([path]), str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))


def olddefconfig(path: Path | None = None) -> Config:
    """Validate the existing .config and rewrite it with defaults for new symbols."""
    path = path or config_path()
    kconf = load_existing(path)
    config = typed_config(kconf, str(path))  # typed checks (numbers in strings) before anything is written
    write_config(kconf, path)
    return config


def savedefconfig(path: Path | None = None, out: Path = Path("defconfig")) -> Path:
    """Write the minimal config that reproduces the current one (as the kernel's savedefconfig)."""
    path = path or config_path()
    kconf = load_existing(path)
    typed_config(kconf, str(path))
    write_config(kconf, out, minimal=True)
    return out


def minimal_config_text(path: Path) -> str:
    """What savedefconfig would write for a config file."""
    kconf = load_strict([path])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "defconfig"
        kconf.write_min_config(str(out))
        return out.read_text()


def listnewconfig(path: Path | None = None) -> list[str]:
    """Visible symbols the config does not set yet, as 'CONFIG_X=default' lines (as the kernel prints)."""
    kconf = load_existing(path or config_path())
    new = []
    for sym in kconf.unique_defined_syms:
        if sym.user_value is None and sym.visibility and any(n.prompt for n in sym.nodes):
            if sym.choice is not None and sym.choice.user_selection is not None:
                continue  # the choice was answered by another member
            new.append(assignment_line(sym, sym.str_value))
    return new


# --------------------------------------------------------------------------
# Changing values programmatically (LR finder APPLY=1, hpo-apply, HPO trials)


def _assignment_lines(assignments: Mapping[str, object]) -> str:
    """.config lines for {symbol: value}; names may carry the CONFIG_ prefix, values are Python or text."""
    kconf = new_kconfig()
    lines = []
    for name, value in assignments.items():
        name = name.removeprefix("CONFIG_")
        sym = kconf.syms.get(name)
        if sym is None or not sym.nodes:
            raise ConfigError(f"CONFIG_{name} is not a kfit option (see 'make menuconfig')")
        if isinstance(value, bool):
            value = "y" if value else "n"
        elif isinstance(value, float):
            value = f"{value:.6g}"
        text = str(value)
        require_utf8(f"CONFIG_{name}", text)  # a config is UTF-8 text: bytes that are not would not be written
        if sym.orig_type in (kconfiglib.INT, kconfiglib.HEX) and not text.strip().isascii():
            raise ConfigError(f"CONFIG_{name}={shown(text, 40)} is not a number: give it in ASCII digits "
                              "(0-9; other scripts' digits are not read)")
        if any(ch in text for ch in "\n\r\0"):  # it would end the line: a second assignment, unchecked
            raise ConfigError(f"CONFIG_{name}={shown(text, 80)!r}: a value cannot hold a line break or a NUL")
        if sym.orig_type == kconfiglib.STRING:
            if len(text) >= 2 and text[0] == text[-1] == '"':  # written as a .config line writes it: the value
                text = text[1:-1].replace('\\"', '"')      # inside the quotes, not a directory named "runs"
            text = text.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(assignment_line(sym, text))
    return "\n".join(lines) + "\n"


def _merged(base_text: str, assignments: Mapping[str, object], source: str,
            notes: list[str] | None) -> tuple[kconfiglib.Kconfig, Config]:
    with tempfile.TemporaryDirectory() as tmp:
        base, change = Path(tmp) / "config", Path(tmp) / "changes"
        base.write_text(base_text)
        change.write_text(_assignment_lines(assignments))
        found: list[str] = []

        def named(text: str) -> str:  # the user's file and "the requested change", not temporary paths
            return (text.replace(str(change), "requested change").replace(str(base), source)
                    .replace("after the later fragments", "after the requested change"))

        try:
            kconf = load_strict([base, change], found)
        except ConfigError as err:
            raise ConfigError(named(str(err))) from None
        finally:
            if notes is not None:
                notes.extend(named(note) for note in found)
        return kconf, typed_config(kconf, source)


def config_from_text(text: str, source: str) -> Config:
    """A Config from a full config's text (Config.text, as a launcher hands it to its ranks), validated as a
    file is; `source` names it in messages. Writes nothing."""
    return _merged(text, {}, source, None)[1]


def derive(config: Config, assignments: Mapping[str, object]) -> Config:
    """`config` with some symbols changed, validated as strictly as a fragment. Writes nothing.

    Every value must take (a hidden symbol, an out-of-range number or a bad
    string is a ConfigError naming it), exactly as for a defconfig fragment.
    """
    return _merged(config.text, assignments, config.source, None)[1]


def apply_assignments(path: Path, assignments: Mapping[str, object], notes: list[str] | None = None) -> Config:
    """Change symbols in the config file at `path` through the same validation, then write it atomically.

    Nothing is written unless the result is valid; the previous file is kept as <path>.old.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file: run 'make <name>-defconfig' first")
    require_config_file(path)
    kconf, config = _merged(path.read_text(), assignments, str(path), notes)
    write_config(kconf, path)
    return config


# --------------------------------------------------------------------------
# Editing a copy (make menuconfig)


def edit_copy_path(path: Path) -> Path:
    """Where menuconfig edits: beside the config, so that a refused edit is kept for the user to fix."""
    return path.with_name(path.name + ".menuconfig")


def _same_bytes(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()


def edit_config(path: Path, edit: Callable[[Path], None], notes: list[str] | None = None) -> Config | None:
    """Run `edit` (the menu) on a copy of the config, which may hold invalid values (the menu is how to fix
    them), and replace the config only if the edited copy passes the strict reader.

    Returns the new Config, or None when nothing was saved or nothing changed. An invalid result is a
    ConfigError naming the copy, which is kept; the config is untouched. A copy left by a refused edit
    and newer than the config is edited again (said in `notes`) rather than started afresh.
    """
    copy = edit_copy_path(path)
    refuse_link(copy)  # kfit's own working copy: the menu must not write through a link planted there
    for existing in (path, copy):  # the menu would fail on them with kconfiglib's traceback
        if existing.exists():
            require_config_file(existing)
    if copy.is_file() and not _same_bytes(copy, path) and (
            not path.is_file() or copy.stat().st_mtime_ns >= path.stat().st_mtime_ns):
        if notes is not None:
            notes.append(f"editing {copy} again, kept from an edit that was refused (delete it to start "
                         f"from {path})")
    elif path.is_file():
        copy_file(path, copy)
    else:
        copy.unlink(missing_ok=True)
    try:
        edit(copy)
    finally:
        copy.with_name(copy.name + ".old").unlink(missing_ok=True)  # kconfiglib's backup of the copy
        if not copy.is_file() or _same_bytes(copy, path):
            copy.unlink(missing_ok=True)
    if not copy.is_file():
        return None
    try:
        kconf = load_existing(copy)
        config = typed_config(kconf, str(path))
    except ConfigError as err:
        raise ConfigError(f"{err}\n{path} is unchanged; the edited copy is kept in {copy}: run "
                          f"'make menuconfig' again to fix it there, or delete it to start from {path}") from None
    write_config(kconf, path)
    copy.unlink()
    return config
