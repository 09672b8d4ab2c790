"""The search space: the Kconfig ranges (or CONFIG_HPO_SPACE's entries) as Optuna distributions, a trial's
sample from them, the check that a study can continue with the config's space, the objective a trial is scored
by, and the Kconfig values a set of parameters stands for."""

from __future__ import annotations

import re
from dataclasses import dataclass

import kconfiglib
import optuna

from ..config import Config, derive
from ..errors import ConfigError, KfitError
from .storage import OBJECTIVES, redact

# Each parameter's Kconfig symbols, for the error when the space changed (a CONFIG_HPO_SPACE entry: that symbol).
SPACE_SYMBOLS = {"learning_rate": "CONFIG_HPO_LR_MIN/MAX", "weight_decay": "CONFIG_HPO_WD_MIN/MAX",
                 "optimizer": "CONFIG_HPO_OPTIMIZER_SGD/ADAM/ADAMW", "effective_batch": "CONFIG_HPO_BATCH_SIZES"}

# Symbols a trial's own settings fix (its budget, its run directory), and the search's own settings.
_NOT_SEARCHABLE = {"EPOCHS": "the trials' epochs are CONFIG_HPO_MAX_RESOURCE", "MAX_STEPS": "trials train by epochs",
                   "EVAL_INTERVAL": "trials evaluate after every epoch", "RESUME": "every trial starts fresh",
                   "RUN_NAME": "every trial has its own directory", "HYPER_PARAM_AUTO":
                   "searching TARGET_EFFECTIVE_BATCH turns it on"}
_ENTRY = re.compile(r"(?:CONFIG_)?([A-Za-z0-9_]+)=(\S+)")
_EXAMPLE = '"LEARNING_RATE=1e-5..1e-1:log WARMUP_STEPS=0..500 OPTIMIZER=ADAMW|SGD"'


def objective_label(name: str) -> str:
    return OBJECTIVES[name][0]


def direction(name: str) -> str:
    return OBJECTIVES[name][1]


def maximise(name: str) -> bool:
    return direction(name) == "maximize"


@dataclass(frozen=True)
class Param:
    """One CONFIG_HPO_SPACE entry: a symbol (or a choice, by its members' common prefix) and its values."""

    symbol: str
    kind: str  # int | float | choice
    low: float | None = None
    high: float | None = None
    log: bool = False
    values: tuple = ()  # listed values (int/float symbols) or choice members' suffixes

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.values:
            return optuna.distributions.CategoricalDistribution(list(self.values))
        if self.kind == "int":
            return optuna.distributions.IntDistribution(int(self.low), int(self.high), log=self.log)
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log)


def _kconfig() -> kconfiglib.Kconfig:
    from ..config.kconfig import new_kconfig

    return new_kconfig()


def _choice_members(kconf: kconfiglib.Kconfig, prefix: str) -> list[str] | None:
    """The suffixes of the choice whose members are all named PREFIX_<SUFFIX>; None if no choice is."""
    for choice in kconf.choices:
        if choice.syms and all(sym.name.startswith(prefix + "_") for sym in choice.syms):
            return [sym.name[len(prefix) + 1:] for sym in choice.syms]
    return None


def symbol_assignments(params: dict, kconf: kconfiglib.Kconfig | None = None) -> dict:
    """Kconfig symbols for the parameters of a CONFIG_HPO_SPACE study (named by their symbols)."""
    kconf = kconf or _kconfig()
    out: dict = {}
    if "TARGET_EFFECTIVE_BATCH" in params:  # only AUTO turns an effective batch into micro-batch x accumulation
        out["HYPER_PARAM_AUTO"] = True
    for name, value in params.items():
        sym = kconf.syms.get(name)
        if sym is not None and sym.nodes:
            out[name] = value
        else:
            out[f"{name}_{value}"] = True
    return out


def _number(text: str, integer: bool):
    return int(text, 10) if integer else float(text)


def _refuse(entry: str, why: str) -> KfitError:
    return ConfigError(f"CONFIG_HPO_SPACE entry '{entry}': {why}")


