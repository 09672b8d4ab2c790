"""HW=profile.json: every number and string a profile gives is bounded where it is read (lib/hardware/strict.py).

A valid profile, written by the code's own writer (HardwareProfile.to_json), has one field at a time replaced by a
generated bad value: an integer of up to 5,000 digits, NaN, +/-Infinity, a negative, a value past its bound, a
string of up to 200,000 characters, a value of the wrong type. load_profile must answer each with one
HardwareError line of bounded length naming the key - never a ValueError or OverflowError traceback, never a
profile that plans with 10**40 bytes of RAM or prints a 200,000-character GPU name. Valid profiles, up to every
bound, still load."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lib import hardware
from lib.errors import HardwareError
from lib.hardware import CPUInfo, HardwareProfile
from lib.hardware.profile import GPUSpeed
from lib.hardware.strict import (MAX_CC_PART, MAX_CORES, MAX_DISK_BYTES, MAX_GPUS, MAX_MEMORY_BYTES, MAX_NAME_CHARS,
                                 MAX_NOTES, MAX_TEXT_CHARS, SPEED_LIMITS)

GiB = 2**30
LONGEST_MESSAGE = 1200  # characters of the one error line
RAW = "\x00raw\x00"  # stands in json.dumps' output for a literal it cannot write (a 5,000-digit integer)


def _valid(vendor: str = "nvidia") -> dict:
    """A profile as its writer writes it: two catalog GPUs with their own speed figures, a measured CPU load."""
    cpu = CPUInfo("Test CPU", 8, 16, 64 * GiB, 60 * GiB, idle_cores=12.5)
    p = hardware.from_catalog("h100" if vendor == "nvidia" else "mi210", cpu=cpu, gpus=2)
    speed = GPUSpeed(fp32_tflops=60.0, half_tflops=900.0, bandwidth_gbs=3000.0, tdp_watts=700.0, tf32_tflops=400.0,
                     link_gbs=450.0, fp8_tflops=1900.0)
    p = dataclasses.replace(p, gpus=tuple(dataclasses.replace(g, speed=speed) for g in p.gpus), notes=("a note",),
                            on_battery=False, cuda_version="12.6", hip_version=None)
    return json.loads(p.to_json())


# Every field a profile gives: (path, kind, bound) - kind "int", "number", "str", "bool"; bound the largest valid
# value (characters for a string); optional fields also take null.
FIELDS = [
    (("disk_free_bytes",), "int", MAX_DISK_BYTES),
    (("on_battery",), "bool", None),
    (("torch_version",), "str", MAX_NAME_CHARS),
    (("cuda_version",), "str", MAX_NAME_CHARS),
    (("hip_version",), "str", MAX_NAME_CHARS),
    (("source",), "str", MAX_TEXT_CHARS),
    (("notes", 0), "str", MAX_TEXT_CHARS),
    (("cpu", "name"), "str", MAX_NAME_CHARS),
    (("cpu", "physical_cores"), "int", MAX_CORES),
    (("cpu", "logical_cores"), "int", MAX_CORES),
    (("cpu", "ram_total_bytes"), "int", MAX_MEMORY_BYTES),
    (("cpu", "ram_available_bytes"), "int", MAX_MEMORY_BYTES),
    (("cpu", "idle_cores"), "number", MAX_CORES),
    (("gpus", 1, "index"), "int", 1),
    (("gpus", 1, "name"), "str", MAX_NAME_CHARS),
    (("gpus", 0, "vendor"), "str", MAX_NAME_CHARS),
    (("gpus", 0, "backend"), "str", MAX_NAME_CHARS),
    (("gpus", 0, "total_bytes"), "int", MAX_MEMORY_BYTES),
    (("gpus", 1, "free_bytes"), "int", MAX_MEMORY_BYTES),
    (("gpus", 0, "compute_capability"), "cc", MAX_CC_PART),
    (("gpus", 0, "arch"), "str", MAX_NAME_CHARS),
    (("gpus", 0, "supports_bf16"), "bool", None),
    (("gpus", 1, "supports_tf32"), "bool", None),
] + [(("gpus", 0, "speed", name), "number", limit) for name, limit in SPEED_LIMITS.items()]
OPTIONAL = {"on_battery", "cuda_version", "hip_version", "idle_cores", "tf32_tflops", "link_gbs", "fp8_tflops"}


def _key(path: tuple) -> str:
    """The key a message names: gpus[1].index, cpu.ram_total_bytes, notes[0]."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


