"""Planted links and files never redirect kfit's writes (issue 32): each repro gives one KfitError line
naming the file, or a named fallback, and the planted link's target keeps its contents."""

from __future__ import annotations

import io
import os

import pytest
from hypothesis import given, settings, strategies as st

from lib import fileio
from lib.distributed import TorchrunOutput
from lib.errors import KfitError


@pytest.fixture
def outside(tmp_path):
    target = tmp_path / "outside.txt"
    target.write_text("keep me\n")
    return target


def _one_line_naming(err: BaseException, path) -> None:
    message = str(err)
    assert isinstance(err, KfitError) and "\n" not in message and str(path) in message


def test_a_lock_symlink_is_refused_and_its_target_untouched(tmp_path, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / fileio.LOCK_NAME).symlink_to(outside)
    assert fileio.lock_holder(run) is None  # a link holds nothing: the resume search goes on
    with pytest.raises(fileio.UnsafeFileError) as refused:
        fileio.try_lock(run)
    _one_line_naming(refused.value, run / fileio.LOCK_NAME)
    assert "symbolic link" in str(refused.value) and outside.read_text() == "keep me\n"


@pytest.mark.parametrize("planted", ["directory", "fifo", "hard link"])
def test_a_lock_that_is_not_kfits_file_is_refused(tmp_path, outside, planted):
    run = tmp_path / "run"
    run.mkdir()
    lock = run / fileio.LOCK_NAME
    {"directory": lock.mkdir, "fifo": lambda: os.mkfifo(lock), "hard link": lambda: os.link(outside, lock)}[planted]()
    assert fileio.lock_holder(run) is None
    with pytest.raises(fileio.UnsafeFileError) as refused:
        fileio.try_lock(run)
    _one_line_naming(refused.value, lock)
    assert outside.read_text() == "keep me\n"


def test_a_lock_is_taken_and_holds_the_pid(tmp_path):
    lock = fileio.try_lock(tmp_path)
    try:
        assert (tmp_path / fileio.LOCK_NAME).read_text() == f"{os.getpid()}\n"
    finally:
        lock.close()


def test_run_files_are_never_written_through_a_symlink(tmp_path, outside):
    for name in ("hardware.json", "plan.json"):
        link = tmp_path / name
        link.symlink_to(outside)
        with pytest.raises(fileio.UnsafeFileError) as refused:
            fileio.write_json_atomic(link, {"a": 1})
        _one_line_naming(refused.value, link)
        with pytest.raises(KfitError):
            fileio.write_atomic(link, b"x", follow_symlinks=False)
        assert outside.read_text() == "keep me\n" and link.is_symlink()
    assert not list(tmp_path.glob(".*.tmp"))
    fileio.write_json_atomic(tmp_path / "new.json", {"a": 1})  # a plain file is written as before
    assert (tmp_path / "new.json").read_text() == '{\n  "a": 1\n}\n'


def test_configs_are_still_written_through_a_symlink(tmp_path, outside):
    link = tmp_path / ".config"
    link.symlink_to(outside)
    with pytest.raises(fileio.UnsafeFileError):  # by default no write follows a link
        fileio.write_atomic(link, b"CONFIG_X=y\n")
    # the config file the user names may be a link to a kept config (lib/config/kconfig.py write_config)
    fileio.write_atomic(link, b"CONFIG_X=y\n", follow_symlinks=True)
    assert link.is_symlink() and outside.read_text() == "CONFIG_X=y\n"


def test_metrics_are_never_appended_through_a_symlink(tmp_path, outside):
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(outside)
    with pytest.raises(fileio.UnsafeFileError) as refused:
        fileio.open_append(link)
    _one_line_naming(refused.value, link)
    assert outside.read_text() == "keep me\n"
    with fileio.open_append(tmp_path / "plain.jsonl") as f:
        f.write("{}\n")
    with fileio.open_append(tmp_path / "plain.jsonl") as f:
        f.write("{}\n")
    assert (tmp_path / "plain.jsonl").read_text() == "{}\n{}\n"


@pytest.mark.parametrize("planted", ["symlink", "directory", "hard link"])
def test_the_monitor_never_writes_metrics_through_a_planted_file(tmp_path, outside, planted):
    from lib.monitor import Monitor
    from tests.helpers import CPU

    path = tmp_path / "metrics.jsonl"
    {"symlink": lambda: path.symlink_to(outside), "directory": path.mkdir,
     "hard link": lambda: os.link(outside, path)}[planted]()
    for append in (False, True):
        with pytest.raises(fileio.UnsafeFileError) as refused:
            Monitor(tmp_path, 10, "cpu", CPU, enabled=False, append=append, log=lambda line: None)
        _one_line_naming(refused.value, path)
        assert outside.read_text() == "keep me\n"  # not emptied, not appended to


