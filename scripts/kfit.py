#!/usr/bin/env python3
"""kfit's command line: every make target is a thin wrapper over a subcommand here.

Machine selection for plan/check-hardware comes from the environment, as make
passes it: HW=profile.json, or GPU=<catalog key> with FREE_GB=, GPUS=; and
WORLD_SIZE= for the number of training processes. KCONFIG_CONFIG selects the
config file and KCONFIG_SEED the randconfig seed, as in the kernel.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lib import config as kconfig  # noqa: E402
from kfit_env import ensure_config, run_main  # noqa: E402,F401  (ensure_config: re-exported for tests)
from lib.env import env_choice  # noqa: E402
from lib.errors import KfitError  # noqa: E402


# --------------------------------------------------------------------------
# Config targets


def cmd_defconfig(args) -> int:
    fragments = args.fragments.split() if args.fragments else []
    out = kconfig.config_path()
    notes: list[str] = []
    kconfig.make_defconfig(args.name, fragments, out, notes)
    for note in notes:
        print(f"note: {note}")
    merged = f" + {', '.join(fragments)}" if fragments else ""
    print(f"# configuration written to {out} (defconfig {args.name}{merged})")
    return 0


def cmd_olddefconfig(args) -> int:
    path = kconfig.config_path()
    kconfig.olddefconfig(path)
    print(f"# configuration written to {path}")
    return 0


def cmd_savedefconfig(args) -> int:
    out = kconfig.savedefconfig(kconfig.config_path(), Path(args.output))
    print(f"# minimal configuration written to {out}")
    return 0


def cmd_listnewconfig(args) -> int:
    for line in kconfig.listnewconfig(kconfig.config_path()):
        print(line)
    return 0


def _menu(copy: Path) -> None:
    """kconfiglib's curses menu on `copy`: it loads and saves the file KCONFIG_CONFIG names."""
    import kconfiglib
    import menuconfig

    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # curses would fail with a traceback
        raise KfitError("menuconfig needs a terminal: run it in one, or use 'make oldconfig', a fragment "
                        "('make <fragment>.config') or an editor on the config file")
    previous = os.environ.get("KCONFIG_CONFIG")
    os.environ["KCONFIG_CONFIG"] = str(copy)
    try:
        menuconfig.menuconfig(kconfiglib.Kconfig(str(kconfig.KCONFIG)))
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
    print(f"# configuration written to {path}" if config else f"# {path} unchanged")
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
    print(f"# configuration written to {path}")
    return 0


def cmd_allconfig(args) -> int:
    """alldefconfig, allnoconfig, allyesconfig."""
    path = kconfig.config_path()
    getattr(kconfig, args.command)(path)
    print(f"# configuration written to {path} ({args.command})")
    return 0


def cmd_randconfig(args) -> int:
    seed = kconfig.randconfig_seed(os.environ.get("KCONFIG_SEED"))
    print(f"KCONFIG_SEED=0x{seed:X}", file=sys.stderr)  # as the kernel prints it: rerun with it to reproduce
    path = kconfig.config_path()
    kconfig.randconfig(seed, path)
    print(f"# configuration written to {path} (randconfig)")
    return 0


def cmd_mergeconfig(args) -> int:
    path = kconfig.config_path()
    notes: list[str] = []
    kconfig.merge_fragment(args.fragment, path, notes)
    for note in notes:
        print(f"note: {note}")
    print(f"# configuration written to {path} (merged fragment {args.fragment})")
    return 0


def cmd_defconfigs(args) -> int:
    """Names for the Makefile's help and pattern rules."""
    names = kconfig.fragment_names() if args.fragments else kconfig.defconfig_names()
    print(" ".join(names))
    return 0


# --------------------------------------------------------------------------
# Plan, hardware, train


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `make plan | head` ends quietly, like other CLIs
    parser = argparse.ArgumentParser(prog="kfit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("defconfig", help="write .config from defconfigs/NAME (+ fragments)")
    p.add_argument("name")
    p.add_argument("--fragments", default=os.environ.get("FRAGMENTS", ""),
                   help="space-separated fragment names from defconfigs/fragments/ (or paths)")
    p.set_defaults(func=cmd_defconfig)
    sub.add_parser("olddefconfig", help="validate .config, fill in new symbols").set_defaults(func=cmd_olddefconfig)
    p = sub.add_parser("savedefconfig", help="write the minimal config to ./defconfig")
    p.add_argument("--output", default="defconfig")
    p.set_defaults(func=cmd_savedefconfig)
    sub.add_parser("listnewconfig", help="list symbols .config does not set").set_defaults(func=cmd_listnewconfig)
    sub.add_parser("menuconfig", help="edit .config in a terminal UI").set_defaults(func=cmd_menuconfig)
    sub.add_parser("oldconfig", help="ask for the symbols .config does not set").set_defaults(func=cmd_oldconfig)
    for name, what in (("alldefconfig", "every symbol at its default"), ("allnoconfig", "as many n as allowed"),
                       ("allyesconfig", "as many y as allowed")):
        sub.add_parser(name, help=f"write .config: {what}").set_defaults(func=cmd_allconfig)
    sub.add_parser("randconfig", help="write a random .config (KCONFIG_SEED=)").set_defaults(func=cmd_randconfig)
    p = sub.add_parser("mergeconfig", help="merge a fragment onto .config (make <fragment>.config)")
    p.add_argument("fragment", help="a name from defconfigs/fragments/, or a path")
    p.set_defaults(func=cmd_mergeconfig)
    p = sub.add_parser("list", help="list defconfig (or fragment) names")
    p.add_argument("--fragments", action="store_true")
    p.set_defaults(func=cmd_defconfigs)
    # Each area registers its own subcommands from scripts/cli_<area>.py (plan, train, tuning, ...).
    for path in sorted(Path(__file__).parent.glob("cli_*.py")):
        importlib.import_module(path.stem).register(sub)
    args = parser.parse_args(argv)

    def run() -> int:
        if getattr(args, "format", "") is None:
            args.format = env_choice("FORMAT", ("text", "json"), "text")
        return args.func(args)

    return run_main(run)


if __name__ == "__main__":
    sys.exit(main())
