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

# The files that take longest, longest first (minutes of a fresh clone's `make check` on 2 cores: real torchrun,
# SLURM and make runs, and the cold fake-tensor traces that fill the shared cache). `make check` and `make test`
# (the quick tier: their tests not marked slow) run each file on
# one xdist worker (--dist loadfile) in collection order (--no-loadscope-reorder): started first, they leave the
# short files to fill the end, instead of one of them starting last and running alone while the other worker idles.
LONGEST_FIRST = (
    "test_fsdp.py", "test_make.py", "test_randcheck.py", "test_distributed.py", "test_recommend.py",
    "test_slurm_scheduler.py",
    "test_hyperparams.py", "test_report.py", "test_memory_replay.py", "test_hpo.py", "test_zoo.py", "test_llama.py",
    "test_validation.py", "test_planner.py", "test_kconfig_targets.py", "test_resume.py", "test_faults.py",
    "test_cli.py", "test_llm_path.py", "test_multinode.py", "test_hpo_postgres.py", "test_llama_fsdp.py", "test_context_parallel.py", "test_layouts.py",
    "test_sharded_memory.py", "test_make_quoting.py", "test_cache_fuzz.py", "test_checkpoint_any_model.py",
    "test_freeze.py", "test_measured_memory.py", "test_trainer.py", "test_export.py", "test_api.py",
    "test_lr_finder.py", "test_checkpoint_validation.py", "test_metrics.py",
)


def pytest_collection_modifyitems(config, items):
    """The files of LONGEST_FIRST first, in its order; the others after them, as collected. A file's tests
    keep their order, and every test stays independent of which file ran before it."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), position[id(item)]))


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


@pytest.fixture
def kfit_here(monkeypatch, capsys):
    """run(cwd, *args, **variables): kfit's command in this process, as `kfit` runs it (its variables as
    environment, every other kfit variable unset, in cwd), as a CompletedProcess. For the commands a test only
    needs the output of (a plan, a config written): no interpreter start and torch import (about 3 s each). A
    test of the process itself (exit status, signals, a traceback kept out) runs scripts/kfit.py instead."""
    from lib.cli import flags, main

    cleared = (*flags.FLAGS, flags.MAKE_LIST, flags.SET_VARIABLE)

    def run(cwd, *args, **env):
        import subprocess

        with monkeypatch.context() as m:
            m.chdir(cwd)
            for name in cleared:
                m.delenv(name, raising=False)
            for name, value in env.items():
                m.setenv(name, value)
            capsys.readouterr()
            code = main(list(args))
            out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["kfit", *args], code, out, err)
    return run
