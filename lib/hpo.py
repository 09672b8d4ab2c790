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
machines share one study. Such a URL may hold a password: everything kfit shows
or writes of it goes through `redact`.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
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
    name = config.hpo_study_name or (f"{config.model}-{config.gpt2_preset}" if config.gpt2_preset else config.model)
    if "/" in name or os.sep in name:  # it names the directory hpo-<name>
        raise KfitError(f"study name {name!r} (HPO_STUDY= or CONFIG_HPO_STUDY_NAME) has a '/': name it without one")
    return name


def redact(text: str) -> str:
    """`text` with the password of every URL in it shown as ***: user:***@host.

    Greedy up to the last @ of the word, as a password may hold an unescaped @ (SQLAlchemy then splits
    at the first one: hiding more is safe, hiding less would show the rest)."""
    return re.sub(r"([A-Za-z][\w+.-]*://[^\s:/]*):\S*@", r"\1:***@", text)


def study_dir(config: Config, storage: str | None = None) -> Path:
    """The study's trial directories (and default SQLite file): one per (storage, study), so a study of the
    same name in another HPO_STORAGE never writes into this one's trial-NNNN."""
    name = f"hpo-{study_name(config)}"
    if storage:
        name += "-" + hashlib.sha256(redact(storage).encode()).hexdigest()[:8]
    return Path(config.output_dir) / name


def storage_url(config: Config, url: str | None = None) -> str:
    """`url` (HPO_STORAGE), else the SQLite file in the study directory."""
    return url or f"sqlite:///{(study_dir(config) / 'study.db').resolve()}"


def _where(url: str, given: bool) -> str:
    return f"HPO_STORAGE={redact(url)}" if given else url


def _storage_error(url: str, given: bool, reason: object, fix: str) -> KfitError:
    reason = " ".join(str(reason).split())  # driver messages can span lines
    return KfitError(redact(f"{_where(url, given)}: {reason}: {fix}"))


_URL_FIX = ("give a SQLAlchemy URL such as sqlite:////abs/path/study.db or postgresql+psycopg2://user@host/db, "
            "or leave HPO_STORAGE unset for the study's own SQLite file")


