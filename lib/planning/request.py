"""What a plan is resolved from: one frozen request instead of long parameter lists and untyped dicts."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..config import Config
from ..hardware import HardwareProfile
from ..plan import BatchChoice, BatchPolicy, ModelDescription


@dataclass(frozen=True)
class Settings:
    """What the process's surroundings say, passed in rather than read by the resolver.

    omp_threads: OMP_NUM_THREADS as the launcher set it (a rank's threads were decided before it started).
    measure: time real micro-batches on this machine's CPU while planning (cached per machine and model);
    False plans from cached timings and the roofline alone (KFIT_STEPTIME_MEASURE=0)."""

    omp_threads: int | None = None
    measure: bool = True

    @classmethod
    def from_environment(cls, env=None) -> "Settings":
        from ..env import env_bool, env_number

        omp = env_number("OMP_NUM_THREADS", int, None, env)
        return cls(omp_threads=omp if omp and omp > 0 else None,
                   measure=env_bool("KFIT_STEPTIME_MEASURE", True, env))


def settings_or_environment(settings: Settings | None) -> Settings:
    """`settings`, or where None this process's (Settings.from_environment()): the documented default of the
    callers that have no command line to parse them (lib/api.py, lib/hyperparams.py, the reports and
    validation). The command line passes its own, parsed once per command (lib/cli/invocation.py)."""
    return Settings.from_environment() if settings is None else settings


@dataclass(frozen=True)
class PlanRequest:
    """A plan for training `model` under `config` on `hardware` with `world_size` processes over `nodes`
    machines. policy: the batch policy (None: the one the config selects, tiers.policy_for)."""

    config: Config
    hardware: HardwareProfile
    model: ModelDescription
    world_size: int = 1
    nodes: int = 1
    policy: BatchPolicy | None = None
    settings: Settings = field(default_factory=Settings)

    @property
    def local_world_size(self) -> int:
        return self.world_size // self.nodes


@dataclass(frozen=True)
class ChooseArgs:
    """What a batch policy is asked (BatchPolicy.choose's keywords, but the config): the decisions made before
    the batch, for one data-parallel strategy."""

    hardware: HardwareProfile
    model: ModelDescription
    device_type: str
    compile: bool
    compile_mode: str | None
    precision: str
    world_size: int
    target: int
    local_world_size: int
    cpu_offload: bool = False
    strategy: str = "none"
    tensor: int = 1  # processes per tensor-parallel group (world sizes count the groups)
    pipeline: tuple[int, str] | None = None  # (CONFIG_PP, its schedule): each process holds its stages' blocks
    nodes: int = 1  # machines the processes span (a pipeline's stages sit on different ones)
    context: int = 1  # processes per context-parallel group, each 1/context of every sample's tokens

    def with_strategy(self, strategy: str) -> "ChooseArgs":
        return replace(self, strategy=strategy)

    def choose(self, policy: BatchPolicy, config: Config, strategy: str | None = None) -> BatchChoice:
        """policy.choose for `config` (under `strategy`, else this one's)."""
        args = {f.name: getattr(self, f.name) for f in fields(self)}
        if strategy is not None:
            args["strategy"] = strategy
        return policy.choose(config=config, **args)
