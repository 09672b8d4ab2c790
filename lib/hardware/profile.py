"""The frozen HardwareProfile every other module consumes, its JSON form, and
load_profile (HW=profile.json).

Units: every ``*_bytes`` field is bytes; every ``*_gb`` argument is GiB
(2**30 bytes), the unit :func:`gib` prints, so a number copied from kfit's
output means the same thing when typed back in.

Profile files are written by hand too, so reading one is strict: a missing,
extra or mistyped key raises HardwareError naming it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from dataclasses import dataclass
from typing import Any

from ..errors import HardwareError
from ..redact import escaped, shown
from ..units import format_bytes, gib

from .strict import (
    MAX_CC_PART, MAX_CORES, MAX_DISK_BYTES, MAX_GPUS, MAX_MEMORY_BYTES, MAX_NOTES, MAX_TEXT_CHARS, SPEED_LIMITS,
    bad_key, check_keys, describe_value, parse_int, read_bool, read_int, read_list, read_number, read_str,
)

VENDORS = ("nvidia", "amd", "apple")
BACKENDS = ("cuda", "rocm", "mps")
_BACKEND_OF_VENDOR = {"nvidia": "cuda", "amd": "rocm", "apple": "mps"}
MAX_PROFILE_BYTES = 2**20  # a saved profile is a few KiB: HW= naming anything larger is a mistake


def format_size(n_bytes: int, mb_decimals: int = 1) -> str:
    """lib.units.format_bytes with one MiB decimal by default: '1.23GiB' from a GiB up, else '37.1MiB'.
    Kept for the callers that import it from lib.hardware (the planner, the command line)."""
    return format_bytes(n_bytes, mb_decimals)


# The bounds of every number and string a profile gives (SPEED_LIMITS: its GPU speed figures, kept importable
# from here) are stated once, in strict.py beside the readers that apply them.
_MEMORY = "bytes; 4 PiB"


@dataclass(frozen=True)
class GPUSpeed:
    """A GPU's own speed figures in a HW= profile (dense peaks, as the GPU catalog's entries hold them): they
    make a GPU the catalog lacks plannable, and override the catalog's for one it has."""

    fp32_tflops: float
    half_tflops: float  # bf16 (fp16 where there is no bf16) tensor cores
    bandwidth_gbs: float  # memory, GB/s (10^9 bytes/s)
    tdp_watts: float
    tf32_tflops: float | None = None  # None: no TF32 tensor cores
    link_gbs: float | None = None  # to its peers in one machine, one direction; None: the catalog's, else PCIe's
    fp8_tflops: float | None = None  # FP8 tensor cores; None: none


@dataclass(frozen=True)
class GPUInfo:
    index: int  # torch device index (after CUDA_VISIBLE_DEVICES)
    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    vendor: str  # "nvidia" | "amd" | "apple"
    backend: str  # "cuda" | "rocm" | "mps"
    total_bytes: int
    free_bytes: int  # NVML free less catalog.CONTEXT_RESERVE_BYTES; torch.cuda.mem_get_info without NVML (and on ROCm)
    compute_capability: tuple[int, int] | None  # NVIDIA (major, minor); None for AMD/Apple
    arch: str  # "sm_90", "gfx90a", "gfx1100", "apple"
    supports_bf16: bool
    supports_tf32: bool  # NVIDIA cc >= 8.0 only
    speed: GPUSpeed | None = None  # a HW= profile's own speed figures; None: the GPU catalog's, by name


@dataclass(frozen=True)
class CPUInfo:
    name: str
    physical_cores: int
    logical_cores: int
    ram_total_bytes: int
    ram_available_bytes: int
    # Usable cores other processes left idle when this was detected (host.cpu_load); None: not measured
    # (a catalog machine, an older profile). lib.threads sizes the CPU threads from it.
    idle_cores: float | None = None


