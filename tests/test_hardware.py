"""lib.hardware and lib.hardware.catalog: detection (real and faked), profiles, catalog."""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import time
import types

import pytest

from lib import hardware
from lib.errors import HardwareError, KfitError
from lib.hardware import CPUInfo, GPUInfo, HardwareProfile, catalog, gib
from lib.hardware.detection import _detect, _query_torch_gpus, _rocm_bf16
from lib.hardware.nvml import query_nvml
from tests.helpers import (FakeDriverNotLoaded, FakeLibraryNotFound, FakeLibRmVersionMismatch,
                           FakeNVMLError, fake_pynvml)

GiB = 2**30
MiB = 2**20
H100 = ("NVIDIA H100 80GB HBM3", 85520809984, 9, 0)
A100 = ("NVIDIA A100-SXM4-80GB", 84987740160, 8, 0)
V100 = ("Tesla V100-SXM2-16GB", 16945512448, 7, 0)


# --------------------------------------------------------------------------
# Fakes with the API surface lib.hardware uses
# --------------------------------------------------------------------------


def fake_torch(devices=(), *, cuda="12.6", hip=None, version="2.13.0+cu126", mps=False, mem_get_info=True):
    """devices: (name, total_bytes, major, minor, free_bytes[, gcnArchName]) per GPU.
    cuda.mem_get_info_calls counts the calls that would create a CUDA context."""
    props = [
        types.SimpleNamespace(
            name=d[0],
            total_memory=d[1],
            major=d[2],
            minor=d[3],
            gcnArchName=d[5] if len(d) > 5 else "",
            uuid=f"0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
        )
        for i, d in enumerate(devices)
    ]

    def get_info(i):
        cuda_ns.mem_get_info_calls += 1
        if not mem_get_info:
            raise RuntimeError("mem_get_info not supported")
        return (devices[i][4], devices[i][1])

    cuda_ns = types.SimpleNamespace(
        is_available=lambda: bool(devices) and (cuda is not None or hip is not None),
        device_count=lambda: len(devices),
        get_device_properties=lambda i: props[i],
        mem_get_info=get_info,
        mem_get_info_calls=0,
    )
    return types.SimpleNamespace(
        __version__=version,
        version=types.SimpleNamespace(cuda=cuda, hip=hip),
        cuda=cuda_ns,
        backends=types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: mps)),
        mps=types.SimpleNamespace(recommended_max_memory=lambda: 16 * GiB),
    )


def cpu_torch():
    return fake_torch((), cuda=None, version="2.13.0+cpu")


# --------------------------------------------------------------------------
# This machine (no GPU)
# --------------------------------------------------------------------------


def test_detect_on_this_machine_is_a_quiet_cpu_profile(tmp_path):
    p = hardware.detect(str(tmp_path))
    assert p.gpus == ()
    assert p.accelerator == "cpu"
    assert p.primary_gpu is None and p.identical_gpu_count == 0
    assert p.notes == ()
    assert p.source == "detected"
    assert p.cuda_version is None and p.hip_version is None
    assert p.torch_version.startswith("2.")
    c = p.cpu
    assert c.name and c.name != "unknown CPU"
    assert 1 <= c.physical_cores <= c.logical_cores <= 4096
    assert 0 < c.ram_available_bytes <= c.ram_total_bytes
    assert c.ram_total_bytes > 256 * MiB
    assert p.disk_free_bytes > 0
    assert p.on_battery in (None, True, False)


def test_detect_is_fast_and_warning_free(recwarn):
    import torch  # noqa: F401 - the budget is "after torch is imported"

    hardware.detect()
    start = time.perf_counter()
    hardware.detect()
    elapsed = time.perf_counter() - start
    assert elapsed < 0.05, f"detect() took {elapsed * 1000:.1f} ms"
    assert len(recwarn) == 0


def test_detect_with_missing_disk_path_uses_nearest_parent(tmp_path):
    p = hardware.detect(str(tmp_path / "runs" / "not-yet"))
    assert p.disk_free_bytes > 0


def test_gib():
    assert gib(3 * GiB) == 3.0
    assert gib(512 * MiB) == 0.5


# --------------------------------------------------------------------------
# JSON round trip and strict parsing
# --------------------------------------------------------------------------


def _catalog_profile(key="h100", **kw):
    cpu = CPUInfo("Test CPU", 8, 16, 64 * GiB, 60 * GiB)
    return hardware.from_catalog(key, cpu=cpu, **kw)


@pytest.mark.parametrize("make", [hardware.detect, lambda: _catalog_profile("a100", gpus=2), lambda: _catalog_profile("mi210")])
def test_json_round_trip(tmp_path, make):
    p = make()
    p = dataclasses.replace(p, notes=("a note",))
    path = tmp_path / "hw.json"
    path.write_text(p.to_json())
    loaded = hardware.load_profile(str(path))
    assert loaded.source == f"file:{path}"
    assert loaded == dataclasses.replace(p, source=f"file:{path}")
    assert HardwareProfile.from_dict(json.loads(p.to_json())) == p
    assert isinstance(loaded.gpus, tuple) and isinstance(loaded.notes, tuple)
    if loaded.gpus and loaded.gpus[0].compute_capability is not None:
        assert isinstance(loaded.gpus[0].compute_capability, tuple)


