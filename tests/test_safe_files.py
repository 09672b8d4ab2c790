"""Planted links and files never redirect kfit's writes (issue 32): each repro gives one KfitError line
naming the file, or a named fallback, and the planted link's target keeps its contents."""

from __future__ import annotations

import io
import os

import pytest

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
    fileio.write_atomic(link, b"CONFIG_X=y\n")  # the default: KCONFIG_CONFIG may be a link to a kept config
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
    from lib.api import plan_for
    from lib.config import make_defconfig
    from lib.hardware import detect

    fragment = tmp_path / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\nCONFIG_DEVICE_CPU=y\n')
    config = make_defconfig("lenet5", [str(fragment)], out=tmp_path / "config")
    hardware = detect()
    plan = plan_for(config, hardware, 1)[1]
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
