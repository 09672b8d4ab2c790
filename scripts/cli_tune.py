"""Import shim: the tune commands live in lib/cli/tune.py (kfit.cli.tune when installed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.cli.tune import *  # noqa: E402,F401,F403
