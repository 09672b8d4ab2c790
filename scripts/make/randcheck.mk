# The configuration space checked as a space (lib/randcheck.py): random valid configs, each planned for this CPU,
# an H100, 8 H100s and two machines of 8, some trained here with one and two processes and command-line overrides.
KFIT_TARGETS += randcheck
help-randcheck := Plan N random configs on 4 machines, train TRAIN of them here (N=50 KCONFIG_SEED= TRAIN=10)
