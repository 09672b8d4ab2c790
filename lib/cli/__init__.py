"""kfit's command line: `kfit <command>`, and every make target is a thin wrapper over a command here.

Settings come from flags or, as make passes them, environment variables (flags.py has the table:
--gpu / GPU=, --free-gb / FREE_GB=, --gpus / GPUS=, ...). KCONFIG_CONFIG (--config) selects the config
file and KCONFIG_SEED (--seed) the randconfig seed, as in the kernel. Installed, this is the `kfit`
command; in a checkout scripts/kfit.py runs it (as make does).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from . import flags
from .common import ensure_config, run_main  # noqa: F401  (ensure_config: re-exported for tests)
from .. import config as kconfig
from ..env import env_choice, env_number
from ..errors import KfitError
from ..redact import shown


# --------------------------------------------------------------------------
# Config targets


def fragment_list(text: str) -> list[str]:
    """FRAGMENTS= as names or paths separated by spaces; a path holding a space is quoted as a shell quotes it
    (FRAGMENTS="'my fragment' fp32")."""
    import shlex

    try:
        return shlex.split(text)
    except ValueError as err:  # an unclosed quote
        raise KfitError(f"FRAGMENTS={text[:200]!r} cannot be split ({err}): close the quote around a path with "
                        "a space, e.g. FRAGMENTS=\"'my fragment' fp32\"") from None


def cmd_defconfig(args) -> int:
    fragments = fragment_list(os.environ.get("FRAGMENTS", ""))
    out = kconfig.config_path()
    notes: list[str] = []
    kconfig.make_defconfig(args.name, fragments, out, notes)
    for note in notes:
        print(f"note: {note}")
    merged = f" + {', '.join(fragments)}" if fragments else ""
    print(f"# configuration written to {shown(out)} (defconfig {args.name}{merged})")
    return 0


def cmd_olddefconfig(args) -> int:
    path = kconfig.config_path()
    kconfig.olddefconfig(path)
    print(f"# configuration written to {shown(path)}")
    return 0


def cmd_savedefconfig(args) -> int:
    out = kconfig.savedefconfig(kconfig.config_path(), Path(args.output))
    print(f"# minimal configuration written to {shown(out)}")
    return 0


def cmd_listnewconfig(args) -> int:
    for line in kconfig.listnewconfig(kconfig.config_path()):
        print(line)
    return 0


def cmd_genoptions(args) -> int:
    """Write lib/config/options.pyi from the Kconfig tree (as the kernel writes autoconf.h)."""
    from .. import fileio
    from ..config.kconfig import new_kconfig
    from ..config.options import fields, stub

    path = Path(__file__).resolve().parent.parent / "config" / "options.pyi"
    text = stub(new_kconfig())
    if path.is_file() and path.read_text() == text:
        print(f"{path}: up to date")
        return 0
    fileio.write_text(path, text)
    print(f"wrote {path}: {sum(1 for _ in fields(new_kconfig()))} options")
    return 0


def _menu(copy: Path) -> None:
    """kconfiglib's curses menu on `copy`: it loads and saves the file KCONFIG_CONFIG names."""
    import menuconfig

    from ..config.kconfig import new_kconfig

    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # curses would fail with a traceback
        raise KfitError("menuconfig needs a terminal: run it in one, or use 'make oldconfig', a fragment "
                        "('make <fragment>.config') or an editor on the config file")
    previous = os.environ.get("KCONFIG_CONFIG")
    os.environ["KCONFIG_CONFIG"] = str(copy)
    try:
        menuconfig.menuconfig(new_kconfig())  # the tree with the families kept in one file
    finally:
        if previous is None:
            del os.environ["KCONFIG_CONFIG"]
        else:
            os.environ["KCONFIG_CONFIG"] = previous


def cmd_menuconfig(args) -> int:
    # The menu edits a copy (it may hold invalid values: the menu is how to fix them); the config is
    # replaced only by a result the strict reader accepts.
    path = kconfig.config_path()
    notes: list[str] = []
    config = kconfig.edit_config(path, _menu, notes)
    for note in notes:
        print(f"note: {note}")
    print(f"# configuration written to {shown(path)}" if config else f"# {shown(path)} unchanged")
    return 0


