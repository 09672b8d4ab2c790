"""A catalog of GPUs that kfit can plan for without having them.

``GPU=h100 kfit ...`` plans a run for an H100 on any machine: from_catalog
(lib.hardware.simulate) turns a catalog entry into the same frozen
HardwareProfile that detection produces.  The figures are data, in
gpus.json beside this module (one entry per GPU, with its "notes"); this
module reads and checks them, and looks them up.  It never touches a device.

How the figures were chosen
---------------------------
* ``name`` is the string ``torch.cuda.get_device_properties(i).name`` reports, so
  a catalog profile and a detected one of the same card compare equal by name
  (``HardwareProfile.identical_gpu_count`` relies on that).
* ``total_bytes`` is what torch reports as ``total_memory`` (the CUDA runtime's
  ``totalGlobalMem``, the same number deviceQuery prints), NOT the marketing
  figure: an "80GB" H100 gives torch 79.65 GiB, an "80GB" A100 79.15 GiB.  The
  figure drifts by tens of MiB between driver versions (ECC, reserved regions),
  so treat the last few hundred MiB as approximate.  Where only a MiB-rounded
  figure was found (torch prints ``total_memory=...MB`` in MiB, rounded down)
  the entry's notes say so; where no torch figure was found they say what
  was used instead.
* ``source`` is the page cited for the entry's key facts; the entry's notes
  name the pages behind the other figures.  Compute capabilities are
  from NVIDIA's table, https://developer.nvidia.com/cuda-gpus (V100:
  https://developer.nvidia.com/cuda-legacy-gpus).
* ``tdp_watts`` is the board power limit of the form factor named in ``name``
  (SXM and PCIe parts of the same chip differ).  lib.steptime multiplies it by
  a run's predicted time for the plan's energy estimate (an upper bound: a run
  rarely holds the board at its limit).
* ``peak`` holds the throughput figures the step-time model (lib.steptime)
  divides counted work by: dense (not 2:4 sparse) TFLOP/s for plain fp32
  (non-tensor), TF32 tensor cores (None where there are none), bf16/fp16
  tensor cores with fp32 accumulation (the fp16 figure on V100 and T4, which
  lack bf16), FP8 tensor cores with fp32 accumulation (None before NVIDIA's
  compute capability 8.9 and AMD's CDNA 3; twice the bf16 rate where there,
  the L40S's datasheet a little more), and memory bandwidth in GB/s (10^9
  bytes/s), each from the page in ``peak.source`` (the FP8 figure's page in
  the entry's last note).  Vendors quote sparse figures first on Ampere and later:
  the dense ones are half of them.
* ``peak.link_gbs`` and ``peak.link`` describe how one GPU talks to its peers
  inside one machine for collectives (all-reduce of gradients, all-gather of
  sharded weights): the bandwidth in GB/s (10^9 bytes/s) that ONE GPU has in
  ONE direction, and the link's name ("NVLink 4", "PCIe 4.0 x16", ...).  It is
  the NVLink (or AMD Infinity Fabric) figure where the form factor named in
  ``name`` has one built in (SXM and OAM modules), else the PCIe link the card
  sits on.  The entry's notes name the page behind it.

  Why one direction: NVIDIA's and AMD's datasheets quote the total of both
  directions ("900 GB/s" for an H100 SXM is 18 NVLink 4 links x 25 GB/s x 2
  directions), but in a ring all-reduce every GPU sends and receives at the
  same time, each byte crossing a GPU's outgoing link once per phase, so the
  time is bytes x 2(n-1)/n over the ONE-direction figure.  NCCL's "bus
  bandwidth" (nccl-tests) is defined against exactly that figure.  So: H100
  SXM 900 -> 450, A100 SXM 600 -> 300, V100 SXM2 300 -> 150, B200 1800 -> 900
  (per-GPU NVLink totals by generation: https://wikimili.com/en/NVLink ).
  PCIe figures are the raw per-direction rate of a x16 link after 128b/130b
  encoding, before protocol overhead: 15.75 GB/s for Gen3, 31.5 for Gen4, 63
  for Gen5 (``PCIE3_X16_GBS`` ... below, the figures gpus.json uses;
  https://hpc-notes.pages.dev/reference/pcie, from Wikipedia's PCI Express
  table).  Protocol overhead leaves roughly 25-28 GB/s usable on Gen4 x16 (an
  estimate, covered by the efficiency below), and GPU-to-GPU traffic over PCIe
  may also cross the CPU's root complex or a PCIe switch.

  These are link peaks.  Collectives achieve a bus bandwidth of typically
  70-85% of them (an H100 SXM pair measured 380 of 450 GB/s one way with
  p2pBandwidthLatencyTest, https://github.com/NVIDIA/nccl/issues/1264 ); the
  step-time model (lib.steptime) applies that efficiency, not the catalog.

  Parts whose NVLink or Infinity Fabric needs an optional bridge (GeForce RTX
  3090: a 2-way NVLink bridge; Instinct MI210: Infinity Fabric Link bridges)
  are listed with their PCIe link: most machines with those cards, and every
  one with more GPUs than a bridge joins, talk over PCIe.  A bridged machine
  is faster than its entry says.
* ``NETWORK_GBS`` is the bandwidth between machines when a run spans several;
  see its comment.  ``link_bytes_per_s`` returns either figure in bytes/s.

CPUs
----
A CPU's throughput is measured on the machine (lib.steptime.device); its
power has no catalog: ``CPU_WATTS_PER_CORE`` is a documented guess.

A catalog GPU is planned with the CPU of the machine it is usually rented in
(its entry's ``host`` in gpus.json, with its source; ``HOSTS`` by key): each GPU's share of the vCPUs and RAM of the common cloud
instance with that GPU (an 8-GPU instance's share for the data-centre parts,
the smallest one-GPU size for the others), so ``GPU=h100`` sizes data loader
workers and CPU threads for an H100 machine, not for the machine planning.
Cards no large cloud rents (GeForce, Radeon PRO, Instinct MI210) get a stated
assumption.  ``HW=`` profiles carry their own CPU.

Default free memory
-------------------
A real GPU never offers its whole ``total_bytes`` to a training run: creating
the CUDA (or HIP) context takes a slice before the first tensor exists.
A catalog profile mimics this with ``CONTEXT_RESERVE_BYTES`` (768 MiB), and
detection subtracts the same figure from NVML's free memory (NVML is read
before training creates its context; ``torch.cuda.mem_get_info``, the fallback
without NVML and on ROCm, measures after creating one).  With lazy module
loading (the default since CUDA 11.7 / torch 1.13) a torch context costs
roughly 0.3-0.6 GiB on Ampere/Hopper-class cards, and the
cuBLAS/cuDNN handles created at the first matmul/conv add more that a fresh
``mem_get_info`` does not see yet.  768 MiB sits in the middle of the 0.5-1 GiB
range seen in practice; it is an estimate, not a measurement of any one card.
The same figure is used for ROCm.  Pass ``FREE_GB=`` to plan with another
figure.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HardwareError
from ..redact import shown
from ..units import MiB
from .strict import MAX_CC_PART, MAX_MEMORY_BYTES, MAX_NAME_CHARS, SPEED_LIMITS, describe_value, parse_int

# See "Default free memory" above.
CONTEXT_RESERVE_BYTES = 768 * MiB

# A CPU's power for energy estimates, a guess: an AMD EPYC 7763 is rated 280 W for 64 cores
# (4.4 W a core; https://www.amd.com/en/products/processors/server/epyc/7003-series/amd-epyc-7763.html),
# and desktop parts land between 4 and 8 W a core at their rated TDP.
CPU_WATTS_PER_CORE = 4.4

# PCIe x16, GB/s in one direction: lanes x transfer rate x 128/130 (encoding) / 8 bits, before
# protocol (TLP/DLLP) overhead; https://hpc-notes.pages.dev/reference/pcie (Wikipedia's table).
PCIE3_X16_GBS = 15.75  # 8 GT/s
PCIE4_X16_GBS = 31.5  # 16 GT/s
PCIE5_X16_GBS = 63.0  # 32 GT/s

# Between machines, GB/s in one direction for each GPU, when a run spans several machines.  A
# conservative default: one 200 Gb/s port per GPU (InfiniBand HDR or NDR200) = 25 GB/s.  JUPITER's
# 4x GH200 nodes have 4 NDR200 ports, one per GPU
# (https://apps.fz-juelich.de/jsc/hps/jupiter/configuration.html); H100/H200 clusters often have one
# 400 Gb/s NDR port per GPU (50 GB/s: NVIDIA's HGX H200 MLPerf system lists 10 x 400 Gb/s for 8 GPUs,
# the h200 entry's source in gpus.json),
# and cloud VMs without RDMA may have far less (a 100 Gb/s Ethernet NIC shared by 8 GPUs is ~1.6 GB/s
# each).  25 GB/s under-promises on the best clusters and over-promises on Ethernet-only ones.
NETWORK_GBS = 25.0


@dataclass(frozen=True)
class Host:
    """The CPU and RAM each GPU of a catalog machine comes with (see "CPUs" above)."""

    machine: str  # the machine the figures are a share of
    vcpus: int  # logical CPUs per GPU
    smt: bool  # two logical CPUs to a physical core (cloud x86 vCPUs are hyperthreads)
    ram_gib: int  # per GPU
    source: str  # the instance table it is read from, or why it is assumed


def host(key: str) -> Host:
    """The CPU and RAM per GPU that catalog GPU `key` (catalog_keys()) is planned with: its entry's "host" in
    gpus.json, the instance's vCPUs and memory divided by its GPUs, from the cloud's instance table (its
    source), or a stated assumption."""
    return HOSTS[key]


@dataclass(frozen=True)
class Peak:
    """Dense peak throughput (TFLOP/s), memory bandwidth and peer link bandwidth (GB/s, 10^9
    bytes/s), with their source (the link's page is in the entry's notes, gpus.json)."""

    fp32_tflops: float  # plain fp32 (CUDA cores / vector units)
    tf32_tflops: float | None  # TF32 tensor cores; None without them
    half_tflops: float  # bf16 (fp16 where there is no bf16) tensor cores, fp32 accumulate
    fp8_tflops: float | None  # FP8 tensor cores, fp32 accumulate; None without them (before Ada/Hopper, CDNA 3)
    bandwidth_gbs: float
    source: str
    link_gbs: float  # one GPU to its peers in one machine, ONE direction (see the module docstring)
    link: str  # the link's name: "NVLink 4", "PCIe 4.0 x16", ...


@dataclass(frozen=True)
class CatalogGPU:
    key: str
    name: str  # as torch.cuda.get_device_properties(i).name reports it
    vendor: str  # "nvidia" | "amd"
    backend: str  # "cuda" | "rocm"
    total_bytes: int  # as torch reports total_memory (see module docstring)
    compute_capability: tuple[int, int] | None  # NVIDIA only
    arch: str  # "sm_90", "gfx90a", ...
    bf16: bool
    tf32: bool
    tdp_watts: int
    memory_type: str
    source: str  # URL of the spec cited for this entry
    peak: Peak  # throughput and bandwidth, for lib.steptime (see the module docstring)
    host: Host  # the CPU and RAM each GPU comes with where it is usually rented (see "CPUs" above)


# --------------------------------------------------------------------------
# The entries: gpus.json, one object per GPU (what the module docstring calls an entry's notes is its
# "notes" list). Read strictly: a missing, extra or mistyped field is an error naming the entry.

DATA_FILE = Path(__file__).with_name("gpus.json")


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(v: Any, limit: float) -> bool:
    """A number above 0 and at most `limit` (strict.py's bounds, the same as a HW= profile's): never NaN nor
    an infinity."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= limit


