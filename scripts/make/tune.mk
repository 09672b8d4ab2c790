# Tuning: the LR range test and the Optuna search (lib/lr_finder.py, lib/hpo/).
# Command-line variables (BATCH=, RUNS=, APPLY=, TRIALS=, HPO_STORAGE=, HPO_STUDY=, DEFCONFIG=) reach kfit as
# environment.
KFIT_TARGETS += find-lr hpo hpo-status hpo-apply
help-find-lr := LR range test at the per-device batch (BATCH=n RUNS=3 APPLY=1)
help-hpo := Optuna search; running again continues the study (TRIALS=n HPO_STORAGE=url HPO_STUDY=name)
help-hpo-status := Progress and best trial (with its plan) of the search
help-hpo-apply := Write the best trial into the config (DEFCONFIG=name: a new defconfig)