def parse_space(config: Config) -> dict[str, Param]:
    """CONFIG_HPO_SPACE's entries, each checked against the Kconfig symbols (an int, number or choice symbol
    this config can set) and its values applied to the config as a trial's would be, strictly; a bad entry is
    one ConfigError naming it and the fix."""
    kconf = _kconfig()
    params: dict[str, Param] = {}
    for entry in config.hpo_space.split():
        m = _ENTRY.fullmatch(entry)
        if not m:
            raise _refuse(entry, f"write NAME=LOW..HIGH, NAME=LOW..HIGH:log or NAME=A|B|C, like {_EXAMPLE}")
        name, spec = m[1].upper(), m[2]
        if name in params:
            raise _refuse(entry, f"{name} is searched twice: keep one entry for it")
        if name in _NOT_SEARCHABLE or name.startswith("HPO_"):
            raise _refuse(entry, f"CONFIG_{name} is not searched ("
                          + _NOT_SEARCHABLE.get(name, "it is a setting of the search itself") + "): leave it out")
        sym = kconf.syms.get(name)
        members = None if sym is not None and sym.nodes else _choice_members(kconf, name)
        if (sym is None or not sym.nodes) and members is None:
            raise _refuse(entry, f"CONFIG_{name} is not a kfit option or choice (see 'make menuconfig'); a choice "
                          "is named by its members' common prefix, like OPTIMIZER for CONFIG_OPTIMIZER_ADAMW")
        if members is not None:
            if ".." in spec:
                raise _refuse(entry, f"{name} is a choice: list its members, like {name}="
                              + "|".join(members[:2]))
            picked = tuple(dict.fromkeys(v.upper() for v in spec.split("|")))
            bad = [v for v in picked if v not in members]
            if bad or not picked:
                raise _refuse(entry, f"{bad[0] if bad else spec!r} is not a member of the {name} choice: "
                              f"choose among {'|'.join(members)}")
            param = Param(name, "choice", values=picked)
        else:
            if sym.orig_type in (kconfiglib.INT, kconfiglib.HEX):
                kind = "int"
            elif sym.orig_type == kconfiglib.STRING and _is_number(config.symbols.get(name) or _default(sym)):
                kind = "float"
            else:
                what = {kconfiglib.BOOL: "a yes/no option", kconfiglib.TRISTATE: "a yes/no option"}.get(
                    sym.orig_type, "a text option, not a number")
                raise _refuse(entry, f"CONFIG_{name} is {what}: search int, number or choice symbols")
            param = _numeric(entry, name, spec, kind, sym)
        _check_values(entry, config, param, kconf)
        params[name] = param
    return params


def _default(sym: kconfiglib.Symbol) -> str:
    """A symbol's first default as written (the value a symbol this config hides would start from)."""
    return sym.defaults[0][0].str_value if sym.defaults else ""


def _is_number(text: str | None) -> bool:
    try:
        float(text or "")
        return True
    except ValueError:
        return False


def _numeric(entry: str, name: str, spec: str, kind: str, sym: kconfiglib.Symbol) -> Param:
    integer = kind == "int"
    whole = "whole numbers" if integer else "numbers"
    try:
        if "|" in spec or ".." not in spec:
            values = tuple(dict.fromkeys(_number(v, integer) for v in spec.split("|")))
            return Param(name, kind, values=values)
        body, _, scale = spec.partition(":")
        if scale not in ("", "log"):
            raise _refuse(entry, f"':{scale}' is no scale: add ':log' for log-uniform, or nothing for uniform")
        low_text, _, high_text = body.partition("..")
        low, high = _number(low_text, integer), _number(high_text, integer)
    except ValueError:
        raise _refuse(entry, f"CONFIG_{name} takes {whole}: write {name}=LOW..HIGH[:log] or {name}=A|B|C") from None
    if not low < high:
        raise _refuse(entry, f"the range's low end {low:g} must be below its high end {high:g}")
    if scale == "log" and low <= 0:
        raise _refuse(entry, f"a log scale needs a low end above 0 (it is {low:g}): raise it or drop ':log'")
    if integer:
        from ..config.generate import active_range

        bounds = active_range(sym)
        if bounds and (low < bounds[0] or high > bounds[1]):
            raise _refuse(entry, f"CONFIG_{name} takes {bounds[0]}..{bounds[1]}: keep the range inside it")
    return Param(name, kind, low, high, scale == "log")