def _figure(name: str, optional: bool = False) -> tuple:
    limit = SPEED_LIMITS[name]
    return ((lambda v: (optional and v is None) or _positive(v, limit)),
            f"a number above 0 and at most {limit:g}" + (" or null" if optional else ""))


# What a field must hold: (its test, its words in an error).
_TEXT = (lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string")
_NAME = (lambda v: isinstance(v, str) and bool(v.strip()) and len(v) <= MAX_NAME_CHARS,
         f"a non-empty string of at most {MAX_NAME_CHARS} characters")
_BYTES = (lambda v: _whole(v) and 0 < v <= MAX_MEMORY_BYTES, f"an integer above 0 and at most {MAX_MEMORY_BYTES:,}")
_WATTS = (lambda v: _whole(v) and _positive(v, SPEED_LIMITS["tdp_watts"]),
          f"an integer above 0 and at most {SPEED_LIMITS['tdp_watts']:g}")
_PEAK_FIELDS = {"fp32_tflops": _figure("fp32_tflops"), "tf32_tflops": _figure("tf32_tflops", optional=True),
                "half_tflops": _figure("half_tflops"), "fp8_tflops": _figure("fp8_tflops", optional=True),
                "bandwidth_gbs": _figure("bandwidth_gbs"), "source": _TEXT, "link_gbs": _figure("link_gbs"),
                "link": _NAME}
_HOST_FIELDS = {"machine": _NAME, "vcpus": (lambda v: _whole(v) and 0 < v <= 4096, "an integer from 1 to 4096"),
                "smt": (lambda v: isinstance(v, bool), "true or false"),
                "ram_gib": (lambda v: _whole(v) and 0 < v <= 65536, "an integer from 1 to 65536"), "source": _TEXT}
_COMMON_FIELDS = {"key": _NAME, "name": _NAME, "vendor": _TEXT, "total_bytes": _BYTES, "tdp_watts": _WATTS,
                  "memory_type": _TEXT, "source": _TEXT, "peak": (lambda v: isinstance(v, dict), "an object"),
                  "host": (lambda v: isinstance(v, dict), "an object"),
                  "notes": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
                            "a list of strings")}
