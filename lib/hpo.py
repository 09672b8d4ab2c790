"""Hyperparameter search with Optuna, inside what the hardware plan allows.

Each trial samples a learning rate, a weight decay, an optimizer and an
*effective* batch from the Kconfig search space, derives a strictly validated
Config from them, and lets the plan turn the effective batch into the
micro-batch the device holds plus gradient accumulation
(`calculate_gradient_accumulation(sampled, max_safe)`); the trial then trains
with the ordinary loop, evaluating after every epoch with the plan's eval
batch (the largest safe one) and reporting the evaluation loss to the pruner.

Pruning: Hyperband (min_resource, max_resource, reduction_factor,
bootstrap_count from Kconfig), plus patience. Optuna's
`PatientPruner(HyperbandPruner(...))` prunes only when *both* agree, which
makes Hyperband more lenient; seed 003 and CONFIG_HPO_PATIENCE mean "also
prune a trial that stopped improving", so `HyperbandWithPatience` prunes when
*either* does. It stays a HyperbandPruner, so TPE keeps sampling within each
trial's bracket.

Storage: an SQLite file in the study directory by default, so running again
continues the study; any SQLAlchemy URL (HPO_STORAGE=) lets workers on several
machines share one study.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import time
import warnings
import zlib
from pathlib import Path
from typing import Callable

import optuna
import torch

from .config import Config, derive
from .errors import KfitError
from .hyperparams import ModelDescription, Plan, resolve

Log = Callable[[str], None]
# Failures that end one trial (recorded as FAIL) but not the study.
TRIAL_FAILURES = (FloatingPointError, torch.OutOfMemoryError)
HEARTBEAT_S, HEARTBEAT_GRACE_S = 60, 300


@contextlib.contextmanager
def _no_experimental_warning():
    """Optuna still flags PatientPruner (2.8) and storage heartbeats (2.9) as experimental: noise on every run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


class HyperbandWithPatience(optuna.pruners.HyperbandPruner):
    """Hyperband that also prunes a trial whose value has not improved for `patience` reports."""

    def __init__(self, *, patience: int, **hyperband) -> None:
        super().__init__(**hyperband)
        with _no_experimental_warning():
            self.patience = optuna.pruners.PatientPruner(None, patience)

    def prune(self, study, trial) -> bool:
        return super().prune(study, trial) or self.patience.prune(study, trial)


def make_pruner(config: Config) -> optuna.pruners.HyperbandPruner:
    hyperband = dict(min_resource=config.hpo_min_resource, max_resource=config.hpo_max_resource,
                     reduction_factor=config.hpo_reduction_factor, bootstrap_count=config.hpo_bootstrap_count)
    if config.hpo_patience > 0:
        return HyperbandWithPatience(patience=config.hpo_patience, **hyperband)
    return optuna.pruners.HyperbandPruner(**hyperband)


def study_name(config: Config) -> str:
    return config.hpo_study_name or (f"{config.model}-{config.gpt2_preset}" if config.gpt2_preset else config.model)


def study_dir(config: Config) -> Path:
    return Path(config.output_dir) / f"hpo-{study_name(config)}"


def storage_url(config: Config, url: str | None = None) -> str:
    """`url` (HPO_STORAGE), else the SQLite file in the study directory."""
    return url or f"sqlite:///{(study_dir(config) / 'study.db').resolve()}"