def _good_dict():
    return _catalog_profile("h100", gpus=2).to_dict()


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda d: d.pop("cpu"), "cpu"),
        (lambda d: d.pop("notes"), "notes"),
        (lambda d: d.update(extra=1), "extra"),
        (lambda d: d["cpu"].pop("logical_cores"), "cpu.logical_cores"),
        (lambda d: d["cpu"].update(threads=4), "cpu.threads"),
        (lambda d: d["gpus"][1].pop("free_bytes"), "gpus[1].free_bytes"),
        (lambda d: d["gpus"][0].update(memory="80GB"), "gpus[0].memory"),
        (lambda d: d["gpus"][0].update(total_bytes="80GB"), "gpus[0].total_bytes"),
        (lambda d: d["gpus"][0].update(total_bytes=80.0), "gpus[0].total_bytes"),
        (lambda d: d["gpus"][0].update(total_bytes=True), "gpus[0].total_bytes"),
        (lambda d: d["gpus"][0].update(free_bytes=d["gpus"][0]["total_bytes"] + 1), "gpus[0].free_bytes"),
        (lambda d: d["gpus"][0].update(free_bytes=-1), "gpus[0].free_bytes"),
        (lambda d: d["gpus"][0].update(vendor="intel"), "gpus[0].vendor"),
        (lambda d: d["gpus"][0].update(backend="rocm"), "gpus[0].backend"),
        (lambda d: d["gpus"][0].update(compute_capability=[9]), "gpus[0].compute_capability"),
        (lambda d: d["gpus"][0].update(compute_capability="9.0"), "gpus[0].compute_capability"),
        (lambda d: d["gpus"][0].update(compute_capability=None), "gpus[0].compute_capability"),
        (lambda d: d["gpus"][0].update(supports_bf16="yes"), "gpus[0].supports_bf16"),
        (lambda d: d["gpus"][0].update(compute_capability=[7, 0]), "gpus[0].supports_tf32"),
        (lambda d: d["gpus"][1].update(index=0), "gpus[1].index"),
        (lambda d: d.update(gpus={}), "gpus"),
        (lambda d: d.update(on_battery="no"), "on_battery"),
        (lambda d: d.update(cuda_version=12.6), "cuda_version"),
        (lambda d: d.update(notes=[1]), "notes[0]"),
        (lambda d: d.update(disk_free_bytes=None), "disk_free_bytes"),
        (lambda d: d["cpu"].update(ram_available_bytes=d["cpu"]["ram_total_bytes"] + 1), "cpu.ram_available_bytes"),
        (lambda d: d["cpu"].update(physical_cores=0), "cpu.physical_cores"),
    ],
)
def test_from_dict_is_strict_and_names_the_key(mutate, key):
    d = _good_dict()
    mutate(d)
    with pytest.raises(HardwareError) as e:
        HardwareProfile.from_dict(d)
    assert f"'{key}'" in str(e.value)
    assert "fix" in str(e.value).lower() or "valid keys" in str(e.value)


def test_from_dict_rejects_non_objects():
    with pytest.raises(HardwareError, match="JSON object"):
        HardwareProfile.from_dict([1, 2])
    d = _good_dict()
    d["gpus"][0] = "H100"
    with pytest.raises(HardwareError, match=r"'gpus\[0\]'"):
        HardwareProfile.from_dict(d)


def test_from_dict_accepts_a_hand_written_amd_profile():
    d = _good_dict()
    d["gpus"] = [
        dict(d["gpus"][0], name="AMD Instinct MI210", vendor="amd", backend="rocm", compute_capability=None,
             arch="gfx90a", supports_tf32=False)
    ]
    p = HardwareProfile.from_dict(d)
    assert p.accelerator == "rocm"


def test_load_profile_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(HardwareError, match="nope.json.*does not exist"):
        hardware.load_profile(str(missing))
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(HardwareError, match=r"bad\.json.*not valid JSON.*line 1"):
        hardware.load_profile(str(bad))
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(HardwareError, match="bin.json"):
        hardware.load_profile(str(binary))
    wrong = tmp_path / "wrong.json"
    d = _good_dict()
    del d["source"]
    wrong.write_text(json.dumps(d))
    with pytest.raises(HardwareError, match=r"wrong\.json.*'source'"):
        hardware.load_profile(str(wrong))
    with pytest.raises(HardwareError, match="is not a regular file"):
        hardware.load_profile(str(tmp_path))


def test_load_profile_refuses_devices_pipes_and_huge_files_without_reading_them(tmp_path):
    """HW=/dev/zero read 6.5 GB in 13 s; a FIFO would block the open."""
    with pytest.raises(HardwareError, match="'/dev/zero' is not a regular file"):
        hardware.load_profile("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(HardwareError, match="fifo' is not a regular file"):
        hardware.load_profile(str(fifo))
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (2**20 + 1))
    with pytest.raises(HardwareError, match=r"huge\.json' is larger than 1 MiB"):
        hardware.load_profile(str(huge))


@pytest.mark.parametrize("value, shown, most", [
    (79.65, "79.65", "79.64"),  # was "more than the 79.65 GiB total ... at most 79.64"
    (79.64747, "79.64747", "79.64746"),  # as precise as the value given
    (80, "80", "79.64"),
])
def test_free_gb_above_the_total_prints_a_total_below_the_value(value, shown, most):
    with pytest.raises(HardwareError) as err:
        hardware.resolve_hardware(gpu="h100", free_gb=value)
    assert f"FREE_GB={shown} is more than the {most} GiB total" in str(err.value)
    assert str(err.value).endswith(f"give at most {most}.")
    assert float(most) < value
    hardware.resolve_hardware(gpu="h100", free_gb=float(most))  # the value suggested is accepted


def test_hardware_error_is_a_kfit_error():
    assert issubclass(HardwareError, KfitError)


# --------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------

REQUIRED_KEYS = {"h100", "a100-40gb", "a100-80gb", "a10g", "l4", "rtx4090", "rtx3090", "w7900", "mi210", "b200", "t4", "v100",
                 "h200", "l40s", "mi300x", "gh200"}


def test_catalog_has_the_required_entries():
    assert REQUIRED_KEYS <= set(catalog.CATALOG)


