"""Import shim: the train commands live in lib/cli/train.py (kfit.cli.train when installed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.cli.train import *  # noqa: E402,F401,F403
