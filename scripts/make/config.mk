# Config targets beyond the kernel's (lib/cli/__init__.py, lib/config/operations.py).
# SET="A=1 B=2" (or the assignments themselves on make's command line) reaches kfit through KFIT_OVERRIDES,
# never a shell.
KFIT_TARGETS += config-set
help-config-set := Write settings into the config, each checked as in a fragment (SET="EPOCHS=3 LEARNING_RATE=0.01")
KFIT_TARGETS += genoptions
help-genoptions := Write lib/config/options.pyi (every Kconfig option as a typed field of config.options) from the Kconfig tree
