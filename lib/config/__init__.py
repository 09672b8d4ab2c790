"""The one reader of .config: Kconfig files + defconfigs + fragments -> a typed, frozen Config.

Everything goes through the kconfiglib API (no regex parsing anywhere else).
kconfiglib is lenient by design: an unknown symbol, a malformed or
out-of-range number, or an assignment whose dependencies are unmet only
produces a warning, and the value silently falls back to a default. Here every
such case is an error that names the symbol, the file it came from and why,
and nothing is written to disk unless the whole configuration is valid.

    kconfig.py      the Kconfig tree, strict loading and validation, atomic writes
    typed.py        the typed Config and the parsing of a loaded kconfig into it
    operations.py   what the make targets call (defconfig, olddefconfig, ...) and
                    programmatic changes (derive, apply_assignments)
"""

from .kconfig import KCONFIG, ROOT
from .operations import (
    DEFAULT_DEFCONFIG, DEFCONFIG_DIR, FRAGMENT_DIR, apply_assignments, config_path, defconfig_file,
    defconfig_names, derive, fragment_file, fragment_names, listnewconfig, make_defconfig,
    minimal_config_text, olddefconfig, read_config, savedefconfig,
)
from .typed import Config

__all__ = [
    "Config", "DEFAULT_DEFCONFIG", "DEFCONFIG_DIR", "FRAGMENT_DIR", "KCONFIG", "ROOT", "apply_assignments",
    "config_path", "defconfig_file", "defconfig_names", "derive", "fragment_file", "fragment_names",
    "listnewconfig", "make_defconfig", "minimal_config_text", "olddefconfig", "read_config", "savedefconfig",
]