def cmd_oldconfig(args) -> int:
    path = kconfig.config_path()
    if sys.stdin.isatty():
        import oldconfig as prompts  # kconfiglib's oldconfig questions

        kconfig.oldconfig(path, ask=prompts.oldconfig)
    else:
        print("note: stdin is not a terminal, so nothing is asked: new symbols take their defaults "
              "(as 'make olddefconfig')")
        kconfig.olddefconfig(path)
    print(f"# configuration written to {shown(path)}")
    return 0


def cmd_allconfig(args) -> int:
    """alldefconfig, allnoconfig, allyesconfig."""
    path = kconfig.config_path()
    getattr(kconfig, args.command)(path)
    print(f"# configuration written to {shown(path)} ({args.command})")
    return 0


def cmd_randconfig(args) -> int:
    seed = kconfig.randconfig_seed(os.environ.get("KCONFIG_SEED"))
    print(f"KCONFIG_SEED=0x{seed:X}", file=sys.stderr)  # as the kernel prints it: rerun with it to reproduce
    path = kconfig.config_path()
    kconfig.randconfig(seed, path)
    print(f"# configuration written to {shown(path)} (randconfig)")
    return 0


def cmd_mergeconfig(args) -> int:
    path = kconfig.config_path()
    notes: list[str] = []
    kconfig.merge_fragment(args.fragment, path, notes)
    for note in notes:
        print(f"note: {note}")
    print(f"# configuration written to {shown(path)} (merged fragment {args.fragment})")
    return 0


def cmd_config_set(args) -> int:
    """Write NAME=VALUE assignments into the config, as the kernel's scripts/config --set-val does, but checked as
    strictly as a fragment: a value that does not take is one error naming it, and the config is left as it was."""
    import json

    pairs = json.loads(os.environ.get(flags.SET_VARIABLE) or "[]")  # make's SET= and NAME=value, --set
    pairs += [flags.set_option(text) for text in args.assignments]
    if not pairs:
        raise KfitError("config-set: nothing to set: give NAME=VALUE pairs ('make config-set SET=\"EPOCHS=3 "
                        "LEARNING_RATE=0.01\"' or 'kfit config-set EPOCHS=3 LEARNING_RATE=0.01')")
    changes = dict(pairs)  # a symbol given twice: the last wins, as in make
    path = kconfig.config_path()
    asked = " ".join(f"CONFIG_{name}={value}" for name, value in changes.items())
    notes: list[str] = []
    try:
        written = kconfig.apply_assignments(path, changes, notes)
    except KfitError as err:
        reason = " ".join(str(err).replace("invalid configuration:", "").replace("requested change: ", "").split())
        raise KfitError(f"config-set {reason}; {path} is unchanged (asked: {asked})") from None
    for note in notes:
        print(f"note: {note}")
    lines = dict(line.split("=", 1) for line in written.text.splitlines() if line.startswith("CONFIG_"))
    now = ", ".join(f"CONFIG_{name}={lines.get('CONFIG_' + name, 'n')}" for name in changes)  # n: '# ... is not set'
    print(f"# {now} written to {shown(path)} (previous in {shown(path)}.old)")
    return 0


def cmd_defconfigs(args) -> int:
    """Names for the Makefile's help and pattern rules."""
    names = kconfig.fragment_names() if args.fragments else kconfig.defconfig_names()
    print(" ".join(names))
    return 0


# --------------------------------------------------------------------------
# The parser

# Each area registers its own commands (plan, train, tuning, ...), in this order in --help.
AREAS = ("plan", "train", "tune", "recommend", "data", "sbatch", "randcheck")


