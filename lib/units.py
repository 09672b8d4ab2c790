"""Bytes and batches as kfit prints them. Bytes in binary units: GiB is 2**30 bytes, MiB 2**20 (the unit names say so: kfit
never prints a decimal GB or MB for memory). Layer 1 (docs/architecture.md): it imports nothing from lib.

`format_bytes` is kfit's one byte formatter; `gib` the figure kfit prints and reads back (FREE_GB=, the
hardware profile's *_gb arguments) in GiB. `batch_split` is kfit's one formatter of a step's micro-batches and
accumulation (its lines multiply: '21 x 24 + 8 x 1 = 512'). MAXIMA bounds the counts a user gives.
"""

from __future__ import annotations

from dataclasses import dataclass

# The most a count the user gives may be, checked before any work: far above what any machine or cluster runs,
# far below what would take kfit minutes and gigabytes to refuse later (a process count in the millions, a
# generation of billions of tokens).
MAXIMA = {"GPUS": 4096, "WORLD_SIZE": 1 << 20, "NODES": 65536, "CPUS": 1 << 20, "ARRAY": 100_000,
          "MAX_TOKENS": 100_000, "TOP_K": 10_000_000, "TRIALS": 1_000_000, "N": 100_000, "TRAIN": 100_000,
          "RUNS": 1000, "BATCH": 1 << 24, "VOCAB": 10_000_000, "EXTEND_EPOCHS": 100_000,
          "EXTEND_STEPS": 1_000_000_000, "FREE_GB": 1 << 20, "KCONFIG_SEED": 2**63 - 1, "SEED": 2**63 - 1,
          # OpenMP's threads per process: a billion made libgomp ask for 216 GB after a minute of planning
          "OMP_NUM_THREADS": 4096}

MiB = 2**20
GiB = 2**30


def gib(n_bytes: int | float) -> float:
    """Bytes as GiB (2**30), the unit kfit prints and reads."""
    return n_bytes / GiB


def format_bytes(n_bytes: int | float, mib_decimals: int = 0, *, sep: str = "") -> str:
    """'1.23GiB' from a GiB up (two decimals), else '37MiB' with `mib_decimals` decimals ('37.1MiB' at 1);
    `sep` goes between the figure and the unit ('1.23 GiB' with sep=" ", as the HTML reports print).

    The GiB threshold is on the signed value: a negative figure prints in MiB ('-3072MiB')."""
    if n_bytes >= GiB:
        return f"{n_bytes / GiB:.2f}{sep}GiB"
    return f"{n_bytes / MiB:.{mib_decimals}f}{sep}MiB"


# --------------------------------------------------------------------------
# Batches as kfit prints them: every line that shows a micro-batch and accumulation shows numbers that multiply.


def micro_batch_sizes(share: int, micro: int) -> list[int]:
    """The micro-batch sizes one process runs for `share` samples (lib.trainer.windows.split_batches cuts by
    them): `micro` each, the last one short where `micro` does not divide the share. A lone last sample would
    break BatchNorm's training statistics, so from a micro-batch of 3 up it and the micro-batch before it are
    cut into two halves instead (21 + 1 -> 11 + 11): no micro-batch is ever larger than `micro`, which is
    what the memory plan fits (a micro-batch of 1 or 2 keeps its lone sample: there is no larger one)."""
    sizes = [micro] * (share // micro) + ([share % micro] if share % micro else [])
    if len(sizes) > 1 and sizes[-1] == 1 and micro >= 3:
        both = sizes[-2] + 1
        sizes[-2:] = [both - both // 2, both // 2]
    return sizes


def _groups(sizes: list[int]) -> list[tuple[int, int]]:
    """[(size, how many)] of consecutive equal sizes."""
    out: list[tuple[int, int]] = []
    for size in sizes:
        if out and out[-1][0] == size:
            out[-1] = (size, out[-1][1] + 1)
        else:
            out.append((size, 1))
    return out


@dataclass(frozen=True)
class BatchSplit:
    """One optimizer step's samples (`effective`) cut into micro-batches of `micro` over `processes` processes.

    `sizes` are the micro-batches of the process with the most samples (all processes alike where `processes`
    divides `effective`, as every plan's does); `last_micro_batch` the last of them, short where `micro` does not
    divide the process's share; `count` how many there are, the accumulation."""

    effective: int
    micro: int
    processes: int
    sizes: tuple[int, ...]
    unit: str = "process"  # what shares the batch: a process, or under tensor parallelism a group of them

    @property
    def count(self) -> int:
        return len(self.sizes)

    @property
    def last_micro_batch(self) -> int:
        return self.sizes[-1]

    def shares(self) -> list[int]:
        """Each process's samples, as the trainer slices a window (lib.trainer.windows.rank_batches)."""
        n, w = self.effective, self.processes
        return [(r + 1) * n // w - r * n // w for r in range(w)]

    def text(self) -> str:
        """'21 x 24 + 8 x 1 = 512'; over processes '64 x 4 x 2 processes = 512' or
        '(21 x 12 + 4 x 1) x 2 processes = 512': numbers that multiply and add up to the effective batch."""
        parts = []
        for share, ranks in _groups(sorted(self.shares())):
            groups = _groups(micro_batch_sizes(share, self.micro))
            one = " + ".join(f"{size} x {n}" for size, n in groups) or "0"  # a process with no sample
            if self.processes == 1:
                parts.append(one)
            else:
                noun = self.unit if ranks == 1 else self.unit + ("es" if self.unit.endswith("s") else "s")
                parts.append(f"{f'({one})' if len(groups) > 1 else one} x {ranks} {noun}")
        return f"{' + '.join(parts)} = {self.effective}"

    def compact(self) -> str:
        """The micro-batch as a key=value line shows it beside its accumulation: '21', or '21 (last 8)' where the
        last is another size, so that '21 (last 8) x 25' is 21 x 24 + 8, or '21 (last 2: 11 + 11)' where a lone
        last sample made the last two halves (21 x 23 + 11 + 11)."""
        first, sizes = self.sizes[0], self.sizes
        if len(sizes) > 1 and sizes[-2] != first:
            return f"{first} (last 2: {sizes[-2]} + {sizes[-1]})"
        return str(first) if first == sizes[-1] else f"{first} (last {sizes[-1]})"


def batch_split(effective: int, micro: int, processes: int = 1, unit: str = "process") -> BatchSplit:
    """How `effective` samples per optimizer step run as micro-batches of `micro` on `processes` processes (or
    whatever `unit` names: the tensor-parallel groups that share a batch)."""
    if effective < 1 or micro < 1 or processes < 1:
        raise ValueError(f"a batch split needs counts of at least 1, not effective={effective!r}, "
                         f"micro={micro!r}, processes={processes!r}")
    share = -(-effective // processes)
    return BatchSplit(effective, micro, processes, tuple(micro_batch_sizes(share, micro)), unit)
