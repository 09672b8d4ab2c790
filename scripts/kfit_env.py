"""What every subcommand reads from the environment: the machine (HW=, GPU=, ...) and the config."""

from __future__ import annotations

import os
import sys
from typing import Callable

from lib import config as kconfig
from lib.env import env_number
from lib.errors import KfitError


def run_main(main: Callable[[], int | None]) -> int:
    """A command's main() under kfit's convention: a user error is one 'error:' line on stderr and exit status
    2, never a traceback; Ctrl-C is 'interrupted' and 130."""
    try:
        return main() or 0
    except KfitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def hardware_from_env(allow_simulated: bool = True):
    """The machine to plan for. For training (allow_simulated=False) it is this one, as detected:
    GPUS= then means the number of training processes (see lib.distributed), not simulated GPUs."""
    from lib.hardware import resolve_hardware

    hw, gpu = os.environ.get("HW") or None, os.environ.get("GPU") or None
    if not allow_simulated and (hw or gpu):
        raise KfitError("HW= and GPU= describe another machine, but training runs on this one: unset them "
                        "(use 'make plan HW=... / GPU=...' to see another machine's plan)")
    # GPUS=N is N training processes everywhere (lib.distributed.process_count); on a simulated machine
    # (GPU=) it also gives that machine N of its GPU
    return resolve_hardware(hw=hw, gpu=gpu, free_gb=env_number("FREE_GB", float),
                            gpus=env_number("GPUS", int) if allow_simulated and gpu else None)


def ensure_config() -> "kconfig.Config":
    """Read the .config; on a fresh clone with none, apply the default defconfig and say so."""
    path = kconfig.config_path()
    if not path.exists():
        print(f"No {path} found: applying the default defconfig '{kconfig.DEFAULT_DEFCONFIG}' "
              f"(as 'make {kconfig.DEFAULT_DEFCONFIG}-defconfig' would)")
        return kconfig.make_defconfig(kconfig.DEFAULT_DEFCONFIG, out=path)
    return kconfig.read_config(path)


def config_to_plan() -> tuple["kconfig.Config", str | None]:
    """The .config, or without one the default defconfig built in memory and a note saying so:
    showing a plan must not create the config."""
    path = kconfig.config_path()
    if path.exists():
        return kconfig.read_config(path), None
    name = kconfig.DEFAULT_DEFCONFIG
    return kconfig.defconfig_config(name), (f"no {path}: this plans the default defconfig '{name}' in memory and "
                                            f"writes nothing ('make {name}-defconfig' writes it)")



def processes(config, hardware, world_size: int | None = None) -> tuple[int, int]:
    """(training processes, machines) as 'make train' would run them: WORLD_SIZE under torchrun (or given),
    else GPUS=N, CONFIG_NPROC or one per identical GPU (lib.distributed.process_count) on each of NNODES
    machines. So a plan previewed with the arguments of a run is the plan that runs."""
    from lib import distributed
    from lib.hyperparams import decide_device

    nodes = distributed.nodes_range()[1]  # an elastic range plans for its largest
    if world_size is None:
        world_size = env_number("WORLD_SIZE", int, minimum=1)
    if world_size is None:
        device_type, _ = decide_device(config, hardware)
        world_size = distributed.process_count(config, hardware, device_type)[0] * nodes
    return world_size, nodes if world_size % nodes == 0 else 1


def plan_for(config, hardware, world_size: int | None = None):
    """(model description, plan) for a config on a machine, as training would resolve it."""
    from lib.hyperparams import ModelDescription, resolve

    model = ModelDescription.from_config(config)
    world_size, nodes = processes(config, hardware, world_size)
    return model, resolve(config, hardware, model, world_size, nodes=nodes)
