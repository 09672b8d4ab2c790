"""The randcheck command: random configs planned for four machines and trained on this CPU (lib/randcheck.py)."""

from __future__ import annotations

from ..env import env_number
from ..errors import KfitError
from .flags import command


def cmd_randcheck(args) -> int:
    from ..config import randconfig_seed
    from ..env import env_text
    from ..randcheck import run

    draws = env_number("N", int, 50, minimum=1)
    train = env_number("TRAIN", int, 10, minimum=0)
    if train > draws:
        raise KfitError(f"TRAIN={train} is more than the N={draws} draws: give TRAIN=0..{draws}")
    first = randconfig_seed(env_text("KCONFIG_SEED"))
    print(f"randcheck: {draws} draws from KCONFIG_SEED={first}, {train} trained with one and two processes")
    summary = run(list(range(first, first + draws)), train=train)
    return 1 if summary.failures else 0


def register(sub) -> None:
    command(sub, "randcheck", "random configs planned for four machines, some trained here, each checked",
            "N", "KCONFIG_SEED", "TRAIN", func=cmd_randcheck)