@pytest.mark.parametrize("key", sorted(catalog.CATALOG))
def test_every_catalog_entry_resolves(key):
    e = catalog.CATALOG[key]
    assert e.key == key == key.lower()
    assert e.source.startswith("https://")
    assert e.tdp_watts > 0 and e.memory_type
    p = hardware.resolve_hardware(gpu=key.upper())
    assert p.source == f"catalog:{key}"
    g = p.primary_gpu
    assert (g.name, g.vendor, g.backend, g.total_bytes, g.arch) == (e.name, e.vendor, e.backend, e.total_bytes, e.arch)
    assert g.free_bytes == e.total_bytes - catalog.CONTEXT_RESERVE_BYTES
    assert p.identical_gpu_count == 1
    assert p.accelerator == e.backend
    assert p.notes == ()
    assert p.cpu.name.startswith(catalog.HOSTS[key].machine)  # the machine the GPU usually comes in
    # internally consistent: it survives the strict parser
    assert HardwareProfile.from_dict(p.to_dict()) == p
    if e.vendor == "nvidia":
        assert e.arch == "sm_%d%d" % e.compute_capability
        assert e.tf32 == e.bf16 == (e.compute_capability >= (8, 0))
    else:
        assert e.compute_capability is None and not e.tf32


@pytest.mark.parametrize(
    "key, cc, gb, bf16",
    [
        ("h100", (9, 0), 80, True),
        ("a100-40gb", (8, 0), 40, True),
        ("a100-80gb", (8, 0), 80, True),
        ("a10g", (8, 6), 24, True),
        ("l4", (8, 9), 24, True),
        ("rtx4090", (8, 9), 24, True),
        ("rtx3090", (8, 6), 24, True),
        ("b200", (10, 0), 180, True),
        ("t4", (7, 5), 16, False),
        ("v100", (7, 0), 16, False),
        ("w7900", None, 48, True),
        ("mi210", None, 64, True),
        ("h200", (9, 0), 141, True),
        ("gh200", (9, 0), 96, True),
        ("l40s", (8, 9), 48, True),
        ("mi300x", None, 192, True),
    ],
)
def test_catalog_facts(key, cc, gb, bf16):
    e = catalog.CATALOG[key]
    assert e.compute_capability == cc
    assert e.bf16 is bf16
    # torch's total is a little under the marketing GB figure, never over it
    assert 0.88 * gb * 1e9 <= e.total_bytes <= gb * GiB


def test_catalog_arches():
    assert catalog.CATALOG["w7900"].arch == "gfx1100"
    assert catalog.CATALOG["mi210"].arch == "gfx90a"
    assert catalog.CATALOG["b200"].arch == "sm_100"
    assert catalog.CATALOG["mi300x"].arch == "gfx942"
    assert catalog.CATALOG["h200"].arch == catalog.CATALOG["gh200"].arch == "sm_90"
    assert catalog.CATALOG["l40s"].arch == "sm_89"


@pytest.mark.parametrize(
    "alias, key",
    [
        ("h100-80gb", "h100"),
        ("H100", "h100"),
        ("a100", "a100-80gb"),
        ("A100_40GB", "a100-40gb"),
        ("4090", "rtx4090"),
        ("RTX 4090", "rtx4090"),
        ("3090", "rtx3090"),
        ("tesla-t4", "t4"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("Tesla V100-SXM2-16GB", "v100"),
        (" MI210 ", "mi210"),
    ],
)
def test_catalog_aliases(alias, key):
    assert catalog.lookup(alias).key == key
    assert hardware.resolve_hardware(gpu=alias).source == f"catalog:{key}"


def test_unknown_catalog_key_lists_valid_keys():
    with pytest.raises(HardwareError) as e:
        hardware.resolve_hardware(gpu="h10")
    msg = str(e.value)
    assert "'h10'" in msg
    for key in REQUIRED_KEYS:
        assert key in msg
    assert "'cpu'" in msg and "HW=" in msg
    assert "Did you mean 'h100'" in msg


# --------------------------------------------------------------------------
# Catalog: the four later entries, and interconnect bandwidth
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "alias, key, name",
    [
        ("H200", "h200", "NVIDIA H200"),
        ("h200-141gb", "h200", "NVIDIA H200"),
        ("H200_SXM", "h200", "NVIDIA H200"),
        ("L40S", "l40s", "NVIDIA L40S"),
        ("l40s-48gb", "l40s", "NVIDIA L40S"),
        ("MI300X", "mi300x", "AMD Instinct MI300X"),
        ("instinct-mi300x", "mi300x", "AMD Instinct MI300X"),
        ("mi300x-192gb", "mi300x", "AMD Instinct MI300X"),
        ("GH200", "gh200", "NVIDIA GH200 480GB"),
        ("gh200-96gb", "gh200", "NVIDIA GH200 480GB"),
        ("Grace Hopper", "gh200", "NVIDIA GH200 480GB"),
    ],
)
def test_later_entries_resolve_by_alias_and_torch_name(alias, key, name):
    e = catalog.lookup(alias)
    assert e.key == key and e.name == name
    assert catalog.lookup(name).key == key  # what torch reports finds the same entry
    assert hardware.resolve_hardware(gpu=alias).source == f"catalog:{key}"
    assert 40 * GiB <= e.total_bytes <= 200 * GiB


def test_later_entries_specifics():
    h200, h100 = catalog.CATALOG["h200"], catalog.CATALOG["h100"]
    assert h200.total_bytes > h100.total_bytes and h200.memory_type == "HBM3e"
    assert h200.peak.bandwidth_gbs > h100.peak.bandwidth_gbs  # same compute, faster memory
    assert h200.peak.half_tflops == h100.peak.half_tflops
    mi300x = catalog.CATALOG["mi300x"]
    assert mi300x.vendor == "amd" and mi300x.backend == "rocm" and mi300x.total_bytes == 196592 * MiB
    assert catalog.CATALOG["gh200"].total_bytes == 102005473280  # deviceQuery's figure
    assert catalog.CATALOG["l40s"].total_bytes == 45589 * MiB
    # dense, not sparse: the L40S datasheet's 733 bf16 TFLOPS is with sparsity
    assert catalog.CATALOG["l40s"].peak.half_tflops < 400