def test_an_owned_append_refuses_a_hard_link(tmp_path, outside):
    os.link(outside, tmp_path / "log")
    with pytest.raises(fileio.UnsafeFileError):
        fileio.open_append(tmp_path / "log", owned=True)
    assert outside.read_text() == "keep me\n"


def test_the_torchrun_log_is_never_appended_through_a_planted_link(tmp_path, outside):
    planted = tmp_path / "kfit-torchrun-1.log"
    planted.symlink_to(outside)
    output = TorchrunOutput(1, io.StringIO())
    output.kept = ["torchrun's report\n"]
    written = output.close(planted)
    assert outside.read_text() == "keep me\n"
    assert written != planted and written.name == planted.name and written.read_text() == "torchrun's report\n"
    assert (written.parent.stat().st_mode & 0o777) == 0o700  # a private mkdtemp directory
    written.unlink()
    written.parent.rmdir()


def test_stale_temporaries_are_swept_and_links_among_them_not_followed(tmp_path, outside):
    old = tmp_path / ".x.json.abc.tmp"
    old.write_text("half")
    os.utime(old, (0, 0))
    fresh = tmp_path / ".y.json.abc.tmp"  # another process may be writing it now
    fresh.write_text("half")
    link = tmp_path / ".z.json.abc.tmp"
    link.symlink_to(outside)
    os.utime(link, (0, 0), follow_symlinks=False)
    assert sorted(fileio.sweep_temporaries(tmp_path)) == sorted([old, link])
    assert fresh.exists() and outside.read_text() == "keep me\n"


def test_a_cache_file_planted_as_a_link_is_read_as_damaged_and_never_written_through(tmp_path, outside, capsys):
    from lib.steptime.cache import read_json, write_json

    fileio.reset_cache_notes()
    link = tmp_path / "cpu-x.json"
    link.symlink_to(outside)
    assert read_json(link) == {}
    write_json(link, {"a": 1})
    err = capsys.readouterr().err
    assert f"note: cache file {link}" in err and "Traceback" not in err
    assert outside.read_text() == "keep me\n"


def test_probe_json_holding_a_list_probes_again_with_a_note(tmp_path, monkeypatch, capsys):
    from lib import probe

    fileio.reset_cache_notes()
    path = tmp_path / "probe.json"
    path.write_text("[]")
    cache = probe.read_cache(path)
    assert cache == {} and probe.cached_result(cache, "k", path) is None
    path.write_text('{"k": [], "j": {"max_micro": "8", "eval_batch": 1}}')
    fileio.reset_cache_notes()
    cache = probe.read_cache(path)
    assert probe.cached_result(cache, "k", path) is None and probe.cached_result(cache, "j", path) is None
    assert f"note: cache file {path}" in capsys.readouterr().err


def test_calibrate_never_fails_a_finished_run(tmp_path, monkeypatch):
    """A damaged calibration.json (an entry without grad_accum, a list) and bad step times: no exception."""
    import json

    from lib import steptime
    from lib.planning import make_plan
    from lib.config import make_defconfig
    from lib.hardware import detect

    fragment = tmp_path / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\n')
    config = make_defconfig("lenet5", [str(fragment)], out=tmp_path / "config")
    hardware = detect()
    plan = make_plan(config, hardware, world_size=1).plan
    cache = tmp_path / "cache"
    (cache / "steptime").mkdir(parents=True)
    (cache / "steptime" / "calibration.json").write_text(json.dumps(
        {"k": [{"micro_batch": 8, "seconds": 0.1, "samples": 8}], "j": "x", "schema": 1}))
    warnings: list[str] = []
    for times in ([], [float("nan")], ["x"], None):
        assert steptime.calibrate(config, hardware, plan, times, cache_dir=cache, warn=warnings.append) is None
    after = steptime.calibrate(config, hardware, plan, [0.01, 0.02], cache_dir=cache, warn=warnings.append)
    assert warnings == [] and after is not None
    stored = json.loads((cache / "steptime" / "calibration.json").read_text())
    assert "k" not in stored and "j" not in stored and stored["schema"] == 1


# -- a run directory being resumed, with links planted in it -------------------------------------------------

