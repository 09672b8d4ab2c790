"""The fault set (issue 16): two trainings in one directory, a full disk, a kill mid-write, a wrong checkpoint,
an unusable OUTPUT_DIR, atomic writes' permissions. Each test asserts what survives."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
import torch

from lib import checkpoint, fileio, resumable
from lib import config as kc
from lib.errors import KfitError
from lib.hyperparams import ModelDescription, resolve
from lib.monitor import Monitor
from lib.trainer import Trainer
from lib.trainer.resume import checkpoint_problem
from tests.helpers import CPU, KFIT, ROOT, kfit_env, write_config

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one CPU thread

# LeNet at effective batch 16, a checkpoint every 4 steps; stopped at step 10 by `interrupted_run`.
BASE = ("CONFIG_DEVICE_CPU=y\nCONFIG_EPOCHS=10\nCONFIG_TARGET_EFFECTIVE_BATCH=16\nCONFIG_LOG_INTERVAL=1\n"
        "CONFIG_EVAL_INTERVAL=10\nCONFIG_CHECKPOINT_INTERVAL_STEPS=y\nCONFIG_CHECKPOINT_EVERY_STEPS=4\n"
        "CONFIG_CHECKPOINT_KEEP=3\n# CONFIG_MONITOR is not set\n")


def configured(tmp_path: Path, extra: str = "") -> tuple[kc.Config, Path]:
    """The Config and its .config file (for a `kfit.py train` subprocess), runs under tmp_path/runs."""
    path = write_config(tmp_path, BASE + f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\n' + extra)
    return kc.read_config(path), path


def trainer(config, **kwargs) -> Trainer:
    plan = resolve(config, CPU, ModelDescription.from_config(config))
    return Trainer(config, plan, CPU, **{"log": lambda line: None, **kwargs})


class Stop(Exception):
    pass


def interrupted_run(config) -> Path:
    """A run that died at step 10 (its evaluation callback raised), as a crash leaves it: checkpoints 4 and 8."""
    def stop(step, epoch, result):
        raise Stop

    t = trainer(config, on_eval=stop)
    with pytest.raises(Stop):
        t.fit()
    assert [s for s, _ in checkpoint.periodic_checkpoints(t.run_dir)] == [8, 4]
    return t.run_dir


def metrics(run_dir: Path) -> list[dict]:
    """Every line of metrics.jsonl, parsed: a torn line fails here."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def wait_for(condition, timeout: float = 120, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the process ended first:\n{proc.communicate()[0]}")
        time.sleep(0.05)
    pytest.fail("timed out")


# --------------------------------------------------------------------------
# Two trainings in one directory


