"""Tuning subcommands: find-lr (LR range test) and hpo, hpo-status, hpo-apply (Optuna search).

Make variables arrive as environment variables (or as flags, lib/cli/flags.py): BATCH=, RUNS=, APPLY= for
find-lr; TRIALS=, HPO_STORAGE=, HPO_STUDY= for hpo (the last two for
hpo-status and hpo-apply too); DEFCONFIG= for hpo-apply.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from .common import ensure_config, env_number, hardware_from_env, new_defconfig_dir, parsed
from .. import config as kconfig, fileio
from ..env import env_utf8
from ..errors import KfitError
from .flags import command
from ..models.registry import label as model_label


def _new_directory(base: Path, prefix: str) -> Path:
    """base/prefix-<timestamp>, made unique (two runs in one second get -2, -3...)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = base / f"{prefix}-{stamp}", 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base / f"{prefix}-{stamp}-{n}"


def _positive(name: str) -> int | None:
    value = env_number(name, int)
    if value is not None and value < 1:
        raise KfitError(f"{name}={value} must be at least 1")
    return value


def _shown(assignments: dict, written: "kconfig.Config") -> str:
    """The assigned symbols' lines as the config that was written holds them: printed is what is written."""
    lines = dict(line.split("=", 1) for line in written.text.splitlines() if line.startswith("CONFIG_"))
    return ", ".join(f"CONFIG_{k}={lines.get(f'CONFIG_{k}', 'n')}" for k in assignments)  # n: '# ... is not set'


def _apply(assignments: dict) -> None:
    """Write into the .config through the strict validation, and say what changed."""
    path = kconfig.config_path()
    notes: list[str] = []
    written = kconfig.apply_assignments(path, assignments, notes)
    for note in notes:
        print(f"note: {note}")
    print(f"# {_shown(assignments, written)} written to {path} "
          f"(previous in {path}.old)")


# --------------------------------------------------------------------------
# find-lr


def cmd_find_lr(args) -> int:
    from .. import lr_finder
    from ..env import env_bool

    apply = env_bool("APPLY", False)  # checked before the sweep, not after it
    from ..planning import make_plan

    run = parsed(None)
    hardware = hardware_from_env(allow_simulated=False, run=run)
    config = ensure_config(run)
    model, plan = make_plan(config, hardware, **run.plan_args())
    batch = _positive("BATCH") or plan.micro_batch
    runs = _positive("RUNS") or 1
    split = plan.split
    why = "BATCH=" if os.environ.get("BATCH") else "the plan's per-device micro-batch"
    why += f"; training steps micro-batches {split.text()}"
    scaling = lr_finder.scaling_for(config, batch, plan.effective_batch)
    print(f"LR range test: {model_label(config)}, "
          f"{config.optimizer}, one process on {plan.device_type} ({plan.precision}) at batch {batch} ({why})")
    print(f"Sweep {config.lr_finder_min_lr:g} -> {config.lr_finder_max_lr:g} over {config.lr_finder_steps} steps, "
          f"smoothing {config.lr_finder_smoothing:g}, stop above {config.lr_finder_diverge:g} x the best; "
          f"{runs} run(s)")
    warning = lr_finder.memory_warning(plan, hardware, batch)
    if warning:
        print(f"warning: {warning}")
    results = lr_finder.find_lr(config, plan, batch=batch, runs=runs)
    for i, r in enumerate(results):
        found = (f"minimum at {r.min_lr:.2g}, suggestion {r.suggestion:.2g} (steepest descent would say "
                 f"{r.steepest_lr:.2g})") if r.suggestion else "the loss never fell"
        print(f"  run {i + 1} (seed {config.seed + i}): {len(r.lrs)} steps in {r.seconds:.1f}s, stopped: "
              f"{r.stop_reason}; {found}")
    summary = lr_finder.summarize(results)
    directory = _new_directory(Path(config.output_dir), "lr-finder")
    facts = [("config", config.source), ("model", model.name + (f"-{model.preset}" if model.preset else "")),
             ("optimizer", f"{config.optimizer}, weight decay {config.weight_decay:g}"),
             ("device", f"{plan.device_type} ({plan.device_name}), {plan.precision}"),
             ("batch", f"{batch} ({why})"), ("configured learning rate", f"{config.learning_rate:g}"),
             ("for the effective batch", f"{plan.effective_batch}: {scaling.describe()}")]
    fileio.write_text(directory / "report.html", lr_finder.render_report(
        results, summary, title=f"LR range test: {facts[1][1]}", facts=facts))
    found = summary.suggestion
    fileio.write_text(directory / "result.json", json.dumps(
        {"batch": batch, "suggestion": found, "low": summary.low, "high": summary.high,
         "effective_batch": plan.effective_batch, "micro_batch": plan.micro_batch, "grad_accum": split.count,
         "last_micro_batch": split.last_micro_batch, "world_size": plan.world_size,
         "scaling": {"rule": scaling.rule, "why": scaling.why, "factor": scaling.factor},
         "effective_suggestion": scaling.convert(found) if found is not None else None,
         "runs": [r.to_dict() for r in results]}, indent=1))
    if summary.suggestion is None:
        raise KfitError(f"the loss never fell in the sweep (report: {directory / 'report.html'}): lower "
                        f"CONFIG_LR_FINDER_MIN_LR (now {config.lr_finder_min_lr:g})")
    measured = lr_finder.rounded(summary.suggestion)
    lr = lr_finder.rounded(scaling.convert(summary.suggestion))
    spread = (f" (median of {runs - summary.failed} runs: {summary.low:.2g} to {summary.high:.2g}, "
              f"spread x{summary.spread:.2f})" if runs > 1 else "")
    print(f"Suggested learning rate at the measured batch {batch}: {measured:.2g}{spread}")
    print(f"Suggested learning rate at the effective batch {plan.effective_batch}: {lr:.2g} ({scaling.describe()}); "
          f"configured: {config.learning_rate:g}")
    print(f"Report: {directory / 'report.html'}")
    if apply:  # training steps at the effective batch: its rate is the one written
        _apply({"LEARNING_RATE": lr})
    return 0


