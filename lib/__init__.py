"""kfit: a Kconfig-driven training toolchain.

Data flows one way, and imports follow it (docs/architecture.md):
Kconfig -> .config -> lib.config.Config -> lib.hardware.HardwareProfile -> lib.plan.Plan
(lib.hyperparams.resolve, with lib.memory and lib.planner) -> lib.trainer -> the run directory.
"""
