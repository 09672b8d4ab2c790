"""Running the study: each trial's plan (capped by one probe before the first), its training with the pruner
told every evaluation, the line per finished trial, and what hpo-status and hpo-apply read back."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Callable

import optuna
import torch

from ..config import Config
from ..data.splits import BatchSplit
from ..errors import KfitError
from ..plan import Plan
from ..planning import make_plan
from ..units import batch_split
from .space import (OBJECTIVES, assignments, check_objective, check_space, describe, heaviest, maximise,
                    objective_label, sample, search_space, space_text, stored_space, study_objective, trial_config)
from . import storage as storage_module
from .storage import (HEARTBEAT_GRACE_S, no_experimental_warning, open_study, redact, storage_failure, storage_label,
                      storage_reason, storage_url, study_dir)

Log = Callable[[str], None]
# Failures that end one trial (recorded as FAIL) but not the study.
TRIAL_FAILURES = (FloatingPointError, torch.OutOfMemoryError)


def new_trial_dir(directory: Path, number: int) -> Path:
    """directory/trial-NNNN, created now; never an existing one (left by an earlier study of this name whose
    database was deleted), which training would overwrite: that one gets trial-NNNN-2, -3..."""
    directory.mkdir(parents=True, exist_ok=True)
    name, n = f"trial-{number:04d}", 1
    while True:
        path = directory / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1


def probe_once(config: Config, hardware, task, log: Log = print) -> dict | None:
    """Before the first trial: the probe (lib/probe.py, as CONFIG_PROBE_* says) of the trial that needs the most
    memory, the largest effective batch with the optimizer that keeps the most state; its largest micro-batch
    and evaluation batch that fit cap every trial (`capped`). None where the config does not probe here."""
    from ..probe import confirm

    params = heaviest(config)
    cfg = trial_config(config, params, "probe")
    result = confirm(cfg, make_plan(cfg, hardware, world_size=1).plan, hardware, task, log=log)
    if result is not None:
        log(f"Probe: every trial's micro-batch at most {result['max_micro']}, eval batch at most "
            f"{result['eval_batch']} (probed once, {describe(params)})")
    return result


def capped(plan: Plan, probed: dict | None) -> Plan:
    """A trial's plan under the probe's caps: the same effective batch, in micro-batches that fit."""
    if probed is None:
        return plan
    from ..probe import apply

    return apply(plan, {"max_micro": probed["max_micro"], "eval_batch": min(plan.eval_batch, probed["eval_batch"])},
                 "once before the trials")


def objective(config: Config, hardware, task, *, storage: str | None = None, log: Log = print,
              probed: dict | None = None, current: dict | None = None) -> Callable[[optuna.Trial], float]:
    """The trial function; `current["trial"]` is set to the number of the trial running (for run_study's
    error when the storage fails during it)."""
    from ..trainer import train

    directory = study_dir(config, storage)
    current = {} if current is None else current

    def attempt(trial: optuna.Trial) -> float:
        current["trial"] = trial.number
        params = sample(trial, config)
        run_dir = new_trial_dir(directory, trial.number)
        cfg = trial_config(config, params, run_dir.name)
        plan = capped(make_plan(cfg, hardware, world_size=1).plan, probed)
        split = plan.split
        for name, value in (("micro_batch", plan.micro_batch), ("grad_accum", split.count),
                            ("last_micro_batch", split.last_micro_batch), ("world_size", plan.world_size),
                            ("effective_batch", plan.effective_batch), ("eval_batch", plan.eval_batch),
                            ("policy", plan.policy), ("run_dir", str(run_dir))):
            trial.set_user_attr(name, value)
        log(f"trial {trial.number}: {describe(params)} -> micro-batches {split.text()}, eval batch {plan.eval_batch}"
            + (f" (in {run_dir.name}: an earlier study of this name left trial-{trial.number:04d})"
               if run_dir.name != f"trial-{trial.number:04d}" else ""))

        goal = config.hpo_objective
        folds = config.hpo_folds

        def on_eval(step: int, epoch: int, metrics: dict, fold: int = 0) -> None:
            loss = metrics["eval_loss"]
            if not math.isfinite(loss):
                raise FloatingPointError(f"evaluation loss became {loss} at epoch {epoch}")
            if fold:  # the pruner judges a cross-validated trial by its first fold
                return
            trial.report(metrics[goal], epoch)
            if folds == 1:
                for name in METRICS:
                    if name in metrics:
                        trial.set_user_attr(name, metrics[name])
            # After the last epoch the trial is done: its result counts in full, pruned or not.
            if epoch < cfg.epochs and trial.should_prune():
                raise optuna.TrialPruned(f"pruned at epoch {epoch} ({objective_label(goal)} {metrics[goal]:.4f})")

        if folds == 1:
            return train(cfg, plan, hardware, run_dir=run_dir, log=lambda line: None, task=task,
                         on_eval=on_eval).final_eval[goal]
        results = []
        for fold in range(folds):
            fold_dir = run_dir / f"fold-{fold + 1}"
            fold_dir.mkdir()
            final = train(cfg, plan, hardware, run_dir=fold_dir, log=lambda line: None,
                          task=fold_task(task, folds, fold, config.seed),
                          on_eval=lambda step, epoch, metrics, f=fold: on_eval(step, epoch, metrics, f)).final_eval
            results.append(final)
        means = {name: sum(r[name] for r in results) / folds for name in METRICS if name in results[0]}
        for name, value in means.items():
            trial.set_user_attr(name, value)
        trial.set_user_attr("folds", folds)
        return means[goal]

    def run(trial: optuna.Trial) -> float:
        try:
            return attempt(trial)
        except (*TRIAL_FAILURES, KeyboardInterrupt) as err:  # Optuna records the trial as FAIL but keeps no reason
            trial.set_user_attr("error", str(err) or "interrupted (SIGINT)")  # a bare KeyboardInterrupt: Ctrl-C
            raise

    return run


# The evaluation's metrics a trial keeps (the mean over folds where it cross-validates).
METRICS = ("eval_loss", "accuracy", "macro_f1", "perplexity")


def _metric_text(name: str, value: float) -> str:
    if name == "accuracy":
        return f"accuracy {value:.2%}"
    if name == "perplexity":
        return f"perplexity {value:.2f}"
    return f"{OBJECTIVES[name][0]} {value:.4f}"


def metrics_text(trial: optuna.trial.FrozenTrial, goal: str, names=("eval_loss", "accuracy", "macro_f1")) -> str:
    """The trial's value (its objective) first, then the other metrics it kept."""
    values = {goal: trial.value, **{n: trial.user_attrs[n] for n in names if n in trial.user_attrs and n != goal}}
    if goal != "eval_loss" and "eval_loss" not in trial.user_attrs:
        values.pop("eval_loss", None)
    return ", ".join(_metric_text(n, v) for n, v in values.items() if v is not None)