def _sqlite_file(url: str, given: bool) -> Path | None:
    """The file of an SQLite URL (None for a server or in-memory SQLite); a URL that does not parse is
    a KfitError saying how to write one."""
    import sqlalchemy.engine
    import sqlalchemy.exc

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError as err:
        raise _storage_error(url, given, f"not a database URL ({err})", _URL_FIX) from None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _storage(url: str, given: bool) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage, with a heartbeat: the trial of a worker that died (killed, machine lost) is
    marked failed after HEARTBEAT_GRACE_S instead of showing as running forever.

    Workers starting together on a new database race to create its tables (one fails with "table
    already exists"; optuna/optuna#1092): by then the tables exist, so try again.
    """
    import sqlalchemy.exc

    file = _sqlite_file(url, given)
    for attempt in range(5):
        try:
            with _no_experimental_warning():
                return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S,
                                                  grace_period=HEARTBEAT_GRACE_S)
        except sqlalchemy.exc.ArgumentError as err:  # an unknown dialect: foo://
            raise _storage_error(url, given, f"not a database SQLAlchemy knows ({err})", _URL_FIX) from None
        except ImportError as err:  # Optuna's, from the driver's ModuleNotFoundError
            module = getattr(err.__cause__, "name", None) or "?"
            package = {"psycopg2": "psycopg2-binary", "psycopg": "'psycopg[binary]'",
                       "MySQLdb": "mysqlclient"}.get(module, module)
            raise _storage_error(
                url, given, f"its database driver ({module}) is not installed",
                f"install it into kfit's environment ({sys.executable} -m pip install {package}), or name an "
                "installed driver in the URL (dialect+driver://...)") from None
        except sqlalchemy.exc.DBAPIError as err:
            if attempt < 4:
                time.sleep(0.2 * (attempt + 1))
                continue
            fix = (f"create the directory {file.parent}, or give a path in an existing one"
                   if file and not file.parent.is_dir() else
                   f"check the file {file} (a writable Optuna database)" if file else
                   "check the host, port, database name and credentials, and that the server is running")
            raise _storage_error(url, given, f"cannot open the database ({err.orig})", fix) from None


def open_study(config: Config, storage: str | None = None, *, create: bool = True) -> optuna.Study:
    """The study in `storage` (created on first use when `create`), with the config's pruner and a seeded TPE.

    The sampler's seed is the config's SEED plus the trials already stored, so
    a second invocation does not redraw the first one's samples, and a run
    from scratch repeats exactly. Workers sharing a database also mix in
    their host and process, or they would all draw the same trials.
    """
    url, given = storage_url(config, storage), bool(storage)
    missing = KfitError(redact(f"no study '{study_name(config)}' in {_where(url, given)}: run 'make hpo' first"
                               + (" with this HPO_STORAGE, or correct it" if given else "")))
    file = _sqlite_file(url, given)
    if not create and file and not file.is_file():
        raise missing  # and do not leave an empty database behind
    if not given:
        study_dir(config).mkdir(parents=True, exist_ok=True)
    try:
        study = optuna.create_study(storage=_storage(url, given), study_name=study_name(config),
                                    direction="minimize", pruner=make_pruner(config), load_if_exists=True) \
            if create else optuna.load_study(study_name=study_name(config), storage=_storage(url, given),
                                             pruner=make_pruner(config))
    except KeyError:
        raise missing from None
    seed = config.seed + len(study.trials)
    if storage:
        seed += zlib.crc32(f"{socket.gethostname()}-{os.getpid()}".encode())
    study.sampler = optuna.samplers.TPESampler(seed=seed % 2**32)
    return study


# Each parameter's Kconfig symbols, for the error when the space changed.
SPACE_SYMBOLS = {"learning_rate": "CONFIG_HPO_LR_MIN/MAX", "weight_decay": "CONFIG_HPO_WD_MIN/MAX",
                 "optimizer": "CONFIG_HPO_OPTIMIZER_SGD/ADAM/ADAMW", "effective_batch": "CONFIG_HPO_BATCH_SIZES"}


def search_space(config: Config) -> dict[str, optuna.distributions.BaseDistribution]:
    """The Kconfig search space as Optuna distributions."""
    return {
        "learning_rate": optuna.distributions.FloatDistribution(config.hpo_lr_min, config.hpo_lr_max, log=True),
        "weight_decay": optuna.distributions.FloatDistribution(config.hpo_wd_min, config.hpo_wd_max, log=True),
        "optimizer": optuna.distributions.CategoricalDistribution(list(config.hpo_optimizers)),
        "effective_batch": optuna.distributions.CategoricalDistribution(list(config.hpo_batch_sizes)),
    }


def sample(trial: optuna.Trial, config: Config) -> dict:
    """The trial's parameters from the Kconfig search space."""
    return {name: trial.suggest_categorical(name, d.choices)
            if isinstance(d, optuna.distributions.CategoricalDistribution)
            else trial.suggest_float(name, d.low, d.high, log=d.log)
            for name, d in search_space(config).items()}


def _space_text(d: optuna.distributions.BaseDistribution) -> str:
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return '"' + " ".join(map(str, d.choices)) + '"'
    return f"{d.low:g}..{d.high:g}" + (" (log)" if getattr(d, "log", False) else "")


def check_space(study: optuna.Study, config: Config, where: str) -> None:
    """Refuse, before any trial, a search space the study cannot continue with: Optuna fixes a categorical
    parameter's choices in a study, and would fail the next trial with a traceback (ranges may change)."""
    stored: dict[str, optuna.distributions.BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, d in trial.distributions.items():
            stored.setdefault(name, d)
    for name, new in search_space(config).items():
        if name not in stored:
            continue
        try:
            optuna.distributions.check_distribution_compatibility(stored[name], new)
        except ValueError:
            raise KfitError(
                f"the search space changed: study '{study.study_name}' in {redact(where)} searched {name} in "
                f"{_space_text(stored[name])}, the config now gives {_space_text(new)} ({SPACE_SYMBOLS[name]}), "
                f"and an Optuna study cannot change it: start a new study (make hpo HPO_STUDY=<new name>, or "
                f"set CONFIG_HPO_STUDY_NAME), or restore {SPACE_SYMBOLS[name]} to {_space_text(stored[name])}"
            ) from None


def assignments(params: dict) -> dict:
    """Kconfig symbols for a set of trial parameters: what a trial trains with and what hpo-apply writes.

    AUTO mode is set too: only AUTO turns an effective batch into micro-batch x accumulation.
    """
    return {"HYPER_PARAM_AUTO": True, "LEARNING_RATE": params["learning_rate"],
            "WEIGHT_DECAY": params["weight_decay"], f"OPTIMIZER_{params['optimizer'].upper()}": True,
            "TARGET_EFFECTIVE_BATCH": params["effective_batch"]}


def trial_config(config: Config, params: dict, run_name: str) -> Config:
    """The trial's Config: the sampled values, max_resource epochs, an evaluation per epoch, a fresh run."""
    return derive(config, {**assignments(params), "EPOCHS": config.hpo_max_resource, "EVAL_INTERVAL": 0,
                           "MAX_STEPS": 0, "RESUME": False, "RUN_NAME": run_name})


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


def plan_of(config: Config, hardware) -> Plan:
    """A trial's plan: one process (trials do not run under torchrun)."""
    return resolve(config, hardware, ModelDescription.from_config(config), 1)


# Optimizers by the state they keep, most first: the probe runs the trial that needs the most memory.
_HEAVIEST_FIRST = ("adamw", "adam", "sgd")


def probe_once(config: Config, hardware, task, log: Log = print) -> dict | None:
    """Before the first trial: the probe (lib/probe.py, as CONFIG_PROBE_* says) of the trial that needs the most
    memory, the largest effective batch with the optimizer that keeps the most state; its largest micro-batch
    and evaluation batch that fit cap every trial (`capped`). None where the config does not probe here."""
    from .probe import confirm

    params = {"optimizer": next(o for o in _HEAVIEST_FIRST if o in config.hpo_optimizers),
              "learning_rate": config.hpo_lr_max, "weight_decay": config.hpo_wd_max,
              "effective_batch": max(config.hpo_batch_sizes)}
    cfg = trial_config(config, params, "probe")
    result = confirm(cfg, plan_of(cfg, hardware), hardware, task, log=log)
    if result is not None:
        log(f"Probe: every trial's micro-batch at most {result['max_micro']}, eval batch at most "
            f"{result['eval_batch']} (probed once, {describe(params)})")
    return result


def capped(plan: Plan, probed: dict | None) -> Plan:
    """A trial's plan under the probe's caps: the same effective batch, in micro-batches that fit."""
    if probed is None:
        return plan
    from .probe import apply

    return apply(plan, {"max_micro": probed["max_micro"], "eval_batch": min(plan.eval_batch, probed["eval_batch"])},
                 "once before the trials")


def objective(config: Config, hardware, task, *, storage: str | None = None, log: Log = print,
              probed: dict | None = None) -> Callable[[optuna.Trial], float]:
    from .trainer import train

    directory = study_dir(config, storage)

    def attempt(trial: optuna.Trial) -> float:
        params = sample(trial, config)
        run_dir = new_trial_dir(directory, trial.number)
        cfg = trial_config(config, params, run_dir.name)
        plan = capped(plan_of(cfg, hardware), probed)
        for name, value in (("micro_batch", plan.micro_batch), ("grad_accum", plan.grad_accum),
                            ("effective_batch", plan.effective_batch), ("eval_batch", plan.eval_batch),
                            ("policy", plan.policy), ("run_dir", str(run_dir))):
            trial.set_user_attr(name, value)
        log(f"trial {trial.number}: {describe(params)} -> micro-batch {plan.micro_batch} x {plan.grad_accum} "
            f"accumulation, eval batch {plan.eval_batch}"
            + (f" (in {run_dir.name}: an earlier study of this name left trial-{trial.number:04d})"
               if run_dir.name != f"trial-{trial.number:04d}" else ""))

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

        return train(cfg, plan, hardware, run_dir=run_dir, log=lambda line: None, task=task,
                     on_eval=on_eval).final_eval["eval_loss"]

    def run(trial: optuna.Trial) -> float:
        try:
            return attempt(trial)
        except (*TRIAL_FAILURES, KeyboardInterrupt) as err:  # Optuna records the trial as FAIL but keeps no reason
            trial.set_user_attr("error", str(err) or "interrupted (SIGINT)")  # a bare KeyboardInterrupt: Ctrl-C
            raise

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


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, through the trainer) stopped the study; the message says what was kept."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def run_study(config: Config, hardware, *, trials: int, timeout: float | None = None, storage: str | None = None,
              task=None, log: Log = print) -> optuna.Study:
    """Run `trials` more trials (or until `timeout` seconds) of the config's study; returns the study."""
    from .task import load_task

    study = open_study(config, storage)
    url = storage_url(config, storage)
    check_space(study, config, _where(url, bool(storage)))
    task = task or load_task(config)  # loaded once; every trial reuses the data
    probed = probe_once(config, hardware, task, log) if trials else None
    # a line per finished trial always; on a terminal Optuna's own bar (stderr) shows the one running too
    try:
        study.optimize(objective(config, hardware, task, storage=storage, log=log, probed=probed),
                       n_trials=trials, timeout=timeout or None, catch=TRIAL_FAILURES,
                       callbacks=[lambda study, trial: log(trial_line(trial))],
                       show_progress_bar=bool(trials) and sys.stderr.isatty())
    except KeyboardInterrupt as stop:  # Optuna has recorded the trial it cut short as failed
        n = counts(study)
        raise Interrupted(redact(f"study '{study.study_name}' keeps its {n['complete']} complete and {n['pruned']} "
                                 f"pruned trial(s) in {url} (a trial cut short is recorded as failed); 'make hpo' "
                                 "continues it"),
                          getattr(stop, "exit_code", 130)) from None
    return study


def counts(study: optuna.Study) -> dict[str, int]:
    states = [t.state.name.lower() for t in study.get_trials(deepcopy=False)]
    return {name: states.count(name) for name in ("complete", "pruned", "fail", "running", "waiting")}


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return min(complete, key=lambda t: t.value) if complete else None


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """Mark failed the running trials without a heartbeat for HEARTBEAT_GRACE_S (their worker was killed or
    lost), as Optuna does only when a worker starts its next trial; returns their numbers."""
    running = {t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}
    if not running:
        return []
    with _no_experimental_warning():
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
