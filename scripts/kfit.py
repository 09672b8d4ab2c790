#!/usr/bin/env python3
"""kfit's command line: every make target is a thin wrapper over a subcommand here.

Machine selection for plan/check-hardware comes from the environment, as make
passes it: HW=profile.json, or GPU=<catalog key> with FREE_GB=, GPUS=; and
WORLD_SIZE= for the number of training processes. KCONFIG_CONFIG selects the
config file, as in the kernel.
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
from kfit_env import ensure_config  # noqa: E402,F401  (re-exported for tests)
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


def cmd_menuconfig(args) -> int:
    import menuconfig  # kconfiglib's curses interface

    path = kconfig.config_path()
    if path.exists():
        kconfig.read_config(path)  # refuse to silently "fix" a config whose values do not take
    os.environ["KCONFIG_CONFIG"] = str(path)  # menuconfig loads and saves the file this names
    import kconfiglib

    menuconfig.menuconfig(kconfiglib.Kconfig(str(kconfig.KCONFIG)))
    if path.exists():
        kconfig.read_config(path)
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
    p = sub.add_parser("list", help="list defconfig (or fragment) names")
    p.add_argument("--fragments", action="store_true")
    p.set_defaults(func=cmd_defconfigs)
    # Each area registers its own subcommands from scripts/cli_<area>.py (plan, train, tuning, ...).
    for path in sorted(Path(__file__).parent.glob("cli_*.py")):
        importlib.import_module(path.stem).register(sub)
    args = parser.parse_args(argv)
    try:
        if getattr(args, "format", "") is None:
            args.format = (os.environ.get("FORMAT") or "text").lower()
            if args.format not in ("text", "json"):
                raise KfitError(f"FORMAT={os.environ['FORMAT']!r}: choose text or json")
        return args.func(args)
    except KfitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
