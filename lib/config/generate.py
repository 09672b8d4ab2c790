"""The kernel's other config targets: alldefconfig, allnoconfig, allyesconfig, randconfig, oldconfig and
`make <fragment>.config`, with the kernel's meanings, built on kconfiglib.

kconfiglib's scripts (alldefconfig.py, allnoconfig.py, ...) write whatever the
assignments produce; here every result goes through `write_checked`, which
writes it out, reads it back through the strict reader and the typed checks,
and only then replaces the config (keeping <config>.old), so a config these
targets write is one `read_config` accepts, and a refused one changes nothing.
"""

from __future__ import annotations

import math
import random
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable

import kconfiglib

from ..redact import shown
from ..units import MAXIMA
from ..errors import ConfigError, KfitError
from .kconfig import load_strict, new_kconfig, write_config
from .operations import load_existing, config_path, fragment_file
from .typed import ONE_OF, Config, typed_config

# randconfig redraws (from the same seeded generator, so a seed still names one config) when a draw breaks
# a rule Kconfig cannot express (typed.py): the kernel's randconfig only ever writes valid configs.
RANDCONFIG_DRAWS = 100


def write_checked(kconf: kconfiglib.Kconfig, out: Path, label: str) -> Config:
    """Write what `kconf` holds to `out` only if it reads back strictly; errors name `label`, not a temp file."""
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / "config"
        kconf.write_config(str(draft), save_old=False)
        try:
            checked = load_strict([draft])
            config = typed_config(checked, str(out))
        except ConfigError as err:
            message = str(err).replace(str(draft), label)
            raise ConfigError(message if label in message else f"{label}: {message}") from None
    write_config(checked, out)
    return config


# --------------------------------------------------------------------------
# all*config


def alldefconfig(out: Path | None = None) -> Config:
    """Every symbol at its default (kconfiglib's alldefconfig.py)."""
    return write_checked(new_kconfig(), out or config_path(), "alldefconfig")


def _allno_y(kconf: kconfiglib.Kconfig) -> set[str]:
    """Symbols allnoconfig leaves y: `option allnoconfig_y`, and for each group the reader needs one of
    (typed.ONE_OF: Kconfig cannot say "at least one"), its first member that defaults to y."""
    keep = {sym.name for sym in kconf.unique_defined_syms if sym.is_allnoconfig_y}
    for group in ONE_OF:
        keep.add(next((name for name in group if kconf.syms[name].str_value == "y"), group[0]))
    return keep


def allnoconfig(out: Path | None = None) -> Config:
    """As many bool symbols n as the Kconfig (and the reader) allow (kconfiglib's allnoconfig.py)."""
    kconf = new_kconfig()
    keep = _allno_y(kconf)
    kconf.warn = False  # n assigned to int, string and prompt-less symbols is ignored, as intended
    for sym in kconf.unique_defined_syms:
        sym.set_value(2 if sym.name in keep else 0)
    kconf.warn = True
    return write_checked(kconf, out or config_path(), "allnoconfig")


def allyesconfig(out: Path | None = None) -> Config:
    """As many bool symbols y as the Kconfig allows; choices at their defaults (kconfiglib's allyesconfig.py)."""
    kconf = new_kconfig()
    kconf.warn = False  # see allnoconfig
    for sym in kconf.unique_defined_syms:
        sym.set_value(1 if sym.choice else 2)  # 1 (m) is ignored in y-mode choices: they keep their default
    for choice in kconf.unique_choices:
        choice.set_value(2)
    kconf.warn = True
    return write_checked(kconf, out or config_path(), "allyesconfig")


# --------------------------------------------------------------------------
# randconfig


def randconfig_seed(text: str | None) -> int:
    """KCONFIG_SEED as the kernel reads it (decimal, or hex with 0x); a fresh random one when unset."""
    if not text:
        return random.SystemRandom().getrandbits(32)
    try:
        seed = int(text, 0)
    except ValueError:
        seed = -1
    if not 0 <= seed <= MAXIMA["KCONFIG_SEED"]:
        raise ConfigError(f"KCONFIG_SEED='{shown(text, 80)}' is not a seed: give a whole number from 0 to "
                          f"{MAXIMA['KCONFIG_SEED']:,}, like 42 or 0x2a")
    return seed


def active_range(sym: kconfiglib.Symbol) -> tuple[int, int] | None:
    """The (low, high) of the first `range` of an int or hex symbol whose condition holds now, or None."""
    base = 16 if sym.orig_type == kconfiglib.HEX else 10
    for low, high, cond in sym.ranges:
        if kconfiglib.expr_value(cond):
            return int(low.str_value, base), int(high.str_value, base)
    return None


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    """Spread over orders of magnitude, as batch sizes, lengths and step counts are, not uniformly."""
    shift = 1 - low  # the low end maps to 1 (ranges may start at 0)
    value = round(math.exp(rng.uniform(0, math.log(high + shift)))) - shift
    return min(max(value, low), high)


