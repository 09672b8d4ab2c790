"""The last run: what `make sample` and `make export` act on when RUN= names none.

A training run's directory is a direct child of CONFIG_OUTPUT_DIR holding the `config` and `plan.json` the
trainer writes at its start (lib/trainer/rundir.py); HPO trials (`hpo-<study>/trial-NNNN`) sit a level deeper
and are never "the last run". The last run that fits a command is the one written most recently (its newest
metrics line, checkpoint or plan), among those whose model the command takes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from . import fileio
from .errors import KfitError

# What a run writes as it goes: the newest of these is when it was last written
WRITTEN = ("metrics.jsonl", "checkpoint.pt", "plan.json")
_MODEL = re.compile(r"^CONFIG_MODEL_([A-Z0-9_]+)=y$", re.M)


def run_model(run_dir: Path) -> str | None:
    """The model a run trained (its config's CONFIG_MODEL_ choice, lower case), None when unreadable."""
    try:
        found = _MODEL.search(fileio.read_text(run_dir / "config", errors="replace"))
    except OSError:
        return None
    return found.group(1).lower() if found else None


def _written(run_dir: Path) -> float | None:
    """When the run was last written; None when it is not a training run's directory."""
    try:
        if run_dir.is_symlink() or not (run_dir.is_dir() and (run_dir / "config").is_file()
                                        and (run_dir / "plan.json").is_file()):
            return None
        times = [(run_dir / name).stat().st_mtime for name in WRITTEN if (run_dir / name).is_file()]
        times += [p.stat().st_mtime for p in run_dir.glob("checkpoint-*.pt")]
    except OSError:
        return None
    return max(times) if times else None


def last_run(output_dir: Path, fits: Callable[[str | None], bool] = lambda model: True) -> Path | None:
    """The training run under `output_dir` written most recently whose model `fits`; None when there is none."""
    try:
        children = list(Path(output_dir).expanduser().iterdir())
    except OSError:
        return None
    written = [(t, p) for p in children if (t := _written(p)) is not None and fits(run_model(p))]
    return max(written)[1] if written else None


def run_or_last(given: str | None, output_dir: Path, command: str, what: str,
                fits: Callable[[str | None], bool] = lambda model: True, kinds: str = "",
                command_line: str | None = None) -> tuple[Path, bool]:
    """RUN= when given, else the last run that fits: (the path, whether it was the last run). None found is
    one KfitError naming RUN= and where kfit looked (`command_line`: the make command to show, default
    `command`)."""
    if given:
        return Path(given), False
    run = last_run(output_dir, fits)
    if run is None:
        raise KfitError(f"no {kinds + ' ' if kinds else ''}run under CONFIG_OUTPUT_DIR ({output_dir}) to {command}: "
                        f"train one first, or name {what} with RUN=, e.g. "
                        f"'make {command_line or command} RUN=runs/<run>'")
    return run, True