def test_fp8_peaks_where_the_tensor_cores_have_fp8_and_none_elsewhere():
    """FP8 tensor cores arrive with NVIDIA's compute capability 8.9 (Ada, Hopper, Blackwell) and AMD's CDNA 3
    (gfx942): there the dense FP8 peak is about twice the bf16 one (the L40S datasheet's a little more), each
    entry's last note naming its page; elsewhere there is none."""
    for key, e in catalog.CATALOG.items():
        has_fp8 = e.compute_capability >= (8, 9) if e.vendor == "nvidia" else e.arch == "gfx942"
        assert (e.peak.fp8_tflops is not None) == has_fp8, key
        if has_fp8:
            assert 1.99 <= e.peak.fp8_tflops / e.peak.half_tflops <= 2.03, key
        assert e.key and "FP8" in catalog_notes(key)[-1], key
    assert catalog.CATALOG["h100"].peak.fp8_tflops == 1978.9 and catalog.CATALOG["a100-80gb"].peak.fp8_tflops is None


def catalog_notes(key: str) -> list[str]:
    import json

    return next(g["notes"] for g in json.loads(catalog.DATA_FILE.read_text())["gpus"] if g["key"] == key)


def test_detected_mi300x_is_the_catalog_entry():
    """What ROCm torch reports for an MI300X finds the catalog entry, with the same total."""
    e = catalog.CATALOG["mi300x"]
    torch_mod = fake_torch(
        [(e.name, e.total_bytes, 9, 4, e.total_bytes - GiB, "gfx942:sramecc+:xnack-")],
        cuda=None, hip="6.2.41133", version="2.13.0+rocm6.2",
    )
    g = _detect(torch_mod, fake_pynvml(init_error=FakeLibraryNotFound())).primary_gpu
    assert (g.name, g.total_bytes, g.arch, g.supports_bf16) == (e.name, e.total_bytes, e.arch, e.bf16)
    assert catalog.lookup(g.name).key == "mi300x"


@pytest.mark.parametrize("key", sorted(catalog.CATALOG))
def test_every_entry_has_a_link(key):
    peak = catalog.CATALOG[key].peak
    assert peak.link_gbs > 0 and isinstance(peak.link, str) and peak.link.strip()
    assert peak.link_gbs < 2000  # one direction: no part in the catalog reaches 2 TB/s per direction
    pcie = {"PCIe 3.0 x16": catalog.PCIE3_X16_GBS, "PCIe 4.0 x16": catalog.PCIE4_X16_GBS,
            "PCIe 5.0 x16": catalog.PCIE5_X16_GBS}
    if peak.link in pcie:
        assert peak.link_gbs == pcie[peak.link]
    else:
        assert peak.link.startswith(("NVLink", "Infinity Fabric")) and peak.link_gbs > catalog.PCIE5_X16_GBS
    assert catalog.link_bytes_per_s(key) == peak.link_gbs * 1e9


@pytest.mark.parametrize(
    "key, gbs, link",
    [
        # the datasheets' totals count both directions: half of 900, 600, 300, 1800
        ("h100", 450, "NVLink 4"),
        ("h200", 450, "NVLink 4"),
        ("a100-80gb", 300, "NVLink 3"),
        ("a100-40gb", 300, "NVLink 3"),
        ("v100", 150, "NVLink 2"),
        ("b200", 900, "NVLink 5"),
        ("t4", 15.75, "PCIe 3.0 x16"),
        ("l40s", 31.5, "PCIe 4.0 x16"),
        ("rtx4090", 31.5, "PCIe 4.0 x16"),
    ],
)
def test_link_is_one_direction(key, gbs, link):
    peak = catalog.CATALOG[key].peak
    assert (peak.link_gbs, peak.link) == (gbs, link)


def test_link_bytes_per_s():
    assert catalog.link_bytes_per_s("h100") == 450e9
    assert catalog.link_bytes_per_s("NVIDIA H100 80GB HBM3") == 450e9  # torch's name
    assert catalog.link_bytes_per_s("h100-sxm") == 450e9  # an alias
    assert catalog.link_bytes_per_s("l40s") == 31.5e9
    for unknown in ("Some Unknown GPU", "h10", "", "   "):
        assert catalog.link_bytes_per_s(unknown) is None  # no exception
        assert catalog.link_bytes_per_s(unknown, across_machines=True) is None
    network = catalog.NETWORK_GBS * 1e9
    assert catalog.link_bytes_per_s("h100", across_machines=True) == network
    assert catalog.link_bytes_per_s("NVIDIA H200", across_machines=True) == network
    # a GPU whose own link is slower than the network is held to its link (a T4's PCIe 3.0 x16)
    assert catalog.link_bytes_per_s("t4", across_machines=True) == catalog.PCIE3_X16_GBS * 1e9 < network
    assert 10 <= catalog.NETWORK_GBS <= 50  # 100-400 Gb/s per GPU: a sane default


def test_catalog_overrides():
    p = hardware.resolve_hardware(gpu="a100-80gb", free_gb=40, gpus=4)
    assert len(p.gpus) == 4 and p.identical_gpu_count == 4
    assert [g.index for g in p.gpus] == [0, 1, 2, 3]
    assert all(g.free_bytes == 40 * GiB for g in p.gpus)
    q = hardware.from_catalog("h100", total_gb=94, cpu=CPUInfo("x", 1, 1, GiB, GiB))
    assert q.gpus[0].total_bytes == 94 * GiB
    assert q.gpus[0].free_bytes == 94 * GiB - catalog.CONTEXT_RESERVE_BYTES
    assert q.cpu.name == "x"