def _check_values(entry: str, config: Config, param: Param, kconf: kconfiglib.Kconfig) -> None:
    """Each end of the range (each listed value) set on the config, checked as strictly as an override."""
    for value in param.values or (param.low, param.high):
        try:
            derive(config, symbol_assignments({param.symbol: value}, kconf))
        except ConfigError as err:
            raise _refuse(entry, " ".join(str(err).split())) from None


_PARSED: dict[tuple[str, str], dict[str, Param]] = {}


def search_space(config: Config) -> dict[str, optuna.distributions.BaseDistribution]:
    """The search space as Optuna distributions: CONFIG_HPO_SPACE's entries (parameters named by their symbols),
    or, where it is empty, the learning rate, weight decay, optimizer and effective batch of CONFIG_HPO_LR_*,
    _WD_*, _OPTIMIZER_* and _BATCH_SIZES."""
    if config.hpo_space:
        key = (config.hpo_space, config.text)
        if key not in _PARSED:
            _PARSED[key] = parse_space(config)
        return {name: p.distribution() for name, p in _PARSED[key].items()}
    return {
        "learning_rate": optuna.distributions.FloatDistribution(config.hpo_lr_min, config.hpo_lr_max, log=True),
        "weight_decay": optuna.distributions.FloatDistribution(config.hpo_wd_min, config.hpo_wd_max, log=True),
        "optimizer": optuna.distributions.CategoricalDistribution(list(config.hpo_optimizers)),
        "effective_batch": optuna.distributions.CategoricalDistribution(list(config.hpo_batch_sizes)),
    }


def sample(trial: optuna.Trial, config: Config) -> dict:
    """The trial's parameters from the search space."""
    out = {}
    for name, d in search_space(config).items():
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            out[name] = trial.suggest_categorical(name, d.choices)
        elif isinstance(d, optuna.distributions.IntDistribution):
            out[name] = trial.suggest_int(name, d.low, d.high, log=d.log)
        else:
            out[name] = trial.suggest_float(name, d.low, d.high, log=d.log)
    return out


def _space_text(d: optuna.distributions.BaseDistribution) -> str:
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return '"' + " ".join(map(str, d.choices)) + '"'
    return f"{d.low:g}..{d.high:g}" + (" (log)" if getattr(d, "log", False) else "")


def space_text(space: dict[str, optuna.distributions.BaseDistribution]) -> str:
    """A space in CONFIG_HPO_SPACE's own notation (what the study stores and hpo-status shows)."""
    words = []
    for name, d in space.items():
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            words.append(f"{name}=" + "|".join(map(str, d.choices)))
        else:
            words.append(f"{name}={d.low:g}..{d.high:g}" + (":log" if d.log else ""))
    return " ".join(words)