@dataclass(frozen=True)
class HardwareProfile:
    gpus: tuple[GPUInfo, ...]
    cpu: CPUInfo
    disk_free_bytes: int
    on_battery: bool | None  # None = no battery
    torch_version: str
    cuda_version: str | None
    hip_version: str | None
    source: str  # "detected", "file:<path>", "catalog:<key>"
    notes: tuple[str, ...]  # what a user should know, each naming the fix

    @property
    def accelerator(self) -> str:
        """"cuda" | "rocm" | "mps" | "cpu"."""
        return self.gpus[0].backend if self.gpus else "cpu"

    @property
    def primary_gpu(self) -> GPUInfo | None:
        return self.gpus[0] if self.gpus else None

    @property
    def identical_gpu_count(self) -> int:
        """GPUs with the same name and total memory as gpus[0]; 0 when none."""
        if not self.gpus:
            return 0
        first = self.gpus[0]
        return sum(1 for g in self.gpus if g.name == first.name and g.total_bytes == first.total_bytes)

    def for_processes(self, processes: int) -> tuple[HardwareProfile, str | None]:
        """The profile that `processes` training processes on this machine plan against, and a note when it
        is not GPU 0's: process i uses GPU i (they share all GPUs when more), and every process runs the
        same plan, so where those GPUs differ the plan is sized for the smallest, which takes their places."""
        used = self.gpus[:max(1, min(processes, len(self.gpus)))]
        if len({(g.name, g.total_bytes) for g in used}) <= 1:
            return self, None
        smallest = min(used, key=lambda g: (g.free_bytes, g.total_bytes))
        names = ", ".join(f"GPU {g.index} {g.name}" for g in sorted(used, key=lambda g: g.index))
        note = (f"the {len(used)} GPUs the processes use differ ({names}): the plan is sized for the smallest, "
                f"GPU {smallest.index} {smallest.name} ({gib(smallest.free_bytes):.1f}GiB free), as every process "
                "runs it; set CUDA_VISIBLE_DEVICES to identical GPUs to use the larger ones fully")
        sized = tuple(dataclasses.replace(smallest, index=g.index) for g in used)
        return dataclasses.replace(self, gpus=sized + self.gpus[len(used):]), note

    def to_dict(self) -> dict:
        """Plain JSON-ready data (lists, not tuples); from_dict reverses it."""
        return {
            "gpus": [_gpu_to_dict(g) for g in self.gpus],
            "cpu": dataclasses.asdict(self.cpu),
            "disk_free_bytes": self.disk_free_bytes,
            "on_battery": self.on_battery,
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "hip_version": self.hip_version,
            "source": self.source,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, d: Any) -> HardwareProfile:
        """Strict: a missing, extra or mistyped key raises HardwareError naming it."""
        return _profile_from_dict(d, origin="hardware profile")


def _gpu_to_dict(g: GPUInfo) -> dict:
    d = dataclasses.asdict(g)
    d["compute_capability"] = list(g.compute_capability) if g.compute_capability is not None else None
    if g.speed is None:  # a detected GPU's figures are the catalog's: the profile says nothing of them
        del d["speed"]
    return d


_SPEED_FIELDS = tuple(f.name for f in dataclasses.fields(GPUSpeed))
_SPEED_OPTIONAL = ("tf32_tflops", "link_gbs", "fp8_tflops")


def _speed_from_dict(origin: str, where: str, d: Any) -> GPUSpeed:
    check_keys(origin, where, d, _SPEED_FIELDS, optional=_SPEED_OPTIONAL)
    figures = {}
    for name in _SPEED_FIELDS:
        figures[name] = read_number(origin, f"{where}.{name}", d.get(name), optional=name in _SPEED_OPTIONAL,
                                    above=True, maximum=SPEED_LIMITS[name],
                                    unit="dense peak, as the GPU catalog's entries hold them")
    return GPUSpeed(**figures)


_GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GPUInfo))
_CPU_FIELDS = tuple(f.name for f in dataclasses.fields(CPUInfo))
_PROFILE_FIELDS = tuple(f.name for f in dataclasses.fields(HardwareProfile))