RESUMED = ("CONFIG_DEVICE_CPU=y\nCONFIG_EPOCHS=10\nCONFIG_TARGET_EFFECTIVE_BATCH=16\nCONFIG_EVAL_INTERVAL=8\n"
           "CONFIG_CHECKPOINT_INTERVAL_STEPS=y\nCONFIG_CHECKPOINT_EVERY_STEPS=4\n# CONFIG_MONITOR is not set\n"
           "CONFIG_MAX_STEPS=10\n")


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A LeNet-5 run stopped at step 8 (its evaluation raised), as a crash leaves it: copied per test."""
    from lib import config as kc
    from tests.helpers import CPU, write_config
    from lib.hyperparams import ModelDescription, resolve
    from lib.trainer import Trainer

    tmp = tmp_path_factory.mktemp("stopped")
    config = kc.read_config(write_config(tmp, RESUMED + f'CONFIG_OUTPUT_DIR="{tmp}/runs"\nCONFIG_RUN_NAME="run"\n'))

    def stop(step, epoch, result):
        raise Stop

    trainer = Trainer(config, resolve(config, CPU, ModelDescription.from_config(config)), CPU,
                      log=lambda line: None, on_eval=stop)
    with pytest.raises(Stop):
        trainer.fit()
    trainer.directory.release()
    return trainer.run_dir


def _kfit_train(directory, monkeypatch) -> tuple[int, str, str]:
    """`kfit train` in `directory` (its .config), in this process as make runs it: (exit status, stdout, stderr)."""
    import contextlib

    from tests.helpers import kfit_script

    monkeypatch.chdir(directory)
    for key in ("GPUS", "WORLD_SIZE", "RESUME", "RESUME_FROM", "INIT_FROM", "KFIT_INJECT_OOM", "FRAGMENTS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KCONFIG_CONFIG", str(directory / ".config"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = kfit_script().main(["train"])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("planted, named", [
    (("metrics.jsonl",), False), (("hardware.json",), False), ((".lock", "hardware.json", "metrics.jsonl"), True),
    ((".lock", "hardware.json", "metrics.jsonl"), False)],
    ids=["metrics.jsonl", "hardware.json", "all three, RUN_NAME", "all three"])
def test_a_resumed_run_with_links_planted_is_refused_in_one_line_or_left_for_a_new_run(
        stopped_run, tmp_path, monkeypatch, planted, named):
    """Where the resume search takes the run, a planted link is refused in one error line naming it (the run
    files and metrics.jsonl are never written through a link); a planted .lock passes the run by with a note,
    and a run named by RUN_NAME is then refused in one line. Either way every link's target is untouched."""
    import shutil

    from lib import config as kc

    work = tmp_path / "work"
    run_dir = work / "runs" / "run"
    shutil.copytree(stopped_run, run_dir)
    (work / "fragment").write_text(RESUMED + 'CONFIG_OUTPUT_DIR="runs"\n' + ('CONFIG_RUN_NAME="run"\n' if named else ""))
    kc.make_defconfig("lenet5", [str(work / "fragment")], out=work / ".config")
    targets = {}
    for name in planted:
        target = tmp_path / f"outside-{name}"
        target.write_text("keep me\n")
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(target)
        targets[name] = target
    code, out, err = _kfit_train(work, monkeypatch)
    assert "Traceback" not in out + err
    assert all(t.read_text() == "keep me\n" for t in targets.values())
    assert all((run_dir / name).is_symlink() for name in planted)
    if ".lock" in planted and not named:  # passed by: a run of its own
        assert code == 0 and f"note: not resuming runs/run: its .lock is not a regular file" in out, out + err
        assert [d.name for d in (work / "runs").iterdir() if d.name != "run"], "no new run"
        return
    refused = ".lock" if ".lock" in planted else planted[0]
    [line] = err.splitlines()
    assert code == 2 and line.startswith(f"error: runs/run/{refused} is a symbolic link (to {targets[refused]})"), err
    assert "remove it and run again" in line


@settings(max_examples=60, deadline=None)
@given(content=st.binary(max_size=6000) | st.text(max_size=40).map(str.encode) | st.just(b"9" * 5000))
def test_a_held_lock_holding_any_bytes_names_a_pid_or_none(content, tmp_path_factory):
    """The PID read from a held run directory's .lock: '²' (a digit to str.isdigit, not to int) and 5,000
    nines (past int's digit limit) ended in tracebacks (an audit); any bytes read as a PID or as 0."""
    import fcntl

    from lib.fileio import LOCK_NAME, lock_holder

    directory = tmp_path_factory.mktemp("run")
    (directory / LOCK_NAME).write_bytes(content)
    with open(directory / LOCK_NAME, "rb") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        pid = lock_holder(directory)
    assert isinstance(pid, int) and pid >= 0
    assert lock_holder(directory) is None  # released


@settings(max_examples=40, deadline=None)
@given(target=st.text(max_size=30), name=st.text(max_size=10))
def test_a_cache_note_is_one_line_whatever_its_file_and_link_say(target, name, tmp_path_factory):
    """A cache file replaced by a link to '/x<line break>FORGED: ...' made the note's link target a line of its
    own (an audit)."""
    fileio.reset_cache_notes()
    path = tmp_path_factory.mktemp("cache") / f"c{name}.json"
    line = fileio.cache_note(path, f"a symbolic link (to {target})")
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