_VENDOR_FIELDS = {
    "nvidia": {"compute_capability": (lambda v: isinstance(v, list) and len(v) == 2 and all(
        _whole(n) and 0 <= n <= MAX_CC_PART for n in v), f"[major, minor], two integers from 0 to {MAX_CC_PART}")},
    "amd": {"arch": _NAME},
}


def _checked(d: dict, fields: dict, where: str) -> dict:
    """d has exactly `fields`, each passing its test; else a HardwareError naming `where` and the field."""
    missing = [k for k in fields if k not in d]
    extra = sorted(str(k) for k in d if k not in fields)
    if missing or extra:
        raise HardwareError(f"{where}: " + "; ".join(
            ([f"missing field(s) {', '.join(missing)}"] if missing else [])
            + ([f"unknown field(s) {', '.join(extra)}"] if extra else [])))
    for k, (test, words) in fields.items():
        if not test(d[k]):
            raise HardwareError(f"{where}: field '{k}' must be {words}, got {describe_value(d[k])}")
    return d


def _entry(d: Any, where: str) -> CatalogGPU:
    """One entry of gpus.json, checked, as a CatalogGPU: what the vendor implies (backend, arch from the
    compute capability, bf16 and TF32) is derived here, not written in the file."""
    if not isinstance(d, dict):
        raise HardwareError(f"{where} must be an object, got {describe_value(d)}")
    if isinstance(d.get("key"), str):
        where += f" ('{shown(d['key'], 60)}')"
    vendor = d.get("vendor")
    if vendor not in _VENDOR_FIELDS:
        raise HardwareError(f"{where}: field 'vendor' must be one of {', '.join(_VENDOR_FIELDS)}, "
                            f"got {describe_value(vendor)}")
    d = _checked(d, {**_COMMON_FIELDS, **_VENDOR_FIELDS[vendor]}, where)
    peak = Peak(**_checked(d["peak"], _PEAK_FIELDS, f"{where}, peak"))
    common = dict(key=d["key"], name=d["name"], vendor=vendor, total_bytes=d["total_bytes"],
                  tdp_watts=d["tdp_watts"], memory_type=d["memory_type"], source=d["source"], peak=peak,
                  host=Host(**_checked(d["host"], _HOST_FIELDS, f"{where}, host")))
    if vendor == "nvidia":
        major, minor = cc = tuple(d["compute_capability"])
        ampere_or_later = cc >= (8, 0)
        # bf16 and TF32 tensor cores arrived with Ampere (cc 8.0); V100 and T4
        # have neither, so runs on them take the fp16 + loss-scaling path.
        return CatalogGPU(**common, backend="cuda", compute_capability=cc, arch=f"sm_{major}{minor}",
                          bf16=ampere_or_later, tf32=ampere_or_later)
    return CatalogGPU(**common, backend="rocm", compute_capability=None, arch=d["arch"],
                      bf16=True,  # every AMD entry is CDNA2, CDNA3 or RDNA3, which have bf16
                      tf32=False)  # TF32 is an NVIDIA tensor-core format


