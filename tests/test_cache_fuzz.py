"""Nothing in the cache directory can crash planning (issue 32): every file kfit writes there, damaged in
each way in turn (truncated, empty, `[]`, `{}`, wrong types, missing fields, another schema, a directory or
a symlink in its place), gives a plan again, with one note naming the file, never a traceback."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from lib import fileio, probe, steptime
from lib.hardware import detect, details
from lib.plan import ModelDescription
from lib.planning import PlanRequest, Settings
from lib.planning.resolver import resolve_request
from lib.planning.memory_policy import PlannerPolicy

pytestmark = pytest.mark.usefixtures("one_thread")
calibrate_module = importlib.import_module("lib.steptime.calibrate")


def _wrong_types(data):
    """Every leaf replaced by a value of another type: numbers by strings, strings and lists by numbers."""
    if isinstance(data, dict):
        return {k: _wrong_types(v) for k, v in data.items()}
    if isinstance(data, list):
        return 7 if not data else [_wrong_types(v) for v in data]
    if isinstance(data, bool) or isinstance(data, (int, float)):
        return "fast"
    return [1]


def _missing_fields(data):
    """One field fewer at every level of objects (the first, sorted)."""
    if isinstance(data, dict) and data:
        first = sorted(data)[0] if sorted(data)[0] != "schema" or len(data) == 1 else sorted(data)[1]
        return {k: _missing_fields(v) for k, v in data.items() if k != first}
    if isinstance(data, list):
        return [_missing_fields(v) for v in data]
    return data


def _corruptions(text: str):
    data = json.loads(text)
    yield "truncated", text[: len(text) // 2]
    yield "empty", ""
    yield "a list", "[]"
    yield "an empty object", "{}"
    yield "wrong types", json.dumps(_wrong_types(data))
    yield "missing fields", json.dumps(_missing_fields(data))
    yield "another schema", json.dumps({**data, "schema": 999} if isinstance(data, dict) else data)
    yield "not UTF-8", "\udcff"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A real cache: lenet5 planned on this CPU once (timings measured), a calibration and a probe result."""
    from lib import config as kc

    root = tmp_path_factory.mktemp("fuzz")
    fragment = root / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{root}/runs"\nCONFIG_DEVICE_CPU=y\nCONFIG_EPOCHS=1\n')
    config = kc.make_defconfig("lenet5", [str(fragment)], out=root / "config")
    return root / "cache", config, detect()


def _plan(cache_dir: Path, config, hardware, monkeypatch, measure: bool = False):
    monkeypatch.setenv("KFIT_CACHE_DIR", str(cache_dir))
    calibrate_module._COUNTERS.clear()  # as a new process: read the files again
    fileio.reset_cache_notes()
    request = PlanRequest(config, hardware, ModelDescription.from_config(config), world_size=1,
                          settings=Settings(omp_threads=1, measure=measure), policy=PlannerPolicy())
    return resolve_request(request)  # a new policy: a new memory predictor, which reads the files again