def _gpu_from_dict(origin: str, where: str, d: Any, position: int) -> GPUInfo:
    check_keys(origin, where, d, _GPU_FIELDS, optional=("speed",))
    k = lambda name: f"{where}.{name}"  # noqa: E731
    index = read_int(origin, k("index"), d["index"], maximum=MAX_GPUS - 1)
    if index != position:
        raise bad_key(origin, k("index"), f"must be {position} (GPUs are listed in torch device order), got {index}")
    vendor = read_str(origin, k("vendor"), d["vendor"])
    if vendor not in VENDORS:
        raise bad_key(origin, k("vendor"), f"must be one of {', '.join(VENDORS)}, got '{shown(vendor, 60)}'")
    backend = read_str(origin, k("backend"), d["backend"])
    if backend != _BACKEND_OF_VENDOR[vendor]:
        raise bad_key(origin, k("backend"), f"must be {_BACKEND_OF_VENDOR[vendor]!r} for vendor {vendor!r}, "
                      f"got '{shown(backend, 60)}'")
    total = read_int(origin, k("total_bytes"), d["total_bytes"], minimum=1, maximum=MAX_MEMORY_BYTES, unit=_MEMORY)
    free = read_int(origin, k("free_bytes"), d["free_bytes"], maximum=MAX_MEMORY_BYTES, unit=_MEMORY)
    if free > total:
        raise bad_key(origin, k("free_bytes"), f"({free}) must not exceed total_bytes ({total})")
    cc_raw = d["compute_capability"]
    cc: tuple[int, int] | None
    if cc_raw is None:
        cc = None
    else:
        if (
            not isinstance(cc_raw, (list, tuple))
            or len(cc_raw) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_CC_PART for x in cc_raw)
        ):
            raise bad_key(origin, k("compute_capability"), f"must be [major, minor], two integers from 0 to "
                          f"{MAX_CC_PART} (e.g. [9, 0] for an H100), or null, got {describe_value(cc_raw)}")
        cc = (cc_raw[0], cc_raw[1])
    if vendor == "nvidia" and cc is None:
        raise bad_key(origin, k("compute_capability"), "must be [major, minor] for an NVIDIA GPU (e.g. [9, 0] for an H100)")
    if vendor != "nvidia" and cc is not None:
        raise bad_key(origin, k("compute_capability"), f"must be null for vendor {vendor!r} (it is an NVIDIA notion)")
    bf16 = read_bool(origin, k("supports_bf16"), d["supports_bf16"])
    tf32 = read_bool(origin, k("supports_tf32"), d["supports_tf32"])
    if tf32 and (cc is None or cc < (8, 0)):
        raise bad_key(origin, k("supports_tf32"), "can only be true for an NVIDIA GPU with compute capability >= 8.0")
    return GPUInfo(
        index=index,
        name=read_str(origin, k("name"), d["name"]),
        vendor=vendor,
        backend=backend,
        total_bytes=total,
        free_bytes=free,
        compute_capability=cc,
        arch=read_str(origin, k("arch"), d["arch"]),
        supports_bf16=bf16,
        supports_tf32=tf32,
        speed=_speed_from_dict(origin, k("speed"), d["speed"]) if d.get("speed") is not None else None,
    )


def _cpu_from_dict(origin: str, d: Any) -> CPUInfo:
    check_keys(origin, "cpu", d, _CPU_FIELDS, optional=("idle_cores",))
    ram_total = read_int(origin, "cpu.ram_total_bytes", d["ram_total_bytes"], minimum=1, maximum=MAX_MEMORY_BYTES,
                         unit=_MEMORY)
    ram_avail = read_int(origin, "cpu.ram_available_bytes", d["ram_available_bytes"], maximum=MAX_MEMORY_BYTES,
                         unit=_MEMORY)
    if ram_avail > ram_total:
        raise bad_key(origin, "cpu.ram_available_bytes", f"({ram_avail}) must not exceed ram_total_bytes ({ram_total})")
    return CPUInfo(
        name=read_str(origin, "cpu.name", d["name"]),
        physical_cores=read_int(origin, "cpu.physical_cores", d["physical_cores"], minimum=1, maximum=MAX_CORES),
        logical_cores=read_int(origin, "cpu.logical_cores", d["logical_cores"], minimum=1, maximum=MAX_CORES),
        ram_total_bytes=ram_total,
        ram_available_bytes=ram_avail,
        idle_cores=read_number(origin, "cpu.idle_cores", d.get("idle_cores"), optional=True, maximum=MAX_CORES),
    )


# What `make check-hardware FORMAT=json` adds beside the profile (lib/hardware/details.py: measured here,
# informational): read back as an object and left out of the profile, so a saved report plans as HW=.
DETAILS_KEY = "details"


