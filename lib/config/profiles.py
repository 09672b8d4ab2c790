"""The memory profiles: the share of free memory (GPU free, or RAM available on a CPU) the planner may use.

The one source of these shares: the config reader (typed.py) gives a config its share from here, the
memory planner (lib/planning/memory_policy.py) labels and checks against it, the report's advice and
`make recommend`'s modes read it, and tests/test_memory_replay.py holds it against the committed H100
measurements. The Kconfig prompts (kconfigs/Kconfig.hyperparams) state the same percentages; tests/test_config.py
fails where they differ.

Margin evidence (tests/test_memory_replay.py): on the 38 committed H100 memory cases the predicted peak is
-1.99%..+4.99% of the measured reserved peak (mean 1.9%), so a real peak is at most 1/(1-0.0199) = 1.020 x the
prediction. A plan keeps its prediction under free x share, so its real peak stays under free x share x 1.020:
balanced at 0.90 peaks at <= 91.8% of free memory, extreme at 0.97 at <= 99.0%. The replay asserts, for
every case and every profile here, that the measured peak stays under the free memory at which the planner
would have chosen that case's micro-batch (extreme could go up to 0.980 on this evidence). Out-of-memory
recovery (lib/planning/ladder.py) remains the net for a model or device the replay has not seen.
"""

from __future__ import annotations

# MEMORY_PROFILE_<NAME> -> its share; CUSTOM takes MEMORY_PROFILE_PERCENT instead
MEMORY_PROFILES = {"CONSERVATIVE": 0.50, "BALANCED": 0.90, "EXTREME": 0.97}
DEFAULT_MEMORY_PROFILE = "BALANCED"  # the Kconfig choice's default
DEFAULT_SHARE = MEMORY_PROFILES[DEFAULT_MEMORY_PROFILE]
LARGEST_SHARE = max(MEMORY_PROFILES.values())


def profile_name(share: float) -> str | None:
    """The named profile ('balanced') whose share this is, or None for a custom share."""
    for name, value in MEMORY_PROFILES.items():
        if value == share:
            return name.lower()
    return None
