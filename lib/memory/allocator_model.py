"""What the CUDA caching allocator reserves beyond what a step allocates, and the kernels' unseen workspaces.

Fitted to the committed H100 measurements (docs/validation/nvidia-h100-80gb-hbm3-2026-11-23*.json,
torch 2.11, 37 eager and checkpointed steps of LeNet-5, ResNet-18/50, gpt2-tiny and GPT-2 124M, fp32,
bf16 and fp16; tests/test_memory_replay.py replays them) and read off how the allocator works
(c10/cuda/CUDACachingAllocator.cpp): a request is rounded up to 512 bytes; requests up to 1 MiB come
from the small pool, larger ones from the large pool; with expandable segments (kfit's setting,
lib.hardware.allocator) each pool is one segment per stream whose physical pages are mapped as it grows,
2 MiB pages for the small pool and 20 MiB pages for the large pool, and are kept mapped once touched,
so the reserved peak is the pools' high-water marks rounded up to their pages plus the holes freed
blocks leave behind them. Measured reserved - allocated: 10-115 MiB on the eager steps, 73-183 MiB
checkpointed (the old 32 MiB + 6% of activations charged 34-601 MiB).

  allocator_fragmentation   PAGE_SLACK_BYTES: the large pool's last 20 MiB page, half-used on average
                            and up to a page, plus the small pool's 2 MiB pages (2-6 MiB slack);
                            + AUTOCAST_CACHE_BYTES under bf16/fp16 autocast (the casts of the weights
                            autocast caches for the forward and frees after it churn both pools: the
                            bf16 steps kept 5-15 MiB more than the fp32 ones of the same model);
                            + HOLE_SHARE_ACTIVATIONS of activations and HOLE_SHARE_TEMPORARIES of
                            temporaries: the holes freed blocks leave that a larger request cannot
                            reuse, so the segment grows past them (best fit, no compaction);
                            HOLE_SHARE_CHECKPOINTED of both when activations are checkpointed (the
                            recomputation interleaves short and long-lived blocks: 6-26% measured);
                            or, where larger, the holes of the traced step's own allocations replayed
                            through the allocator (caching_allocator.py): a large block freed where a
                            larger one cannot go. GPT-2 124M on its 50,257-token vocabulary under bf16
                            frees its bf16 logits where the fp32 log-softmax cannot go: 825 MiB (8) and
                            1645 MiB (16) measured beyond the allocated peak, 816 and 1639 replayed, where
                            the shares gave 167 and 294 (the run of 2026-11-26). The replay misses the
                            small churn the trace does not see (the weight casts, the cuBLAS
                            workspaces' places), which the shares cover, hence the larger of the two;
                            fixed segments (a user's own PYTORCH_CUDA_ALLOC_CONF): 32 MiB + 65%, as
                            measured on the first H100 run (ResNet-18 fp32 256's gap; not refitted).
  cudnn_benchmark           models with convolutions: CUDNN_BENCHMARK_BATCH_SHARE x the batch's bytes
                            (half under bf16/fp16 autocast, whose convolutions run in 16 bits): the
                            workspaces cuDNN's benchmark tries at the first step are freed, but the
                            pages they made the segment map stay reserved. A bound, not a law: LeNet-5
                            fp32 4096 (16 MiB of batch) reserved 60 MiB more in one run than in an
                            identical one; the bound covers the larger.
  attention_workspace       ATTENTION_WORKSPACE_SHARE of activations, models with attention: the
                            fused attention backward's fp32 accumulators for one layer (GPT-2 124M:
                            6 MiB per sequence beyond the BLAS workspaces, 1.0-1.8% of activations;
                            gpt2-tiny: none measurable at its peak).
"""

from __future__ import annotations

MiB = 2**20

PAGE_SLACK_BYTES = 24 * MiB  # one 20 MiB large-pool page + the small pool's 2 MiB pages
AUTOCAST_CACHE_BYTES = 10 * MiB
HOLE_SHARE_ACTIVATIONS = 0.014
HOLE_SHARE_TEMPORARIES = 0.02
HOLE_SHARE_CHECKPOINTED = 0.198  # of activations + temporaries
FIXED_SEGMENTS_BASE_BYTES = 32 * MiB
HOLE_SHARE_FIXED_SEGMENTS = 0.65
CUDNN_BENCHMARK_BATCH_SHARE = 3.0
ATTENTION_WORKSPACE_SHARE = 0.01
AUTOCAST_PRECISIONS = ("bf16", "fp16")


def hole_share(*, checkpointed: bool, expandable: bool) -> float:
    """The share of activations (and temporaries, but see fragmentation) left as holes."""
    if not expandable:
        return HOLE_SHARE_FIXED_SEGMENTS
    return HOLE_SHARE_CHECKPOINTED if checkpointed else HOLE_SHARE_ACTIVATIONS


def fragmentation(activations: int, temporaries: int, *, checkpointed: bool, expandable: bool,
                  autocast: bool, replayed_holes: int | None = None) -> int:
    """Reserved beyond allocated at the step's peak (module docstring); `replayed_holes`: the traced step's
    allocations replayed through the allocator (caching_allocator.py), where the trace has them."""
    if not expandable:
        return FIXED_SEGMENTS_BASE_BYTES + int(HOLE_SHARE_FIXED_SEGMENTS * (activations + temporaries))
    holes = (HOLE_SHARE_CHECKPOINTED * (activations + temporaries) if checkpointed
             else HOLE_SHARE_ACTIVATIONS * activations + HOLE_SHARE_TEMPORARIES * temporaries)
    fitted = PAGE_SLACK_BYTES + (AUTOCAST_CACHE_BYTES if autocast else 0) + int(holes)
    return fitted if replayed_holes is None else max(replayed_holes, fitted)


def cudnn_benchmark(batch_bytes: int, *, autocast: bool) -> int:
    """The pages cuDNN's benchmark workspaces leave mapped, for a model with convolutions."""
    return int(CUDNN_BENCHMARK_BATCH_SHARE * batch_bytes * (0.5 if autocast else 1.0))


def attention_workspace(activations: int) -> int:
    return int(ATTENTION_WORKSPACE_SHARE * activations)
