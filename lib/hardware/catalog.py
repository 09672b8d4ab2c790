"""A catalog of GPUs that kfit can plan for without having them.

``GPU=h100 kfit ...`` plans a run for an H100 on any machine: from_catalog
(lib.hardware.simulate) turns a catalog entry into the same frozen
HardwareProfile that detection produces.  This module is plain data plus a
lookup; it never touches a device.

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
  the entry says so; where no torch figure was found the comment says what
  was used instead.
* ``source`` is the page cited for the entry's key facts; a comment above each
  entry names the pages behind the other figures.  Compute capabilities are
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
  lack bf16), and memory bandwidth in GB/s (10^9 bytes/s), each from the page
  in ``peak.source``.  Vendors quote sparse figures first on Ampere and later:
  the dense ones are half of them.
* ``peak.link_gbs`` and ``peak.link`` describe how one GPU talks to its peers
  inside one machine for collectives (all-reduce of gradients, all-gather of
  sharded weights): the bandwidth in GB/s (10^9 bytes/s) that ONE GPU has in
  ONE direction, and the link's name ("NVLink 4", "PCIe 4.0 x16", ...).  It is
  the NVLink (or AMD Infinity Fabric) figure where the form factor named in
  ``name`` has one built in (SXM and OAM modules), else the PCIe link the card
  sits on.  The comment above each entry names the page behind it.

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
  for Gen5 (``PCIE3_X16_GBS`` ... below;
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
import re
from dataclasses import dataclass

from ..errors import HardwareError

MiB = 2**20
GiB = 2**30

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
# _H200_MLPERF below),
# and cloud VMs without RDMA may have far less (a 100 Gb/s Ethernet NIC shared by 8 GPUs is ~1.6 GB/s
# each).  25 GB/s under-promises on the best clusters and over-promises on Ethernet-only ones.
NETWORK_GBS = 25.0


@dataclass(frozen=True)
class Peak:
    """Dense peak throughput (TFLOP/s), memory bandwidth and peer link bandwidth (GB/s, 10^9
    bytes/s), with their source (the link's page is in the comment above each entry)."""

    fp32_tflops: float  # plain fp32 (CUDA cores / vector units)
    tf32_tflops: float | None  # TF32 tensor cores; None without them
    half_tflops: float  # bf16 (fp16 where there is no bf16) tensor cores, fp32 accumulate
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


def _nvidia(key, name, total_bytes, cc, tdp_watts, memory_type, source, peak):
    major, minor = cc
    ampere_or_later = cc >= (8, 0)
    return CatalogGPU(
        key=key,
        name=name,
        vendor="nvidia",
        backend="cuda",
        total_bytes=total_bytes,
        compute_capability=cc,
        arch=f"sm_{major}{minor}",
        # bf16 and TF32 tensor cores arrived with Ampere (cc 8.0); V100 and T4
        # have neither, so runs on them take the fp16 + loss-scaling path.
        bf16=ampere_or_later,
        tf32=ampere_or_later,
        tdp_watts=tdp_watts,
        memory_type=memory_type,
        source=source,
        peak=peak,
    )


def _amd(key, name, total_bytes, arch, tdp_watts, memory_type, source, peak):
    return CatalogGPU(
        key=key,
        name=name,
        vendor="amd",
        backend="rocm",
        total_bytes=total_bytes,
        compute_capability=None,
        arch=arch,
        bf16=True,  # every AMD entry is CDNA2, CDNA3 or RDNA3, which have bf16
        tf32=False,  # TF32 is an NVIDIA tensor-core format
        tdp_watts=tdp_watts,
        memory_type=memory_type,
        source=source,
        peak=peak,
    )


_NVIDIA_DATACENTER = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_A100 = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_GA102 = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
_T4 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"
_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_H200_MLPERF = ("https://raw.githubusercontent.com/mlcommons/inference_results_v4.1/main/closed/NVIDIA/"
                "systems/H200-SXM-141GBx8_TRT_MaxQ.json")
_L40S = "https://www.mullet.se/product.html?product_id=355414"

_ENTRIES = (
    # H100 SXM5 80GB.  85520809984 bytes is the total torch/CUDA reports (nvidia-smi:
    # 81559 MiB), quoted in the PR cited.  700 W:
    # https://hawkvelt.id.au/post/2024-08-04-nvidia-h100 ; cc 9.0: cuda-gpus.
    # Peak: the H100 SXM datasheet (sparse TF32/bf16 halved); also
    # https://glennklockwood.com/garden/processors/h100 .
    # Link: NVLink 4, 18 links, "900 GB/s" in the datasheet (both directions) -> 450.
    _nvidia(
        "h100", "NVIDIA H100 80GB HBM3", 85520809984, (9, 0), 700, "HBM3",
        "https://github.com/modal-labs/modal-client/pull/2797",
        Peak(66.9, 494.7, 989.4, 3350, _NVIDIA_DATACENTER, link_gbs=450, link="NVLink 4"),
    ),
    # H200 SXM 141GB: the H100's GH100 GPU (132 SMs) with 141 GB HBM3e.  torch prints
    # total_memory=143156MB (MiB, rounded down; approximate) for name 'NVIDIA H200', cc 9.0, in a
    # comment of deploy/modal/src/llm/vllm/vlm/skywork_r1v.py in https://github.com/ai-bot-pro/achatbot
    # (nvidia-smi shows 143771 MiB).  700 W ("H200 TGP 700W") and "18x 4th Gen
    # NVLink, 900GB/s": NVIDIA's MLPerf system description cited.
    # Peak: compute as the H100 SXM (the page in peak.source: "H200 GPUs are the same as H100
    # GPUs ..., just with 144 GB of HBM3e"); 4.8 TB/s: https://www.aiminingco.com/gpu/h200/specs .
    # Link: NVLink 4, 900 GB/s both directions -> 450.
    _nvidia(
        "h200", "NVIDIA H200", 143156 * MiB, (9, 0), 700, "HBM3e",
        _H200_MLPERF,
        Peak(66.9, 494.7, 989.4, 4800, "https://glennklockwood.com/garden/processors/h100",
             link_gbs=450, link="NVLink 4"),
    ),
    # GH200 480GB: the Grace Hopper superchip's Hopper GPU, 96 GB HBM3 (the "480GB" is the Grace
    # CPU's LPDDR5X).  deviceQuery in the repository cited: "NVIDIA GH200 480GB", cc 9.0,
    # 97280 MBytes (102005473280 bytes), 132 SMs at 1980 MHz; nvidia-smi 97871 MiB and a 900 W cap.
    # 900 W is the whole superchip's limit (CPU and memory included), also JSC's figure for this
    # part ("TDP: 900 W (for full GH200 superchip)",
    # https://apps.fz-juelich.de/jsc/hps/jupiter/configuration.html ), so the energy estimate
    # counts the CPU too.  4 TB/s HBM3: the JSC page.
    # Peak: not confirmed from a GH200 datasheet (none was found): the H100 SXM's figures, since
    # the GPU has the same 132 SMs at the same 1980 MHz (an OpenCL benchmark on this card computes
    # 66.9 fp32 TFLOPS: configuration/OpenCL_benchmark.md in https://github.com/mredenti/PowerCapping ).
    # Link: NVLink 4, 18 links like the H100.  In JSC's 4x GH200 nodes each pair of GPUs has
    # 150 GB/s per direction, three peers -> 450 per GPU (the JSC page).  A single-superchip machine
    # (most cloud GH200s) has no peer at all.
    _nvidia(
        "gh200", "NVIDIA GH200 480GB", 102005473280, (9, 0), 900, "HBM3",
        "https://github.com/slitvinov/grace",
        Peak(66.9, 494.7, 989.4, 4000, "https://glennklockwood.com/garden/processors/h100",
             link_gbs=450, link="NVLink 4"),
    ),
    # A100 SXM4 40GB.  deviceQuery on this card: 40339 MBytes (42298834944 bytes).
    # 400 W, HBM2: https://glennklockwood.com/garden/processors/A100 ; cc 8.0.
    # Peak: the A100 datasheet (40GB SXM: 1,555 GB/s).
    # Link: NVLink 3, "600GB/s" for SXM in the datasheet (both directions) -> 300.
    _nvidia(
        "a100-40gb", "NVIDIA A100-SXM4-40GB", 42298834944, (8, 0), 400, "HBM2",
        "https://github.com/bottlerocket-os/bottlerocket/pull/3873",
        Peak(19.5, 156, 312, 1555, _A100, link_gbs=300, link="NVLink 3"),
    ),
    # A100 SXM4 80GB.  deviceQuery (CUDA 12.2 driver): 81051 MBytes (84987740160
    # bytes), i.e. torch's "79.15 GiB total capacity"; other drivers report up to
    # ~100 MiB more (approximate).  nvidia-smi shows 81920 MiB (modal PR #2797).
    # Same 400 W board as the 40GB part, HBM2e.
    # Peak: the A100 datasheet (80GB SXM: 2,039 GB/s).
    # Link: NVLink 3, 600 GB/s both directions -> 300 (the A100 datasheet).
    _nvidia(
        "a100-80gb", "NVIDIA A100-SXM4-80GB", 84987740160, (8, 0), 400, "HBM2e",
        "https://glennklockwood.com/garden/processors/A100",
        Peak(19.5, 156, 312, 2039, _A100, link_gbs=300, link="NVLink 3"),
    ),
    # A10G (AWS G5).  torch prints total_memory=22587MB (MiB, rounded down), so
    # 22587 MiB is approximate to within 1 MiB; nvidia-smi: 23028 MiB and a 300 W
    # cap in the issue cited.  24 GB GDDR6:
    # https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ ;
    # cc 8.6 (A10 family: cuda-gpus).
    # Peak: the A10G's own figures (lower tensor throughput than the A10's), from the
    # Baseten comparison (A10G: 35 TF32, 70 bf16 tensor TFLOPS, 600 GB/s).
    # Link: PCIe 4.0 x16, no NVLink.  Not confirmed for the A10G itself (AWS publishes no board
    # sheet): the A10's GA102 board is PCIe 4.0 x16,
    # https://sysrqmts.com/ru/gpus/compare/nvidia-a10-pcie-vs-nvidia-quadro-rtx-4000 .
    _nvidia(
        "a10g", "NVIDIA A10G", 22587 * MiB, (8, 6), 300, "GDDR6",
        "https://github.com/NVIDIA/DCGM/issues/232",
        Peak(31.2, 35, 70, 600, "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
             link_gbs=PCIE4_X16_GBS, link="PCIe 4.0 x16"),
    ),
    # L4.  deviceQuery: 22518 MBytes (23612293120 bytes); nvidia-smi 23034 MiB
    # (modal PR #2797).  72 W, 24 GB GDDR6: page cited.  cc 8.9.
    # Peak: the L4 datasheet (120 TF32 / 242 bf16 sparse, halved; 300 GB/s).
    # Link: PCIe 4.0 x16, no NVLink (https://store.sourcecode.com/en-us/bg-bucket-compare/125/9820 ).
    _nvidia(
        "l4", "NVIDIA L4", 23612293120, (8, 9), 72, "GDDR6",
        "https://pcpartdb.com/gpus/view/nvidia-l4",
        Peak(30.3, 60, 121, 300, "https://www.nvidia.com/en-us/data-center/l4/",
             link_gbs=PCIE4_X16_GBS, link="PCIe 4.0 x16"),
    ),
    # L40S.  torch prints total_memory=45589MB (MiB, rounded down; approximate) for
    # 'NVIDIA L40S', cc 8.9, 142 SMs, in a public blog post ("Understanding GPU utilization
    # strategies in Kubernetes", 2024-06-11, whose address the search index did not keep), and the
    # same post's OOM message says "total capacity of 44.52 GiB" (= 45589 MiB); nvidia-smi: 46068
    # MiB (modal PR #2797).  48 GB GDDR6, 350 W, PCIe Gen4 x16 ("64GB/s bidirectional"): NVIDIA's
    # spec table on the page cited.
    # Peak: the same table (91.6 fp32; 366 TF32 and 733 bf16 sparse, halved to 183 and 362.05;
    # 864 GB/s).
    # Link: PCIe 4.0 x16; the L40S has no NVLink
    # (https://www.itcreations.com/nvidia-gpu/nvidia-l40s-gpu-accelerator ).
    _nvidia(
        "l40s", "NVIDIA L40S", 45589 * MiB, (8, 9), 350, "GDDR6",
        _L40S,
        Peak(91.6, 183, 362.05, 864, _L40S, link_gbs=PCIE4_X16_GBS, link="PCIe 4.0 x16"),
    ),
    # GeForce RTX 4090.  torch prints total_memory=24563MB (MiB, rounded down;
    # approximate to within 1 MiB; a desktop also drives a display, which takes
    # more).  450 W TGP, 24 GB GDDR6X: page cited.  cc 8.9.
    # Peak: NVIDIA's Ada architecture whitepaper (bf16 with fp32 accumulate; 1,008 GB/s).
    # Link: PCIe 4.0 x16; Ada GeForce cards have no NVLink
    # (https://videocardz.com/newz/gigabyte-rtx-4090-graphics-cards-have-hidden-and-unused-tracing-for-nvlink ).
    # Two cards in a desktop often get x8 lanes each (half this figure).
    _nvidia(
        "rtx4090", "NVIDIA GeForce RTX 4090", 24563 * MiB, (8, 9), 450, "GDDR6X",
        "https://gadgetbrains.com/?p=3712",
        Peak(82.6, 82.6, 165.2, 1008, _ADA, link_gbs=PCIE4_X16_GBS, link="PCIe 4.0 x16"),
    ),
    # GeForce RTX 3090.  deviceQuery: 24268 MBytes (25447170048 bytes), torch's
    # "23.70 GiB total capacity".  350 W, 24 GB GDDR6X: page cited.  cc 8.6.
    # Peak: NVIDIA's GA102 whitepaper (bf16 with fp32 accumulate; 936 GB/s).
    # Link: PCIe 4.0 x16 (GA102 whitepaper, "PCIe Gen 4").  The 3090 also takes an optional 2-way
    # NVLink 3 bridge, "56.25 GB/sec bandwidth in each direction" (the same whitepaper), which
    # joins pairs only; see the module docstring for why the PCIe figure is listed.
    _nvidia(
        "rtx3090", "NVIDIA GeForce RTX 3090", 25447170048, (8, 6), 350, "GDDR6X",
        "https://www.hardwaredb.net/geforce-rtx-3090-benchmark",
        Peak(35.6, 35.6, 71, 936, _GA102, link_gbs=PCIE4_X16_GBS, link="PCIe 4.0 x16"),
    ),
    # Tesla T4.  deviceQuery: 15102 MBytes (15835660288 bytes), torch's "14.75 GiB
    # total capacity"; nvidia-smi 15360 MiB (modal PR #2797).  70 W, 16 GB GDDR6:
    # page cited.  cc 7.5: no bf16, no TF32.
    # Peak: the T4 datasheet (65 fp16 mixed-precision TFLOPS; 320 GB/s).
    # Link: PCIe 3.0 x16, no NVLink ("PCI Express Gen3", the T4 product brief:
    # https://manualmachine.com/pny/tcst4mpb/8129101-user-manual ).
    _nvidia(
        "t4", "Tesla T4", 15835660288, (7, 5), 70, "GDDR6",
        "https://www.aiminingco.com/gpu/t4/specs",
        Peak(8.1, None, 65, 320, _T4, link_gbs=PCIE3_X16_GBS, link="PCIe 3.0 x16"),
    ),
    # Tesla V100 SXM2 16GB.  deviceQuery: 16160 MBytes (16945512448 bytes), torch's
    # "15.78 GiB total capacity".  nvidia-smi in the issue cited: 16384 MiB,
    # 300 W cap.  cc 7.0 (cuda-legacy-gpus): no bf16, no TF32.
    # Peak: the V100 datasheet (SXM2: 125 fp16 tensor TFLOPS, 900 GB/s).
    # Link: NVLink 2, "300 GB/s" for SXM2 in the V100 datasheet (6 links, both directions) -> 150.
    _nvidia(
        "v100", "Tesla V100-SXM2-16GB", 16945512448, (7, 0), 300, "HBM2",
        "https://github.com/1CatAI/1Cat-vLLM/issues/85",
        Peak(15.7, None, 125, 900, _V100, link_gbs=150, link="NVLink 2"),
    ),
    # B200.  torch prints total_memory=182631MB (MiB, rounded down; another
    # driver gave 182642MB), matching the "Total Global Memory: 178.35 GB" (GiB)
    # in the PR cited; approximate.  nvidia-smi: 183359 MiB, 1000 W cap:
    # https://github.com/NVIDIA/TensorRT-LLM/issues/10278 .  cc 10.0 (cuda-gpus).
    # Marketed as 192 GB HBM3e; about 180 GB of it is enabled.
    # Peak: the HGX B200 (1,000 W) figures NVIDIA lists, dense, as collected on the page cited
    # (7.7 TB/s for the 180 GB part).
    # Link: NVLink 5, "1.8TB/s" in NVIDIA's HGX B200 table (both directions) -> 900; the table is
    # quoted at https://zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html .
    _nvidia(
        "b200", "NVIDIA B200", 182631 * MiB, (10, 0), 1000, "HBM3e",
        "https://github.com/pytorch/ao/pull/4002",
        Peak(75, 1100, 2250, 7700, "https://glennklockwood.com/garden/processors/B200",
             link_gbs=900, link="NVLink 5"),
    ),
    # AMD Radeon PRO W7900, RDNA3 (gfx1100).  48 GB GDDR6, 295 W: page cited.  No
    # torch/ROCm figure was found: 48 GiB is the physical size (AMD's "GB" here is
    # binary; 24 x 2 GiB chips); ROCm reports a few MiB less.  Approximate.
    # Peak: AMD's product page (61.3 fp32, 122.6 fp16/bf16 TFLOPS; 864 GB/s).
    # Link: PCIe 4.0 x16 ("a PCIe 4.0 interface", the page cited); no Infinity Fabric link.
    _amd(
        "w7900", "AMD Radeon PRO W7900", 48 * GiB, "gfx1100", 295, "GDDR6",
        "https://www.itcreations.com/amd-gpu/amd-radeon-pro-w7900-gpu",
        Peak(61.3, None, 122.6, 864, "https://www.amd.com/en/products/professional-graphics/amd-radeon-pro-w7900",
             link_gbs=PCIE4_X16_GBS, link="PCIe 4.0 x16"),
    ),
    # AMD Instinct MI210, CDNA2 (gfx90a).  64 GB HBM2e, 300 W: AnandTech's launch
    # article (cited).  ROCm reports a 64 GB gfx90a device as 68702699520 bytes
    # (64 GiB - 16 MiB, KFD mem_banks size_in_bytes) in public logs; that figure
    # is taken from a gfx90a log, not an MI210 one, so it is approximate.
    # Peak: AMD's MI210 page (22.6 vector fp32, 181 bf16 matrix TFLOPS; 1.6 TB/s).
    # Link: PCIe 4.0 x16 (the article cited).  Its three Infinity Fabric links need an optional
    # bridge; see the module docstring for why the PCIe figure is listed.
    _amd(
        "mi210", "AMD Instinct MI210", 68702699520, "gfx90a", 300, "HBM2e",
        "https://www.anandtech.com/show/17326/amd-releases-instinct-mi210-accelerator-cdna-2-on-a-pcie-card",
        Peak(22.6, None, 181, 1638, "https://www.amd.com/en/products/accelerators/instinct/mi200/mi210.html",
             link_gbs=PCIE4_X16_GBS, link="PCIe 4.0 x16"),
    ),
    # AMD Instinct MI300X (OAM), CDNA3 (gfx942).  torch (ROCm) prints total_memory=196592MB (MiB,
    # rounded down: 192 GiB - 16 MiB, like the MI210) for 'AMD Instinct MI300X',
    # gcnArchName 'gfx942:sramecc+:xnack-', 304 CUs, in the issue cited.  192 GB HBM3, 750 W: AMD's
    # MLPerf system description ("AMD Instinct MI300X-NPS1-SPX-192GB-750W",
    # https://raw.githubusercontent.com/mlcommons/inference_results_v4.1/main/closed/AMD/systems/8xMI300X_2xEPYC-9374F.json ).
    # Peak: ROCm's MI300 microarchitecture page (163.4 vector fp32, 1307.4 bf16 matrix TFLOPS dense,
    # 5.3 TB/s).  MI300X also has 653.7 TF32 TFLOPS, but the catalog's tf32 is NVIDIA's format and
    # torch's allow_tf32 does not reach it, so tf32_tflops stays None like the other AMD entries.
    # Link: Infinity Fabric (xGMI), seven links to the seven other OAMs of a fully connected 8-GPU
    # platform (the ROCm page).  Per link 64 GB/s per direction (128 GB/s both), so 7 x 64 = 448:
    # not confirmed on an AMD page; the per-link figure is from secondary pages
    # (https://www.emergentmind.com/topics/amd-mi300x-gpu : "128 GB/s bidirectional per link";
    # https://gpu.blog/gpus/instinct-mi300x-mi300x : 896 GB/s aggregate, both directions), and
    # agrees with xGMI-3 (16 lanes x 32 GT/s = 64 GB/s per direction) on MI300A.
    _amd(
        "mi300x", "AMD Instinct MI300X", 196592 * MiB, "gfx942", 750, "HBM3",
        "https://github.com/ROCm/ROCm/issues/4203",
        Peak(163.4, None, 1307.4, 5300, "https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi300.html",
             link_gbs=448, link="Infinity Fabric (xGMI)"),
    ),
)

CATALOG: dict[str, CatalogGPU] = {e.key: e for e in _ENTRIES}

# Other spellings people type.  "a100" means the 80GB part: it replaced the 40GB
# launch part across the market (glennklockwood.com page above) and is what
# clouds rent today; ask for "a100-40gb" explicitly for the older card.
ALIASES: dict[str, str] = {
    "h100-80gb": "h100",
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
            f"GPU={key!r} is not a catalog key: use one of {', '.join(catalog_keys())} "
            "(or 'cpu' for a CPU-only plan)."
        )
    found = _LOOKUP.get(_normalize(key))
    if found is not None:
        return CATALOG[found]
    close = difflib.get_close_matches(_normalize(key), list(_LOOKUP), n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(_LOOKUP[c]) for c in close)}?" if close else ""
    raise HardwareError(
        f"unknown GPU {key!r} in the catalog.{hint} Valid keys: {', '.join(catalog_keys())} "
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
