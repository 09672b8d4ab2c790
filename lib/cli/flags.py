"""Command-line flags for the variables make passes (GPU=, FREE_GB=, GPUS=, ...): one table, every flag
named after its variable in --help.

A flag given on the command line is put into os.environ under its variable before the command runs, so
lib/env.py stays the one parser of every value (and its errors the one wording), a flag wins over the
variable, and processes kfit starts (torchrun's ranks, the sharded tracer) see it as make's variable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
from dataclasses import dataclass
from typing import Iterator

from ..env import require_utf8
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
    "EXTEND_EPOCHS": Flag("--extend-epochs", "N", "continue a finished run (RUN=, default the last run) for N more "
                          "epochs, its schedule extended"),
    "EXTEND_STEPS": Flag("--extend-steps", "N", "continue a finished run (RUN=, default the last run) for N more "
                         "optimizer steps, its schedule extended"),
    "PROMPT": Flag("--prompt", "TEXT", "the text the model continues"),
    "MAX_TOKENS": Flag("--max-tokens", "N", "tokens to generate (default 200)"),
    "TEMPERATURE": Flag("--temperature", "T", "sampling temperature, 0 for greedy (default 0.8)"),
    "TOP_K": Flag("--top-k", "K", "sample among the K likeliest tokens, 0 for all (default 200)"),
    "SEED": Flag("--seed", "N", "the sampling seed: the same seed repeats a sample (default 0)"),
    # tuning
    "N": Flag("--draws", "N", "random configs to draw, seeds KCONFIG_SEED, +1, ... (default 50)"),
    "TRAIN": Flag("--train", "K", "how many of the plannable draws to train, with one and two processes (default 10)"),
    "BATCH": Flag("--batch", "N", "the batch to sweep at (default: the plan's per-device micro-batch)"),
    "RUNS": Flag("--runs", "N", "repeat the sweep N times with different seeds; the median is suggested"),
    "APPLY": Flag("--apply", None, "write the suggestion into the config"),
    "TRIALS": Flag("--trials", "N", "trials to run now (default CONFIG_HPO_TRIALS)"),
    "HPO_STORAGE": Flag("--storage", "URL", "the study's database, a SQLAlchemy URL (default runs/hpo-<study>/study.db)"),
    "HPO_STUDY": Flag("--study", "NAME", "the study's name (default CONFIG_HPO_STUDY_NAME)"),
    "DEFCONFIG": Flag("--defconfig", "NAME", "write a new defconfig of this name (or path) instead of the config"),
    "WRITE": Flag("--write", None, "write each recommendation as a defconfig, recommended-<mode>"),
    # make data
    "CORPUS": Flag("--corpus", "PATH", "a .txt/.jsonl/.parquet file, a directory of them, or a glob "
                   "(default: the standard library's pydoc text)"),
    "TOKENIZER": Flag("--tokenizer", "FILE", "a Hugging Face tokenizer.json to use instead of training a BPE"),
    "VOCAB": Flag("--vocab", "N", "tokens of the byte-level BPE trained on the corpus (default 4096, at least 257)"),
    # SLURM batch scripts (make sbatch)
    "NODES": Flag("--nodes", "N", "machines the batch job takes (sbatch --nodes)"),
    "CPUS": Flag("--cpus", "N", "CPU cores per node for the job (default: the partition's nodes', from sinfo)"),
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
    if name in OVERRIDABLE:
        p.add_argument("--set", dest="set_overrides", action="append", metavar="NAME=VALUE",
                       help="set a Kconfig symbol in the config (CONFIG_ optional; repeat it), checked as a fragment; "
                       "on make's command line: NAME=VALUE or SET=\"A=1 B=2\"" if name == WRITES_OVERRIDES else
                       "override a Kconfig symbol for this command only (CONFIG_ optional; repeat it), checked "
                       "as a fragment and never written to the config; on make's command line: NAME=VALUE")
    if func is not None:
        p.set_defaults(func=func)
    return p


@contextlib.contextmanager
def applied(args: argparse.Namespace) -> Iterator[dict[str, str]]:
    """The flags given, and make's command-line variables (KFIT_OVERRIDES, each value as typed), put into
    os.environ while the command runs (then restored: main() is also called in-process, by tests); the Kconfig
    overrides among them, with --set's, into KFIT_SET for Invocation.overrides. Yields {variable: flag} for
    naming them in errors."""
    given, values = {}, {}
    for dest, value in vars(args).items():
        if dest.startswith(_DEST) and value is not None:
            name = dest[len(_DEST):]
            values[name] = ("1" if value else "0") if isinstance(value, bool) else value
            given[name] = FLAGS[name].option
    command = getattr(args, "command", "")
    takes = {dest[len(_DEST):] for dest in vars(args) if dest.startswith(_DEST)}
    pairs = make_assignments(os.environ.get(MAKE_LIST, ""))
    variables, overrides = overrides_from_make(pairs, command, takes)
    # make's SET="EPOCHS=1 LEARNING_RATE=0.01": each word one --set, split as a shell would (never run), so
    # SET='HPO_SPACE="LEARNING_RATE=1e-4..1e-2 EPOCHS=1..3" HPO_FOLDS=3' keeps a quoted value with spaces whole
    set_words = [word for name, value in pairs if name == "SET" for word in set_words_of(value)]
    overrides += [set_option(text) for text in (*set_words, *(getattr(args, "set_overrides", None) or ()))]
    for name, value in overrides:
        if "\n" in value or "\r" in value or "\0" in value:
            raise KfitError(f"CONFIG_{name}={value!r}: an override's value cannot hold a line break")
        require_utf8(name, value)  # the run's config is UTF-8 text
    if overrides and command not in OVERRIDABLE:
        shown = " ".join(f"CONFIG_{name}={value}" for name, value in overrides)
        raise KfitError(f"{shown}: '{command}' does not train or plan from the config, so an override would not "
                        f"apply: drop it (overrides work with {', '.join(sorted(OVERRIDABLE))}; a fragment or "
                        "'make menuconfig' changes the config itself)")
    changes = {**{k: v for k, v in variables.items() if k not in given}, **values, MAKE_LIST: None,
               SET_VARIABLE: json.dumps(overrides) if overrides else None}
    saved = {name: os.environ.get(name) for name in changes}
    try:
        for name, value in changes.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield given
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def set_words_of(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError as err:  # an unbalanced quote
        raise KfitError(f"SET={value}: {err}: quote a value with spaces whole, as in SET='NAME=\"a b\"'") from None


def set_option(text: str) -> tuple[str, str]:
    """--set NAME=VALUE: NAME a Kconfig symbol (CONFIG_ optional), or a choice as PRECISION=BF16."""
    name, sep, value = text.partition("=")
    if not sep:
        raise KfitError(f"--set {text}: give NAME=VALUE with NAME a Kconfig symbol ('make menuconfig' lists them)")
    symbols = _symbols()
    found = _symbol_assignment(name.strip(), value, symbols)
    if found is None:
        raise not_a_setting(f"--set {text}", name.strip(), value, symbols)
    return found


def not_a_setting(shown: str, name: str, value: str, symbols: dict) -> KfitError:
    """The one refusal of NAME=value that names no kfit variable or Kconfig symbol, however it was given (make's
    command line, SET=, --set): a choice's members where NAME is a choice (PRECISION=FP8), else the symbol it
    probably meant. Nothing runs after it: a mistyped setting never trains the run it did not describe."""
    bare = name.upper().removeprefix("CONFIG_")
    choices = {id(sym.choice): sym.choice for sym in symbols.values()
               if sym.choice is not None and sym.name.startswith(bare + "_")}
    members = next((sorted(m.name[len(bare) + 1:] for m in choice.syms) for choice in choices.values()
                    if all(m.name.startswith(bare + "_") for m in choice.syms)), [])
    if members:
        return KfitError(f"{shown}: {bare} is a choice of {', '.join(members)}, not {value.strip()!r}: "
                         f"give one of them, as in {bare}={members[0]}")
    meant = _near_miss(name.upper(), symbols, strict=False)[1]
    hint = f"did you mean CONFIG_{meant}?" if meant else "'make menuconfig' lists the symbols"
    return KfitError(f"{shown}: {name} is not a kfit variable or Kconfig symbol, so it would do nothing: {hint}")


def name_flag(err: KfitError, given: dict[str, str]) -> KfitError:
    """A variable's error ("GPUS='x' is not a number ...") for a value that came from a flag, naming the flag."""
    message = str(err)
    for name, option in given.items():
        if message.startswith(f"{name}="):
            return KfitError(f"{option}: {message}")
    return err