def load_entries(path: Path = DATA_FILE) -> tuple[CatalogGPU, ...]:
    """The catalog's entries from `path` (gpus.json), in file order, checked; keys must be unique."""
    data = json.loads(path.read_text(), parse_int=parse_int)  # a 5,000-digit integer: refused by its field's test
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list) or not data["gpus"]:
        raise HardwareError(f"{path}: must be an object whose 'gpus' is a non-empty list of entries")
    entries = tuple(_entry(d, f"{path}: entry {i}") for i, d in enumerate(data["gpus"]))
    keys = [e.key for e in entries]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise HardwareError(f"{path}: entry {twice[0]!r} is listed more than once")
    return entries


_ENTRIES = load_entries()

CATALOG: dict[str, CatalogGPU] = {e.key: e for e in _ENTRIES}
HOSTS: dict[str, Host] = {e.key: e.host for e in _ENTRIES}

# Other spellings people type.  "a100" means the 80GB part: it replaced the 40GB
# launch part across the market (glennklockwood.com page above) and is what
# clouds rent today; ask for "a100-40gb" explicitly for the older card.
ALIASES: dict[str, str] = {
    "h100-80gb": "h100",
    "h100-sxm5-96gb": "h100-96gb",
    "h100-hbm2e": "h100-96gb",
    "h100-pcie-80gb": "h100-pcie",
    "h100-nvl-94gb": "h100-nvl",
    "instinct-mi325x": "mi325x",
    "mi325x-256gb": "mi325x",
    "h100-sxm": "h100",
    "h100-sxm5": "h100",
    "h200-141gb": "h200",
    "h200-sxm": "h200",
    "h200-sxm5": "h200",
    "gh200-96gb": "gh200",
    "gh200-480gb": "gh200",
    "grace-hopper": "gh200",
    "a100": "a100-80gb",
    "a100-80g": "a100-80gb",
    "a100-sxm4-80gb": "a100-80gb",
    "a100-40g": "a100-40gb",
    "a100-sxm4-40gb": "a100-40gb",
    "a10g-24gb": "a10g",
    "l4-24gb": "l4",
    "l40s-48gb": "l40s",
    "4090": "rtx4090",
    "rtx-4090": "rtx4090",
    "geforce-rtx-4090": "rtx4090",
    "3090": "rtx3090",
    "rtx-3090": "rtx3090",
    "geforce-rtx-3090": "rtx3090",
    "tesla-t4": "t4",
    "t4-16gb": "t4",
    "v100-16gb": "v100",
    "v100-sxm2-16gb": "v100",
    "tesla-v100": "v100",
    "b200-180gb": "b200",
    "radeon-pro-w7900": "w7900",
    "pro-w7900": "w7900",
    "instinct-mi210": "mi210",
    "instinct-mi300x": "mi300x",
    "mi300x-192gb": "mi300x",
}