@pytest.mark.slow
def test_a_second_train_beside_a_live_one_starts_its_own_run(tmp_path):
    config = write_config(tmp_path, BASE + 'CONFIG_OUTPUT_DIR="runs"\nCONFIG_MAX_STEPS=60\n')
    env, runs = kfit_env(config), tmp_path / "runs"
    popen = dict(cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = subprocess.Popen(KFIT + ["train"], **popen)
    second = None
    try:
        live = wait_for(lambda: next((d for d in runs.glob("*") if checkpoint.periodic_checkpoints(d)), None),
                        proc=first)
        first.send_signal(signal.SIGSTOP)  # alive and resumable-looking, for as long as the second needs
        second = subprocess.Popen(KFIT + ["train"], **popen)
        wait_for(lambda: any((d / "metrics.jsonl").is_file() for d in runs.glob("*") if d != live), proc=second)
        first.send_signal(signal.SIGCONT)  # both train at once now
        out2, _ = second.communicate(timeout=300)
        out1, _ = first.communicate(timeout=300)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
    assert first.returncode == 0 and second.returncode == 0, out1 + out2
    assert f"note: not resuming {live.relative_to(tmp_path)}: process {first.pid} is still training it" in out2
    [other] = [d for d in runs.iterdir() if d != live]
    for run_dir in (live, other):  # neither wrote into the other's: every step once, every line whole
        lines = metrics(run_dir)
        assert [line["step"] for line in lines if "loss" in line] == list(range(1, 61))
        assert (run_dir / "checkpoint.pt").is_file()


@pytest.mark.slow
def test_a_named_run_in_use_is_refused_and_left_alone(tmp_path):
    config = write_config(tmp_path, BASE + 'CONFIG_OUTPUT_DIR="runs"\nCONFIG_RUN_NAME="named"\nCONFIG_MAX_STEPS=4\n')
    run_dir = tmp_path / "runs" / "named"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    lock = fileio.try_lock(run_dir)  # as a live `make train` of this run holds it
    before = files(run_dir)
    try:
        refused = subprocess.run(KFIT + ["train"], cwd=tmp_path, env=kfit_env(config), capture_output=True,
                                 text=True, timeout=300)
    finally:
        lock.close()
    [line] = refused.stderr.splitlines()
    assert refused.returncode == 2 and line.startswith("error: runs/named is in use by process "), refused.stderr
    assert f"process {os.getpid()}" in line and f"kill {os.getpid()}" in line and "CONFIG_RUN_NAME" in line
    assert files(run_dir) == before


def test_the_resume_search_passes_over_a_live_run(tmp_path):
    config, _ = configured(tmp_path, "CONFIG_MAX_STEPS=12\n")
    run_dir = interrupted_run(config)
    lock = fileio.try_lock(run_dir)  # as a live `make train` holds it
    before, notes = files(run_dir), []
    try:
        assert resumable.find_resumable(tmp_path / "runs", config.text, 16, log=notes.append) is None
        assert f"process {os.getpid()} is still training it" in notes[-1]
        # picked by a search just before the live process took it: a run of its own, the live one untouched
        t = trainer(config, resume=run_dir, log=notes.append)
        result = t.fit()
        assert result.run_dir != run_dir and t.resumed_from is None and any("has just taken it" in n for n in notes)
        assert files(run_dir) == before
    finally:
        lock.close()
    assert resumable.find_resumable(tmp_path / "runs", config.text, 16) == run_dir


def test_metrics_lines_of_two_writers_never_tear(tmp_path):
    """Two monitors on one metrics.jsonl (what two trainings in one run directory did): every line whole."""
    fresh = Monitor(tmp_path, 10, "cpu", CPU, enabled=False, log=lambda line: None)
    appending = Monitor(tmp_path, 10, "cpu", CPU, enabled=False, log=lambda line: None, append=True)
    for i in range(200):
        for name, m in (("fresh", fresh), ("appending", appending)):
            m.event("test", name, i=i, payload="x" * (i * 50))
    fresh.close()
    appending.close()
    lines = metrics(tmp_path)
    assert sorted((line["message"], line["i"]) for line in lines) == sorted(
        (name, i) for name in ("fresh", "appending") for i in range(200))


# --------------------------------------------------------------------------
# A full disk, a kill mid-write, a wrong checkpoint


@pytest.mark.slow
def test_no_room_while_checkpointing_is_one_error_line_and_the_earlier_checkpoints_survive(tmp_path):
    resource = pytest.importorskip("resource", reason="no RLIMIT_FSIZE here to make writes run out of room")
    config, path = configured(tmp_path, "CONFIG_MAX_STEPS=20\n")
    run_dir = interrupted_run(config)
    earlier = {p.name: p.read_bytes() for _, p in checkpoint.periodic_checkpoints(run_dir)}
    limit = 200_000  # bytes per file: the config, plan and metrics fit, a LeNet checkpoint (~750 kB) does not
    assert all(len(b) > limit for b in earlier.values())

    def small_files():  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    try:
        result = subprocess.run(KFIT + ["train"], cwd=tmp_path, env=kfit_env(path), capture_output=True, text=True,
                                timeout=300, preexec_fn=small_files)
    except (ValueError, OSError) as err:
        pytest.skip(f"cannot limit a child's file size here ({err})")
    assert f"Resuming {run_dir} from step 8" in result.stdout, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert result.returncode == 2 and line.startswith(f"error: no room to write checkpoint-12.pt in {run_dir} ("), line
    assert "MiB needed" in line and "File too large" in line and "raise the file size limit ('ulimit -f')" in line
    assert "newest: checkpoint-8.pt" in line
    assert {p.name: p.read_bytes() for _, p in checkpoint.periodic_checkpoints(run_dir)} == earlier
    assert not list(run_dir.glob("*.tmp"))
    assert [line["step"] for line in metrics(run_dir) if "loss" in line][-1] == 12


def out_of_room_unless(fits):
    """A write_atomic that fails with ENOSPC, as a full disk does, unless `fits(directory)`."""
    write = fileio.write_atomic

    def room(path, data, **options):
        if not fits(Path(path).parent):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(path, data, **options)
    return room


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_out_of_room_the_oldest_checkpoints_go_first_whatever_keep_never_the_newest(tmp_path, monkeypatch, keep):
    config, _ = configured(tmp_path)
    notes = []
    t = trainer(config, log=notes.append)
    t.started = time.perf_counter()  # as fit() sets it: a checkpoint records the time trained
    for step in (4, 8, 12):
        checkpoint.save_checkpoint(checkpoint.periodic_path(t.run_dir, step), {"step": step})
    monkeypatch.setattr(fileio, "write_atomic",
                        out_of_room_unless(lambda d: len(checkpoint.periodic_checkpoints(d)) < 2))
    t.checkpoints.save(checkpoint.periodic_path(t.run_dir, 16), keep=keep)  # 4 and 8 go first, oldest first; 12 stays
    assert [s for s, _ in checkpoint.periodic_checkpoints(t.run_dir)] == [16, 12]
    assert notes == [f"note: little room in {t.run_dir}: removed checkpoint-{s}.pt to write checkpoint-16.pt"
                     for s in (4, 8)]
    monkeypatch.setattr(fileio, "write_atomic", out_of_room_unless(lambda d: False))  # never room
    with pytest.raises(KfitError, match=r"no room to write checkpoint-20.pt in .* \(.* needed, .* free; No space left "
                       r"on device\); the earlier checkpoints are intact \(newest: checkpoint-16.pt\): free space in "
                       r".*, or set CONFIG_OUTPUT_DIR to a disk with room; 'make train' then resumes"):
        t.checkpoints.save(checkpoint.periodic_path(t.run_dir, 20), keep=keep)
    assert [s for s, _ in checkpoint.periodic_checkpoints(t.run_dir)] == [16]  # the newest good one stays
    assert not list(t.run_dir.glob("*.tmp"))
    t.directory.release()


def test_out_of_room_the_final_checkpoint_may_replace_the_newest_periodic_one(tmp_path, monkeypatch):
    config, _ = configured(tmp_path)
    t = trainer(config, log=lambda line: None)
    t.started = time.perf_counter()
    for step in (4, 8):
        checkpoint.save_checkpoint(checkpoint.periodic_path(t.run_dir, step), {"step": step})
    monkeypatch.setattr(fileio, "write_atomic",
                        out_of_room_unless(lambda d: not checkpoint.periodic_checkpoints(d)))
    t.checkpoints.save_final({"eval_loss": 1.0})
    assert checkpoint.finished_checkpoint(t.run_dir) == t.run_dir / checkpoint.FINAL
    assert checkpoint.periodic_checkpoints(t.run_dir) == []
    t.directory.release()


def test_out_of_room_a_periodic_checkpoint_never_deletes_the_only_one(tmp_path, monkeypatch):
    config, _ = configured(tmp_path)
    t = trainer(config, log=lambda line: None)
    t.started = time.perf_counter()
    checkpoint.save_checkpoint(checkpoint.periodic_path(t.run_dir, 4), {"step": 4})
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda d: type("U", (), {"free": 1000})())
    monkeypatch.setattr(fileio, "write_atomic", out_of_room_unless(lambda d: False))
    with pytest.raises(KfitError, match=r"no room to write checkpoint-8.pt .* needed, .* free; .*newest: "
                       r"checkpoint-4.pt\): free at least .* space in "):
        t.checkpoints.save(checkpoint.periodic_path(t.run_dir, 8), keep=1)
    assert [s for s, _ in checkpoint.periodic_checkpoints(t.run_dir)] == [4]
    t.directory.release()