# --------------------------------------------------------------------------
# make's command line: `make train EPOCHS=2 FRAGMENTS=...` reaches kfit as one variable, KFIT_OVERRIDES (make's
# own escaped list of its command-line variables, $(MAKEOVERRIDES)), so no value passes through a shell. Each
# value is used exactly as typed (make expands nothing in it); a NAME that is a Kconfig symbol is a one-run
# override of the config (KFIT_SET, as `kfit <command> --set NAME=value` gives it).

MAKE_LIST = "KFIT_OVERRIDES"  # set by the Makefile: $(MAKEOVERRIDES)
SET_VARIABLE = "KFIT_SET"  # the overrides, as JSON [[name, value], ...], for this command's Invocation (invocation.py)
# Variables of make, the Makefile and the programs it runs other than kfit (install, test, benchmarks, GPU
# validation): never an override, never warned about.
MAKE_VARIABLES = frozenset({
    "V", "PYTHON", "VENV", "PY", "KFIT", "ROOT", "Q", "KFIT_VERBOSE", "PYTEST_JOBS", "PYTEST_ARGS", "PYTEST_ADDOPTS",
    "TORCH_SPEC", "TORCH_VERSION", "TORCH_ROCM_INDEX", "DEVICE", "QUICK", "CHECKS", "STEPS", "REPEATS", "LOAD", "SHELL", "MAKEFLAGS",
    "MAKEFILES", "MFLAGS", "GNUMAKEFLAGS", "MAKELEVEL", "MAKECMDGOALS", "CURDIR", "SUFFIXES", "MAKE", "SET",
    MAKE_LIST, SET_VARIABLE})