def test_catalog_cpu_is_the_gpus_usual_host_by_default():
    p = hardware.from_catalog("l4")  # an AWS g6.xlarge: 4 vCPUs, 16 GiB (tests/test_catalog_cpu.py)
    assert (p.cpu.name, p.cpu.logical_cores, p.cpu.ram_total_bytes) == ("AWS g6.xlarge: 4 vCPUs and 16 GiB per GPU",
                                                                        4, 16 * GiB)
    assert p.on_battery is None


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(free_gb=0), "FREE_GB=0"),
        (dict(free_gb=-3), "FREE_GB=-3"),
        (dict(free_gb=float("nan")), "FREE_GB"),
        (dict(free_gb="40"), "FREE_GB='40'"),
        (dict(free_gb=81), r"FREE_GB=81 is more than the 79\.64 GiB total.*at most 79\.64\."),
        (dict(gpus=0), "GPUS=0"),
        (dict(gpus=1.5), "GPUS=1.5"),
        (dict(gpus=True), "GPUS=True"),
    ],
)
def test_bad_overrides(kw, match):
    with pytest.raises(HardwareError, match=match):
        hardware.resolve_hardware(gpu="h100", **kw)


def test_gpu_cpu_is_a_cpu_only_profile_and_rejects_gpu_overrides():
    p = hardware.resolve_hardware(gpu="CPU")
    assert p.gpus == () and p.accelerator == "cpu" and p.source == "catalog:cpu"
    assert p.cpu.logical_cores >= 1
    with pytest.raises(HardwareError, match="GPUS=.*no GPU"):
        hardware.resolve_hardware(gpu="cpu", gpus=2)
    with pytest.raises(HardwareError, match="FREE_GB=.*no GPU"):
        hardware.resolve_hardware(gpu="cpu", free_gb=4)


def test_detected_cpu_profile_rejects_gpu_overrides():
    with pytest.raises(HardwareError, match="GPUS=.*no GPU"):
        hardware.resolve_hardware(gpus=1)


def test_resolve_hw_file_wins_and_takes_overrides(tmp_path):
    path = tmp_path / "box.json"
    path.write_text(_catalog_profile("rtx3090", gpus=2).to_json())
    p = hardware.resolve_hardware(hw=str(path))
    assert p.source == f"file:{path}" and p.identical_gpu_count == 2
    q = hardware.resolve_hardware(hw=str(path), gpu="h100", gpus=1, free_gb=20)
    assert q.primary_gpu.name == "NVIDIA GeForce RTX 3090"
    assert len(q.gpus) == 1 and q.gpus[0].free_bytes == 20 * GiB
    assert any("GPU=h100 was ignored" in n for n in q.notes)
    r = hardware.resolve_hardware(hw=str(path), gpus=3)
    assert r.identical_gpu_count == 3 and [g.index for g in r.gpus] == [0, 1, 2]
    assert any("simulates 1 more" in n for n in r.notes)
    with pytest.raises(HardwareError, match="at most 23.69"):
        hardware.resolve_hardware(hw=str(path), free_gb=24)


# --------------------------------------------------------------------------
# Faked machines
# --------------------------------------------------------------------------


def test_two_identical_h100s_with_another_process_using_memory(tmp_path):
    name, total, major, minor = H100
    used_by_other = 30 * GiB
    torch_mod = fake_torch([(name, total, major, minor, total - used_by_other), (name, total, major, minor, total - 600 * MiB)])
    nvml = fake_pynvml([(name, 81559 * MiB, 81559 * MiB - used_by_other), (name, 81559 * MiB, 81559 * MiB)])
    p = _detect(torch_mod, nvml, str(tmp_path))
    assert p.accelerator == "cuda" and p.cuda_version == "12.6" and p.torch_version == "2.13.0+cu126"
    assert len(p.gpus) == 2 and p.identical_gpu_count == 2
    g0, g1 = p.gpus
    # free memory is NVML's, less the context training will create (as in the catalog)
    reserve = catalog.CONTEXT_RESERVE_BYTES
    assert g0 == GPUInfo(0, name, "nvidia", "cuda", total, total - used_by_other - reserve, (9, 0), "sm_90", True, True)
    assert g1.free_bytes == total - reserve and g1.index == 1
    assert torch_mod.cuda.mem_get_info_calls == 0
    # the busy GPU is worth a note; the idle one is not
    assert len(p.notes) == 1 and "GPU 0" in p.notes[0] and "30.8" in p.notes[0]
    assert "init" in nvml.calls and nvml.calls[-1] == "shutdown"


def test_mixed_pair():
    torch_mod = fake_torch([(*H100, H100[1] - GiB), (*A100, A100[1] - GiB)])
    p = _detect(torch_mod, fake_pynvml([]))
    assert len(p.gpus) == 2 and p.identical_gpu_count == 1
    assert p.primary_gpu.name == H100[0]
    assert p.gpus[1].compute_capability == (8, 0) and p.gpus[1].arch == "sm_80"
    assert any("GPUs differ" in n and "CUDA_VISIBLE_DEVICES" in n for n in p.notes)


def test_v100_takes_the_fp16_path():
    p = _detect(fake_torch([(*V100, V100[1] - GiB)], cuda="11.8"), None)
    g = p.primary_gpu
    assert g.compute_capability == (7, 0) and g.arch == "sm_70"
    assert g.supports_bf16 is False and g.supports_tf32 is False
    assert p.notes == ()


