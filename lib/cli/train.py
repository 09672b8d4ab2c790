"""The train and export commands: fallback, launch under torchrun, probe, resume, train.

Exit status: 0 done; 1 the loss diverged; 2 an error the user can fix; 3 the training
device failed for good (a checkpoint of the last good step where one could be saved), or another process
of the run (a rank, a machine) stopped;
4 stopped on low battery (CONFIG_BATTERY_STOP); 130 / 143 stopped by SIGINT / SIGTERM
after saving a checkpoint. After 3, 4, 130 and 143, 'make train' resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from .common import ensure_config, hardware_from_env
from .. import config as kconfig
from ..env import env_number, env_text, env_utf8
from ..errors import KfitError
from ..redact import shown, visible_text
from .flags import command
from .invocation import SET_VARIABLE, Invocation
from .slurm import with_slurm

# torch and what needs it are imported by the commands that use them, not with this module: kfit's parser
# imports every command's module, and a config target or a refused variable then starts in about 0.5 s, not 3 s.


def _rank_script() -> Path:
    """What torchrun runs in each rank (`<script> train`): scripts/kfit.py in a checkout, as make runs it, else
    the installed package's __main__.py."""
    from ..resources import CHECKOUT, PACKAGE

    script = CHECKOUT / "scripts" / "kfit.py" if CHECKOUT else None
    return script if script and script.is_file() else PACKAGE / "__main__.py"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def resume_from(config, run: Invocation, log=print):
    """The run to continue, as a function of the plan: RESUME_FROM's run or checkpoint (checked now, before
    any work); none with INIT_FROM (a new run); else the latest unfinished one in OUTPUT_DIR with a matching
    config and effective batch, unless CONFIG_RESUME=n or RESUME=0 (RESUME=1 resumes even when CONFIG_RESUME=n)."""
    from ..api import run_to_resume

    return run_to_resume(config, resume=config.resume if run.resume is None else run.resume,
                         resume_from=run.resume_from, init_from=run.init_from, log=log)


def _oom_relaunch(config, since: float) -> str | None:
    """Why to relaunch a sharded run that failed: it ran out of memory and marked the micro-batch to retry."""
    from ..checkpoint import oom_marker_since

    marker = oom_marker_since(Path(config.output_dir), since)
    if marker is None:
        return None
    return (f"Out of memory at step {marker['step']} under FSDP: relaunching from the last checkpoint at "
            f"micro-batch {marker['micro_batch']} (the same effective batch)")


# The train command's flag that names the launch file a rank of a kfit launch reads (written by _launch)
LAUNCH_FLAG = "--launch"


def _withheld(run: Invocation) -> frozenset[str]:
    """kfit's variables, kept from torchrun's ranks: every variable a flag stands for, make's list of
    command-line assignments, the one-command overrides and each overridden symbol's own variable (make puts
    `make train EPOCHS=2` in the environment as EPOCHS). A rank takes what the launcher decided from the launch
    file, so no setting reaches it twice or by another road."""
    from .flags import FLAGS, MAKE_LIST

    symbols = {form for name, _ in run.overrides for form in (name, f"CONFIG_{name}")}
    return frozenset({*FLAGS, MAKE_LIST, SET_VARIABLE, *symbols})


def _launch(config, hardware, model, plan, run: Invocation, nproc: int, why: str) -> int:
    """Run `plan` in torchrun's processes: the plan, the config it was made from (the command line's overrides
    applied, once, here) and what the ranks take from the command line (resume, init) go to every rank as one
    launch file, named on the ranks' command line; kfit's variables are kept from their environment. So no rank
    resolves the plan, reads .config or parses a variable: every rank trains exactly what this launch said."""
    from .. import distributed
    from ..parallel import is_sharded

    nnodes = run.planned_nodes
    print(f"Launching {nproc} training processes per machine on {nnodes} machine(s) with torchrun ({why}); "
          f"{plan.cpu_threads} CPU thread(s) each")
    # the threads are decided here, before any rank starts: a rank would count its siblings as load
    # a sharded run that ran out of memory is relaunched at half the micro-batch: no rank can redo a step
    relaunch = is_sharded(plan.strategy) and config.oom_recovery
    fd, path = tempfile.mkstemp(prefix="kfit-launch-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump({"plan": plan.to_dict(), "config": config.text, "source": config.source,
                       "invocation": run.for_ranks()}, out)
        env = with_slurm(os.environ)
        return distributed.run_torchrun(
            nproc, _rank_script(), env, threads=plan.cpu_threads, script_args=("train", LAUNCH_FLAG, path),
            withheld=_withheld(run), relaunch=(lambda since: _oom_relaunch(config, since)) if relaunch else None,
            attempts=(config.oom_max_halvings or 0) if relaunch else 0)
    finally:
        os.unlink(path)


