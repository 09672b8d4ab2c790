"""Hyperparameter search with Optuna, inside what the hardware plan allows.

Each trial samples a learning rate, a weight decay, an optimizer and an
*effective* batch from the Kconfig search space (or the symbols CONFIG_HPO_SPACE
names, over its ranges), derives a strictly validated
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

The package: storage.py (where a study lives, how it is opened, `redact`), space.py (the search space and the
Kconfig values a trial's parameters stand for), runner.py (the trials, the study's run, its status).
"""

from ..errors import KfitError  # noqa: F401  (lib.hpo.KfitError, as before the split)
from .runner import (
    TRIAL_FAILURES, Interrupted, Log, best_assignments, best_trial, capped, counts, fail_stale_trials, fold_task,
    new_trial_dir, objective, probe_once, run_study, status_lines, trial_line,
)
from .space import (OBJECTIVES, SPACE_SYMBOLS, assignments, check_objective, check_space, describe, heaviest,
                    parse_space, sample, search_space, space_text, trial_config)
from .storage import (
    HEARTBEAT_GRACE_S, HEARTBEAT_S, HyperbandWithPatience, checked_storage, make_pruner, open_study, redact,
    storage_url, study_dir, study_name,
)

__all__ = [
    "HEARTBEAT_GRACE_S", "HEARTBEAT_S", "OBJECTIVES", "SPACE_SYMBOLS", "TRIAL_FAILURES", "HyperbandWithPatience",
    "checked_storage",
    "Interrupted", "Log", "assignments", "best_assignments", "best_trial", "capped", "check_objective", "check_space",
    "counts", "describe", "fail_stale_trials", "fold_task", "heaviest", "make_pruner", "new_trial_dir", "objective",
    "open_study", "parse_space", "probe_once", "redact", "run_study", "sample", "search_space",
    "space_text", "status_lines", "storage_url", "study_dir", "study_name", "trial_config", "trial_line",
]
