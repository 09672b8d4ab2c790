"""kfit: a Kconfig-driven training toolchain.

Data flows one way: Kconfig -> .config -> lib.config.Config -> lib.hyperparams.Plan -> lib.trainer.
"""
