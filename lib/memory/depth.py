"""A deep transformer's step traced at two shallow depths and scaled to its own.

A fake-tensor trace costs time per op, and a transformer's ops grow with its depth: Llama 3.1 8B's 32
blocks at 8k context took 12-26 s a trace here, and a plan traces a dozen steps. But every block is the
same, so each moment of the step holds bytes affine in the number of blocks (parameters, gradients,
optimizer state and saved activations per block, plus the embedding, the head and the loss once). The
step's peak is the largest of a few such moments with different slopes (the end of the forward, where
autocast still caches every block's bf16 weights; the loss's gradient at the start of backward; the
optimizer step), and the largest of affine functions is not affine: scaled as one figure it came out 5%
low for Llama 350M and 1B with checkpointing. So trace.py and sharded.py keep the peak of each stretch of
the step (`Trace.segments`: each forward, backward and optimizer step), and this module scales each
stretch by the depth and takes the largest.

The shallow depths are 2 and 3, and 3 and 4 for a sharded step (FSDP2's prefetch in backward settles from 3
blocks on: `SHALLOW_SHARDED`); where every k-th block is checkpointed the blocks are alike only k at a time,
so the depths are k and 2k (2k and 3k sharded), and a depth that is no whole number of k is traced whole. Checked
against full traces in tests/test_depth.py (within 0.5%; equal to the byte in most cases).
`MemoryPredictor(full_depth=True)` traces every block instead.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from ..config import Config
from .trace import Trace

SHALLOW = (2, 3)
# A sharded step's: FSDP2 prefetches the next block's all-gather in backward only from 3 blocks on (Llama 70B
# over 64 ranks: 3.2 GiB of all-gathers in flight at 2 blocks, 4.8 at 3, 4 and 5), so 2 is off its line
SHALLOW_SHARDED = (3, 4)
MIN_LAYERS = 6  # a model this shallow or shallower is traced whole: scaling would save little


def _period(config: Config) -> int:
    """The blocks that repeat: every block, or every k-th block's checkpointing with k blocks between
    (CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_LAYER, whose blocks are not all alike)."""
    return (config.recompute_every or 2) if config.recompute_policy == "selective_layer" else 1


def shallow_depths(config: Config, sharded: bool) -> tuple[int, int]:
    """The two depths a step is traced at: SHALLOW (SHALLOW_SHARDED for a sharded strategy's), in whole
    periods of blocks where the blocks differ (every k-th checkpointed: k and 2k blocks, 2k and 3k sharded)."""
    period = _period(config)
    if period == 1:
        return SHALLOW_SHARDED if sharded else SHALLOW
    return (2 * period, 3 * period) if sharded else (period, 2 * period)


def depth_of(config: Config, sharded: bool = False) -> int | None:
    """The blocks of a model whose step is traced shallow and scaled (a family that declares its depth in the
    registry, deeper than MIN_LAYERS and than its shallow depths, in whole periods of alike blocks), else
    None."""
    from ..models.registry import MODELS

    spec = MODELS.get(config.model)
    if spec is None or spec.depth is None:
        return None
    layers = spec.depth.layers(config)
    if layers <= MIN_LAYERS or layers % _period(config) or layers <= shallow_depths(config, sharded)[1]:
        return None
    return layers


def at_depth(config: Config, layers: int) -> Config:
    """`config`'s model with `layers` blocks and everything else as it is (its family's Depth.at)."""
    return _at_depth(config.text, config.source, layers) if config.text else _derived(config, layers)


@functools.lru_cache(maxsize=16)
def _at_depth(text: str, source: str, layers: int) -> Config:
    from ..config import config_from_text

    return _derived(config_from_text(text, source), layers)  # a plan asks for each a dozen times


def _derived(config: Config, layers: int) -> Config:
    from ..models.registry import spec_for

    return spec_for(config.model).depth.at(config, layers)


def line(a: float, b: float, layers: int, depths: tuple[int, int] = SHALLOW) -> float:
    """The value at `layers` of the line through (depths[0], a) and (depths[1], b)."""
    lo, hi = depths
    return b + (layers - hi) * (b - a) / (hi - lo)


def scaled(shallow: tuple[Trace, Trace], layers: int, depths: tuple[int, int] = SHALLOW) -> Trace:
    """The trace at `layers` blocks from traces at `depths`: each stretch's peak and breakdown on the line
    through the two, the largest stretch taken (the whole peak where a trace kept no stretches)."""
    a, b = shallow

    def at(x: float, y: float) -> float:  # the value at `layers` blocks
        return line(x, y, layers, depths)

    def stretch(x: dict, y: dict) -> dict:
        keys = dict.fromkeys([*x["breakdown"], *y["breakdown"]])
        return {"peak_bytes": round(at(x["peak_bytes"], y["peak_bytes"])),
                "breakdown": {k: max(0, round(at(x["breakdown"].get(k, 0), y["breakdown"].get(k, 0))))
                              for k in keys}}

    forward = b.forward_segment if a.forward_segment == b.forward_segment else None
    if a.segments and len(a.segments) == len(b.segments):
        segments = tuple(stretch(x, y) for x, y in zip(a.segments, b.segments))
    else:
        segments = (stretch({"peak_bytes": a.peak_bytes, "breakdown": a.breakdown},
                            {"peak_bytes": b.peak_bytes, "breakdown": b.breakdown}),)
        forward = None
    top = max(segments, key=lambda s: s["peak_bytes"])
    # The allocator's replayed holes (caching_allocator.py) follow no line in the depth (Llama 1B with
    # checkpointing: 1.10 GiB traced whole, 2.52 on the line through 2 and 3 blocks): the larger of the two,
    # which the fitted share of activations (allocator_model.py) overrides where it is larger
    holes = (None if a.allocator_holes is None or b.allocator_holes is None
             else max(a.allocator_holes, b.allocator_holes))
    return replace(b, peak_bytes=top["peak_bytes"], breakdown=top["breakdown"],
                   parameters=round(at(a.parameters, b.parameters)), seconds=a.seconds + b.seconds,
                   allocator_holes=holes, segments=segments, forward_segment=forward,
                   autograd_nodes=max(0, round(at(a.autograd_nodes, b.autograd_nodes))))


__all__ = ["MIN_LAYERS", "SHALLOW", "SHALLOW_SHARDED", "at_depth", "depth_of", "line", "scaled", "shallow_depths"]