def handed_launch(path: str):
    """In a rank: (config, plan) as the launcher handed them (the launch file _launch wrote)."""
    return read_launch(path)[:2]


def read_launch(path: str):
    """In a rank: (config, plan, invocation) from the launch file _launch wrote; its threads are torchrun's."""
    from ..env import env_number
    from ..plan import Plan

    try:
        with open(path) as handed:
            launch = json.load(handed)
        plan = Plan.from_dict(launch["plan"])
        text, source = launch["config"], launch["source"]
        if not isinstance(text, str) or not isinstance(source, str):
            raise ValueError("no config text")
        omp = env_number("OMP_NUM_THREADS", int, None)
        run = Invocation.from_launch(launch.get("invocation") or Invocation().for_ranks(),
                                     omp if omp and omp > 0 else None)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise KfitError(f"{LAUNCH_FLAG} {path}: the launcher's plan cannot be read ({err}); "
                        "start the run with 'make train'") from None
    return kconfig.config_from_text(text, source), plan, run


def _handed_plan(config, hardware, run: Invocation, world_size: int, log, nodes: int = 1, plan=None):
    """In a rank: the launcher's `plan`; resolved here only where there is none (torchrun started by hand) or
    an elastic restart changed the world size (`world_size` processes over the `nodes` machines that joined),
    and then said. A rank that falls back to the CPU cannot train a GPU plan beside GPU ranks: refused."""
    from ..planning import make_plan, received

    if plan is not None:
        if plan.device_type != "cpu" and not hardware.gpus:
            raise KfitError(f"this rank's GPU cannot train (see the warning above), but the run was planned for "
                            f"{plan.device_name}: fix or leave out that GPU (CUDA_VISIBLE_DEVICES) and start again")
        if plan.world_size == world_size:
            return received(config, plan)
        log(f"note: {world_size} processes joined, the launcher planned for {plan.world_size}: re-planning for "
            f"{world_size} (an elastic restart)")
    else:
        log("note: no plan from a kfit launcher (torchrun started by hand?): resolving it in every rank")
    return make_plan(config, hardware, world_size=world_size, nodes=nodes, settings=run.settings)


def extended_run(run: Invocation):
    """EXTEND_EPOCHS= / EXTEND_STEPS=: the finished run (RUN=, else the last run under the config's OUTPUT_DIR)
    made an unfinished run of its extended config, which is returned (lib/extension.py)."""
    from ..extension import extend

    what = "EXTEND_EPOCHS=" if run.extend_epochs else "EXTEND_STEPS="
    clash = [name for name, given in (("RESUME_FROM=", run.resume_from), ("INIT_FROM=", run.init_from),
                                      ("RESUME=0", run.resume is False),
                                      ("EXTEND_STEPS=", run.extend_epochs and run.extend_steps)) if given]
    if clash or run.overrides:
        extra = clash[0] if clash else f"the override {run.overrides[0][0]}={run.overrides[0][1]}"
        raise KfitError(f"{what} continues a finished run with its own config: drop {extra} (to change a setting, "
                        "start a new run from its weights with INIT_FROM=<run>)")
    run_dir = _run("extend", "the finished run to extend", given=run.run,
                   command_line=f"train {what}{run.extend_epochs or run.extend_steps}")
    return extend(run_dir, epochs=run.extend_epochs, steps=run.extend_steps)


# A process of the run stopped under this one: resumable, like a failed device (exit status 3)
PEER_LOST_EXIT = 3


