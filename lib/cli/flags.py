"""Command-line flags for the variables make passes (GPU=, FREE_GB=, GPUS=, ...): one table, every flag
named after its variable in --help.

A flag given on the command line is put into os.environ under its variable before the command runs, so
lib/env.py stays the one parser of every value (and its errors the one wording), a flag wins over the
variable, and processes kfit starts (torchrun's ranks, the sharded tracer) see it as make's variable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

from ..errors import KfitError


@dataclass(frozen=True)
class Flag:
    option: str
    metavar: str | None  # None: a switch (--x sets 1, --no-x sets 0)
    help: str


FLAGS: dict[str, Flag] = {
    # the config file, for every command
    "KCONFIG_CONFIG": Flag("--config", "FILE", "the config file to read and write (default .config)"),
    # config targets
    "FRAGMENTS": Flag("--fragments", "'A B'", "fragments from defconfigs/fragments/ (or paths) merged on top"),
    "KCONFIG_SEED": Flag("--seed", "N", "randconfig's seed, to repeat a random config (default: a new one)"),
    # the machine to plan for, and the processes
    "HW": Flag("--hw", "FILE", "plan for the machine described in this hardware profile JSON"),
    "GPU": Flag("--gpu", "KEY", "catalog GPU to plan for (e.g. h100, a100-40gb; cpu for no GPU)"),
    "FREE_GB": Flag("--free-gb", "GB", "free memory of each (simulated) GPU, in GiB"),
    "GPUS": Flag("--gpus", "N", "training processes (with --gpu: also that machine's GPU count)"),
    "WORLD_SIZE": Flag("--world-size", "N", "plan for N training processes in all"),
    "NNODES": Flag("--nnodes", "N", "machines taking part (MIN:MAX for an elastic job)"),
    "NODE_RANK": Flag("--node-rank", "I", "this machine's rank, 0..NNODES-1"),
    "MASTER_ADDR": Flag("--master-addr", "HOST", "the rendezvous host (the NODE_RANK=0 machine)"),
    "MASTER_PORT": Flag("--master-port", "PORT", "the rendezvous port (default 29500)"),
    "FORMAT": Flag("--format", "{text,json}", "output format (default text)"),
    "OUT": Flag("--out", "PATH", "where to write the output"),
    # training and its outputs
    "RESUME": Flag("--resume", None, "--resume continues the latest matching unfinished run even when "
                   "CONFIG_RESUME=n; --no-resume starts fresh"),
    "RESUME_FROM": Flag("--resume-from", "PATH", "continue this run directory (its newest readable checkpoint) "
                        "or checkpoint, instead of the search for a matching unfinished run"),
    "INIT_FROM": Flag("--init-from", "PATH", "start a new run from the weights of this run directory, checkpoint "
                      "or model.safetensors (fine-tuning)"),
    "RUN": Flag("--run", "DIR", "a run directory or checkpoint"),
    "PROMPT": Flag("--prompt", "TEXT", "the text the model continues"),
    "MAX_TOKENS": Flag("--max-tokens", "N", "tokens to generate (default 200)"),
    "TEMPERATURE": Flag("--temperature", "T", "sampling temperature, 0 for greedy (default 0.8)"),
    "TOP_K": Flag("--top-k", "K", "sample among the K likeliest tokens, 0 for all (default 200)"),
    "SEED": Flag("--seed", "N", "the sampling seed: the same seed repeats a sample (default 0)"),
    # tuning
    "BATCH": Flag("--batch", "N", "the batch to sweep at (default: the plan's per-device micro-batch)"),
    "RUNS": Flag("--runs", "N", "repeat the sweep N times with different seeds; the median is suggested"),
    "APPLY": Flag("--apply", None, "write the suggestion into the config"),
    "TRIALS": Flag("--trials", "N", "trials to run now (default CONFIG_HPO_TRIALS)"),
    "HPO_STORAGE": Flag("--storage", "URL", "the study's database, a SQLAlchemy URL (default runs/hpo-<study>/study.db)"),
    "HPO_STUDY": Flag("--study", "NAME", "the study's name (default CONFIG_HPO_STUDY_NAME)"),
    "DEFCONFIG": Flag("--defconfig", "NAME", "write a new defconfig of this name (or path) instead of the config"),
    "WRITE": Flag("--write", None, "write each recommendation as a defconfig, recommended-<mode>"),
    # SLURM batch scripts (make sbatch)
    "NODES": Flag("--nodes", "N", "machines the batch job takes (sbatch --nodes)"),
    "CPUS": Flag("--cpus", "N", "CPU cores per node for the job (default: the planned machine's logical cores)"),
    "PARTITION": Flag("--partition", "NAME", "the SLURM partition to submit to"),
    "TIME": Flag("--time", "LIMIT", "the job's time limit, as sbatch --time takes it (e.g. 2:00:00, 1-12)"),
    "ACCOUNT": Flag("--account", "NAME", "the SLURM account to charge"),
    "ARRAY": Flag("--array", "N", "write a job array of N Optuna workers (make hpo) against HPO_STORAGE instead"),
}

# The machine and processes a plan is for, as plan, check-hardware and recommend read them.
MACHINE = ("HW", "GPU", "FREE_GB", "GPUS", "WORLD_SIZE", "NNODES")

EXIT_CODES = """exit status: 0 done; 1 training diverged (the loss became NaN or inf); 2 an error you can fix (one
'error:' line says what); 3 the training device failed (a checkpoint and the resume command are printed); 4
stopped on low battery; 130 / 143 stopped by Ctrl-C / SIGTERM (training saved a checkpoint first: run it
again to resume). Under make, make itself exits 2 for any of them and names kfit's status in its last line,
'make: *** [Makefile:NN: train] Error 1'."""

_DEST = "env_"  # argparse dest prefix: env_GPU holds --gpu's value


def add(parser: argparse.ArgumentParser, *names: str, help: dict[str, str] | None = None) -> None:
    """Add the flags of these variables; `help` rewords a flag for one command."""
    group = parser.add_argument_group("settings (a flag wins over its environment variable, as make passes it)")
    for name in ("KCONFIG_CONFIG", *names):
        flag = FLAGS[name]
        text = f"{(help or {}).get(name, flag.help)} (env {name})"
        if flag.metavar is None:
            group.add_argument(flag.option, dest=_DEST + name, action=argparse.BooleanOptionalAction,
                               default=None, help=text)
        else:
            group.add_argument(flag.option, dest=_DEST + name, metavar=flag.metavar, default=None, help=text)


def command(sub, name: str, text: str, *variables: str, func=None, help: dict[str, str] | None = None):
    """A subcommand whose --help says what it does and lists its flags with their variables."""
    p = sub.add_parser(name, help=text, description=text[:1].upper() + text[1:] + ".", epilog=EXIT_CODES)
    add(p, *variables, help=help)
    if "FORMAT" in variables:
        p.set_defaults(format=None)  # resolved from --format / FORMAT= when the command runs
    if func is not None:
        p.set_defaults(func=func)
    return p


@contextlib.contextmanager
def applied(args: argparse.Namespace) -> Iterator[dict[str, str]]:
    """The flags given, put into os.environ while the command runs (then restored: main() is also called
    in-process, by tests); yields {variable: flag} for naming them in errors."""
    given, saved = {}, {}
    for dest, value in vars(args).items():
        if dest.startswith(_DEST) and value is not None:
            name = dest[len(_DEST):]
            saved[name] = os.environ.get(name)
            os.environ[name] = ("1" if value else "0") if isinstance(value, bool) else value
            given[name] = FLAGS[name].option
    try:
        yield given
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def name_flag(err: KfitError, given: dict[str, str]) -> KfitError:
    """A variable's error ("GPUS='x' is not a number ...") for a value that came from a flag, naming the flag."""
    message = str(err)
    for name, option in given.items():
        if message.startswith(f"{name}="):
            return KfitError(f"{option}: {message}")
    return err
