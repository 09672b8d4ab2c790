"""`make sbatch` scripts under a real SLURM scheduler: a local slurmctld and one slurmd on this machine
(scripts/ensure-slurm.sh), a tiny CPU run submitted with sbatch, and the preemption path (the warning signal,
the checkpoint, the requeue, the resumed run). Skipped, with the script's reason, where no cluster can be
started (not root, not Debian, offline)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from lib import config as kc
from lib.cli.sbatch import time_limit_seconds, warning_lead
from lib.errors import KfitError

ROOT = Path(__file__).resolve().parent.parent
ENSURE = ROOT / "scripts" / "ensure-slurm.sh"
# make's and kfit's variables that an enclosing `make test ...` would otherwise carry into the runs
_CLEARED = ("KCONFIG_CONFIG", "FRAGMENTS", "HW", "GPU", "FREE_GB", "GPUS", "WORLD_SIZE", "RESUME", "NNODES",
            "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "RANK", "NODES", "CPUS", "TIME", "PARTITION",
            "ACCOUNT", "ARRAY", "OUT", "HPO_STORAGE", "TRIALS", "MAKEFLAGS", "MFLAGS", "GNUMAKEFLAGS", "MAKELEVEL",
            "MAKEOVERRIDES", "KFIT_STEPTIME_MEASURE")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")



@pytest.fixture(scope="session")
def slurm():
    """The local cluster, started once per session (the script reuses running daemons)."""
    try:
        done = subprocess.run(["sh", str(ENSURE)], capture_output=True, text=True, timeout=420)
    except subprocess.TimeoutExpired:
        pytest.skip("scripts/ensure-slurm.sh did not finish in 420 s")
    if done.returncode != 0:
        pytest.skip((done.stderr.strip().splitlines() or ["scripts/ensure-slurm.sh failed"])[-1])


def make(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    result = subprocess.run(["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), *args], cwd=cwd,
                            env={**full, **env}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


def config(tmp_path: Path, extra: str = "") -> Path:
    fragment = tmp_path / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\n{extra}')
    return kc.make_defconfig("lenet5", ["cpu-smoke", str(fragment)], out=tmp_path / ".config").source


def job(job_id: str) -> dict[str, str]:
    """`scontrol show job`'s fields (JobState, Restarts, Reason, ...), or {} once the job is forgotten."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))


def wait_for(job_id: str, done, what: str, timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = job(job_id)
        if done(fields):
            return fields
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], timeout=30)
    raise AssertionError(f"job {job_id}: no {what} within {timeout:.0f} s; last seen {job(job_id)}")


def submit(tmp_path: Path, nodes: int, gpus: int, extra: str = "") -> tuple[str, Path, str]:
    """(job id, the script's output file, make sbatch's output) for a script written by make sbatch."""
    cfg = config(tmp_path, extra)
    written = make(tmp_path, "sbatch", f"NODES={nodes}", f"GPUS={gpus}", "TIME=10", KCONFIG_CONFIG=str(cfg)).stdout
    script = Path(re.search(r"written to (\S+);", written).group(1))
    text = script.read_text()
    for line in (f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", "#SBATCH --requeue",
                 "#SBATCH --time=10", "#SBATCH --signal=B:USR1@"):
        assert line in text, text
    assert "--gpus-per-node" not in text  # a CPU plan asks the scheduler for no GPUs
    submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    print(f"SLURM job {job_id}")  # the ids for the record (pytest -s)
    return job_id, tmp_path / "runs" / f"slurm-kfit-lenet5-{job_id}.out", written


def run_dir(tmp_path: Path) -> Path:
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and p.name.startswith("lenet5-")]
    assert len(runs) == 1, runs  # a requeued job resumes its run: never a second directory
    return runs[0]


def test_time_limits_read_as_sbatch_reads_them_and_the_warning_leaves_time_to_checkpoint():
    assert [time_limit_seconds(t) for t in ("30", "30:30", "2:00:00", "1-12", "1-12:30", "1-0:0:5")] == \
        [1800, 1830, 7200, 129600, 131400, 86405]
    for bad in ("", "1:2:3:4", "1h", "0:30"):
        with pytest.raises(KfitError, match="TIME="):
            time_limit_seconds(bad)
    assert warning_lead(None, None) == 60 and warning_lead(30.0, None) == 120
    assert warning_lead(30.0, 120) == 60 and warning_lead(1e6, None) == 65535


