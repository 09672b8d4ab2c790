#!/usr/bin/env python3
"""kfit's command line run from a checkout, as make runs it: the code is lib/cli/ (installed, the `kfit`
command). `scripts/kfit.py <command> --help` lists the commands and their flags."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.cli import *  # noqa: E402,F401,F403  (main; ensure_config and signal for tests)
from lib.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
