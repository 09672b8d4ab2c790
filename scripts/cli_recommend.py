"""Import shim: the recommend commands live in lib/cli/recommend.py (kfit.cli.recommend when installed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lib.cli.recommend import *  # noqa: E402,F401,F403