# A training killed with SIGKILL halfway through writing checkpoint-8.pt's bytes.
KILLED_MID_WRITE = r"""
import os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from lib import config as kc
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.trainer import Trainer

marked, mkstemp, fdopen = set(), tempfile.mkstemp, os.fdopen

def marking_mkstemp(*args, **kwargs):
    fd, name = mkstemp(*args, **kwargs)
    if kwargs.get("prefix", "").startswith(".checkpoint-8.pt."):
        marked.add(fd)
    return fd, name

class HalfThenHang:
    def __init__(self, f): self.f = f
    def __enter__(self): return self
    def __exit__(self, *exc): return self.f.__exit__(*exc)
    def __getattr__(self, name): return getattr(self.f, name)
    def write(self, data):
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        print("half written", flush=True)
        time.sleep(600)

tempfile.mkstemp = marking_mkstemp
os.fdopen = lambda fd, *a, **k: HalfThenHang(fdopen(fd, *a, **k)) if fd in marked else fdopen(fd, *a, **k)
config = kc.read_config(sys.argv[2])
cpu = resolve_hardware(gpu="cpu")
Trainer(config, resolve(config, cpu, ModelDescription.from_config(config)), cpu, log=lambda line: None).fit()
"""


@pytest.mark.slow
def test_sigkill_mid_checkpoint_write_resumes_from_the_previous_checkpoint(tmp_path):
    config, path = configured(tmp_path, "CONFIG_MAX_STEPS=12\n")
    child = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(ROOT), str(path)], env=kfit_env(path),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert child.stdout.readline() == "half written\n", child.communicate()[0]
    finally:
        child.kill()
        child.wait()
    [run_dir] = (tmp_path / "runs").iterdir()
    [partial] = run_dir.glob(".checkpoint-8.pt.*.tmp")
    assert [s for s, _ in checkpoint.periodic_checkpoints(run_dir)] == [4]
    assert (run_dir / fileio.LOCK_NAME).read_text() == f"{child.pid}\n"  # a dead process's lock
    steps = [line["step"] for line in metrics(run_dir) if "loss" in line]
    assert steps == list(range(1, 9))

    assert resumable.find_resumable(tmp_path / "runs", config.text, 16) == run_dir
    t = trainer(config, resume=run_dir)
    result = t.fit()
    assert t.resumed_from == checkpoint.periodic_path(run_dir, 4) and result.steps == 12
    assert not partial.exists()  # removed under the taken-over lock
    steps = [line["step"] for line in metrics(run_dir) if "loss" in line]
    assert steps == list(range(1, 9)) + list(range(5, 13))  # steps 5-8 recomputed after the resume


