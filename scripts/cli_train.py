"""The train subcommand: fallback, launch under torchrun, probe, resume, train.

Exit status: 0 done; 1 the loss diverged; 2 an error the user can fix; 130 / 143
stopped by SIGINT / SIGTERM after saving a checkpoint ('make train' resumes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kfit_env import ensure_config, hardware_from_env, plan_for
from lib.env import env_bool, env_number
from lib.errors import HardwareError, KfitError

ROOT = Path(__file__).resolve().parent.parent


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def usable_hardware(config, hardware, warn=_stderr, index: int = 0):
    """The detected machine, or its CPU when GPU `index` cannot train under DEVICE_AUTO (CONFIG_CPU_FALLBACK)."""
    from lib.hardware import gpu_unusable_reason, resolve_hardware

    if config.device == "cpu":
        return hardware
    reason = gpu_unusable_reason(index) if hardware.accelerator in ("cuda", "rocm") else None
    if reason is None and (hardware.gpus or not hardware.notes):
        return hardware  # a usable GPU, or a machine without one
    if reason is None:  # a GPU torch cannot use at all: the resolver plans the CPU (or refuses DEVICE_CUDA)
        reason = "; ".join(hardware.notes)
    if config.device == "cuda":
        raise HardwareError(f"CONFIG_DEVICE_CUDA is set but {reason}")
    if not config.cpu_fallback:
        raise HardwareError(f"{reason}. CONFIG_CPU_FALLBACK=n forbids training on the CPU instead: fix the GPU, "
                            "or enable CONFIG_CPU_FALLBACK")
    warn(f"warning: {reason}")
    warn("warning: training on the CPU instead (CONFIG_CPU_FALLBACK=y): expect it to be much slower")
    return resolve_hardware(gpu="cpu")


def resume_from(config, plan) -> Path | None:
    """The run to continue: the latest unfinished one in OUTPUT_DIR with a matching config and effective
    batch, unless CONFIG_RESUME=n or RESUME=0 (RESUME=1 resumes even when CONFIG_RESUME=n)."""
    from lib.checkpoint import find_resumable

    if not env_bool("RESUME", config.resume):
        return None
    return find_resumable(Path(config.output_dir), config.text, plan.effective_batch, config.run_name, log=print)


def _oom_relaunch(config, since: float) -> str | None:
    """Why to relaunch a sharded run that failed: it ran out of memory and marked the micro-batch to retry."""
    from lib.checkpoint import oom_marker_since

    marker = oom_marker_since(Path(config.output_dir), since)
    if marker is None:
        return None
    return (f"Out of memory at step {marker['step']} under FSDP: relaunching from the last checkpoint at "
            f"micro-batch {marker['micro_batch']} (the same effective batch)")


def cmd_train(args) -> int:
    import torch

    from lib import distributed
    from lib.hyperparams import compile_line, summary_line
    from lib.hardware.allocator import RETENTION_FACTOR, needs_returning, return_freed_memory
    from lib.oom import ADVICE, is_oom
    from lib.parallel import is_sharded
    from lib.task import load_task
    from lib.trainer import TrainingInterrupted, train

    hardware = hardware_from_env(allow_simulated=False)
    # every variable is checked before a config is written or a process launched
    env_bool("RESUME")
    nnodes = distributed.nodes_range()[1]
    world_size = env_number("WORLD_SIZE", int, 1, minimum=1)
    config = ensure_config()
    if not distributed.under_torchrun():
        if world_size > 1:
            raise KfitError(f"WORLD_SIZE={world_size} is set, but kfit was not started by torchrun: "
                            f"unset it and use 'make train GPUS={world_size}', which launches "
                            "torchrun ('make plan WORLD_SIZE=N' shows what N processes would run)")
        hardware = usable_hardware(config, hardware)
        _, plan = plan_for(config, hardware, world_size=1)  # the config is validated before any launch
        nproc, why = distributed.process_count(config, hardware, plan.device_type)
        if nproc > 1 or nnodes > 1:  # one process on each of several machines is torchrun's too
            _, launch = plan_for(config, hardware, world_size=nproc * nnodes)  # refuses a world size it cannot take
            print(f"Launching {nproc} training processes per machine on {nnodes} machine(s) with torchrun ({why}); "
                  f"{launch.cpu_threads} CPU thread(s) each")
            # the threads are decided here, before any rank starts: a rank would count its siblings as load
            # a sharded run that ran out of memory is relaunched at half the micro-batch: no rank can redo a step
            relaunch = is_sharded(launch.strategy) and config.oom_recovery
            return distributed.run_torchrun(
                nproc, ROOT / "scripts" / "kfit.py", dict(os.environ), threads=launch.cpu_threads,
                relaunch=(lambda since: _oom_relaunch(config, since)) if relaunch else None,
                attempts=(config.oom_max_halvings or 0) if relaunch else 0)
    rank = distributed.current()
    say = print if rank.is_main else (lambda *a, **k: None)
    if rank.active:
        hardware = usable_hardware(config, hardware, _stderr if rank.is_main else (lambda line: None), rank.local_rank)
        _, plan = plan_for(config, hardware, rank.world_size)
        rank = distributed.setup(plan.device_type)
        hardware = distributed.hardware_for_rank(hardware, rank)
    try:
        model, plan = plan_for(config, hardware, rank.world_size)
        say(summary_line(plan, hardware, model))
        say(compile_line(plan))
        say(f"CPU threads: {plan.cpu_threads} ({plan.reasons['cpu_threads']})")
        for note in plan.notes:
            say(f"Note: {note}")
        task = load_task(config)
        if plan.effective_batch > len(task.train):
            say(f"warning: the effective batch {plan.effective_batch} is larger than the training set "
                f"({len(task.train):,} samples): each step uses all of them, one step per epoch; lower "
                f"CONFIG_TARGET_EFFECTIVE_BATCH to {len(task.train)} or less")
        from lib.probe import maybe_probe

        probed = maybe_probe(config, plan, hardware, task, log=say, rank=rank)
        if probed != plan:  # another micro-batch: its own predicted time
            from lib.hyperparams import with_predictions

            probed = with_predictions(config, hardware, probed)
        plan = probed
        if plan.device_type == "cpu" and needs_returning(plan.predicted_peak_bytes, plan.budget_bytes):
            returned = return_freed_memory()
            say(f"Memory: the predicted peak x {RETENTION_FACTOR} (glibc keeps freed memory) exceeds the budget: "
                + ("freed tensors go back to the system (slower steps, RAM within budget)" if returned
                   else "this C library cannot be told to return freed memory; RAM may exceed the budget"))
        resume = distributed.broadcast(resume_from(config, plan) if rank.is_main else None)
        result = train(config, plan, hardware, task=task, resume=resume, log=say)
    except TrainingInterrupted as stop:
        return stop.exit_code
    except FloatingPointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        what = ("CONFIG_OOM_RECOVERY is off" if not config.oom_recovery else
                "under FSDP no rank can redo a step alone: the launcher relaunches the run at half the micro-batch"
                if is_sharded(plan.strategy) and rank.active else
                "it could not be recovered")
        print(f"error: out of memory ({' '.join(str(err).split())[:200]}); {what}: {ADVICE}", file=sys.stderr)
        return 2
    finally:
        distributed.teardown()
    final = result.final_eval
    if rank.is_main:
        metric = (f"accuracy {final['accuracy']:.2%}" if "accuracy" in final else
                  f"perplexity {final['perplexity']:.2f}" if "perplexity" in final else
                  f"eval loss {final['eval_loss']:.4f}")
        print(f"Done: {result.steps} steps, {result.epochs:.1f} epochs in {result.seconds:.1f}s; {metric}; "
              f"run in {result.run_dir}")
    return 0


def cmd_export(args) -> int:
    from lib.export import export

    run = args.run or os.environ.get("RUN")
    if not run:
        raise KfitError("RUN= is missing: name a run directory (under CONFIG_OUTPUT_DIR) or a checkpoint, "
                        "e.g. 'make export RUN=runs/gpt2-tiny-20261123-101500'")
    path = export(Path(run), Path(args.out or os.environ["OUT"]) if (args.out or os.environ.get("OUT")) else None)
    print(f"Exported {path} (the model's state_dict: torch.load(path, weights_only=True)), with config and "
          f"plan.json beside it")
    return 0


def register(sub) -> None:
    sub.add_parser("train", help="train as configured (GPUS=N: N processes under torchrun; RESUME=0: start "
                   "fresh)").set_defaults(func=cmd_train)
    p = sub.add_parser("export", help="write one model.pt from a run's checkpoint, sharded or not")
    p.add_argument("--run", help="a run directory or checkpoint (env RUN)")
    p.add_argument("--out", help="the directory to write (env OUT; default <run>/export)")
    p.set_defaults(func=cmd_export)