# Keys, aliases and torch names in one table: the normalized spelling -> key.
_LOOKUP: dict[str, str] = {}


def _normalize(text: str) -> str:
    """Lowercase, with runs of spaces/underscores/dashes as one dash."""
    return re.sub(r"[\s_\-]+", "-", text.strip().lower())


for _e in _ENTRIES:
    _LOOKUP[_normalize(_e.key)] = _e.key
    _LOOKUP[_normalize(_e.name)] = _e.key  # "NVIDIA H100 80GB HBM3" works too
for _alias, _key in ALIASES.items():
    _LOOKUP[_normalize(_alias)] = _key


def catalog_keys() -> list[str]:
    """The canonical keys, sorted."""
    return sorted(CATALOG)


def lookup(key: str) -> CatalogGPU:
    """The entry for a key, an alias or a torch device name (case-insensitive).

    Raises HardwareError listing the valid keys when nothing matches.
    """
    if not isinstance(key, str) or not key.strip():
        raise HardwareError(
            f"GPU={repr(key) if not isinstance(key, str) else repr(shown(key, 60))} is not a catalog key: use one of {', '.join(catalog_keys())} "
            "(or 'cpu' for a CPU-only plan)."
        )
    found = _LOOKUP.get(_normalize(key))
    if found is not None:
        return CATALOG[found]
    close = difflib.get_close_matches(_normalize(key), list(_LOOKUP), n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(_LOOKUP[c]) for c in close)}?" if close else ""
    raise HardwareError(
        f"unknown GPU '{shown(key, 60)}' in the catalog.{hint} Valid keys: {', '.join(catalog_keys())} "
        f"(aliases: {', '.join(sorted(ALIASES))}), or 'cpu' for a CPU-only plan. "
        "For a GPU not in the catalog, describe it in a profile file and pass HW=<file.json>."
    )


def link_bytes_per_s(name_or_key: str, *, across_machines: bool = False) -> float | None:
    """The bandwidth, in bytes/s and ONE direction, that one GPU has for collectives.

    ``name_or_key`` is a catalog key, an alias or a torch device name, as for :func:`lookup`.
    Within one machine it is the entry's ``peak.link_gbs`` (NVLink, Infinity Fabric or PCIe);
    ``across_machines=True`` gives the network between machines, ``NETWORK_GBS`` - or the
    GPU's own link where that is slower (a T4's PCIe 3.0 x16, 15.75 GB/s, also carries its
    network traffic).  A link peak, not an achieved rate: see the module docstring.

    None for a GPU that is not in the catalog (no exception): the caller has no figure for it.
    """
    try:
        entry = lookup(name_or_key)
    except HardwareError:
        return None
    link = entry.peak.link_gbs * 1e9
    return min(NETWORK_GBS * 1e9, link) if across_machines else link