def test_a_checkpoint_with_the_wrong_contents_falls_back_to_the_previous(tmp_path):
    config, _ = configured(tmp_path, "CONFIG_MAX_STEPS=12\n")
    run_dir = interrupted_run(config)
    wrong = checkpoint.periodic_path(run_dir, 8)
    torch.save({}, wrong)  # readable, but not a checkpoint
    notes = []
    t = trainer(config, resume=run_dir, log=notes.append)
    assert t.resumed_from == checkpoint.periodic_path(run_dir, 4)
    assert f"warning: {wrong} is not a usable checkpoint (it lacks model, optimizer, scaler, progress, rng" in notes[0]
    assert t.fit().steps == 12


def test_checkpoint_problem_names_what_is_wrong():
    assert checkpoint_problem([1, 2]) == "it holds a list, not a dict"
    assert "progress" in checkpoint_problem({"model": {}, "optimizer": {}, "scaler": {}, "progress": {"x": 1},
                                             "rng": {"torch": 0, "python": 0}})
    assert checkpoint_problem({"sharded": True, "scaler": {}, "progress": {"window_size": 16, "micro_batch": 16},
                               "rng": {"torch": 0, "python": 0}}) is None


# --------------------------------------------------------------------------
# After the last step: nothing there can lose a finished run