def cmd_train(args) -> int:
    # a rank of a kfit launch: what its launcher decided, from the launch file; else the command's variables,
    # parsed once: each is checked before a config is written or a process launched
    launch = getattr(args, "launch", None)
    handed = read_launch(launch) if launch else None
    run = handed[2] if handed else Invocation.from_environment()
    import torch

    from .. import distributed
    from ..api import train_planned, usable_hardware
    from ..oom import ADVICE, is_oom
    from ..parallel import is_sharded
    from ..planning import make_plan, process_count
    from ..planning.decisions import decide_device
    from ..trainer import TrainingInterrupted

    hardware = hardware_from_env(allow_simulated=False, run=run)
    # a rank of a kfit launch trains the config and plan its launcher handed it, overrides applied there
    if handed and not distributed.under_torchrun():
        raise KfitError(f"{LAUNCH_FLAG} is how a kfit launch hands its plan to torchrun's ranks: train with "
                        "'make train' (GPUS=N launches N processes)")
    config = handed[0] if handed else extended_run(run) if run.extend_epochs or run.extend_steps else \
        ensure_config(run)
    # RESUME_FROM is checked before any process is launched (torchrun's rank 0 checks it again, and resumes)
    pick = resume_from(config, run) if distributed.current().is_main else None
    if not distributed.under_torchrun():
        if run.world_size is not None and run.world_size > 1:
            raise KfitError(f"WORLD_SIZE={run.world_size} is set, but kfit was not started by torchrun: "
                            f"unset it and use 'make train GPUS={run.world_size}', which launches "
                            "torchrun ('make plan WORLD_SIZE=N' shows what N processes would run)")
        distributed.rendezvous_args(with_slurm(os.environ))  # NNODES=, NODE_RANK=, MASTER_*=: before any work
        hardware = usable_hardware(config, hardware, _stderr)
        device_type, _ = decide_device(config, hardware)
        nproc, why = process_count(config, hardware, device_type, run.gpus)
        # the one resolve of this launch: it validates the config (and refuses a world size it cannot take)
        # before any process starts, and every rank trains it
        model, plan = make_plan(config, hardware, **run.plan_args(nproc * run.planned_nodes))
        if nproc > 1 or run.planned_nodes > 1:  # one process on each of several machines is torchrun's too
            return _launch(config, hardware, model, plan, run, nproc, why)
    rank = distributed.current()
    say = print if rank.is_main else (lambda *a, **k: None)
    if distributed.under_torchrun():  # a rank (of one process too: torchrun started by hand, or an elastic one)
        hardware = usable_hardware(config, hardware, _stderr if rank.is_main else (lambda line: None), rank.local_rank)
        model, plan = _handed_plan(config, hardware, run, rank.world_size, say,
                                   nodes=max(1, rank.world_size // max(1, rank.local_world_size)),
                                   plan=handed[1] if handed else None)
    if rank.active:
        rank = distributed.setup(plan.device_type)
        hardware = distributed.hardware_for_rank(hardware, rank)
    try:
        result = train_planned(config, hardware, plan, model, rank=rank, log=say,
                               resume=pick or (lambda plan: None), init_from=run.init_from)
    except TrainingInterrupted as stop:
        return stop.exit_code
    except FloatingPointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if distributed.peer_lost(err):
            print(f"error: rank {rank.rank} lost another training process of the run ({shown(' '.join(str(err).split()), 160)}): "
                  "a machine or a rank stopped; 'make train' on every machine resumes from the last checkpoint",
                  file=sys.stderr)
            return PEER_LOST_EXIT
        if not is_oom(err):
            raise
        what = ("CONFIG_OOM_RECOVERY is off" if not config.oom_recovery else
                "under FSDP no rank can redo a step alone: the launcher relaunches the run at half the micro-batch"
                if is_sharded(plan.strategy) and rank.active else
                "it could not be recovered")
        print(f"error: out of memory ({shown(' '.join(str(err).split()), 200)}); {what}: {ADVICE}", file=sys.stderr)
        return 2
    finally:
        distributed.teardown()
    final = result.final_eval
    if rank.is_main:
        metric = (f"accuracy {final['accuracy']:.2%}" if "accuracy" in final else
                  f"perplexity {final['perplexity']:.2f}" if "perplexity" in final else
                  f"eval loss {final['eval_loss']:.4f}")
        print(f"Done: {result.steps} steps, {result.epochs:.1f} epochs in {result.seconds:.1f}s; {metric}; "
              f"run in {shown(result.run_dir, 1000)}")
    return 0


def _run(command: str, what: str, fits=lambda model: True, kinds: str = "", *, given: str | None = None,
         command_line: str | None = None) -> Path:
    """RUN= (`given`, else the environment's), or the last run under the config's CONFIG_OUTPUT_DIR that fits
    the command (said on stderr)."""
    from ..runs import run_or_last

    path = kconfig.config_path()
    output_dir = Path(kconfig.read_config(path).output_dir if path.is_file() else "runs").expanduser()
    run, last = run_or_last(given or os.environ.get("RUN"), output_dir, command, what, fits, kinds,
                            command_line=command_line)
    if last:
        print(f"{command_line or command}: the last {kinds + ' ' if kinds else ''}run, {shown(run, 1000)} (RUN= names "
              "another)",
              file=sys.stderr)
    return run


def cmd_export(args) -> int:
    run = _run("export", "a run directory (under CONFIG_OUTPUT_DIR) or a checkpoint")
    out = env_text("OUT")
    from ..export import export

    path = export(run, Path(out).expanduser() if out else None)
    print(f"Exported {shown(path)} (the model's state_dict: safetensors.torch.load_file(path)), with config and "
          f"plan.json beside it")
    return 0


def cmd_sample(args) -> int:
    from ..models.registry import MODELS

    families = [name for name, spec in MODELS.items() if spec.text]
    settings = dict(max_tokens=env_number("MAX_TOKENS", int, 200, minimum=1),  # checked before any work
                    temperature=env_number("TEMPERATURE", float, 0.8, minimum=0.0, maximum=100.0),
                    top_k=env_number("TOP_K", int, 200, minimum=0) or None,
                    seed=env_number("SEED", int, 0, minimum=0))
    prompt = env_utf8("PROMPT")  # checked before any work too
    run = _run("sample", "a run directory, a checkpoint or an exported model.safetensors",
               lambda model: model in families, kinds=" or ".join(families))
    from ..sample import sample

    text, about = sample(run, prompt, **settings)
    step = f" at step {about['step']}" if about["step"] is not None else ""
    print(f"# {about.get('model', 'gpt2')} {about['preset']}{step}, {about['tokenizer']}, on {about['device']}", file=sys.stderr)
    print(visible_text(prompt + text))  # a model's output is data: no escape sequence reaches the terminal
    return 0


def cmd_report(args) -> int:
    run = _run("report", "a run directory (under CONFIG_OUTPUT_DIR)")
    out = env_text("OUT")
    from ..run_report import write_report

    path = write_report(run, Path(out).expanduser() if out else None)
    print(f"Wrote {shown(path)}: the run's loss, evaluations, learning rate, throughput, step time and memory against "
          "the plan's predictions, and its events")
    return 0


def register(sub) -> None:
    command(sub, "train", "train as configured (applies the default defconfig if there is no config)", "GPUS",
            "WORLD_SIZE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RESUME", "RESUME_FROM", "INIT_FROM",
            "EXTEND_EPOCHS", "EXTEND_STEPS", "RUN", func=cmd_train,
            help={"GPUS": "training processes on this machine, launched with torchrun (default: one per GPU)",
                  "RUN": "with EXTEND_EPOCHS/EXTEND_STEPS: the finished run to extend (default: the last run)",
                  "WORLD_SIZE": "set by torchrun for each rank; to plan N processes use 'kfit plan --world-size N'"}
            ).add_argument(LAUNCH_FLAG, dest="launch", metavar="FILE", help=argparse.SUPPRESS)  # a rank's launch file
    command(sub, "export", "write one model.safetensors from a run's checkpoint, sharded or not", "RUN", "OUT",
            func=cmd_export, help={"OUT": "the directory to write (default <run>/export)"})
    command(sub, "report", "one HTML page of a run: its curves against the plan's predictions, its events",
            "RUN", "OUT", func=cmd_report,
            help={"RUN": "a run directory (default: the last run under CONFIG_OUTPUT_DIR)",
                  "OUT": "the page to write (default <run>/report.html)"})
    command(sub, "sample", "generate text from a trained language model's run", "RUN", "PROMPT", "MAX_TOKENS",
            "TEMPERATURE", "TOP_K", "SEED", func=cmd_sample,
            help={"RUN": "a run directory, checkpoint or exported model.safetensors (default: the last run of a "
                         "language model under CONFIG_OUTPUT_DIR)"})