def randomize(kconf: kconfiglib.Kconfig, rng: random.Random) -> None:
    """The kernel's randconfig in menu order (so a choice made earlier decides what is visible later):
    a random member of each choice, random bools, and half the ranged numbers at a random value in their
    range (the others, and strings, keep their defaults: a random string is no meaningful value). What `kconf`
    has a user value for already is kept (randcheck's weighted picks over a base defconfig)."""
    for node in kconf.node_iter():
        item = node.item
        if not node.prompt or not isinstance(item, (kconfiglib.Symbol, kconfiglib.Choice)) or not item.visibility:
            continue
        if isinstance(item, kconfiglib.Choice):
            options = [sym for sym in item.syms if sym.visibility == 2]
            if options and item.user_selection is None:  # a choice made already (a base config's) is kept
                rng.choice(options).set_value(2)
        elif item.choice is None and item.user_value is None:
            if item.orig_type == kconfiglib.BOOL and len(item.assignable) > 1:
                item.set_value(rng.choice(item.assignable))
            elif item.orig_type in (kconfiglib.INT, kconfiglib.HEX) and rng.random() < 0.5:
                bounds = active_range(item)
                if bounds is not None:
                    value = _log_uniform(rng, *bounds)
                    item.set_value(hex(value) if item.orig_type == kconfiglib.HEX else str(value))


def randconfig(seed: int, out: Path | None = None) -> Config:
    """A random config that the strict reader accepts; the same seed gives the same config."""
    rng = random.Random(seed)
    label = f"randconfig (KCONFIG_SEED=0x{seed:X})"
    last = None
    for _ in range(RANDCONFIG_DRAWS):
        kconf = new_kconfig()
        randomize(kconf, rng)
        try:
            return write_checked(kconf, out or config_path(), label)
        except ConfigError as err:  # a rule beyond Kconfig's (typed.py): draw again
            last = err
    raise ConfigError(f"{label}: no valid configuration in {RANDCONFIG_DRAWS} draws; the last one: {last}")


# --------------------------------------------------------------------------
# oldconfig


def oldconfig(path: Path | None = None, ask: Callable[[kconfiglib.MenuNode], None] | None = None) -> Config:
    """Ask (through `ask`, kconfiglib's oldconfig prompt) only for the symbols the config does not set,
    then write it as olddefconfig does. With ask=None, new symbols take their defaults (olddefconfig).

    A value the reader refuses (a learning rate that is not a number) is said and asked again; nothing
    is written unless the result is valid.
    """
    path = path or config_path()
    kconf = load_existing(path)
    typed_config(kconf, str(path))  # refuse a broken config before asking anything
    if ask is not None:
        _ask_new(kconf, ask, str(path))
    return write_checked(kconf, path, str(path))


def _ask_new(kconf: kconfiglib.Kconfig, ask, source: str) -> None:
    """kconfiglib's oldconfig loop: answers can make more symbols visible, so go again until none change."""
    kconf.warn_to_stderr = True  # kconfiglib's "invalid value" warnings are the prompt's feedback
    while True:
        before = {sym.name: sym.str_value for sym in kconf.unique_defined_syms}
        for node in kconf.node_iter():
            _ask_until_valid(kconf, node, ask, source)
        if before == {sym.name: sym.str_value for sym in kconf.unique_defined_syms}:
            return


def _ask_until_valid(kconf, node, ask, source: str) -> None:
    sym = node.item
    while True:
        asked = isinstance(sym, kconfiglib.Symbol) and sym.user_value is None
        try:
            ask(node)
        except EOFError:
            raise KfitError(f"oldconfig: the input ended before every new symbol was answered; {source} "
                            "is unchanged") from None
        if not asked or sym.user_value is None:
            return
        try:
            typed_config(kconf, source)
            return
        except ConfigError as err:
            if not re.search(rf"\bCONFIG_{re.escape(sym.name)}\b", str(err)):
                return  # another symbol's problem: the final check reports it
            print(f"error: {shown(err, 1000)}", file=sys.stderr)  # then kconfiglib asks again
            sym.unset_value()


# --------------------------------------------------------------------------
# make <fragment>.config


def merge_fragment(name: str, path: Path | None = None, notes: list[str] | None = None) -> Config:
    """Merge defconfigs/fragments/<name> (or a file) onto the current config, as the kernel's
    `make kvm_guest.config`: the config and each fragment value must take, or nothing is written."""
    path = path or config_path()
    load_existing(path)  # the config itself must be valid (and exist) before anything merges onto it
    kconf = load_strict([path, fragment_file(name)], notes)
    return write_checked(kconf, path, str(path))