def _storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage, with a heartbeat: the trial of a worker that died (killed, machine lost) is
    marked failed after HEARTBEAT_GRACE_S instead of showing as running forever.

    Workers starting together on a new database race to create its tables (one fails with "table
    already exists"; optuna/optuna#1092): by then the tables exist, so try again.
    """
    import sqlalchemy.exc

    for attempt in range(5):
        try:
            with _no_experimental_warning():
                return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S,
                                                  grace_period=HEARTBEAT_GRACE_S)
        except sqlalchemy.exc.DBAPIError:
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))


def open_study(config: Config, storage: str | None = None, *, create: bool = True) -> optuna.Study:
    """The study in `storage` (created on first use when `create`), with the config's pruner and a seeded TPE.

    The sampler's seed is the config's SEED plus the trials already stored, so
    a second invocation does not redraw the first one's samples, and a run
    from scratch repeats exactly. Workers sharing a database also mix in
    their host and process, or they would all draw the same trials.
    """
    url = storage_url(config, storage)
    missing = KfitError(f"no study '{study_name(config)}' in {url}: run 'make hpo' first")
    if not storage:
        if not create and not (study_dir(config) / "study.db").is_file():
            raise missing  # and do not leave an empty database behind
        study_dir(config).mkdir(parents=True, exist_ok=True)
    try:
        study = optuna.create_study(storage=_storage(url), study_name=study_name(config), direction="minimize",
                                    pruner=make_pruner(config), load_if_exists=True) if create else \
            optuna.load_study(study_name=study_name(config), storage=_storage(url), pruner=make_pruner(config))
    except KeyError:
        raise missing from None
    seed = config.seed + len(study.trials)
    if storage:
        seed += zlib.crc32(f"{socket.gethostname()}-{os.getpid()}".encode())
    study.sampler = optuna.samplers.TPESampler(seed=seed % 2**32)
    return study


def sample(trial: optuna.Trial, config: Config) -> dict:
    """The trial's parameters from the Kconfig search space."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", config.hpo_lr_min, config.hpo_lr_max, log=True),
        "weight_decay": trial.suggest_float("weight_decay", config.hpo_wd_min, config.hpo_wd_max, log=True),
        "optimizer": trial.suggest_categorical("optimizer", list(config.hpo_optimizers)),
        "effective_batch": trial.suggest_categorical("effective_batch", list(config.hpo_batch_sizes)),
    }


def assignments(params: dict) -> dict:
    """Kconfig symbols for a set of trial parameters: what a trial trains with and what hpo-apply writes.

    AUTO mode is set too: only AUTO turns an effective batch into micro-batch x accumulation.
    """
    return {"HYPER_PARAM_AUTO": True, "LEARNING_RATE": params["learning_rate"],
            "WEIGHT_DECAY": params["weight_decay"], f"OPTIMIZER_{params['optimizer'].upper()}": True,
            "TARGET_EFFECTIVE_BATCH": params["effective_batch"]}


def trial_config(config: Config, params: dict, number: int) -> Config:
    """The trial's Config: the sampled values, max_resource epochs, an evaluation per epoch, a fresh run."""
    return derive(config, {**assignments(params), "EPOCHS": config.hpo_max_resource, "EVAL_INTERVAL": 0,
                           "MAX_STEPS": 0, "RESUME": False, "RUN_NAME": f"trial-{number:04d}"})


def plan_of(config: Config, hardware) -> Plan:
    """A trial's plan: one process (trials do not run under torchrun)."""
    return resolve(config, hardware, ModelDescription.from_config(config), 1)


def objective(config: Config, hardware, task, *, log: Log = print) -> Callable[[optuna.Trial], float]:
    from .trainer import train

    directory = study_dir(config)

    def run(trial: optuna.Trial) -> float:
        params = sample(trial, config)
        cfg = trial_config(config, params, trial.number)
        plan = plan_of(cfg, hardware)
        for name, value in (("micro_batch", plan.micro_batch), ("grad_accum", plan.grad_accum),
                            ("effective_batch", plan.effective_batch), ("eval_batch", plan.eval_batch),
                            ("policy", plan.policy), ("run_dir", str(directory / cfg.run_name))):
            trial.set_user_attr(name, value)
        log(f"trial {trial.number}: {describe(params)} -> micro-batch {plan.micro_batch} x {plan.grad_accum} "
            f"accumulation, eval batch {plan.eval_batch}")

        def on_eval(step: int, epoch: int, metrics: dict) -> None:
            loss = metrics["eval_loss"]
            if not math.isfinite(loss):
                raise FloatingPointError(f"evaluation loss became {loss} at epoch {epoch}")
            trial.report(loss, epoch)
            for name in ("accuracy", "perplexity"):
                if name in metrics:
                    trial.set_user_attr(name, metrics[name])
            # After the last epoch the trial is done: its result counts in full, pruned or not.
            if epoch < cfg.epochs and trial.should_prune():
                raise optuna.TrialPruned(f"pruned at epoch {epoch} (eval loss {loss:.4f})")

        try:
            result = train(cfg, plan, hardware, run_dir=directory / cfg.run_name, log=lambda line: None,
                           task=task, on_eval=on_eval)
        except TRIAL_FAILURES as err:  # Optuna records the trial as FAIL (catch=) but keeps no reason
            trial.set_user_attr("error", str(err))
            raise
        return result.final_eval["eval_loss"]

    return run


