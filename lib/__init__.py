"""kfit: a Kconfig-driven training toolchain.

Data flows one way, and imports follow it (docs/architecture.md):
Kconfig -> .config -> lib.config.Config -> lib.hardware.HardwareProfile -> lib.plan.Plan
(lib.planning.make_plan, with lib.memory and lib.steptime) -> lib.trainer -> the run directory.

Installed, this package is `kfit` (in a checkout, `lib`). Its Python API (lib/api.py) is here too:
kfit.load_config, kfit.machine, kfit.resolve_plan and kfit.train; they are imported on first use, so
`import kfit` costs nothing until then (no torch).
"""

_API = ("load_config", "machine", "resolve_plan", "train")
__all__ = [*_API, "__version__"]


def _version() -> str:
    """The installed distribution's version (pip install, or make env's editable install); in a checkout
    without one, pyproject.toml's, where it is stated."""
    from importlib import metadata
    from pathlib import Path

    try:
        return metadata.version("kfit")
    except metadata.PackageNotFoundError:
        import re

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
        return found.group(1) if found else "unknown"


def __getattr__(name: str):
    # lib/api.py's names (none is a submodule's name: the import system sets submodules as attributes here)
    if name in _API:
        from . import api

        return getattr(api, name)
    if name == "__version__":
        return _version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
