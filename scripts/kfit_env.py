"""Import shim: what every command reads from the environment lives in lib/cli/common.py (kfit.cli.common)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.cli.common import *  # noqa: E402,F401,F403
