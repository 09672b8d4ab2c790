"""The one reader of .config: Kconfig files + defconfigs + fragments -> a typed, frozen Config.

Everything goes through the kconfiglib API (no regex parsing anywhere else).
kconfiglib is lenient by design: an unknown symbol, a malformed or
out-of-range number, or an assignment whose dependencies are unmet only
produces a warning, and the value silently falls back to a default. Here every
such case is an error that names the symbol, the file it came from and why,
and nothing is written to disk unless the whole configuration is valid.

    kconfig.py      the Kconfig tree, strict loading and validation, atomic writes
    typed.py        the typed Config and the parsing of a loaded kconfig into it
    profiles.py     the memory profiles' shares of free memory (the one source)
    operations.py   what the make targets call (defconfig, olddefconfig, ...),
                    programmatic changes (derive, apply_assignments) and menuconfig's edited copy
    generate.py     the kernel's other targets: all*config, randconfig, oldconfig, <fragment>.config
"""

from .kconfig import KCONFIG, ROOT
from .generate import (
    alldefconfig, allnoconfig, allyesconfig, merge_fragment, oldconfig, randconfig, randconfig_seed,
)
from .operations import (
    DEFAULT_DEFCONFIG, DEFCONFIG_DIR, FRAGMENT_DIR, apply_assignments, config_from_text, config_path,
    defconfig_config,
    defconfig_file,
    defconfig_names, derive, edit_config, edit_copy_path, fragment_file, fragment_names, listnewconfig,
    make_defconfig, minimal_config_text, olddefconfig, read_config, savedefconfig,
)
from .profiles import DEFAULT_SHARE, LARGEST_SHARE, MEMORY_PROFILES, profile_name
from .typed import Config

__all__ = [
    "Config", "DEFAULT_DEFCONFIG", "DEFAULT_SHARE", "LARGEST_SHARE", "MEMORY_PROFILES", "profile_name", "DEFCONFIG_DIR", "FRAGMENT_DIR", "KCONFIG", "ROOT", "alldefconfig",
    "allnoconfig", "allyesconfig", "apply_assignments", "config_from_text", "config_path", "defconfig_config", "defconfig_file",
    "defconfig_names", "derive", "edit_config", "edit_copy_path", "fragment_file", "fragment_names", "listnewconfig",
    "make_defconfig", "merge_fragment", "minimal_config_text", "oldconfig", "olddefconfig", "randconfig",
    "randconfig_seed", "read_config", "savedefconfig",
]