def trial_line(trial: optuna.trial.FrozenTrial, goal: str = "eval_loss") -> str:
    """One line per finished trial, as `make hpo` prints them."""
    state = trial.state.name.lower()
    seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else 0
    if trial.state == optuna.trial.TrialState.COMPLETE:
        extra = metrics_text(trial, goal, ("accuracy",) if goal == "eval_loss" else ("eval_loss", "accuracy"))
        if "folds" in trial.user_attrs:
            extra += f" (mean of {trial.user_attrs['folds']} folds)"
    elif trial.state == optuna.trial.TrialState.PRUNED:
        extra = (f"at epoch {trial.last_step} ({objective_label(goal)} "
                 f"{trial.intermediate_values[trial.last_step]:.4f})") if trial.last_step is not None else ""
    else:
        extra = trial.user_attrs.get("error", "")
    return f"trial {trial.number} {state} in {seconds:.1f}s: {extra}"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, through the trainer) stopped the study; the message says what was kept."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run_study(config: Config, hardware, *, trials: int, timeout: float | None = None, storage: str | None = None,
              task=None, log: Log = print) -> optuna.Study:
    """Run `trials` more trials (or until `timeout` seconds) of the config's study; returns the study."""
    from ..task import load_task

    space = search_space(config)  # CONFIG_HPO_SPACE checked before the study is opened
    study = open_study(config, storage)
    url = storage_url(config, storage)
    check_objective(study, config, storage_label(url, bool(storage)))
    check_space(study, config, storage_label(url, bool(storage)))
    task = task or load_task(config)  # loaded once; every trial reuses the data
    check_metric(config, task)
    if config.hpo_folds > 1 and len(task.train) < config.hpo_folds:
        raise KfitError(f"CONFIG_HPO_FOLDS={config.hpo_folds}: the training set has {len(task.train)} samples, "
                        "fewer than the folds: lower CONFIG_HPO_FOLDS")
    # the study keeps what it searches: hpo-status shows it from any machine
    study.set_user_attr("objective", config.hpo_objective)
    study.set_user_attr("space", space_text(space))
    study.set_user_attr("folds", config.hpo_folds)
    log(f"Space: {space_text(space)}; objective {objective_label(config.hpo_objective)} "
        f"({'maximised' if maximise(config.hpo_objective) else 'minimised'})"
        + (f"; {config.hpo_folds}-fold cross-validation" if config.hpo_folds > 1 else ""))
    probed = probe_once(config, hardware, task, log) if trials else None
    current: dict = {}
    # a line per finished trial always; on a terminal Optuna's own bar (stderr) shows the one running too
    try:
        study.optimize(objective(config, hardware, task, storage=storage, log=log, probed=probed, current=current),
                       n_trials=trials, timeout=timeout or None, catch=TRIAL_FAILURES,
                       callbacks=[lambda study, trial: log(trial_line(trial, config.hpo_objective))],
                       show_progress_bar=bool(trials) and sys.stderr.isatty())
    except KeyboardInterrupt as stop:  # Optuna has recorded the trial it cut short as failed
        n = counts(study)
        raise Interrupted(redact(f"study '{study.study_name}' keeps its {n['complete']} complete and {n['pruned']} "
                                 f"pruned trial(s) in {url} (a trial cut short is recorded as failed); 'make hpo' "
                                 "continues it"),
                          getattr(stop, "exit_code", 130)) from None
    except Exception as err:  # noqa: BLE001 - the storage failing mid-trial is one error line, the trial FAIL
        failure = storage_failure(err)
        if failure is None:
            raise
        raise storage_failed(study, url, bool(storage), current.get("trial"), failure) from None
    return study


