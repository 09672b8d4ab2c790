"""kfit from Python, without make: load a config, plan it for this or another machine, train it.

    import kfit

    config = kfit.load_config("lenet5", fragments=["cpu-smoke"], overrides={"EPOCHS": 1})
    print(kfit.resolve_plan(config, gpu="h100", free_gb=70).micro_batch)  # another machine's plan
    result = kfit.train(config, output_dir="runs")                           # here, as `kfit train`
    print(result.run_dir, result.final_eval)

Everything goes through the same code as the command line: the strict config reader (a value that does not
take is a ConfigError naming it), the resolver, and the one training loop. Errors the user can fix are
KfitError subclasses (lib/errors.py), one line each. Unlike the command line, these functions read no
environment variables for their settings (GPU=, GPUS=, RESUME=, ...): the arguments say everything. One default
comes from the surroundings, as documented where it applies: `settings=None` (resolve_plan, train)
takes this process's planning settings, `lib.planning.Settings.from_environment()` (OMP_NUM_THREADS, whether
to time steps on this CPU: KFIT_STEPTIME_MEASURE); pass a `Settings` to decide them here. The command line
always passes its own, parsed once per command.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from . import config as kconfig
from .errors import ConfigError, KfitError

if TYPE_CHECKING:
    from .config import Config
    from .hardware import HardwareProfile
    from .plan import ModelDescription, Plan
    from .planning import Settings
    from .trainer import TrainResult

# Not `plan` or `hardware`: the package's submodules have those names (kfit.plan, kfit.hardware), and the
# import system would put them in place of functions so named.
__all__ = ["load_config", "machine", "resolve_plan", "train"]


def load_config(source: "str | os.PathLike | Config" = kconfig.DEFAULT_DEFCONFIG,
                overrides: Mapping[str, object] | None = None, *, fragments: Sequence[str] = ()) -> "Config":
    """A validated, frozen Config.

    source: a defconfig name (as `kfit list` shows: "lenet5", "gpt2", ...), a path to a config or
    defconfig file, or a Config. fragments: names from defconfigs/fragments/ (or paths) merged on top, as
    `kfit defconfig NAME --fragments`. overrides: {symbol: value} set last, with or without the CONFIG_
    prefix ({"EPOCHS": 2, "LEARNING_RATE": 0.01, "COMPILE_AUTO": False}), checked as strictly as a fragment.
    Writes nothing."""
    if isinstance(source, kconfig.Config):
        config = source
        if fragments:
            raise ConfigError("fragments apply to a defconfig name or file, not to a loaded Config: use overrides")
    else:  # a defconfig name or a config file, as `kfit defconfig` reads them, written to a scratch file
        name = os.fspath(source)
        with tempfile.TemporaryDirectory(prefix="kfit-config-") as tmp:
            config = kconfig.make_defconfig(name, fragments, out=Path(tmp) / ".config")
        path = kconfig.defconfig_file(name)
        label = path.name if path.parent == kconfig.DEFCONFIG_DIR else str(path)
        config = dataclasses.replace(config, source=label + "".join(f" + {f}" for f in fragments))
    return kconfig.derive(config, overrides) if overrides else config


def machine(*, gpu: str | None = None, hw: "str | os.PathLike | None" = None, free_gb: float | None = None,
             gpus: int | None = None) -> "HardwareProfile":
    """The machine to plan for: this one as detected; or a catalog GPU (gpu="h100", "a100-40gb"; "cpu" for
    this machine without its GPUs), with free_gb GiB free on each and `gpus` of them; or a hardware profile
    JSON file (hw=, as `kfit check-hardware --format json` writes)."""
    return _machine(gpu, hw, free_gb, gpus)


def _machine(gpu, hw, free_gb, gpus) -> "HardwareProfile":
    from .hardware import resolve_hardware

    return resolve_hardware(hw=os.fspath(hw) if hw is not None else None, gpu=gpu, free_gb=free_gb, gpus=gpus)


def resolve_plan(config: "Config", hardware: "HardwareProfile | None" = None, *, gpu: str | None = None,
         hw: "str | os.PathLike | None" = None, free_gb: float | None = None, gpus: int | None = None,
         world_size: int | None = None, settings: "Settings | None" = None) -> "Plan":
    """The plan `kfit plan` shows (and `kfit train` would start from) for `config` on a machine: `hardware`
    (a profile from kfit.machine()), else the one gpu/hw/free_gb/gpus describe (see machine()), else this
    one. gpus=N also means N training processes, as GPUS=N does; world_size plans for that many processes
    in all. settings: what the surroundings say (lib.planning.Settings); None, the default, takes this
    process's (Settings.from_environment()). plan.to_dict() is `kfit plan --format json`'s plan."""
    from .planning import make_plan

    if hardware is None:
        hardware = _machine(gpu, hw, free_gb, gpus)
    elif gpu or hw or free_gb is not None:
        raise KfitError("give either a hardware profile or gpu/hw/free_gb, not both")
    return make_plan(config, hardware, world_size=world_size, gpus=gpus, settings=settings).plan


def train(config: "Config", *, output_dir: "str | os.PathLike | None" = None, resume: bool = False,
          resume_from: "str | os.PathLike | None" = None, init_from: "str | os.PathLike | None" = None,
          log: Callable[[str], None] = print, settings: "Settings | None" = None) -> "TrainResult":
    """Train `config` on this machine in this process, with kfit's loop: the plan, the probe, checkpoints,
    metrics and the run directory exactly as `kfit train` (one process; `kfit train --gpus N` launches N).

    output_dir: where the run directory goes (default CONFIG_OUTPUT_DIR). resume: continue the latest
    unfinished run there whose config and effective batch match. resume_from: continue this run directory
    (its newest readable checkpoint) or checkpoint instead, as `kfit train --resume-from`; init_from: start
    a new run from the weights of a run directory, checkpoint or model.safetensors (`--init-from`). A
    mismatch with the config is a KfitError before anything is written. log: each line kfit would print.
    settings: the planning settings, as resolve_plan's (None: this process's).
    Returns the TrainResult: run_dir, steps, epochs, seconds, stop_reason, final_eval (the last
    evaluation's metrics) and history. A diverged loss raises FloatingPointError; a stop by SIGINT /
    SIGTERM raises lib.trainer.TrainingInterrupted (its exit_code is 130 / 143) after a checkpoint."""
    from .hardware import resolve_hardware
    from .planning import make_plan

    if output_dir is not None:
        config = kconfig.derive(config, {"OUTPUT_DIR": os.fspath(output_dir)})
    pick = run_to_resume(config, resume=resume, resume_from=resume_from, init_from=init_from, log=log)
    here = usable_hardware(config, resolve_hardware(), warn=log)
    model, plan = make_plan(config, here, world_size=1, settings=settings)
    return train_planned(config, here, plan, model, log=log, resume=pick, init_from=init_from)


def run_to_resume(config: "Config", *, resume: bool, resume_from: "str | os.PathLike | None" = None,
                  init_from: "str | os.PathLike | None" = None, log: Callable[[str], None] = print
                  ) -> "Callable[[Plan], Path | None]":
    """What train_planned continues, given the plan: RESUME_FROM's checkpoint (checked here, before any
    work; its effective batch against the plan's), or its run directory, where the restore takes the newest
    checkpoint that fits the model (setting aside, with one warning, one that does not); nothing for INIT_FROM
    (always a new run), else the resume search when `resume`."""
    from .checkpoint import run_of
    from .trainer.initial import initial_source, not_both
    from .trainer.resume import resume_point

    not_both(resume_from, init_from)
    if resume_from is not None:
        path, effective = resume_point(Path(os.fspath(resume_from)), config, log)
        source = Path(os.fspath(resume_from)).expanduser()
        if run_of(source) == source:
            path = source

        def chosen(plan: "Plan") -> Path:
            if plan.effective_batch != effective:
                raise KfitError(f"RESUME_FROM={resume_from}: its effective batch was {effective}, this plan's is "
                                f"{plan.effective_batch}: set CONFIG_TARGET_EFFECTIVE_BATCH={effective} to continue it")
            return path
        return chosen
    if init_from is not None:
        initial_source(Path(os.fspath(init_from)))
        return lambda plan: None
    if resume:
        return lambda plan: find_run(config, plan, log)
    return lambda plan: None


def find_run(config: "Config", plan: "Plan", log: Callable[[str], None] = print) -> Path | None:
    """The run to continue: the latest unfinished one in the output directory with a matching config and
    effective batch."""
    from .resumable import find_resumable

    return find_resumable(Path(config.output_dir), config.text, plan.effective_batch, config.run_name, log=log)


def usable_hardware(config: "Config", machine: "HardwareProfile", warn: Callable[[str], None] = print,
                    index: int = 0) -> "HardwareProfile":
    """The detected machine, or its CPU when GPU `index` cannot train under DEVICE_AUTO (CONFIG_CPU_FALLBACK)."""
    from .errors import HardwareError
    from .hardware import gpu_unusable_reason, resolve_hardware

    if config.device == "cpu":
        return machine
    reason = gpu_unusable_reason(index) if machine.accelerator in ("cuda", "rocm") else None
    if reason is None and (machine.gpus or not machine.notes):
        return machine  # a usable GPU, or a machine without one
    if reason is None:  # a GPU torch cannot use at all: the resolver plans the CPU (or refuses DEVICE_CUDA)
        reason = "; ".join(machine.notes)
    if config.device == "cuda":
        raise HardwareError(f"CONFIG_DEVICE_CUDA is set but {reason}")
    if not config.cpu_fallback:
        raise HardwareError(f"{reason}. CONFIG_CPU_FALLBACK=n forbids training on the CPU instead: fix the GPU, "
                            "or enable CONFIG_CPU_FALLBACK")
    warn(f"warning: {reason}")
    warn("warning: training on the CPU instead (CONFIG_CPU_FALLBACK=y): expect it to be much slower")
    return resolve_hardware(gpu="cpu")


def train_planned(config: "Config", machine: "HardwareProfile", plan: "Plan", model: "ModelDescription", *,
                  rank=None, log: Callable[[str], None] = print, resume: "Callable[[Plan], Path | None]",
                  init_from: "str | os.PathLike | None" = None) -> "TrainResult":
    """Confirm `plan` on the device (the probe), then train: one process, or one rank of a torchrun job
    (`rank`, set up). The plan was resolved once, by the launching process. `resume(plan)` names the run to
    continue, or None; on rank 0 only. `init_from`: weights a new run starts from (INIT_FROM)."""
    from . import distributed
    from .hardware.allocator import RETENTION_FACTOR, keep_freed_memory, needs_returning, return_freed_memory
    from .planning import confirm
    from .planning.render import start_lines
    from .task import load_task
    from .trainer import train as train_loop

    rank = rank or distributed.SINGLE
    for line in start_lines(plan, machine, model):
        log(line)
    task = load_task(config)
    if plan.effective_batch > len(task.train):
        log(f"warning: the effective batch {plan.effective_batch} is larger than the training set "
            f"({len(task.train):,} samples): each step uses all of them, one step per epoch; lower "
            f"CONFIG_TARGET_EFFECTIVE_BATCH to {len(task.train)} or less")
    plan = confirm(config, plan, machine, task, log=log, rank=rank)
    if plan.device_type == "cpu" and needs_returning(plan.predicted_peak_bytes, plan.budget_bytes):
        returned = return_freed_memory()
        log(f"Memory: the predicted peak x {RETENTION_FACTOR} (glibc keeps freed memory) exceeds the budget: "
            + ("freed tensors go back to the system (slower steps, RAM within budget)" if returned
               else "this C library cannot be told to return freed memory; RAM may exceed the budget"))
    elif plan.device_type == "cpu":
        keep_freed_memory()  # steps reuse the heap, as the planner's timed steps did (lib/hardware/allocator.py)
    run = distributed.broadcast(resume(plan) if rank.is_main else None)
    return train_loop(config, plan, machine, task=task, resume=run, log=log,
                      init_from=Path(os.fspath(init_from)) if init_from is not None else None)