huge_digits = st.integers(4_301, 5_000).map(lambda n: "9" * n) | st.integers(21, 4_300).map(lambda n: "1" + "0" * n)
literals = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
# up to 80,000 characters: as JSON escapes them (12 characters for one beyond the BMP), within the 1 MiB a profile
# file may have (a larger file is refused before its keys are read)
long_text = st.builds(lambda c, n: c * n, st.characters(codec="utf-8"), st.integers(MAX_TEXT_CHARS + 1, 80_000))
wrong_type = st.sampled_from([True, False, [], {}, [1, 2], {"a": 1}, "12", 12, 1.5])


def _bad_values(kind: str, bound, optional: bool, positive: bool = False):
    """Values that must be refused for a field of this kind: a (python value, raw JSON literal or None) pair."""
    raw = (huge_digits | huge_digits.map(lambda d: "-" + d) | literals).map(lambda t: (RAW, t))
    if kind in ("int", "number"):
        values = st.one_of(
            st.integers(max_value=-1) if kind == "int" else st.floats(max_value=-1e-9, allow_infinity=False),
            st.integers(min_value=int(bound) + 1, max_value=10**60),
            st.floats(min_value=float(bound) * 1.001, allow_infinity=False),
            st.text(max_size=30), long_text,
            wrong_type.filter(lambda v: isinstance(v, (bool, list, dict, str))),
            *([st.floats(min_value=0.5, max_value=bound).filter(lambda v: not v.is_integer())] if kind == "int" else []),
            *([st.just(0), st.just(0.0)] if positive else []),  # a speed figure is above 0
        )
    elif kind == "str":
        values = st.one_of(st.text(min_size=bound + 1, max_size=bound + 50), long_text,
                           st.integers(), st.floats(allow_nan=True), wrong_type.filter(lambda v: not isinstance(v, str)))
    elif kind == "cc":
        values = st.one_of(st.tuples(st.integers(MAX_CC_PART + 1, 10**40), st.integers(0, 9)).map(list),
                           st.tuples(st.integers(0, 9), st.integers(max_value=-1)).map(list),
                           st.lists(st.integers(0, 9), min_size=3, max_size=5), st.just([9.0, 0]), st.just(["9", "0"]),
                           long_text, wrong_type.filter(lambda v: v not in ([1, 2],)))
        raw = raw.map(lambda pair: ([RAW, 0], pair[1]))
    else:  # bool
        values = st.one_of(st.integers(), st.text(max_size=10), long_text, st.just([]), st.just({}))
    if not optional and kind != "cc":
        values = values | st.just(None)
    return values.map(lambda v: (v, None)) | raw


def _set(d: dict, path: tuple, value) -> None:
    for part in path[:-1]:
        d = d[part]
    d[path[-1]] = value


def _write(path, d: dict, raw: str | None) -> None:
    text = json.dumps(d)  # NaN and Infinity as JSON's Python dialect writes them
    if raw is not None:
        text = text.replace(json.dumps(RAW), raw)
    path.write_text(text)


@st.composite
def bad_profiles(draw):
    path, kind, bound = draw(st.sampled_from(FIELDS))
    value, raw = draw(_bad_values(kind, bound, path[-1] in OPTIONAL, positive="speed" in path))
    d = _valid()
    _set(d, path, value)
    return path, d, raw


def _one_line_naming(err: HardwareError, key: str) -> str:
    message = str(err)
    assert "\n" not in message and "\r" not in message, message[:300]
    assert len(message) < LONGEST_MESSAGE, (len(message), message[:300])
    assert f"'{key}'" in message, message[:300]
    return message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=bad_profiles())
def test_a_bad_value_in_any_field_is_one_error_line_naming_it(tmp_path, case):
    path, d, raw = case
    hw = tmp_path / "hw.json"
    _write(hw, d, raw)
    with pytest.raises(HardwareError) as err:
        hardware.load_profile(str(hw))
    _one_line_naming(err.value, _key(path))


@pytest.mark.parametrize("path, kind, bound", FIELDS, ids=[_key(f[0]) for f in FIELDS])
def test_every_field_refuses_the_audits_values(tmp_path, path, kind, bound):
    """The audit's cases for each field, without Hypothesis: a 5,000-digit integer (ValueError: Exceeds the limit
    (4300 digits)), NaN, Infinity, 10**40, a negative, a 200,000-character string."""
    hw = tmp_path / "hw.json"
    cases = [(RAW, "9" * 5000), (RAW, "-" + "9" * 5000), (RAW, "NaN"), (RAW, "Infinity"), (RAW, "-Infinity"),
             (10**40, None), (-1, None), ("x" * 200_000, None)]
    if kind == "cc":
        cases = [([RAW, 0], "9" * 5000), ([10**30, 0], None), ([9, -1], None), ([9, 100], None), ("x" * 200_000, None)]
    for value, raw in cases:
        d = _valid()
        _set(d, path, value)
        _write(hw, d, raw)
        with pytest.raises(HardwareError) as err:
            hardware.load_profile(str(hw))
        message = _one_line_naming(err.value, _key(path))
        if kind in ("int", "number") and raw is None and not isinstance(value, str):
            assert "at most" in message  # the accepted range is stated
        if isinstance(value, str):
            assert "x" * 200 not in message  # shown cut


