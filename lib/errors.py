"""User-facing errors.

Every error a user can cause (a bad config value, a missing data path, an
impossible plan) is a KfitError: the CLI prints its message, which names the
problem and the fix, and exits with status 2 without a traceback.
"""


# The longest message kfit shows: one that quotes a user's value whole (a 100,000-character GPU=) is cut in its
# middle, where the value is, keeping its start (what is wrong) and its end (the fix)
MESSAGE_LIMIT = 1000


def cut_middle(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text`, or its start and end with how much was cut between them where it is longer than `limit`."""
    if len(text) <= limit:
        return text
    head = tail = limit * 2 // 5
    return f"{text[:head]} ... ({len(text) - head - tail:,} characters cut) ... {text[-tail:]}"


class KfitError(Exception):
    """An error caused by input the user can fix. Its message is cut to MESSAGE_LIMIT characters however it is
    shown (the CLI's error line, a script's traceback, a log), so a value of megabytes is never echoed whole."""

    def __str__(self) -> str:
        return cut_middle(super().__str__())


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