def test_rocm_mi210():
    total = 68702699520
    torch_mod = fake_torch(
        [("AMD Instinct MI210", total, 9, 0, total - GiB, "gfx90a:sramecc+:xnack-")],
        cuda=None, hip="6.2.41133", version="2.13.0+rocm6.2",
    )
    p = _detect(torch_mod, fake_pynvml(init_error=FakeLibraryNotFound()))
    g = p.primary_gpu
    assert p.accelerator == "rocm" and p.hip_version == "6.2.41133" and p.cuda_version is None
    assert (g.vendor, g.backend, g.arch, g.compute_capability) == ("amd", "rocm", "gfx90a", None)
    assert g.supports_bf16 is True and g.supports_tf32 is False
    assert g.free_bytes == total - GiB
    assert p.notes == ()


@pytest.mark.parametrize(
    "arch, bf16",
    [("gfx90a", True), ("gfx942", True), ("gfx950", True), ("gfx1100", True), ("gfx1201", True),
     ("gfx908", False), ("gfx906", False), ("gfx1030", False), ("weird", False)],
)
def test_rocm_bf16_rule(arch, bf16):
    assert _rocm_bf16(arch) is bf16


def test_cpu_only_torch_with_nvml_gpus_gives_no_gpus_and_names_the_fix():
    nvml = fake_pynvml([(H100[0], 81559 * MiB, 81000 * MiB)] * 2, cuda_driver=12040)
    p = _detect(cpu_torch(), nvml)
    assert p.gpus == () and p.accelerator == "cpu"
    assert len(p.notes) == 1
    note = p.notes[0]
    assert "2 NVIDIA GPU(s)" in note and H100[0] in note
    assert "CPU-only build" in note and "install a CUDA build" in note and "CUDA 12.4" in note


