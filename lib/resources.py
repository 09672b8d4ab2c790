"""Where kfit's own files are: the Kconfig tree and the defconfigs, from a checkout or an installed package.

Layer 1 (docs/architecture.md): it imports nothing from lib.

A clone runs from its own files: `Kconfig`, `kconfigs/` and `defconfigs/` beside `lib/`, so an edit there
takes at once (make, `pip install -e`). A built wheel has no checkout around it: setup.py's build step
copies the same files into the package as `_data/` (kfit/_data/Kconfig, ...). `_data/` is looked for first:
only a built package has one, while a stale `Kconfig` could sit beside an installed package in
site-packages.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # lib/ in a checkout, site-packages/kfit/ when installed
PACKAGED_DATA = PACKAGE / "_data"
# The checkout this code runs from, or None when it runs from an installed package.
CHECKOUT: Path | None = PACKAGE.parent if (PACKAGE.parent / "Kconfig").is_file() and \
    (PACKAGE.parent / "defconfigs").is_dir() else None
# Where the model families kept in one file each are (lib/models/families/, docs/architecture.md): the config
# layer reads each file's Kconfig entries from here without importing it, the model registry imports its spec.
FAMILY_DIRS: list[Path] = [PACKAGE / "models" / "families"]


def data_root() -> Path:
    """The directory holding `Kconfig`, `kconfigs/` and `defconfigs/`."""
    if (PACKAGED_DATA / "Kconfig").is_file():
        return PACKAGED_DATA
    if CHECKOUT is not None:
        return CHECKOUT
    # A broken install, not a user error: say what is missing rather than fail later on a path.
    raise FileNotFoundError(f"kfit's Kconfig tree is missing: neither {PACKAGED_DATA / 'Kconfig'} (an installed "
                            f"package) nor {PACKAGE.parent / 'Kconfig'} (a checkout) exists; reinstall kfit")
