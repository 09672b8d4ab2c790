# Tuning: the LR range test and the Optuna search (lib/lr_finder.py, lib/hpo/).
# Command-line variables (BATCH=, RUNS=, APPLY=, TRIALS=, HPO_STORAGE=, HPO_STUDY=, DEFCONFIG=) reach kfit as
# environment.

.PHONY: find-lr hpo hpo-status hpo-apply

find-lr: $(ENV_STAMP) ## LR range test at the per-device batch (BATCH=n RUNS=3 APPLY=1)
	$(Q)$(KFIT) find-lr

hpo: $(ENV_STAMP) ## Optuna search; running again continues the study (TRIALS=n HPO_STORAGE=url HPO_STUDY=name)
	$(Q)$(KFIT) hpo

hpo-status: $(ENV_STAMP) ## Progress and best trial (with its plan) of the search
	$(Q)$(KFIT) hpo-status

hpo-apply: $(ENV_STAMP) ## Write the best trial into the config (DEFCONFIG=name: a new defconfig)
	$(Q)$(KFIT) hpo-apply
