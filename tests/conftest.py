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


@pytest.fixture
def one_thread():
    """Beside other test processes on few cores, two spinning OpenMP threads made tiny runs up to 30x
    slower (measured); results compared within a test all use the same setting. A module that wants it
    for every test says pytestmark = pytest.mark.usefixtures("one_thread")."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def make_config(tmp_path):
    """build(fragment text, base defconfig) -> a config on the CPU with its runs under tmp_path."""
    from lib import config as kc

    def build(text: str, base: str = "lenet5"):
        n = len(list(tmp_path.glob("fragment*")))
        fragment = tmp_path / f"fragment{n}"
        fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\n' + text)
        return kc.make_defconfig(base, [str(fragment)], out=tmp_path / f"config{n}")
    return build