def _profile_from_dict(d: Any, *, origin: str) -> HardwareProfile:
    check_keys(origin, "", d, _PROFILE_FIELDS + (DETAILS_KEY,), optional=(DETAILS_KEY,))
    if d.get(DETAILS_KEY) is not None and not isinstance(d[DETAILS_KEY], dict):
        raise bad_key(origin, DETAILS_KEY, "must be a JSON object or null (what check-hardware measured)")
    gpus = tuple(
        _gpu_from_dict(origin, f"gpus[{i}]", g, i)
        for i, g in enumerate(read_list(origin, "gpus", d["gpus"], max_items=MAX_GPUS))
    )
    backends = {g.backend for g in gpus}
    if len(backends) > 1:
        raise bad_key(origin, "gpus", f"mixes backends ({', '.join(sorted(backends))}); one torch build drives one backend")
    notes = []
    for i, n in enumerate(read_list(origin, "notes", d["notes"], max_items=MAX_NOTES)):
        notes.append(read_str(origin, f"notes[{i}]", n, max_chars=MAX_TEXT_CHARS))
    return HardwareProfile(
        gpus=gpus,
        cpu=_cpu_from_dict(origin, d["cpu"]),
        disk_free_bytes=read_int(origin, "disk_free_bytes", d["disk_free_bytes"], maximum=MAX_DISK_BYTES,
                                 unit="bytes; 1 EiB"),
        on_battery=read_bool(origin, "on_battery", d["on_battery"], optional=True),
        torch_version=read_str(origin, "torch_version", d["torch_version"]),
        cuda_version=read_str(origin, "cuda_version", d["cuda_version"], optional=True),
        hip_version=read_str(origin, "hip_version", d["hip_version"], optional=True),
        source=read_str(origin, "source", d["source"], max_chars=MAX_TEXT_CHARS),
        notes=tuple(notes),
    )


def load_profile(path: str) -> HardwareProfile:
    """HW=profile.json: a profile saved with to_json (or written by hand)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a device or a pipe could be read without end, or block
            raise HardwareError(f"hardware profile {path!r} is not a regular file: HW= must name a JSON file "
                                "written by 'make check-hardware FORMAT=json > FILE'.")
        with open(path, "rb") as f:
            data = f.read(MAX_PROFILE_BYTES + 1)
        if len(data) > MAX_PROFILE_BYTES:
            raise HardwareError(f"hardware profile {path!r} is larger than {MAX_PROFILE_BYTES // 2**20} MiB, "
                                "which no profile is (they are a few KiB): check the HW= path, or regenerate it "
                                "with 'make check-hardware FORMAT=json > FILE'.")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise HardwareError(
            f"hardware profile {path!r} does not exist: check the HW= path, or save one from a "
            "machine with 'make check-hardware FORMAT=json > FILE'."
        ) from None
    except UnicodeDecodeError:
        raise HardwareError(
            f"hardware profile {path!r} is not UTF-8 text: HW= must name a JSON file written by "
            "'make check-hardware FORMAT=json > FILE'."
        ) from None
    except OSError as e:
        raise HardwareError(f"hardware profile {path!r} cannot be read ({e.strerror}): check the HW= path and its permissions.") from None
    try:
        data = json.loads(text, parse_int=parse_int)  # an integer of too many digits: refused by its key's reader
    except RecursionError:
        raise HardwareError(f"hardware profile {path!r} nests its JSON too deeply to be a profile: regenerate it "
                            "with 'make check-hardware FORMAT=json > FILE'.") from None
    except json.JSONDecodeError as e:
        raise HardwareError(
            f"hardware profile {path!r} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}): "
            "fix the file, or regenerate it with 'make check-hardware FORMAT=json > FILE'."
        ) from None
    except ValueError as e:  # what the parser refuses beyond JSON's grammar (Python's limit on an integer's digits)
        raise HardwareError(
            f"hardware profile {path!r} holds a value Python cannot read ({shown(e, 120)}): fix the file, or "
            "regenerate it with 'make check-hardware FORMAT=json > FILE'."
        ) from None
    profile = _profile_from_dict(data, origin=f"hardware profile {path!r}")
    return dataclasses.replace(profile, source=f"file:{escaped(path)}")