def test_the_plan_is_never_absurd_for_an_absurd_profile(tmp_path):
    """The audit: ram_total_bytes=10**40 planned a budget of 8381903171539306557485535461376.00GiB; a 200,000-character
    GPU name was echoed in a 600,050-character line."""
    hw = tmp_path / "hw.json"
    for path, value, words in ((("cpu", "ram_total_bytes"), 10**40, "4 PiB"),
                               (("cpu", "ram_available_bytes"), 10**40, "4 PiB"),
                               (("cpu", "logical_cores"), 10**30, "100,000"),
                               (("cpu", "idle_cores"), float("inf"), "100,000"),
                               (("gpus", 0, "total_bytes"), 10**40, "4 PiB"),
                               (("gpus", 0, "name"), "N" * 200_000, "at most 200 characters")):
        d = _valid()
        if path == ("cpu", "ram_total_bytes"):
            d["cpu"]["ram_available_bytes"] = 10**39
        _set(d, path, value)
        _write(hw, d, None)
        with pytest.raises(HardwareError, match=words) as err:
            hardware.load_profile(str(hw))
        _one_line_naming(err.value, _key(path))
    d = _valid()
    d["gpus"][0]["compute_capability"] = [10**30, 0]
    _write(hw, d, None)
    with pytest.raises(HardwareError, match="from 0 to 99"):
        hardware.load_profile(str(hw))


def test_too_many_gpus_and_notes_are_refused(tmp_path):
    hw = tmp_path / "hw.json"
    d = _valid()
    gpu = d["gpus"][0]
    d["gpus"] = [dict(gpu, index=i) for i in range(MAX_GPUS + 1)]
    _write(hw, d, None)
    with pytest.raises(HardwareError, match=r"'gpus' must have at most 1,024 items, got 1,025"):
        hardware.load_profile(str(hw))
    d = _valid()
    d["notes"] = [""] * (MAX_NOTES + 1)
    _write(hw, d, None)
    with pytest.raises(HardwareError, match=r"'notes' must have at most"):
        hardware.load_profile(str(hw))


def test_many_long_unknown_keys_are_named_cut(tmp_path):
    hw = tmp_path / "hw.json"
    d = _valid()
    d["gpus"][0].update({f"{i}" + "k" * 100_000: 1 for i in range(9)})
    _write(hw, d, None)
    with pytest.raises(HardwareError) as err:
        hardware.load_profile(str(hw))
    message = _one_line_naming(err.value, "gpus[0].0" + "k" * 39 + "... (99,961 more characters)")
    assert "and 5 more" in message


def test_a_json_value_python_cannot_read_is_one_error(tmp_path, monkeypatch):
    """The parser's own ValueError (Python's 4,300-digit limit, were an integer converted) is one error line too."""
    from lib.hardware import profile

    monkeypatch.setattr(profile, "parse_int", int)
    hw = tmp_path / "hw.json"
    d = _valid()
    d["disk_free_bytes"] = RAW
    _write(hw, d, "9" * 5000)
    with pytest.raises(HardwareError, match=r"hw\.json' holds a value Python cannot read \(Exceeds the limit") as err:
        hardware.load_profile(str(hw))
    assert "\n" not in str(err.value) and len(str(err.value)) < LONGEST_MESSAGE


@pytest.mark.parametrize("value", [10**5000, -(10**5000), [10**5000, 0], {"a": 10**5000}, float("nan")],
                         ids=["huge", "-huge", "[huge, 0]", "{a: huge}", "nan"])
def test_from_dict_with_python_values_never_raises_anything_else(value):
    """HardwareProfile.from_dict (a caller's dict, not JSON text): showing a 5,000-digit int must not convert it."""
    for path in (("disk_free_bytes",), ("gpus", 0, "compute_capability"), ("gpus", 0, "name"), ("cpu", "idle_cores")):
        d = _valid()
        _set(d, path, value)
        with pytest.raises(HardwareError) as err:
            HardwareProfile.from_dict(d)
        _one_line_naming(err.value, _key(path))


# --------------------------------------------------------------------------
# Valid profiles still load, up to every bound


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_the_writers_profiles_load(tmp_path, vendor):
    hw = tmp_path / "hw.json"
    d = _valid(vendor)
    _write(hw, d, None)
    loaded = hardware.load_profile(str(hw))
    assert json.loads(loaded.to_json()) == {**d, "source": f"file:{hw}"}