def stored_space(study: optuna.Study) -> dict[str, optuna.distributions.BaseDistribution]:
    """The distributions the study's trials sampled from, first seen first."""
    stored: dict[str, optuna.distributions.BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, d in trial.distributions.items():
            stored.setdefault(name, d)
    return stored


def check_space(study: optuna.Study, config: Config, where: str) -> None:
    """Refuse, before any trial, a search space the study cannot continue with: Optuna fixes a categorical
    parameter's choices in a study, and would fail the next trial with a traceback (ranges may change)."""
    stored = stored_space(study)
    for name, new in search_space(config).items():
        if name not in stored:
            continue
        try:
            optuna.distributions.check_distribution_compatibility(stored[name], new)
        except ValueError:
            symbols = SPACE_SYMBOLS.get(name, f"{name} in CONFIG_HPO_SPACE")
            raise KfitError(
                f"the search space changed: study '{study.study_name}' in {redact(where)} searched {name} in "
                f"{_space_text(stored[name])}, the config now gives {_space_text(new)} ({symbols}), "
                f"and an Optuna study cannot change it: start a new study (make hpo HPO_STUDY=<new name>, or "
                f"set CONFIG_HPO_STUDY_NAME), or restore {symbols} to {_space_text(stored[name])}"
            ) from None


def study_objective(study: optuna.Study) -> str:
    """The objective a study was created with (a study from before objectives were stored: eval loss, its only
    objective; a study without trials or objective yet: as its direction says)."""
    if "objective" in study.user_attrs:
        return study.user_attrs["objective"]
    if not _ran(study) and study.direction == optuna.study.StudyDirection.MAXIMIZE:
        return "accuracy"
    return "eval_loss"


def _ran(study: optuna.Study) -> list:
    """The study's trials that started (not those only enqueued, which carry no objective yet)."""
    return [t for t in study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.WAITING]


def check_objective(study: optuna.Study, config: Config, where: str) -> None:
    """Refuse a config whose objective is not the study's: a study's direction is fixed when it is created."""
    have, want = study_objective(study), config.hpo_objective
    fresh = "objective" not in study.user_attrs and not _ran(study)
    if have != want and not (fresh and direction(have) == direction(want)):
        raise KfitError(
            f"the objective changed: study '{study.study_name}' in {redact(where)} scores trials by "
            f"{objective_label(have)}, the config asks {objective_label(want)} (CONFIG_HPO_OBJECTIVE_{want.upper()}), "
            f"and a study keeps its objective: start a new study (make hpo HPO_STUDY=<new name>, or set "
            f"CONFIG_HPO_STUDY_NAME), or choose CONFIG_HPO_OBJECTIVE_{have.upper()}")


_DEFAULT_NAMES = ("learning_rate", "weight_decay", "optimizer", "effective_batch")


def assignments(params: dict) -> dict:
    """Kconfig symbols for a set of trial parameters: what a trial trains with and what hpo-apply writes.

    The fixed space sets AUTO mode too: only AUTO turns an effective batch into micro-batch x accumulation.
    """
    if not set(params) & set(_DEFAULT_NAMES):
        return symbol_assignments(params)
    return {"HYPER_PARAM_AUTO": True, "LEARNING_RATE": params["learning_rate"],
            "WEIGHT_DECAY": params["weight_decay"], f"OPTIMIZER_{params['optimizer'].upper()}": True,
            "TARGET_EFFECTIVE_BATCH": params["effective_batch"]}


def trial_config(config: Config, params: dict, run_name: str) -> Config:
    """The trial's Config: the sampled values, max_resource epochs, an evaluation per epoch, a fresh run."""
    return derive(config, {**assignments(params), "EPOCHS": config.hpo_max_resource, "EVAL_INTERVAL": 0,
                           "MAX_STEPS": 0, "RESUME": False, "RUN_NAME": run_name})


# Optimizers by the state they keep, most first: the probe runs the trial that needs the most memory.
HEAVIEST_FIRST = ("adamw", "adam", "sgd")


def heaviest(config: Config) -> dict:
    """The parameters of the trial that needs the most memory: the largest effective batch with the optimizer
    that keeps the most state (a CONFIG_HPO_SPACE: every range's high end, the largest listed value)."""
    if not config.hpo_space:
        return {"optimizer": next(o for o in HEAVIEST_FIRST if o in config.hpo_optimizers),
                "learning_rate": config.hpo_lr_max, "weight_decay": config.hpo_wd_max,
                "effective_batch": max(config.hpo_batch_sizes)}
    params = {}
    for name, d in search_space(config).items():
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            if name == "OPTIMIZER":
                params[name] = next((o.upper() for o in HEAVIEST_FIRST if o.upper() in d.choices), d.choices[0])
            else:
                numbers = [c for c in d.choices if isinstance(c, (int, float))]
                params[name] = max(numbers) if len(numbers) == len(d.choices) else d.choices[0]
        else:
            params[name] = d.high
    return params


def describe(params: dict) -> str:
    if not set(params) & set(_DEFAULT_NAMES):
        return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
    return (f"{params['optimizer']} lr {params['learning_rate']:.3g} wd {params['weight_decay']:.2g} "
            f"effective batch {params['effective_batch']}")