def mark_failed(study: optuna.Study, number: int, wait_s: float) -> bool:
    """Mark trial `number` failed (unless already finished), retrying a locked storage for up to `wait_s`;
    whether it is no longer running."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            return True
        except Exception as err:  # noqa: BLE001 - the storage may still be locked
            if storage_failure(err) is None or time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def storage_failed(study: optuna.Study, url: str, given: bool, number: int | None, failure: BaseException) -> KfitError:
    """The error for a storage that failed during a trial (locked by another connection for longer than
    storage.LOCK_WAIT_S, or gone), after marking that trial failed where the storage lets it."""
    wait = storage_module.LOCK_WAIT_S
    where = storage_label(url, given)
    if number is None:
        kept = "no trial was running"
    elif mark_failed(study, number, wait):
        kept = f"trial {number} is marked failed"
    else:
        kept = (f"trial {number} could not be marked failed (it stays running until 'make hpo-status' fails it, "
                f"{HEARTBEAT_GRACE_S // 60} minutes without a heartbeat)")
    return KfitError(redact(f"{where}: the study's storage failed during a trial ({storage_reason(failure)}; "
                            f"waited up to {wait:g}s for a lock another connection held): {kept}; 'make hpo' "
                            "continues the study once the storage is free", url))


def counts(study: optuna.Study) -> dict[str, int]:
    states = [t.state.name.lower() for t in study.get_trials(deepcopy=False)]
    return {name: states.count(name) for name in ("complete", "pruned", "fail", "running", "waiting")}


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        return None
    return (max if maximise(study_objective(study)) else min)(complete, key=lambda t: t.value)


def check_metric(config: Config, task) -> None:
    """Refuse an objective the model's evaluation does not report (accuracy, macro-F1: classifiers, and custom
    models whose factory returns metrics of those names)."""
    goal, names = config.hpo_objective, task.metrics.names
    if goal not in names:
        raise KfitError(f"CONFIG_HPO_OBJECTIVE_{goal.upper()}: the {config.model} model's evaluation reports no "
                        f"{objective_label(goal)} (a {task.info.kind} model: {', '.join(names)}): choose "
                        "CONFIG_HPO_OBJECTIVE_EVAL_LOSS")


class FoldSplit(BatchSplit):
    """The samples `indices` of a split (a cross-validation fold, or the other folds)."""

    def __init__(self, base, indices: torch.Tensor) -> None:
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, indices):
        return self.base[self.indices[torch.as_tensor(indices, dtype=torch.long)].tolist()]


def fold_task(task, folds: int, fold: int, seed: int):
    """The task that trains on all folds of the training set but `fold` and evaluates on that one: the samples
    shuffled once by the config's seed, then cut into `folds` parts of (nearly) equal size."""
    order = torch.randperm(len(task.train), generator=torch.Generator().manual_seed(seed))
    parts = torch.tensor_split(order, folds)
    rest = torch.cat([p for i, p in enumerate(parts) if i != fold])
    return dataclasses.replace(task, train=FoldSplit(task.train, rest), eval=FoldSplit(task.train, parts[fold]))


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """Mark failed the running trials without a heartbeat for HEARTBEAT_GRACE_S (their worker was killed or
    lost), as Optuna does only when a worker starts its next trial; returns their numbers."""
    running = {t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
    if not running:
        return []
    with no_experimental_warning():
        optuna.storages.fail_stale_trials(study)
    return sorted(t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
                  if t.number in running)


def status_lines(study: optuna.Study, storage: str) -> list[str]:
    """What `make hpo-status` prints: progress, pace, and the best trial with its plan."""
    stale = fail_stale_trials(study)
    n = counts(study)
    trials = study.get_trials(deepcopy=False)
    lines = [f"Study '{study.study_name}' in {redact(storage)}: {len(trials)} trials: {n['complete']} complete, "
             f"{n['pruned']} pruned, {n['fail']} failed, {n['running']} running"
             + (f", {n['waiting']} queued" if n["waiting"] else "")]
    if stale:
        lines.append(f"  trial(s) {', '.join(map(str, stale))}: no heartbeat for over {HEARTBEAT_GRACE_S // 60} "
                     "minutes (the worker was killed or lost): marked failed")
    done = [t for t in trials if t.datetime_complete]
    busy = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in done)
    if busy > 0:
        lines.append(f"  {len(done) / busy * 60:.1f} trials per minute of trial time; "
                     f"{n['pruned'] / len(done):.0%} of finished trials pruned")
    goal = study_objective(study)
    space = study.user_attrs.get("space") or space_text(stored_space(study))
    folds = study.user_attrs.get("folds", 1)
    lines += [f"  space: {space or 'no trial yet'}",
              f"  objective: {objective_label(goal)} ({'maximised' if maximise(goal) else 'minimised'})"
              + (f", mean over {folds} cross-validation folds" if folds > 1 else "")]
    best = best_trial(study)
    if best is None:
        return lines + ["  no complete trial yet"]
    a = best.user_attrs
    lines += [f"  best: trial {best.number}, {metrics_text(best, goal, METRICS)}",
              f"    {describe(best.params)}",
              f"    plan: micro-batches {_split_text(a)}, eval batch {a.get('eval_batch')} (policy {a.get('policy')})",
              f"    run: {a.get('run_dir')}"]
    return lines


def _split_text(attrs: dict) -> str:
    """A trial's micro-batches as they multiply ('21 x 24 + 8 x 1 = 512'), from what its user attributes keep."""
    try:
        return batch_split(attrs["effective_batch"], attrs["micro_batch"], attrs.get("world_size", 1)).text()
    except (KeyError, TypeError, ValueError):  # a trial that recorded no plan
        return "unknown"


def best_assignments(study: optuna.Study) -> dict:
    best = best_trial(study)
    if best is None:
        raise KfitError(f"study '{study.study_name}' has no complete trial yet: run 'make hpo' first")
    return assignments(best.params)
