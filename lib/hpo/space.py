"""The search space: the Kconfig ranges as Optuna distributions, a trial's sample from them, the check that
a study can continue with the config's space, and the Kconfig values a set of parameters stands for."""

from __future__ import annotations

import optuna

from ..config import Config, derive
from ..errors import KfitError
from .storage import redact


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


def describe(params: dict) -> str:
    return (f"{params['optimizer']} lr {params['learning_rate']:.3g} wd {params['weight_decay']:.2g} "
            f"effective batch {params['effective_batch']}")