def test_cuda_torch_that_cannot_see_nvml_gpus_explains_why(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = fake_pynvml([(H100[0], 81559 * MiB, 81000 * MiB)], cuda_driver=11040)
    torch_mod = fake_torch([], cuda="12.6")  # CUDA build, is_available() False
    (note,) = _detect(torch_mod, nvml).notes
    assert "driver supports only CUDA 11.4" in note and "update the NVIDIA driver" in note
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    (note,) = _detect(torch_mod, nvml).notes
    assert "CUDA_VISIBLE_DEVICES=''" in note and "unset it" in note
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    (note,) = _detect(torch_mod, fake_pynvml([(H100[0], 1, 1)], cuda_driver=12080)).notes
    assert "is_available() is False" in note and "nvidia-smi" in note


def test_driver_library_mismatch_is_reported():
    p = _detect(cpu_torch(), fake_pynvml(init_error=FakeLibRmVersionMismatch()))
    assert p.gpus == ()
    (note,) = p.notes
    assert "reboot" in note


@pytest.mark.parametrize("err", [FakeLibraryNotFound(), FakeDriverNotLoaded(), FakeNVMLError("x"), RuntimeError("broken")])
def test_no_nvml_is_a_silent_cpu_profile(err, recwarn):
    p = _detect(cpu_torch(), fake_pynvml(init_error=err))
    assert p.gpus == () and p.notes == () and p.accelerator == "cpu"
    assert len(recwarn) == 0


def test_real_pynvml_on_this_machine_is_silent():
    import pynvml

    assert query_nvml(pynvml) is None
    assert query_nvml(None) is None


def test_free_memory_from_nvml_by_uuid_without_a_cuda_context():
    # NVML lists the cards in the other order (PCI bus vs torch's order): the UUID decides.
    torch_mod = fake_torch([(*H100, 1), (*A100, 1)])
    nvml = fake_pynvml([(A100[0], A100[1], 20 * GiB), (H100[0], H100[1], 50 * GiB)])
    nvml.nvmlDeviceGetUUID = lambda h: f"GPU-0000000{1 - h}-aaaa-bbbb-cccc-dddddddddddd"
    p = _detect(torch_mod, nvml)
    reserve = catalog.CONTEXT_RESERVE_BYTES
    assert [g.free_bytes for g in p.gpus] == [50 * GiB - reserve, 20 * GiB - reserve]
    assert torch_mod.cuda.mem_get_info_calls == 0


def test_free_memory_from_mem_get_info_without_nvml_then_a_note():
    name, total, major, minor = H100
    torch_mod = fake_torch([(name, total, major, minor, 40 * GiB)])
    assert _detect(torch_mod, None).primary_gpu.free_bytes == 40 * GiB
    assert torch_mod.cuda.mem_get_info_calls == 1
    torch_mod = fake_torch([(name, total, major, minor, 0)], mem_get_info=False)
    q = _detect(torch_mod, None)
    assert q.primary_gpu.free_bytes == total
    assert any("could not be measured" in n for n in q.notes)


def test_apple_mps():
    cpu = CPUInfo("Apple M2 Max", 12, 12, 32 * GiB, 20 * GiB)
    torch_mod = fake_torch([], cuda=None, version="2.13.0", mps=True)
    gpus, notes = _query_torch_gpus(torch_mod, cpu=cpu)
    (g,) = gpus
    assert (g.name, g.vendor, g.backend, g.arch) == ("Apple M2 Max", "apple", "mps", "apple")
    assert g.total_bytes == 32 * GiB and g.free_bytes == 16 * GiB  # recommended_max_memory
    assert g.supports_bf16 is False and g.compute_capability is None and notes == ()


def test_unreadable_device_is_skipped_with_a_note():
    torch_mod = fake_torch([(*H100, H100[1]), (*H100, H100[1])])

    def props(i):
        if i == 0:
            raise RuntimeError("device lost")
        return types.SimpleNamespace(name=H100[0], total_memory=H100[1], major=9, minor=0, uuid="x")

    torch_mod.cuda.get_device_properties = props
    p = _detect(torch_mod, None)
    assert len(p.gpus) == 1 and p.gpus[0].index == 0
    assert any("GPU 0 was skipped" in n for n in p.notes)


def test_torch_warnings_become_notes_only_when_there_are_gpus(recwarn):
    import warnings

    torch_mod = fake_torch([(*H100, H100[1] - GiB)])
    real_info = torch_mod.cuda.mem_get_info

    def noisy(i):
        warnings.warn("NVIDIA H100 with CUDA capability sm_90 is not compatible with the current PyTorch installation.")
        return real_info(i)

    torch_mod.cuda.mem_get_info = noisy
    p = _detect(torch_mod, None)
    assert any(n.startswith("torch warned: NVIDIA H100") for n in p.notes)

    quiet = cpu_torch()
    quiet.cuda.is_available = lambda: warnings.warn("CUDA initialization: no driver") or False
    assert _detect(quiet, None).notes == ()
    assert len(recwarn) == 0


# --------------------------------------------------------------------------
# Runtime queries: memory, usability, telemetry
# --------------------------------------------------------------------------


def test_device_memory_on_cpu_is_rss_with_a_resettable_peak():
    current, peak = hardware.device_memory("cpu")
    assert current > 16 * MiB and peak >= current
    # fresh pages from the kernel, touched: RSS grows (a malloc'd block may reuse pages an earlier test's
    # heap kept resident, as make train's keep_freed_memory does in the same process)
    block = mmap.mmap(-1, 64 * MiB)
    block.write(b"x" * (64 * MiB))
    grown, peak = hardware.device_memory("cpu")
    assert grown > current and peak >= grown
    block.close()
    hardware.reset_peak_memory("cpu")
    now, peak = hardware.device_memory("cpu")
    assert peak == now
    hardware.empty_device_cache("cpu")


def _usability_torch(error=None, *, devices=1):
    calls = []

    def ones(n, device):
        calls.append(device)
        if error is not None:
            raise error
        return types.SimpleNamespace(add_=lambda v: None)

    cuda = types.SimpleNamespace(is_available=lambda: devices > 0, device_count=lambda: devices,
                                 synchronize=lambda i: calls.append(("sync", i)))
    return types.SimpleNamespace(cuda=cuda, ones=ones, calls=calls)


@pytest.mark.parametrize(
    "error, fix",
    [
        (RuntimeError("CUDA error: no kernel image is available for execution on the device"), "install a torch build"),
        (RuntimeError("CUDA error: out of memory"), "other processes hold its memory"),
        (RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable"), "exclusive-process"),
        (RuntimeError("The NVIDIA driver on your system is too old (found version 11040)"), "update the NVIDIA"),
        (OSError("something else"), "nvidia-smi"),
    ],
)
def test_gpu_unusable_reason_names_the_error_and_the_fix(error, fix):
    reason = hardware.gpu_unusable_reason(1, torch_mod=_usability_torch(error, devices=2))
    assert reason.startswith("GPU 1 is unusable (")
    assert type(error).__name__ in reason and str(error)[:20] in reason and fix in reason


def test_gpu_unusable_reason_is_none_when_usable_or_absent():
    usable = _usability_torch()
    assert hardware.gpu_unusable_reason(0, torch_mod=usable) is None
    assert usable.calls == ["cuda:0", ("sync", 0)]
    assert hardware.gpu_unusable_reason(0, torch_mod=_usability_torch(RuntimeError("x"), devices=0)) is None
    assert hardware.gpu_unusable_reason() is None  # this machine: no GPU


def test_gpu_telemetry_reads_nvml_and_names_throttle_reasons():
    nvml = fake_pynvml([H100[:2] + (H100[1],)] * 2,
                       telemetry=dict(util=97, temp=84, power_mw=612_345, reasons=0x1 | 0x4 | 0x20))
    torch_mod = fake_torch([(*H100, 1)] * 2)
    t = hardware.GpuTelemetry.open(1, pynvml_mod=nvml, torch_mod=torch_mod)
    assert ("uuid", "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd") in nvml.calls  # matched by UUID
    r = t.read()
    assert r == {"gpu_util_pct": 97, "temp_c": 84, "power_w": 612.3, "gpu_mem_used_bytes": 0,
                 "throttle": ["sw_power_cap", "sw_thermal"]}  # idle (0x1) is not a problem
    assert all(hardware.THROTTLE_KIND[n] in ("thermal", "power") for n in r["throttle"])
    nvml.telemetry = {"temp": 60}  # the rest: not supported on this board
    assert t.read() == {"temp_c": 60, "gpu_mem_used_bytes": 0}
    t.close()
    assert nvml.calls.count("init") == 1 and nvml.calls[-1] == "shutdown"


def test_gpu_telemetry_without_nvml_is_none():
    assert hardware.GpuTelemetry.open(0, pynvml_mod=fake_pynvml(init_error=FakeLibraryNotFound())) is None
    assert hardware.GpuTelemetry.open(0) is None  # this machine: nvidia-ml-py, no driver
    nvml = fake_pynvml([])  # NVML works but has no such GPU: the session is closed again
    assert hardware.GpuTelemetry.open(0, pynvml_mod=nvml, torch_mod=cpu_torch()) is None
    assert nvml.calls[-1] == "shutdown"


# --------------------------------------------------------------------------
# lib/hardware/details.py: seed 002's profiler items, unknown rather than an error


def test_low_precision_support_follows_the_compute_capability():
    from lib.hardware.details import low_precision

    assert low_precision((7, 0)) == {"int8": False, "fp8": False}  # V100
    assert low_precision((7, 5)) == {"int8": True, "fp8": False}  # T4
    assert low_precision((8, 9)) == {"int8": True, "fp8": True}  # L4, RTX 4090
    assert low_precision((9, 0)) == {"int8": True, "fp8": True}  # H100
    assert low_precision(None) == {"int8": None, "fp8": None}  # ROCm, MPS: unknown


def test_read_speed_times_the_largest_file_once_and_remembers(tmp_path, monkeypatch):
    from lib.hardware import details

    monkeypatch.setenv("KFIT_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    data.mkdir()
    assert details.read_speed(data)[0] is None  # nothing to read: unknown, with why
    (data / "small.bin").write_bytes(b"x" * 1000)
    speed, how = details.read_speed(data)
    assert speed is None and "under 4 MiB" in how
    (data / "big.bin").write_bytes(os.urandom(6 * 2**20))
    speed, how = details.read_speed(data)
    assert speed > 0 and "6 MiB of big.bin" == how
    assert details.read_speed(data) == (speed, "big.bin, cached")
    assert details.read_speed(tmp_path / "missing")[0] is None


def test_memory_bandwidth_is_measured_once_per_cpu(tmp_path, monkeypatch):
    from lib.hardware import details

    monkeypatch.setenv("KFIT_CACHE_DIR", str(tmp_path))
    first = details.memory_bandwidth("test cpu")
    assert first > 1e8  # bytes/s: any machine copies more than 100 MB/s
    monkeypatch.setattr(details, "_timed", lambda fn: pytest.fail("measured again"))
    assert details.memory_bandwidth("test cpu") == first


def test_gpu_power_reads_the_enforced_limit_and_the_draw():
    from lib.hardware.details import gpu_power

    torch_mod = types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_properties=lambda i: (_ for _ in ()).throw(
        RuntimeError("no uuid"))))
    nvml = fake_pynvml([("NVIDIA H100 80GB HBM3", 80 * 2**30, 79 * 2**30)],
                       telemetry={"power_limit_mw": 700000, "power_mw": 71234})
    assert gpu_power(0, pynvml_mod=nvml, torch_mod=torch_mod) == (700.0, 71.2)
    nvml.telemetry.clear()  # a board that reports neither
    assert gpu_power(0, pynvml_mod=nvml, torch_mod=torch_mod) == (None, None)
    assert gpu_power(0, pynvml_mod=fake_pynvml([], init_error=FakeLibraryNotFound()), torch_mod=torch_mod) == (None,
                                                                                                              None)


def test_check_hardware_json_carries_the_details_and_still_reads_back_as_a_profile(tmp_path, monkeypatch):
    from lib.hardware import details

    monkeypatch.setenv("KFIT_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "tokens.bin").write_bytes(os.urandom(5 * 2**20))
    p = _catalog_profile("a100", gpus=1)
    found = details.collect(p, data)
    assert found["data"]["directory"] == str(data) and found["data"]["read_bytes_per_s"] > 0
    assert found["cpu"]["memory_bandwidth_bytes_per_s"] > 1e8
    assert [set(g) for g in found["gpus"]] == [{"index", "power_limit_watts", "power_draw_watts", "int8", "fp8"}]
    assert found["gpus"][0]["fp8"] is False  # A100: 8.0
    json.dumps(found)  # plain JSON
    saved = {**json.loads(p.to_json()), "details": found}
    assert HardwareProfile.from_dict(saved) == p  # informational: left out of the profile
    assert HardwareProfile.from_dict({**saved, "details": None}) == p
    with pytest.raises(HardwareError, match="key 'details' must be a JSON object or null"):
        HardwareProfile.from_dict({**saved, "details": [1]})


def test_a_profile_with_its_own_speed_figures_plans_a_gpu_the_catalog_lacks(tmp_path):
    """HW= for a GPU the catalog does not know: renamed, an H100 profile has no step time; with the H100's
    figures as its own `speed` it predicts the H100's step, and a typo'd figure is one error naming it."""
    import json

    from lib import config as kc
    from lib.errors import HardwareError
    from lib.hardware import load_profile
    from lib.hyperparams import ModelDescription, resolve

    config = kc.make_defconfig("gpt2-tiny", out=tmp_path / ".config")
    h100 = hardware.resolve_hardware(gpu="h100")
    data = h100.to_dict()
    assert "speed" not in data["gpus"][0]  # a catalog or detected GPU's figures are the catalog's
    data["gpus"][0]["name"] = "Acme X1"
    path = tmp_path / "x1.json"

    def planned(speed):
        data["gpus"][0].pop("speed", None)
        if speed is not None:
            data["gpus"][0]["speed"] = speed
        path.write_text(json.dumps(data))
        profile = load_profile(str(path))
        return profile, resolve(config, profile, ModelDescription.from_config(config))

    _, unknown = planned(None)
    assert unknown.predicted_step_seconds is None
    peak = catalog.lookup("h100").peak
    speed = {"fp32_tflops": peak.fp32_tflops, "tf32_tflops": peak.tf32_tflops, "half_tflops": peak.half_tflops,
             "bandwidth_gbs": peak.bandwidth_gbs, "tdp_watts": 700, "link_gbs": peak.link_gbs}
    profile, own = planned(speed)
    reference = resolve(config, h100, ModelDescription.from_config(config))
    assert own.predicted_step_seconds == pytest.approx(reference.predicted_step_seconds)
    assert "the HW= profile's peaks" in own.reasons["step_time"]
    assert HardwareProfile.from_dict(json.loads(profile.to_json())) == profile  # the figures round-trip
    for bad, why in (({**speed, "half_tflops": 9.9e9}, r"'gpus\[0\].speed.half_tflops' must be above 0 and at most 100000"),
                     ({**speed, "bandwidth_gbs": -1}, "speed.bandwidth_gbs"),
                     ({k: v for k, v in speed.items() if k != "tdp_watts"}, "tdp_watts")):
        with pytest.raises(HardwareError, match=why):
            planned(bad)