@pytest.mark.slow
def test_a_make_sbatch_script_runs_to_completion_under_slurm(slurm, tmp_path):
    start = time.monotonic()
    job_id, log, written = submit(tmp_path, nodes=1, gpus=2)
    assert written.startswith("Hyperparams: AUTO mode") and "effective=32" in written  # the plan it was made for
    fields = wait_for(job_id, lambda f: f.get("JobState") in FINAL, "end", 150)
    output = log.read_text()
    assert fields["JobState"] == "COMPLETED", output
    assert "Launching 2 training processes per machine on 1 machine(s)" in output
    assert re.search(r"^Done: 3 steps", output, re.M), output
    assert (run_dir(tmp_path) / "checkpoint.pt").is_file()
    print(f"job {job_id} done in {time.monotonic() - start:.0f} s")


def test_make_sbatch_asks_for_the_cpus_and_memory_sinfo_reports_not_the_catalogs(slurm, tmp_path):
    """Planned for a catalog H100 node (whose catalog host has 192 CPUs), the script still asks for what the
    cluster's nodes have: the local one-node cluster's, as sinfo reports them."""
    reported = subprocess.run(["sinfo", "--noheader", "--format=%c %m"], capture_output=True, text=True,
                              timeout=30).stdout.split()
    cfg = config(tmp_path)
    written = make(tmp_path, "sbatch", "GPU=h100", "GPUS=8", KCONFIG_CONFIG=str(cfg)).stdout
    text = Path(re.search(r"written to (\S+);", written).group(1)).read_text()
    assert f"#SBATCH --cpus-per-task={reported[0]}\n" in text and f"#SBATCH --mem={reported[1]}M\n" in text, text
    assert "# CPUs and memory per task: sinfo, its smallest node" in text
    assert "--cpus-per-task=192" not in text


@pytest.mark.slow
def test_the_warning_signal_checkpoints_requeues_and_the_job_resumes(slurm, tmp_path):
    start = time.monotonic()
    job_id, log, _ = submit(tmp_path, nodes=1, gpus=2, extra=(
        "CONFIG_EPOCHS=100\nCONFIG_MAX_STEPS=1500\nCONFIG_LOG_INTERVAL=500\nCONFIG_CHECKPOINT_INTERVAL_STEPS=y\n"
        "CONFIG_CHECKPOINT_EVERY_STEPS=50\n"))
    deadline = time.monotonic() + 120
    while not list((tmp_path / "runs").glob("lenet5-*/checkpoint-*.pt")):
        assert time.monotonic() < deadline and job(job_id).get("JobState") not in FINAL, log.read_text()
        time.sleep(0.5)
    # what SLURM sends before the time limit (--signal=B:USR1@...), sent now
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True, timeout=30)
    fields = wait_for(job_id, lambda f: f.get("JobState") == "PENDING" and f.get("Restarts", "0") != "0"
                      or f.get("JobState") in FINAL, "requeue", 90)
    assert fields.get("Restarts") == "1", log.read_text()
    # SLURM starts the requeued job again by itself once its old credential has expired (15 s on the test cluster)
    fields = wait_for(job_id, lambda f: f.get("JobState") in FINAL, "end", 150)
    output = log.read_text()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", output
    stopped = re.search(r"^SIGTERM received: checkpoint saved at step (\d+)", output, re.M)
    assert stopped, output
    assert "Exited with exit code 143" in output and f"requeueing job {job_id}" in output
    assert re.search(rf"^Resuming \S+ from step {stopped.group(1)} ", output, re.M), output
    assert re.search(r"^Done: 1500 steps", output, re.M), output
    # both starts planned the same effective batch, and the finished run records it
    assert re.findall(r"effective=(\d+)", output) == ["32", "32"], output
    finished = run_dir(tmp_path)
    assert (finished / "checkpoint.pt").is_file()
    assert json.loads((finished / "plan.json").read_text())["effective_batch"] == 32
    print(f"job {job_id} stopped at step {stopped.group(1)}, resumed and done in {time.monotonic() - start:.0f} s")