def describe(params: dict) -> str:
    return (f"{params['optimizer']} lr {params['learning_rate']:.3g} wd {params['weight_decay']:.2g} "
            f"effective batch {params['effective_batch']}")


def trial_line(trial: optuna.trial.FrozenTrial) -> str:
    """One line per finished trial, as `make hpo` prints them."""
    state = trial.state.name.lower()
    seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else 0
    if trial.state == optuna.trial.TrialState.COMPLETE:
        extra = f"eval loss {trial.value:.4f}"
        if "accuracy" in trial.user_attrs:
            extra += f", accuracy {trial.user_attrs['accuracy']:.2%}"
    elif trial.state == optuna.trial.TrialState.PRUNED:
        extra = f"at epoch {trial.last_step} (eval loss {trial.intermediate_values[trial.last_step]:.4f})" \
            if trial.last_step is not None else ""
    else:
        extra = trial.user_attrs.get("error", "")
    return f"trial {trial.number} {state} in {seconds:.1f}s: {extra}"


def run_study(config: Config, hardware, *, trials: int, timeout: float | None = None, storage: str | None = None,
              task=None, log: Log = print) -> optuna.Study:
    """Run `trials` more trials (or until `timeout` seconds) of the config's study; returns the study."""
    from .task import load_task

    study = open_study(config, storage)
    task = task or load_task(config)  # loaded once; every trial reuses the data
    # a line per finished trial always; on a terminal Optuna's own bar (stderr) shows the one running too
    study.optimize(objective(config, hardware, task, log=log), n_trials=trials, timeout=timeout or None,
                   catch=TRIAL_FAILURES, callbacks=[lambda study, trial: log(trial_line(trial))],
                   show_progress_bar=bool(trials) and sys.stderr.isatty())
    return study


def counts(study: optuna.Study) -> dict[str, int]:
    states = [t.state.name.lower() for t in study.get_trials(deepcopy=False)]
    return {name: states.count(name) for name in ("complete", "pruned", "fail", "running", "waiting")}


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return min(complete, key=lambda t: t.value) if complete else None


def status_lines(study: optuna.Study, storage: str) -> list[str]:
    """What `make hpo-status` prints: progress, pace, and the best trial with its plan."""
    n = counts(study)
    trials = study.get_trials(deepcopy=False)
    lines = [f"Study '{study.study_name}' in {storage}: {len(trials)} trials: {n['complete']} complete, "
             f"{n['pruned']} pruned, {n['fail']} failed, {n['running']} running"
             + (f", {n['waiting']} queued" if n["waiting"] else "")]
    done = [t for t in trials if t.datetime_complete]
    busy = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in done)
    if busy > 0:
        lines.append(f"  {len(done) / busy * 60:.1f} trials per minute of trial time; "
                     f"{n['pruned'] / len(done):.0%} of finished trials pruned")
    best = best_trial(study)
    if best is None:
        return lines + ["  no complete trial yet"]
    a = best.user_attrs
    lines += [f"  best: trial {best.number}, eval loss {best.value:.4f}"
              + (f", accuracy {a['accuracy']:.2%}" if "accuracy" in a else "")
              + (f", perplexity {a['perplexity']:.2f}" if "perplexity" in a else ""),
              f"    {describe(best.params)}",
              f"    plan: micro-batch {a.get('micro_batch')} x accumulation {a.get('grad_accum')} = "
              f"{a.get('effective_batch')}, eval batch {a.get('eval_batch')} (policy {a.get('policy')})",
              f"    run: {a.get('run_dir')}"]
    return lines


def best_assignments(study: optuna.Study) -> dict:
    best = best_trial(study)
    if best is None:
        raise KfitError(f"study '{study.study_name}' has no complete trial yet: run 'make hpo' first")
    return assignments(best.params)
