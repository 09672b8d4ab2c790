"""User-facing errors.

Every error a user can cause (a bad config value, a missing data path, an
impossible plan) is a KfitError: the CLI prints its message, which names the
problem and the fix, and exits with status 2 without a traceback.
"""


class KfitError(Exception):
    """An error caused by input the user can fix."""


class ConfigError(KfitError):
    """A .config, defconfig or fragment value that does not take."""


class DataError(KfitError):
    """A dataset path that is missing, empty or corrupt."""


class HardwareError(KfitError):
    """A hardware profile that cannot be detected, loaded or built."""


class PlanError(KfitError):
    """A configuration that cannot run on the given hardware."""


class NoFitError(PlanError):
    """The memory planner predicts that not even micro-batch 1 fits: `what` says how far over the budget it is,
    `helps` what would help, `hint` a sentence after them (the message joins the three)."""

    def __init__(self, what: str, helps: list[str] | tuple[str, ...] = (), hint: str = "") -> None:
        self.what, self.helps, self.hint = what, tuple(helps), hint
        super().__init__(what + (". What would help, with the predicted peak at micro-batch 1 where known: "
                                 + "; ".join(self.helps) if self.helps else "") + hint)
