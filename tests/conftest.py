"""Shared by every test module: kfit's trace cache goes to .pytest_cache/kfit, never to ~/.cache.

The directory persists between runs (make clean removes it), so the memory
planner's traces are paid once; cache keys include the code they depend on.
Plans in tests must not depend on how busy the machine is: one CPU thread
(OMP_NUM_THREADS, which lib.threads obeys) and no real step timings while
planning (KFIT_STEPTIME_MEASURE=0); the tests of those set them themselves.
"""

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def kfit_cache_dir():
    path = Path(__file__).resolve().parent.parent / ".pytest_cache" / "kfit"
    os.environ["KFIT_CACHE_DIR"] = str(path)  # make subprocesses (tests through make) inherit it too
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["KFIT_STEPTIME_MEASURE"] = "0"
    return path
