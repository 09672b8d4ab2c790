"""Which run `make train` continues: the latest unfinished run in OUTPUT_DIR with the same training math
(the .config lines that decide what a step computes) and effective batch; every run passed by for a reason
that is not obvious is said in one note line, never a traceback.

The files a run directory holds (checkpoints, the out-of-memory marker, the INIT_FROM record) are
lib.checkpoint's; this module only reads them.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from . import fileio
from .checkpoint import (INIT_RECORD, OOM_MARKER, finished_checkpoint, holder_name, load_checkpoint,
                         periodic_checkpoints)
from .plan import Plan
from .redact import shown

# Symbols that do not change what is computed: a run may be resumed with other values of these.
# (The micro-batch policy and memory share only split the same effective batch differently; the
# effective batch itself is compared separately.)
NOT_TRAINING_MATH = ("RESUME", "MONITOR", "CHECKPOINT_", "PROBE_", "OOM_", "NPROC", "CPU_FALLBACK",
                     "LOG_INTERVAL", "EVAL_INTERVAL", "DATALOADER_WORKERS", "TIME_LIMIT", "OUTPUT_DIR",
                     "RUN_NAME", "MEMORY_PROFILE", "HYPER_PARAM_POLICY", "LR_FINDER_", "HPO_",
                     "PARALLEL_", "FSDP_", "TP", "PP",  # sharding, splitting and pipeline stages change where
                     # tensors live and when they are computed, not the math
                     "THERMAL_", "BATTERY_",  # when to pause or stop, not what a step computes
                     "EARLY_STOP_",  # when to stop (CHECKPOINT_BEST_* are CHECKPOINT_ already)
                     "TRACK")  # where metrics are also sent
CONTEXT_SPLIT = "CP"  # the context-parallel degree, by its whole name (a prefix would take CPU_THREADS too)


def training_identity(config_text: str) -> list[str]:
    """The .config lines that decide the training math (comments and NOT_TRAINING_MATH symbols left out)."""
    lines = []
    for line in config_text.splitlines():
        line = line.strip()
        if line.startswith("# CONFIG_") and line.endswith(" is not set"):
            name = line[len("# CONFIG_"):-len(" is not set")]
        elif line.startswith("CONFIG_") and "=" in line:
            name = line[len("CONFIG_"):].split("=", 1)[0]
        else:  # a comment, or no setting at all (a line a damaged file cut short)
            continue
        if not name.startswith(NOT_TRAINING_MATH) and name != CONTEXT_SPLIT:
            lines.append(line)
    return sorted(lines)


def identity_differences(theirs: str, ours: str) -> list[str]:
    """The symbols whose training-math lines differ between two .config texts, as "CONFIG_X: a there, b here"."""
    def by_name(text: str) -> dict[str, str]:
        out = {}
        for line in training_identity(text):
            name = line[2:-len(" is not set")] if line.startswith("# ") else line.split("=", 1)[0]
            out[name] = line.split("=", 1)[1] if "=" in line else "not set"
        return out
    a, b = by_name(theirs), by_name(ours)
    return [f"{name}: {a.get(name, 'absent')} there, {b.get(name, 'absent')} here"
            for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]


def find_resumable(output_dir: Path, config_text: str, effective_batch: int, run_name: str = "",
                   log=print) -> Path | None:
    """The run directory of the latest unfinished run in output_dir (only RUN_NAME when that is set)
    whose config matches and whose effective batch is the same (as plan.json records it, else its newest
    readable checkpoint). A run directory holding a file kfit cannot read (a config or lock that is a directory,
    a plan.json that is not a plan, no permission) is passed by or falls back with one note, never a traceback."""
    base = Path(output_dir).expanduser()
    try:
        runs = [base / run_name] if run_name else (sorted(base.iterdir()) if base.is_dir() else [])
    except OSError as err:
        log(f"note: not resuming a run: {shown(base)} cannot be listed ({err.strerror or err})")
        return None
    identity = training_identity(config_text)
    candidates = []
    for run_dir in runs:
        if run_dir.is_symlink():  # a link among the runs is not a run of this directory: never resumed through
            continue
        try:
            newest = resumable_since(run_dir, identity, effective_batch, run_name, log)
        except OSError as err:  # a file the checks above did not foresee: this run is passed by, said once
            log(f"note: not resuming {shown(run_dir)}: {shown(err.filename or run_dir)} cannot be read "
                f"({err.strerror or err})")
            continue
        if newest is not None:
            candidates.append((newest, run_dir))
    if not candidates:
        note_other_config(runs, config_text, log)
    return max(candidates)[1] if candidates else None


def one_off_settings(run_text: str, file_text: str) -> list[str] | None:
    """The command-line settings (CONFIG_NAME=value, as make and --set take them) that turn the config file's
    training math into the run's: what a command must add to resume a run started with one-off overrides ([] when
    the two agree). None where no settings do: the run's config from another kfit, a value no setting writes.
    Each is written with its CONFIG_ prefix: a symbol that is also a variable of another command (SEED=, make
    sample's seed) is refused without it."""
    def by_name(text: str) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for line in training_identity(text):
            if line.startswith("# "):
                out[line[len("# CONFIG_"):-len(" is not set")]] = None
            else:
                name, value = line[len("CONFIG_"):].split("=", 1)
                out[name] = value
        return out

    run, file = by_name(run_text), by_name(file_text)
    settings = []
    for name in sorted(set(run) | set(file)):
        if run.get(name) == file.get(name):
            continue
        value = run.get(name)
        if value is None:
            if file.get(name) != "y":
                return None
            settings.append(f"CONFIG_{name}=n")  # a bool, or a choice's member another one replaces in the run
        else:
            settings.append(f"CONFIG_{name}={value[1:-1] if value.startswith(chr(34)) else value}")
    if not settings:
        return []
    return settings if _reproduces(settings, file_text, run_text) else None


def _reproduces(settings: list[str], file_text: str, run_text: str) -> bool:
    """Whether the settings, applied to the file's config as the command line applies them, give the run's
    training math (not where the run's config is from another kfit, or holds a value no setting writes)."""
    from . import config as kconfig
    from .errors import KfitError

    try:
        derived = kconfig.derive(kconfig.config_from_text(file_text, "the config file"),
                                 dict(s.split("=", 1) for s in settings))
    except (KfitError, ValueError):
        return False
    return training_identity(derived.text) == training_identity(run_text)


def note_other_config(runs: list[Path], config_text: str, log=print) -> None:
    """One note for the newest unfinished run that its config alone kept from resuming: the symbols that
    differ, and how to continue it (a run interrupted before an upgrade that added a symbol is one: its saved
    config lacks the line). Runs passed by for another reason said so already."""
    newest = None
    for run_dir in runs:
        try:
            saved = periodic_checkpoints(run_dir) if run_dir.is_dir() else []
            config = run_dir / "config"
            if not saved or finished_checkpoint(run_dir) or not config.is_file() or config.is_symlink():
                continue
            differences = identity_differences(fileio.read_text(config), config_text)
            when = saved[0][1].stat().st_mtime
        except (OSError, UnicodeDecodeError):
            continue
        if differences and (newest is None or when > newest[0]):
            newest = (when, run_dir, differences)
    if newest is not None:
        _, run_dir, differences = newest
        more = f"; {len(differences) - 3} more" if len(differences) > 3 else ""
        try:
            settings = one_off_settings(fileio.read_text(run_dir / "config", follow_symlinks=False), config_text)
        except (OSError, UnicodeDecodeError):
            settings = None
        how = (f"make train {' '.join(shlex.quote(s) for s in settings)}" if settings and len(settings) <= 3 else
               f"make train KCONFIG_CONFIG={shlex.quote(str(run_dir / 'config'))}")
        log(f"note: not resuming {shown(run_dir)}, an unfinished run of another config ({'; '.join(differences[:3])}"
            f"{more}): '{how}' continues it; this run is a separate one")


def resumable_since(run_dir: Path, identity: list[str], effective_batch: int, run_name: str = "",
                    log=print) -> float | None:
    """When an unfinished run of this training identity and effective batch last checkpointed (its newest
    checkpoint's or out-of-memory marker's mtime), None when it is not one to resume (said where the reason
    is not obvious)."""
    newest = periodic_checkpoints(run_dir) if run_dir.is_dir() else []
    marker = run_dir / OOM_MARKER  # out of memory before its first checkpoint: restarts in place
    config = run_dir / "config"
    if (not newest and not marker.is_file()) or finished_checkpoint(run_dir) or not config.exists():
        return None
    try:
        fileio.refuse_link(config)
        config_text = fileio.read_text(config)
    except (OSError, UnicodeDecodeError) as err:
        why = ("not a regular file" if isinstance(err, fileio.UnsafeFileError) else
               err.strerror if isinstance(err, OSError) else "not UTF-8 text")
        log(f"note: not resuming {shown(run_dir)}: its config cannot be read ({shown(why, 300)})")
        return None
    if training_identity(config_text) != identity:
        return None
    if (run_dir / INIT_RECORD).is_file():
        log(f"note: not resuming {shown(run_dir)}: it started from other weights (INIT_FROM, its {INIT_RECORD}); "
            f"'make train RESUME_FROM={shown(run_dir)}' continues it")
        return None
    effective = recorded_effective_batch(run_dir, newest, log)
    if effective is None:
        return None
    if effective != effective_batch:
        log(f"note: not resuming {shown(run_dir)}: its effective batch was {effective}, this run's is "
            f"{effective_batch}")
        return None
    lock = run_dir / fileio.LOCK_NAME
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        log(f"note: not resuming {shown(run_dir)}: its {fileio.LOCK_NAME} is not a regular file (a directory or link "
            f"planted there); remove it and 'make train' resumes the run; this run is a separate one")
        return None
    holder = None if run_name else fileio.lock_holder(run_dir)  # a named run in use is refused later
    if holder is not None:
        log(f"note: not resuming {shown(run_dir)}: {holder_name(holder)} is still training it "
            f"('kill {holder or '<pid>'}' stops it after a checkpoint; 'make train' then resumes it); this run is a "
            "separate one")
        return None
    return (newest[0][1] if newest else marker).stat().st_mtime


def plan_json_problem(data) -> str | None:
    """What keeps a parsed plan.json from being a plan with an effective batch, None when it is one."""
    try:
        Plan.from_dict(data)
    except ValueError as err:
        return shown(" ".join(str(err).split()), 100)
    effective = data.get("effective_batch")
    if isinstance(effective, bool) or not isinstance(effective, int) or effective < 1:
        return f"its effective_batch is {effective!r}, not a whole number >= 1"
    return None


def recorded_effective_batch(run_dir: Path, newest: list[tuple[int, Path]], log=print) -> int | None:
    """A run's effective batch as its plan.json says; a plan.json that is not a plan (empty, cut short, of
    another shape) falls back, with one note, to the window of its newest readable checkpoint."""
    path = run_dir / "plan.json"
    data, problem = fileio.read_json_file(path)  # never through a link; never raises
    problem = problem or plan_json_problem(data)
    if problem is None:
        return data["effective_batch"]
    for _, saved in newest:
        try:
            window = load_checkpoint(saved)["progress"]["window_size"]
        except Exception:  # noqa: BLE001 - an unreadable one: the next older (the resume says which it takes)
            continue
        if isinstance(window, int) and not isinstance(window, bool):
            log(f"note: {shown(path)} is not a plan ({shown(problem, 300)}): the effective batch {window} of "
                f"{saved.name} decides; a resumed run writes plan.json again")
            return window
    log(f"note: not resuming {shown(run_dir)}: its plan.json is not a plan ({shown(problem, 300)}) and no checkpoint "
        f"there records the effective batch; delete {shown(run_dir)} or keep it aside: this run is a separate one")
    return None