@pytest.mark.parametrize("key", sorted(hardware.catalog.CATALOG))
def test_every_catalog_machine_round_trips(tmp_path, key):
    hw = tmp_path / "hw.json"
    p = hardware.from_catalog(key, gpus=8)
    hw.write_text(p.to_json())
    assert hardware.load_profile(str(hw)) == dataclasses.replace(p, source=f"file:{hw}")


def test_every_bound_itself_is_accepted(tmp_path):
    hw = tmp_path / "hw.json"
    d = _valid()
    for gpu in d["gpus"]:
        gpu.update(total_bytes=MAX_MEMORY_BYTES, free_bytes=MAX_MEMORY_BYTES, name="N" * MAX_NAME_CHARS,
                   arch="a" * MAX_NAME_CHARS, compute_capability=[MAX_CC_PART, MAX_CC_PART], speed=SPEED_LIMITS)
    d["cpu"].update(name="C" * MAX_NAME_CHARS, physical_cores=MAX_CORES, logical_cores=MAX_CORES,
                    ram_total_bytes=MAX_MEMORY_BYTES, ram_available_bytes=MAX_MEMORY_BYTES, idle_cores=MAX_CORES)
    d.update(disk_free_bytes=MAX_DISK_BYTES, notes=["n" * MAX_TEXT_CHARS] * 3, source="s" * MAX_TEXT_CHARS,
             torch_version="t" * MAX_NAME_CHARS)
    _write(hw, d, None)
    p = hardware.load_profile(str(hw))
    assert p.cpu.ram_total_bytes == MAX_MEMORY_BYTES and p.gpus[0].compute_capability == (99, 99)
    d = _valid()
    d["gpus"] = [dict(d["gpus"][0], index=i) for i in range(MAX_GPUS)]
    _write(hw, d, None)
    assert len(hardware.load_profile(str(hw)).gpus) == MAX_GPUS


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(st.characters(codec="utf-8"), min_size=1, max_size=MAX_NAME_CHARS),
       memory=st.integers(1, MAX_MEMORY_BYTES), cores=st.integers(1, MAX_CORES),
       idle=st.none() | st.floats(0, MAX_CORES) | st.integers(0, MAX_CORES),
       cc=st.tuples(st.integers(0, MAX_CC_PART), st.integers(0, MAX_CC_PART)),
       half=st.floats(min_value=1e-6, max_value=SPEED_LIMITS["half_tflops"]))
def test_generated_valid_profiles_load(tmp_path, name, memory, cores, idle, cc, half):
    hw = tmp_path / "hw.json"
    d = _valid()
    d["gpus"][0].update(name=name, total_bytes=memory, free_bytes=memory // 2, compute_capability=list(cc),
                        supports_tf32=cc >= (8, 0))
    d["gpus"][0]["speed"]["half_tflops"] = half
    d["cpu"].update(physical_cores=cores, logical_cores=cores, idle_cores=idle)
    _write(hw, d, None)
    p = hardware.load_profile(str(hw))
    assert len(p.gpus[0].name) >= len(name) and p.gpus[0].total_bytes == memory and p.cpu.logical_cores == cores
    assert "\n" not in p.gpus[0].name and (idle is None or math.isfinite(p.cpu.idle_cores))


# --------------------------------------------------------------------------
# The same bounds where a number overrides a profile: GPUS=, FREE_GB=, TOTAL_GB=, GPU=


@pytest.mark.parametrize("gpus", [0, -1, MAX_GPUS + 1, 10**30, 10**5000], ids=["0", "-1", "1025", "1e30", "huge"])
def test_gpus_override_is_bounded(gpus):
    with pytest.raises(HardwareError, match="from 1 to 1024") as err:
        hardware.resolve_hardware(gpu="h100", gpus=gpus)
    assert len(str(err.value)) < LONGEST_MESSAGE


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e30, 10**5000, -1],
                         ids=["inf", "nan", "1e30", "huge", "-1"])
def test_free_and_total_gb_are_bounded(value):
    with pytest.raises(HardwareError, match="positive number of GiB") as err:
        hardware.resolve_hardware(gpu="h100", free_gb=value)
    assert len(str(err.value)) < LONGEST_MESSAGE
    with pytest.raises(HardwareError, match="TOTAL_GB"):
        hardware.from_catalog("h100", total_gb=value)


def test_an_unknown_gpu_key_is_shown_cut():
    with pytest.raises(HardwareError) as err:
        hardware.catalog.lookup("h" * 200_000)
    assert "more characters" in str(err.value) and len(str(err.value)) < 2000