def test_every_damaged_cache_file_gives_a_plan_and_a_note_naming_it(cache, monkeypatch, capsys):
    cache_dir, config, hardware = cache
    monkeypatch.setattr(steptime.device, "MEASURE_BUDGET_S", 0.0)  # each damaged CPU file is measured again
    plan = _plan(cache_dir, config, hardware, monkeypatch, measure=True)
    steptime.calibrate(config, hardware, plan, [0.01, 0.011, 0.012])
    monkeypatch.setenv("KFIT_CACHE_DIR", str(cache_dir))
    probe.write_cache(probe.cache_path(), {"abc": {"max_micro": 8, "eval_batch": 16, "trials": [[8, True]]}})
    monkeypatch.setattr(details, "COPY_BYTES", 4096)  # make check-hardware's bandwidth, measured cheaply
    assert details.memory_bandwidth("fuzz cpu") > 0
    files = sorted(p for p in cache_dir.rglob("*.json") if p.is_file())
    names = {p.name.split("-")[0] for p in files}
    assert {"calibration.json", "cpu", "counts", "probe.json", "host"} <= names, names
    capsys.readouterr()
    originals = {p: p.read_text() for p in files}
    for path in files:
        for how, text in _corruptions(originals[path]):
            path.write_bytes(text.encode("utf-8", "surrogateescape"))
            if path.name == "probe.json":  # read when training probes, not when planning
                fileio.reset_cache_notes()
                assert isinstance(probe.read_cache(path), dict)
                probe.cached_result(probe.read_cache(path), "abc", path)
            elif path.name == "host-details.json":  # read by make check-hardware and make recommend
                fileio.reset_cache_notes()
                assert details.memory_bandwidth("fuzz cpu") > 0  # measured again where the entry is gone
            else:
                assert _plan(cache_dir, config, hardware, monkeypatch).micro_batch >= 1, (path, how)
            err = capsys.readouterr().err
            assert "Traceback" not in err, (path, how, err)
            # a calibration, probe or trace file short of entries (not of fields) is still a whole file
            whole = how in ("an empty object", "missing fields") and not path.name.startswith(("cpu", "counts"))
            assert whole or f"note: cache file {path}" in err, (path, how, err)
            path.write_text(originals[path])
        for planted in ("directory", "symlink"):
            path.unlink()
            outside = cache_dir.parent / "outside.txt"
            outside.write_text("keep me")
            path.mkdir() if planted == "directory" else path.symlink_to(outside)
            if path.name == "probe.json":
                fileio.reset_cache_notes()
                assert probe.read_cache(path) == {}
                probe.write_cache(path, {})
            elif path.name == "host-details.json":
                fileio.reset_cache_notes()
                assert details.cached() == {} and details.memory_bandwidth("fuzz cpu") > 0  # never written through
            else:
                assert _plan(cache_dir, config, hardware, monkeypatch).micro_batch >= 1, (path, planted)
            err = capsys.readouterr().err
            assert "Traceback" not in err and f"note: cache file {path}" in err, (path, planted, err)
            assert outside.read_text() == "keep me"
            path.rmdir() if planted == "directory" else path.unlink()
            path.write_text(originals[path])


def test_an_unwritable_cache_directory_plans_probes_and_calibrates(cache, monkeypatch, tmp_path, capsys):
    """As a read-only cache directory (root ignores permission bits, so: a cache directory under a file,
    where every write fails with an OSError)."""
    _, config, hardware = cache
    monkeypatch.setattr(steptime.device, "MEASURE_BUDGET_S", 0.0)  # nothing is cached: measured at each plan
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    unwritable = blocker / "cache"
    plan = _plan(unwritable, config, hardware, monkeypatch)
    assert plan.micro_batch >= 1
    lines: list[str] = []
    probe.write_cache(unwritable / "probe.json", {"k": {"max_micro": 1, "eval_batch": 1}}, log=lines.append)
    [line] = lines
    assert line.startswith("note: probe result not cached in ") and "probe.json" in line
    warnings: list[str] = []
    assert steptime.calibrate(config, hardware, plan, [0.01, 0.02], cache_dir=unwritable, warn=warnings.append) is None
    [warning] = warnings
    assert warning.startswith("warning: step time not calibrated (") and "the run itself is complete" in warning
    monkeypatch.setattr(details, "COPY_BYTES", 4096)
    assert details.memory_bandwidth("unwritable cpu") > 0 and not unwritable.exists()  # measured, not kept
    assert "Traceback" not in capsys.readouterr().err


def test_a_symlink_planted_for_a_trace_cache_file_is_not_written_through(cache, monkeypatch, capsys):
    cache_dir, config, hardware = cache
    _plan(cache_dir, config, hardware, monkeypatch)
    [path, *_] = sorted((cache_dir / "memory").glob("*.json"))
    outside = cache_dir.parent / "outside-trace.txt"
    outside.write_text("keep me")
    path.unlink()
    path.symlink_to(outside)
    try:
        assert _plan(cache_dir, config, hardware, monkeypatch).micro_batch >= 1
        assert outside.read_text() == "keep me"
    finally:
        path.unlink()
