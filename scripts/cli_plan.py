"""Import shim: the plan commands live in lib/cli/plan.py (kfit.cli.plan when installed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.cli.plan import *  # noqa: E402,F401,F403
