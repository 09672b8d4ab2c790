"""Imported at the start of every Python process whose path has this folder (PYTHONPATH): the CPU ring
attention of tests/cpu_ring.py installed, so that a test's `kfit train` launcher and its torchrun ranks
split attention over a context-parallel group as a GPU's would."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cpu_ring  # noqa: E402

cpu_ring.install()