def broken(what: str):
    def fail(*args, **kwargs):
        raise OSError(errno.EIO, f"{what} broke")
    return fail


@pytest.mark.parametrize("part", ["step-time report", "metrics.jsonl's last line", "monitor close", "tracker close"])
def test_bookkeeping_that_fails_after_the_last_step_is_a_warning_and_the_run_is_saved(tmp_path, monkeypatch, part):
    from lib.trainer.timing import StepTimer

    config, _ = configured(tmp_path, "CONFIG_MAX_STEPS=6\n")
    if part == "step-time report":  # a step-time calibration (or its report) that raises
        monkeypatch.setattr(StepTimer, "finish", broken("calibration"))
    elif part == "metrics.jsonl's last line":  # its write fails after the checkpoint (a disk full by then)
        event = Monitor.event
        monkeypatch.setattr(Monitor, "event", lambda self, kind, *a, **k: broken("metrics.jsonl")() if kind ==
                            "finished" else event(self, kind, *a, **k))
    elif part == "monitor close":
        monkeypatch.setattr(Monitor, "close", broken("closing"))
    else:  # an experiment tracker's close (a W&B or MLflow server gone)
        monkeypatch.setattr(Monitor, "start", lambda self: setattr(self, "tracking", type(
            "Tracker", (), {"log": lambda s, r: None, "close": broken("the tracker")})()) or self)
    lines: list[str] = []
    t = trainer(config, log=lines.append)
    result = t.fit()
    assert result.steps == 6 and result.stop_reason == "max_steps" and "eval_loss" in result.final_eval
    assert checkpoint.finished_checkpoint(t.run_dir) == t.run_dir / checkpoint.FINAL
    assert checkpoint.load_checkpoint(t.run_dir / checkpoint.FINAL)["step"] == 6
    [warning] = [line for line in lines if line.startswith("warning:")]
    assert "broke" in warning and "the checkpoints are unaffected" in warning and "\n" not in warning, lines
    assert any(line.startswith(f"Saved {t.run_dir / checkpoint.FINAL}") for line in lines), lines
    assert fileio.lock_holder(t.run_dir) is None  # let go: the next make train may take it


# --------------------------------------------------------------------------
# A sharded checkpoint on a full disk