def version_lines() -> list[str]:
    """kfit --version: kfit (and the checkout's commit), Python, torch with its CUDA or ROCm build, and the
    device torch sees, as `python -m torch.utils.collect_env` names them."""
    import platform
    import subprocess

    from .. import __version__
    from ..resources import CHECKOUT

    lines = [f"kfit {__version__}"]
    if CHECKOUT:
        try:
            commit = subprocess.run(["git", "-C", str(CHECKOUT), "describe", "--always", "--dirty"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
        lines[0] += f" (checkout {CHECKOUT}{f', {commit}' if commit else ''})"
    lines.append(f"Python {platform.python_version()} ({sys.executable})")
    from ..hardware import detect

    hw = detect()
    build = f"CUDA {hw.cuda_version}" if hw.cuda_version else f"ROCm {hw.hip_version}" if hw.hip_version else "CPU build"
    lines.append(f"torch {hw.torch_version} ({build})")
    names = [g.name for g in hw.gpus]
    lines.append(f"device: {len(names)} x {names[0]}" if names and len(set(names)) == 1 else
                 f"devices: {', '.join(names)}" if names else f"device: CPU, {hw.cpu.name}")
    return lines


class VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print("\n".join(version_lines()))
        parser.exit()


class Parser(argparse.ArgumentParser):
    """argparse's parser with kfit's one error line: `error: <what>: 'kfit <command> --help' lists ...` and
    exit status 2, instead of a usage block and a second line (every subcommand's parser is one too)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        from ..redact import shown

        print(f"error: {shown(message, 300)}: '{self.prog} --help' lists the commands and flags", file=sys.stderr)
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    import importlib

    top = Parser(prog="kfit", description=__doc__.splitlines()[0], epilog=flags.EXIT_CODES)
    top.add_argument("--version", action=VersionAction,
                     help="print kfit's, Python's and torch's versions and this machine's device, then exit")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = flags.command(sub, "defconfig", "write the config from defconfigs/NAME (+ fragments)", "FRAGMENTS",
                      func=cmd_defconfig)
    p.add_argument("name", help="a name from defconfigs/ ('kfit list'), or a path to a defconfig file")
    flags.command(sub, "olddefconfig", "validate the config, fill in new symbols with defaults",
                  func=cmd_olddefconfig)
    p = flags.command(sub, "savedefconfig", "write the minimal config to ./defconfig", func=cmd_savedefconfig)
    p.add_argument("--output", default="defconfig", metavar="FILE", help="where to write it (default ./defconfig)")
    flags.command(sub, "listnewconfig", "list symbols the config does not set", func=cmd_listnewconfig)
    flags.command(sub, "genoptions", "write lib/config/options.pyi, the typed stub of every Kconfig option, from "
                  "the Kconfig tree", func=cmd_genoptions)
    flags.command(sub, "menuconfig", "edit the config in a terminal menu; kept only if valid", func=cmd_menuconfig)
    flags.command(sub, "oldconfig", "ask for the symbols the config does not set", func=cmd_oldconfig)
    for name, what in (("alldefconfig", "every symbol at its default"), ("allnoconfig", "as many n as allowed"),
                       ("allyesconfig", "as many y as allowed")):
        flags.command(sub, name, f"write the config: {what}", func=cmd_allconfig)
    flags.command(sub, "randconfig", "write a random valid config", "KCONFIG_SEED", func=cmd_randconfig)
    p = flags.command(sub, "mergeconfig", "merge a fragment onto the config (make <fragment>.config)",
                      func=cmd_mergeconfig)
    p.add_argument("fragment", help="a name from defconfigs/fragments/, or a path")
    p = flags.command(sub, "config-set", "write NAME=VALUE settings into the config, each checked as in a fragment",
                      func=cmd_config_set)
    p.add_argument("assignments", nargs="*", metavar="NAME=VALUE",
                   help="a Kconfig symbol (CONFIG_ optional) and its value, or a choice as PRECISION=BF16")
    p = flags.command(sub, "list", "list the defconfig (or fragment) names", func=cmd_defconfigs)
    p.add_argument("--fragments", action="store_true", help="list the fragments instead")
    for area in AREAS:
        importlib.import_module(f".{area}", __package__).register(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `make plan | head` ends quietly, like other CLIs
    args = parser().parse_args(argv)

    def run() -> int:
        with flags.applied(args) as given:
            try:
                if getattr(args, "format", "") is None:
                    args.format = env_choice("FORMAT", ("text", "json"), "text")
                # read by OpenMP at torch's first parallel region: bounded before any work (units.MAXIMA)
                env_number("OMP_NUM_THREADS", int, None, minimum=0)
                return args.func(args)
            except KfitError as err:
                raise flags.name_flag(err, given) from None

    try:
        return run_main(run)
    except ModuleNotFoundError as err:  # an environment whose packages were removed: one line, not a traceback
        from ..resources import CHECKOUT

        fix = ("run 'make env', or remove the environment ('rm -rf .venv') and run make again" if CHECKOUT else
               "install kfit again ('pip install --force-reinstall kfit')")
        print(f"error: the package {err.name!r} kfit needs is missing from {sys.executable}'s environment: {fix}",
              file=sys.stderr)
        return 2