# --------------------------------------------------------------------------
# hpo, hpo-status, hpo-apply


def _quiet_optuna() -> None:
    import optuna

    # One line per trial is ours to print, a failed one's reason included: Optuna's own warning repeats it
    # with a traceback (and an interrupted trial's too).
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def _study_config(config):
    """The config with HPO_STUDY= (a study name for this command) over CONFIG_HPO_STUDY_NAME."""
    name = env_utf8("HPO_STUDY")  # kept in the study's database as text
    return kconfig.derive(config, {"HPO_STUDY_NAME": name}) if name else config


def _terminate(signum, frame):
    from .. import hpo

    raise hpo.Interrupted("SIGTERM", 128 + signum)


def cmd_hpo(args) -> int:
    from .. import hpo

    _quiet_optuna()
    hardware = hardware_from_env(allow_simulated=False)
    config = _study_config(ensure_config())
    storage = hpo.checked_storage(os.environ.get("HPO_STORAGE"))
    url = hpo.redact(hpo.storage_url(config, storage))
    trials = _positive("TRIALS") or config.hpo_trials
    timeout = config.hpo_timeout_s
    print(f"HPO: study '{hpo.study_name(config)}' in {url}; {trials} trial(s)"
          + (f", at most {timeout}s" if timeout else "") + f"; Hyperband {config.hpo_min_resource}.."
          f"{config.hpo_max_resource} epochs, reduction {config.hpo_reduction_factor}"
          + (f", patience {config.hpo_patience}" if config.hpo_patience else ""))
    # SIGTERM (a cluster's scheduler) ends the search as Ctrl-C does: the trial it cuts short is recorded as
    # failed rather than left running; the trainer catches it itself while a trial trains.
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        study = hpo.run_study(config, hardware, trials=trials, timeout=timeout, storage=storage)
    except hpo.Interrupted as stop:
        print(f"interrupted: {stop}", file=sys.stderr)
        return stop.exit_code
    finally:
        signal.signal(signal.SIGTERM, previous)
    for line in hpo.status_lines(study, url):
        print(line)
    return 0


def _existing_study():
    """(config, storage URL, study) of the config's study, which must exist. Reads .config, never writes it."""
    from .. import hpo

    _quiet_optuna()
    config = _study_config(kconfig.read_config())
    storage = hpo.checked_storage(os.environ.get("HPO_STORAGE"))
    return config, hpo.storage_url(config, storage), hpo.open_study(config, storage, create=False)


def cmd_hpo_status(args) -> int:
    from .. import hpo

    _, url, study = _existing_study()
    for line in hpo.status_lines(study, url):
        print(line)
    return 0


def cmd_hpo_apply(args) -> int:
    from .. import hpo

    study = _existing_study()[2]
    assignments = hpo.best_assignments(study)
    name = os.environ.get("DEFCONFIG")
    if not name:
        _apply(assignments)
        return 0
    # A bare name goes into defconfigs/ (then 'make <name>-defconfig' works); a path is used as given.
    out = Path(name) if os.sep in name else new_defconfig_dir() / name
    if out.exists():
        raise KfitError(f"{out} exists: choose another DEFCONFIG= name, or remove it first")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "config"
        fileio.copy_file(kconfig.config_path(), copy)
        written = kconfig.apply_assignments(copy, assignments)
        kconfig.savedefconfig(copy, out)
    print(f"# defconfig with the best trial's {_shown(assignments, written)} written to {out}")
    return 0


def register(sub) -> None:
    command(sub, "find-lr", "LR range test at the per-device batch", "BATCH", "RUNS", "APPLY", func=cmd_find_lr)
    command(sub, "hpo", "Optuna search; running it again continues the study", "TRIALS", "HPO_STORAGE",
            "HPO_STUDY", func=cmd_hpo)
    command(sub, "hpo-status", "progress and best trial (with its plan) of the study", "HPO_STORAGE", "HPO_STUDY",
            func=cmd_hpo_status)
    command(sub, "hpo-apply", "write the best trial into the config (or a new defconfig)", "HPO_STORAGE",
            "HPO_STUDY", "DEFCONFIG", func=cmd_hpo_apply)