# Names of other tools' settings a user may put on make's command line: not a near-miss of a kfit symbol.
FOREIGN = ("KFIT_", "CUDA_", "NCCL_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "HF_", "WANDB_", "MLFLOW_", "XDG_",
           "TORCHELASTIC_", "LD_", "PATH", "HOME", "LANG", "LC_", "TERM", "TMP")
# The commands that read the config through ensure_config / config_to_plan, where an override applies; and
# config-set, which writes the overrides into the config (make config-set SET="A=1 B=2").
WRITES_OVERRIDES = "config-set"
OVERRIDABLE = frozenset({"plan", "train", "find-lr", "hpo", WRITES_OVERRIDES})


def make_assignments(text: str) -> list[tuple[str, str]]:
    """make's escaped list of command-line variables (MAKEFLAGS' form: a space inside a value as '\\ ', a
    backslash as '\\\\', '$' as '$$') back into (name, value) pairs in the order given, each value exactly as
    typed."""
    words, word, i, started = [], [], 0, False
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            word.append(text[i + 1])
            i, started = i + 2, True
            continue
        if ch == "$" and text[i + 1:i + 2] == "$":
            word.append("$")
            i, started = i + 2, True
            continue
        if ch in " \t":
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(ch)
            started = True
        i += 1
    if started:
        words.append("".join(word))
    pairs = []
    for item in reversed(words):  # make lists the last one given first
        name, sep, value = item.partition("=")
        if sep:
            pairs.append((name.rstrip(":+?!"), value))
    return pairs


def _symbols() -> dict[str, object]:
    from ..config.kconfig import new_kconfig

    return {name: sym for name, sym in new_kconfig().syms.items() if sym.nodes}


def _symbol_assignment(name: str, value: str, symbols: dict) -> tuple[str, str] | None:
    """(symbol, value) for NAME=value when NAME names a Kconfig symbol (with or without CONFIG_), or a choice by its
    members' common prefix (PRECISION=BF16 is CONFIG_PRECISION_BF16=y); None when it names none."""
    bare = name.removeprefix("CONFIG_")
    if bare in symbols:
        return bare, value
    member = f"{bare}_{value.strip().upper()}"
    if value.strip() and member in symbols and symbols[member].choice is not None:
        return member, "y"
    return None


def _near_miss(name: str, symbols: dict, strict: bool = True) -> tuple[bool, str | None]:
    """(whether NAME=value looks like a kfit setting, the Kconfig symbol it probably meant or None); `strict`:
    another tool's name (FOREIGN) is never one."""
    import difflib

    if strict and (not name.isupper() or (name.startswith(FOREIGN) and not name.startswith("CONFIG_"))):
        return False, None
    bare = name.removeprefix("CONFIG_")
    close = difflib.get_close_matches(bare, list(symbols), n=1, cutoff=0.75)
    if not close and len(bare) >= 4:
        close = sorted((s for s in symbols if bare in s or s in bare), key=lambda s: abs(len(s) - len(bare)))[:1]
    if close:
        return True, close[0]
    return name.startswith("CONFIG_"), None


def overrides_from_make(pairs: list[tuple[str, str]], command: str, takes: set[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Split make's command-line variables: ({kfit variable: literal value}, [(symbol, value) overrides]).
    Any other NAME=value is refused as SET= refuses it (`not_a_setting`), except make's own variables and other
    tools' settings (FOREIGN: they reach the environment, where those tools read them). `takes`: the variables
    this command has flags for (a variable that is also a symbol, such as SEED, is the variable where the
    command takes it, else the symbol)."""
    symbols: dict | None = None
    variables, overrides = {}, []
    for name, value in pairs:
        if name in FLAGS or name in MAKE_VARIABLES:
            if name in FLAGS:
                variables[name] = value
            if name in takes or name not in FLAGS or name in ("KCONFIG_CONFIG",):
                continue
            symbols = symbols if symbols is not None else _symbols()
            if name in symbols and command in OVERRIDABLE:
                raise KfitError(f"{name}={value} is a variable of another target, not an override of CONFIG_{name}: "
                                f"write CONFIG_{name}={value} to override it for this command")
            continue
        if not name.replace("_", "").isalnum():
            continue
        symbols = symbols if symbols is not None else _symbols()
        found = _symbol_assignment(name, value, symbols)
        if found is not None:
            overrides.append(found)
        elif not name.startswith(FOREIGN) or name.startswith("CONFIG_"):
            raise not_a_setting(f"{name}={value}", name, value, symbols)
    return variables, overrides
