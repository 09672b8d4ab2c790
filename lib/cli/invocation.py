"""One typed reading of a command's variables: the flags (lib/cli/flags.py puts each into the environment, as make
passes its variables) and the environment, parsed once, checked, and frozen. What lib/api.py, lib/distributed.py
and lib/planning take comes from here as plain arguments. A rank of a kfit launch parses nothing: its
invocation, config and plan come in the launch file its launcher names on its command line (`train --launch
FILE`), and kfit's variables are kept from its environment; only OMP_NUM_THREADS is set for torchrun."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from ..errors import KfitError
from ..env import env_bool, env_number, env_text
from .slurm import with_slurm

if TYPE_CHECKING:
    from ..planning import Settings

# The one-command Kconfig overrides, as JSON [[symbol, value], ...] (lib/cli/flags.py writes it).
SET_VARIABLE = "KFIT_SET"


@dataclass(frozen=True)
class Invocation:
    gpus: int | None = None  # GPUS=: training processes on this machine (a simulated machine's GPUs with GPU=)
    world_size: int | None = None  # WORLD_SIZE=: set by torchrun in a rank; `plan --world-size N` to preview
    nodes: tuple[int, int] = (1, 1)  # NNODES= as (min, max) machines
    resume: bool | None = None  # RESUME=
    resume_from: str | None = None
    init_from: str | None = None
    extend_epochs: int | None = None  # EXTEND_EPOCHS=: continue a finished run (lib/extension.py)
    extend_steps: int | None = None
    run: str | None = None  # RUN=: the run to extend (default the last one)
    hw: str | None = None
    gpu: str | None = None
    free_gb: float | None = None
    settings: Settings = field(default_factory=lambda: _settings_type()())
    # Kconfig symbols set for this command only (make's NAME=value, `--set`), as (symbol, value) in the order
    # given: KFIT_SET, which lib/cli/flags.py writes and torchrun's ranks inherit
    overrides: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> "Invocation":
        env = with_slurm(os.environ if env is None else env)  # inside a SLURM job: its nodes, rank and host
        plain = dict(gpus=env_number("GPUS", int, None, env, minimum=1),
                     world_size=env_number("WORLD_SIZE", int, None, env, minimum=1),
                     resume=env_bool("RESUME", None, env), resume_from=env_text("RESUME_FROM", env),
                     init_from=env_text("INIT_FROM", env), hw=env_text("HW", env), gpu=env_text("GPU", env),
                     extend_epochs=env_number("EXTEND_EPOCHS", int, None, env, minimum=1),
                     extend_steps=env_number("EXTEND_STEPS", int, None, env, minimum=1), run=env_text("RUN", env),
                     free_gb=env_number("FREE_GB", float, None, env),
                     overrides=_overrides(env_text(SET_VARIABLE, env)))
        # NNODES= and the planning settings after the plain values: their parsers live beside torch (lib.distributed,
        # lib.planning), so a refused GPUS=, RESUME=, FREE_GB=, ... costs no torch import (about 3 s)
        from .. import distributed

        return cls(nodes=distributed.nodes_range(env), settings=_settings_type().from_environment(env), **plain)

    @property
    def planned_nodes(self) -> int:
        """The machines a plan is made for: an elastic range plans for its largest."""
        return self.nodes[1]

    def for_ranks(self) -> dict:
        """What a rank of this launch takes from the command line, for the launch file (from_launch reads it back):
        the run to continue or start from, and whether to time steps; everything else the launcher decided."""
        return dict(resume=self.resume, resume_from=self.resume_from, init_from=self.init_from,
                    measure=self.settings.measure)

    @classmethod
    def from_launch(cls, handed: dict, omp_threads: int | None) -> "Invocation":
        """A rank's invocation: its launcher's (for_ranks), and the threads torchrun started it with."""
        settings = _settings_type()(omp_threads=omp_threads, measure=bool(handed["measure"]))
        return cls(resume=handed["resume"], resume_from=handed["resume_from"], init_from=handed["init_from"],
                   settings=settings)

    def plan_args(self, world_size: int | None = None) -> dict:
        """The door's keywords (lib.planning.make_plan) for this command's processes (WORLD_SIZE=, GPUS=,
        NNODES=) and settings: so a plan previewed with the arguments of a run is the plan that runs."""
        return dict(world_size=world_size or self.world_size, gpus=self.gpus, nodes=self.planned_nodes,
                    settings=self.settings)


def _settings_type() -> type:
    """lib.planning.Settings, imported when first needed: lib.planning imports torch, which a command that only
    writes a config (or refuses a variable) never needs."""
    from ..planning import Settings

    return Settings


def _overrides(text: str | None) -> tuple[tuple[str, str], ...]:
    if not text:
        return ()
    try:
        pairs = json.loads(text)
        return tuple((str(name), str(value)) for name, value in pairs)
    except (ValueError, TypeError, RecursionError):
        raise KfitError(f"{SET_VARIABLE}={text[:80]!r} is not the overrides kfit writes ([[symbol, value], ...]): "
                        f"unset it and give overrides as NAME=value to make or --set to kfit") from None
