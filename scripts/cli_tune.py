"""Tuning subcommands: find-lr (LR range test) and hpo, hpo-status, hpo-apply (Optuna search).

Make variables arrive as environment variables: BATCH=, RUNS=, APPLY= for
find-lr; TRIALS=, HPO_STORAGE= for hpo; DEFCONFIG= for hpo-apply.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

from kfit_env import ensure_config, env_number, hardware_from_env, plan_for
from lib import config as kconfig
from lib.errors import KfitError


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


def _shown(assignments: dict) -> str:
    return ", ".join(f"CONFIG_{k}=" + ("y" if v is True else f"{v:.3g}" if isinstance(v, float) else str(v))
                     for k, v in assignments.items())


def _apply(assignments: dict) -> None:
    """Write into the .config through the strict validation, and say what changed."""
    path = kconfig.config_path()
    notes: list[str] = []
    kconfig.apply_assignments(path, assignments, notes)
    for note in notes:
        print(f"note: {note}")
    print(f"# {_shown(assignments)} written to {path} "
          f"(previous in {path}.old)")


# --------------------------------------------------------------------------
# find-lr


def cmd_find_lr(args) -> int:
    from lib import lr_finder

    hardware = hardware_from_env(allow_simulated=False)
    config = ensure_config()
    model, plan = plan_for(config, hardware)
    batch = _positive("BATCH") or plan.micro_batch
    runs = _positive("RUNS") or 1
    why = "BATCH=" if os.environ.get("BATCH") else (
        f"the plan's per-device micro-batch; training steps {plan.effective_batch} = {plan.micro_batch} x "
        f"{plan.grad_accum} x {plan.world_size} process(es)")
    print(f"LR range test: {config.model}{'-' + config.gpt2_preset if config.gpt2_preset else ''}, "
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
             ("batch", f"{batch} ({why})"), ("configured learning rate", f"{config.learning_rate:g}")]
    (directory / "report.html").write_text(lr_finder.render_report(
        results, summary, title=f"LR range test: {facts[1][1]}", facts=facts))
    (directory / "result.json").write_text(json.dumps(
        {"batch": batch, "suggestion": summary.suggestion, "low": summary.low, "high": summary.high,
         "runs": [r.to_dict() for r in results]}, indent=1))
    if summary.suggestion is None:
        raise KfitError(f"the loss never fell in the sweep (report: {directory / 'report.html'}): lower "
                        f"CONFIG_LR_FINDER_MIN_LR (now {config.lr_finder_min_lr:g})")
    lr = lr_finder.rounded(summary.suggestion)
    spread = (f" (median of {runs - summary.failed} runs: {summary.low:.2g} to {summary.high:.2g}, "
              f"spread x{summary.spread:.2f})" if runs > 1 else "")
    print(f"Suggested learning rate: {lr:.2g}{spread}; configured: {config.learning_rate:g}")
    print(f"Report: {directory / 'report.html'}")
    if env_number("APPLY", int):
        _apply({"LEARNING_RATE": lr})
    return 0


# --------------------------------------------------------------------------
# hpo, hpo-status, hpo-apply


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is ours to print


def cmd_hpo(args) -> int:
    from lib import hpo

    _quiet_optuna()
    hardware = hardware_from_env(allow_simulated=False)
    config = ensure_config()
    storage = os.environ.get("HPO_STORAGE") or None
    trials = _positive("TRIALS") or config.hpo_trials
    timeout = config.hpo_timeout_s
    print(f"HPO: study '{hpo.study_name(config)}' in {hpo.storage_url(config, storage)}; {trials} trial(s)"
          + (f", at most {timeout}s" if timeout else "") + f"; Hyperband {config.hpo_min_resource}.."
          f"{config.hpo_max_resource} epochs, reduction {config.hpo_reduction_factor}"
          + (f", patience {config.hpo_patience}" if config.hpo_patience else ""))
    study = hpo.run_study(config, hardware, trials=trials, timeout=timeout, storage=storage)
    for line in hpo.status_lines(study, hpo.storage_url(config, storage)):
        print(line)
    return 0


def _existing_study():
    """(config, storage URL, study) of the config's study, which must exist."""
    from lib import hpo

    _quiet_optuna()
    config = ensure_config()
    storage = os.environ.get("HPO_STORAGE") or None
    return config, hpo.storage_url(config, storage), hpo.open_study(config, storage, create=False)


def cmd_hpo_status(args) -> int:
    from lib import hpo

    _, url, study = _existing_study()
    for line in hpo.status_lines(study, url):
        print(line)
    return 0


def cmd_hpo_apply(args) -> int:
    from lib import hpo

    study = _existing_study()[2]
    assignments = hpo.best_assignments(study)
    name = os.environ.get("DEFCONFIG")
    if not name:
        _apply(assignments)
        return 0
    # A bare name goes into defconfigs/ (then 'make <name>-defconfig' works); a path is used as given.
    out = Path(name) if os.sep in name else kconfig.DEFCONFIG_DIR / name
    if out.exists():
        raise KfitError(f"{out} exists: choose another DEFCONFIG= name, or remove it first")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "config"
        shutil.copyfile(kconfig.config_path(), copy)
        kconfig.apply_assignments(copy, assignments)
        kconfig.savedefconfig(copy, out)
    print(f"# defconfig with the best trial's {_shown(assignments)} written to {out}")
    return 0


def register(sub) -> None:
    sub.add_parser("find-lr", help="LR range test (BATCH=, RUNS=, APPLY=1)").set_defaults(func=cmd_find_lr)
    sub.add_parser("hpo", help="Optuna search (TRIALS=, HPO_STORAGE=)").set_defaults(func=cmd_hpo)
    sub.add_parser("hpo-status", help="progress and best trial of the study").set_defaults(func=cmd_hpo_status)
    sub.add_parser("hpo-apply", help="write the best trial into .config (or DEFCONFIG=name)").set_defaults(
        func=cmd_hpo_apply)
