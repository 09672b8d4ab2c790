"""A replay of the CUDA caching allocator with expandable segments: what a step's allocations reserve.

The fake-tensor trace gives the order in which a step's tensors come and go; the CUDA caching
allocator (c10/cuda/CUDACachingAllocator.cpp, kfit's setting `expandable_segments:True`) decides
where each goes, and so how much it maps beyond what is allocated. Replayed here as it works:

  * a request is rounded up to 512 bytes; up to 1 MiB it comes from the small pool, beyond from the
    large pool; each pool is one segment (one stream) whose pages are mapped as it grows, 2 MiB pages
    for the small pool and 20 MiB for the large, and stay mapped (no empty_cache inside a step);
  * best fit: the smallest free block that holds the request (the lowest address among equals), split
    when what is left is more than 1 MiB (large pool) or at least 512 bytes (small pool);
  * when no free block holds it, the segment grows at its end: a free block there is extended by the
    pages the request still needs, else the request takes new pages of its own;
  * a freed block merges with free neighbours.

A large block freed in the middle of the segment that a larger request cannot use stays mapped beside
the growth: GPT-2 124M on its 50,257-token vocabulary under bf16 autocast frees the bf16 logits
(785 MiB at micro-batch 8) where the fp32 log-softmax (1570 MiB) cannot go, and reserved 825 MiB beyond
its allocated peak. Replayed on the allocator's own event streams of the H100 steps
(docs/validation/diagnostics-2026-11-2*/alloc_events.jsonl.gz, tests/test_caching_allocator.py), the
reserved peak comes out within 2.3% on every step of 100 MiB or more (0.2% on that GPT-2 step).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Iterable

MiB = 2**20
ROUND = 512  # kMinBlockSize
SMALL_REQUEST = 1 * MiB  # kSmallSize: the largest request the small pool serves
SMALL_PAGE = 2 * MiB  # kSmallBuffer: the small pool's mapping granularity
LARGE_PAGE = 20 * MiB  # kLargeBuffer: the large pool's mapping granularity


class ExpandableSegment:
    """One pool's segment: blocks by address, the free ones also by (size, address) for best fit."""

    def __init__(self, page: int, small: bool) -> None:
        self.page, self.small = page, small
        self.blocks: dict[int, list] = {}  # start -> [size, free]
        self.by_end: dict[int, int] = {}  # end -> start
        self.free: list[tuple[int, int]] = []  # (size, start), sorted
        self.mapped = 0  # bytes mapped: the segment's end
        self.peak = 0

    def _add(self, start: int, size: int, free: bool) -> None:
        self.blocks[start] = [size, free]
        self.by_end[start + size] = start
        if free:
            insort(self.free, (size, start))

    def _remove(self, start: int) -> int:
        size, free = self.blocks.pop(start)
        del self.by_end[start + size]
        if free:
            self.free.pop(bisect_left(self.free, (size, start)))
        return size

    def malloc(self, size: int) -> tuple[int, int]:
        """(start, block size) of a rounded request."""
        i = bisect_left(self.free, (size, -1))
        if i < len(self.free):
            block, start = self.free[i]
            self._remove(start)
        else:  # grow the segment at its end, extending a free block there
            start = self.by_end.get(self.mapped)
            have = self._remove(start) if start is not None and self.blocks[start][1] else 0
            if not have:
                start = self.mapped
            grow = -(-(size - have) // self.page) * self.page
            block = have + grow
            self.mapped += grow
            self.peak = max(self.peak, self.mapped)
        rest = block - size
        if rest >= ROUND if self.small else rest > SMALL_REQUEST:
            self._add(start + size, rest, True)
            block = size
        self._add(start, block, False)
        return start, block

    def release(self, start: int) -> None:
        size = self._remove(start)
        after = self.blocks.get(start + size)
        if after is not None and after[1]:
            size += self._remove(start + size)
        before = self.by_end.get(start)
        if before is not None and self.blocks[before][1]:
            size += self._remove(before)
            start = before
        self._add(start, size, True)


@dataclass(frozen=True)
class Replay:
    reserved_peak: int  # both pools' mapped pages at their most
    allocated_peak: int  # blocks handed out at their most (sizes as allocated: rounded, unsplit remainders)

    @property
    def holes(self) -> int:
        """What the allocator reserves beyond the step's allocated peak."""
        return max(0, self.reserved_peak - self.allocated_peak)


def rounded(size: int) -> int:
    return max(ROUND, -(-size // ROUND) * ROUND)


def replay(events: Iterable[tuple[int, int]]) -> Replay:
    """Replay (key, bytes) events in order: bytes > 0 allocates a block for key, 0 frees key's block
    (an unknown key is ignored: a tensor that existed before the replay)."""
    pools = {True: ExpandableSegment(SMALL_PAGE, True), False: ExpandableSegment(LARGE_PAGE, False)}
    live: dict[int, tuple[bool, int, int]] = {}
    allocated = peak = 0
    for key, size in events:
        if size > 0:
            size = rounded(size)
            small = size <= SMALL_REQUEST
            start, block = pools[small].malloc(size)
            old = live.pop(key, None)  # a key allocated twice: the first block is gone (resized)
            if old is not None:
                pools[old[0]].release(old[1])
                allocated -= old[2]
            live[key] = (small, start, block)
            allocated += block
            peak = max(peak, allocated)
        elif key in live:
            small, start, block = live.pop(key)
            pools[small].release(start)
            allocated -= block
    return Replay(pools[True].peak + pools[False].peak, peak)
