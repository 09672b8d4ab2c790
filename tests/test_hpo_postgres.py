"""Optuna workers on several machines share one study on PostgreSQL: a local server (scripts/ensure-postgres.sh),
two `make hpo` workers at once against HPO_STORAGE=postgresql+psycopg2://..., and a `make sbatch ARRAY=2` job
array of such workers under the local SLURM (scripts/ensure-slurm.sh). Skipped, with the scripts' reasons,
where PostgreSQL (or SLURM) cannot be started, or psycopg2 is not installed (requirements-test.txt)."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from lib import config as kc

ROOT = Path(__file__).resolve().parent.parent
_CLEARED = ("KCONFIG_CONFIG", "FRAGMENTS", "HW", "GPU", "FREE_GB", "GPUS", "WORLD_SIZE", "RESUME", "NNODES",
            "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NODES", "CPUS", "TIME", "PARTITION", "ACCOUNT", "ARRAY", "OUT",
            "HPO_STORAGE", "HPO_STUDY", "TRIALS", "MAKEFLAGS", "MFLAGS", "GNUMAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES")

pytestmark = pytest.mark.slow


def ensure(script: str) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(["sh", str(ROOT / "scripts" / script)], capture_output=True, text=True, timeout=420)
    except subprocess.TimeoutExpired:
        pytest.skip(f"scripts/{script} did not finish in 420 s")
    if done.returncode != 0:
        pytest.skip((done.stderr.strip().splitlines() or [f"scripts/{script} failed"])[-1])
    return done


@pytest.fixture(scope="module")
def postgres() -> str:
    """The storage URL of the local server."""
    pytest.importorskip("psycopg2", reason="psycopg2-binary (requirements-test.txt) is not installed")
    return ensure("ensure-postgres.sh").stdout.strip().splitlines()[-1]


@pytest.fixture
def hpo_config(tmp_path) -> Path:
    """lenet5 on the CPU, one epoch a trial, its own study name (the database outlives the test)."""
    fragment = tmp_path / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\nCONFIG_HYPER_PARAM_POLICY_TIERS=y\n'
                        'CONFIG_HPO_MIN_RESOURCE=1\nCONFIG_HPO_MAX_RESOURCE=1\nCONFIG_HPO_REDUCTION_FACTOR=4\n'
                        'CONFIG_HPO_PATIENCE=0\nCONFIG_HPO_BATCH_SIZES="32 64 128"\n'
                        f'CONFIG_HPO_STUDY_NAME="pg-{uuid.uuid4().hex[:12]}"\n')
    return kc.make_defconfig("lenet5", [str(fragment)], out=tmp_path / ".config").source


def env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in _CLEARED}, "OMP_NUM_THREADS": "1", **extra}


def check_study(config: Path, url: str, trials: int) -> None:
    """One study holding every trial, complete, each in a trial directory of its own named after it."""
    import optuna

    from lib import hpo

    cfg = kc.read_config(config)
    study = optuna.load_study(study_name=hpo.study_name(cfg), storage=url)
    found = study.get_trials()
    assert sorted(t.number for t in found) == list(range(trials))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in found), [t.user_attrs for t in found]
    dirs = [t.user_attrs["run_dir"] for t in found]
    assert len(set(dirs)) == trials and all(Path(d).name == f"trial-{t.number:04d}" for d, t in zip(dirs, found))
    # every worker wrote under the shared OUTPUT_DIR, in the directory of this (storage, study)
    assert {Path(d).parent for d in dirs} == {hpo.study_dir(cfg, url)}
    assert sorted(p.name for p in hpo.study_dir(cfg, url).glob("trial-*")) == sorted(Path(d).name for d in dirs)


def test_two_make_hpo_workers_share_one_study_on_postgresql(postgres, hpo_config, tmp_path):
    start = time.monotonic()
    workers = [subprocess.Popen(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "hpo"], cwd=tmp_path,
                                env=env(KCONFIG_CONFIG=str(hpo_config), HPO_STORAGE=postgres, TRIALS="2"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n".join(outputs)
    assert all("kfit:***@127.0.0.1" in out and "hpo-test-secret" not in out for out in outputs)  # the password is hidden
    check_study(hpo_config, postgres, trials=4)
    print(f"two workers, 4 trials in {time.monotonic() - start:.0f} s")


def test_a_make_sbatch_job_array_of_hpo_workers_runs_under_slurm(postgres, hpo_config, tmp_path):
    ensure("ensure-slurm.sh")
    start = time.monotonic()
    made = subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "sbatch", "ARRAY=2", "CPUS=1",
                           "TRIALS=1", "TIME=10"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=env(KCONFIG_CONFIG=str(hpo_config), HPO_STORAGE=postgres))
    assert made.returncode == 0, made.stdout + made.stderr
    assert "2 HPO worker(s) (a job array) against postgresql+psycopg2://kfit:***@" in made.stdout
    script = Path(re.search(r"written to (\S+);", made.stdout).group(1))
    assert "#SBATCH --array=0-1" in script.read_text()
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    print(f"SLURM array job {job}")
    deadline = time.monotonic() + 240
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=30).stdout.strip():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], timeout=30)
            pytest.fail(f"array job {job} still queued or running after 240 s")
        time.sleep(1)
    logs = sorted((tmp_path / "runs").glob(f"slurm-*-{job}_*.out"))
    text = "\n".join(p.read_text() for p in logs)
    assert len(logs) == 2 and text.count("step ended with status 0") == 2, text
    check_study(hpo_config, postgres, trials=2)
    print(f"array job {job}: 2 workers done in {time.monotonic() - start:.0f} s")