def failing(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process, as a unit test
def test_no_room_for_a_sharded_checkpoint_is_the_same_one_line_error(tmp_path, monkeypatch):
    """Either writer out of room (torch.distributed.checkpoint's shards, or rank 0's extra.pt): the
    non-sharded path's one error line, the earlier checkpoint intact, no partial directory left."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    tensors = {"model": {"w": torch.ones(4)}}
    earlier = checkpoint.periodic_path(tmp_path, 4, sharded=True)
    checkpoint.save_sharded(earlier, tensors, {"step": 4}, is_main=True, barrier=lambda: None)
    path = checkpoint.periodic_path(tmp_path, 8, sharded=True)
    for writer in ("shards", "extra.pt"):
        with monkeypatch.context() as patch:
            if writer == "shards":  # inside dcp.save, which wraps a rank's failure in a CheckpointException
                patch.setattr(FileSystemWriter, "write_data", failing(errno.ENOSPC))
            else:
                patch.setattr(fileio, "write_atomic", failing(errno.ENOSPC))
            with pytest.raises(KfitError) as refused:
                checkpoint.save_sharded(path, tensors, {"step": 8}, is_main=True, barrier=lambda: None)
        message = str(refused.value)
        assert message.startswith(f"no room to write checkpoint-8.dcp in {tmp_path} ("), (writer, message)
        assert "No space left on device" in message and "\n" not in message
        assert "(newest: checkpoint-4.dcp)" in message and "'make train' then resumes" in message
        assert not path.exists() and not list(tmp_path.glob(".*.tmp")), list(tmp_path.iterdir())
        assert checkpoint.load_checkpoint(earlier)["step"] == 4
    with monkeypatch.context() as patch:  # any other error is not a full disk's
        patch.setattr(fileio, "write_atomic", failing(errno.EACCES))
        with pytest.raises(OSError, match="Permission denied"):
            checkpoint.save_sharded(path, tensors, {"step": 8}, is_main=True, barrier=lambda: None)


# --------------------------------------------------------------------------
# CONFIG_OUTPUT_DIR


@pytest.mark.parametrize("value", ["/dev/null", "/proc/nope"])
def test_an_unusable_output_dir_is_refused_before_any_work(tmp_path, monkeypatch, value):
    if not Path(value).parent.is_dir():
        pytest.skip(f"{Path(value).parent} does not exist here")
    config = dataclasses.replace(configured(tmp_path)[0], output_dir=value)
    monkeypatch.setattr("lib.trainer.loop.load_task", lambda config: pytest.fail("the data was loaded"))
    with pytest.raises(KfitError) as refused:
        trainer(config)
    message = str(refused.value)
    assert message.startswith(f'CONFIG_OUTPUT_DIR="{value}" cannot hold runs (') and "\n" not in message
    assert "set CONFIG_OUTPUT_DIR to a directory you can write" in message
    assert ("is not a directory" if value == "/dev/null" else "cannot create anything in /proc") in message


def test_a_home_relative_output_dir_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    config = dataclasses.replace(configured(tmp_path, "CONFIG_MAX_STEPS=1\n")[0], output_dir="~/x")
    result = trainer(config).fit()
    assert result.run_dir.parent == tmp_path / "home" / "x" and not (tmp_path / "~").exists()


# --------------------------------------------------------------------------
# Atomic writes: permissions and symlinks


@pytest.fixture
def umask_022():
    before = os.umask(0o022)
    yield
    os.umask(before)


def test_atomic_writes_keep_the_mode_or_follow_the_umask(tmp_path, umask_022):
    shared = tmp_path / "shared.json"
    shared.write_text("{}")
    shared.chmod(0o664)
    checkpoint.write_json_atomic(shared, {"a": 1})
    assert shared.stat().st_mode & 0o777 == 0o664 and json.loads(shared.read_text()) == {"a": 1}
    checkpoint.save_checkpoint(tmp_path / "checkpoint.pt", {"step": 1})  # new: 0666 less the umask, not 0600
    assert (tmp_path / "checkpoint.pt").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "shared.json"]


def test_olddefconfig_writes_through_a_symlinked_config_keeping_its_mode(tmp_path, umask_022):
    kept = tmp_path / "configs" / "mine"
    kept.parent.mkdir()
    kept.write_text("CONFIG_EPOCHS=7\n")
    kept.chmod(0o664)
    link = tmp_path / ".config"
    link.symlink_to(kept)
    kc.olddefconfig(link)
    assert link.is_symlink() and link.resolve() == kept and kept.stat().st_mode & 0o777 == 0o664
    assert "CONFIG_EPOCHS=7" in kept.read_text() and "CONFIG_MODEL_" in kept.read_text()
    assert (tmp_path / ".config.old").read_text() == "CONFIG_EPOCHS=7\n"
    assert not list(tmp_path.rglob("*.tmp"))


@settings(max_examples=60, deadline=None)
@given(needed=st.integers(1, 300 << 20), short=st.integers(1, 4 << 20))
def test_a_full_disk_says_how_much_is_needed_and_free_in_figures_that_differ(needed, short, tmp_path_factory):
    """A checkpoint 0.4 MiB over the free space said '1MiB needed, 1MiB free ... free at least 0MiB space' (an
    audit): the shortfall is rounded up to a whole MiB, and a small file's figures keep a decimal."""
    import errno as errnos
    import shutil
    from collections import namedtuple

    free = max(0, needed - short)
    usage = namedtuple("usage", "total used free")(1 << 40, 0, free)
    directory = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(shutil, "disk_usage", lambda path: usage)
        with pytest.raises(KfitError) as refused:
            with checkpoint.full_disk_is_an_error(directory / "checkpoint-1.pt", needed):
                raise OSError(errnos.ENOSPC, "No space left on device")
    message = str(refused.value)
    assert "at least 0MiB" not in message and "at least 0.0MiB" not in message, message
    assert "free at least " in message
