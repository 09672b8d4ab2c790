"""The one door to a plan: every plan kfit makes or confirms goes through `make_plan` and `confirm`.

    planned = make_plan(config, hardware, gpus=2)        # (model description, plan) for 2 processes
    plan = confirm(config, planned.plan, hardware, task)  # the probe on the device, then re-predicted

The command line, the Python API (lib/api.py), the facade a training script calls (lib/hyperparams.py), HPO,
recommend, the reports, validation and the benchmarks all come here; the model description is derived here
from the config, and the number of processes counted here, so no caller can plan a model or a layout other
than the one training would run. What the surroundings say comes in `settings` (None: this process's,
Settings.from_environment()); the command line passes its own, parsed once per command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

from ..config import Config
from ..errors import KfitError
from ..hardware import HardwareProfile
from ..plan import BatchPolicy, ModelDescription, Plan
from ..units import MAXIMA
from .request import PlanRequest, Settings, settings_or_environment
from .resolver import resolve_request

if TYPE_CHECKING:
    from ..distributed import Rank
    from ..task import Task


class Planned(NamedTuple):
    """A plan and the model description it was made for."""

    model: ModelDescription
    plan: Plan


def process_count(config: Config, hardware: HardwareProfile, device_type: str,
                  gpus: int | None = None) -> tuple[int, str]:
    """Training processes on one machine, and why: `gpus` (GPUS=) wins, then NPROC_MANUAL, then AUTO (one
    per identical GPU)."""
    if gpus is not None:
        if gpus < 1:
            raise KfitError(f"GPUS='{gpus}' is too small: give a whole number from 1 to {MAXIMA['GPUS']:,}")
        return gpus, f"GPUS={gpus}"
    if config.nproc_mode == "manual":
        return config.nproc, f"CONFIG_NPROC={config.nproc}"
    if device_type == "cuda" and hardware.identical_gpu_count > 1:
        return hardware.identical_gpu_count, f"AUTO: {hardware.identical_gpu_count} identical GPUs"
    return 1, "AUTO: one process"


def processes(config: Config, hardware: HardwareProfile, *, world_size: int | None = None,
              gpus: int | None = None, nodes: int = 1) -> tuple[int, int]:
    """(training processes in all, machines) as `kfit train` runs them: `world_size` if given, else
    process_count() on each of `nodes` machines. A world size that does not spread evenly over the machines is
    planned as one machine's."""
    from .decisions import decide_device

    if world_size is None:
        device_type, _ = decide_device(config, hardware)
        world_size = process_count(config, hardware, device_type, gpus)[0] * nodes
    return world_size, nodes if world_size % nodes == 0 else 1


def make_plan(config: Config, hardware: HardwareProfile, *, world_size: int | None = None, gpus: int | None = None,
              nodes: int = 1, settings: Settings | None = None, policy: BatchPolicy | None = None) -> Planned:
    """The plan training would run for `config` on `hardware`, for the processes processes() counts.
    policy: the batch policy (None: the one the config selects)."""
    model = ModelDescription.from_config(config)
    world_size, nodes = processes(config, hardware, world_size=world_size, gpus=gpus, nodes=nodes)
    return Planned(model, resolve_request(PlanRequest(config, hardware, model, world_size=world_size, nodes=nodes,
                                                      policy=policy, settings=settings_or_environment(settings))))


def received(config: Config, plan: Plan) -> Planned:
    """A plan made by the door in another process (the launcher's, read back by a rank), with its model."""
    return Planned(ModelDescription.from_config(config), plan)


def confirm(config: Config, plan: Plan, hardware: HardwareProfile, task: "Task", *,
            log: Callable[[str], None] = print, rank: "Rank | None" = None) -> Plan:
    """`plan` as the device confirms it: the probe (CONFIG_PROBE_*) and, where it moved the micro-batch, the
    new split's predicted time. On one rank of a run, `rank`'s device."""
    from .. import distributed
    from ..probe import maybe_probe
    from .throughput import with_predictions

    probed = maybe_probe(config, plan, hardware, task, log=log, rank=rank or distributed.SINGLE)
    return probed if probed == plan else with_predictions(config, hardware, probed)
