"""What every subcommand reads from the environment: the machine (HW=, GPU=, ...) and the config."""

from __future__ import annotations

import os

from lib import config as kconfig
from lib.env import env_number  # noqa: F401  (re-exported for the cli_* modules)
from lib.errors import KfitError


def hardware_from_env(allow_simulated: bool = True):
    """The machine to plan for. For training (allow_simulated=False) it is this one, as detected:
    GPUS= then means the number of training processes (see lib.distributed), not simulated GPUs."""
    from lib.hardware import resolve_hardware

    hw, gpu = os.environ.get("HW") or None, os.environ.get("GPU") or None
    if not allow_simulated and (hw or gpu):
        raise KfitError("HW= and GPU= describe another machine, but training runs on this one: unset them "
                        "(use 'make plan HW=... / GPU=...' to see another machine's plan)")
    return resolve_hardware(hw=hw, gpu=gpu, free_gb=env_number("FREE_GB", float),
                            gpus=env_number("GPUS", int) if allow_simulated else None)


def ensure_config() -> "kconfig.Config":
    """Read the .config; on a fresh clone with none, apply the default defconfig and say so."""
    path = kconfig.config_path()
    if not path.exists():
        print(f"No {path} found: applying the default defconfig '{kconfig.DEFAULT_DEFCONFIG}' "
              f"(as 'make {kconfig.DEFAULT_DEFCONFIG}-defconfig' would)")
        return kconfig.make_defconfig(kconfig.DEFAULT_DEFCONFIG, out=path)
    return kconfig.read_config(path)




def plan_for(config, hardware, world_size: int | None = None):
    """(model description, plan) for a config on a machine, as training would resolve it."""
    from lib.hyperparams import ModelDescription, resolve, world_size_from_env

    model = ModelDescription.from_config(config)
    return model, resolve(config, hardware, model, world_size or world_size_from_env())
