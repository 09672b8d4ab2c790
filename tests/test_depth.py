"""A deep transformer's step (Llama, GPT-2) traced at two shallow depths and scaled (lib/memory/depth.py):
against full traces of every block, for the memory tracer and the step-time counter, and the scaling itself
over generated steps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from lib.memory import MemoryPredictor, Trace
from lib.memory.depth import at_depth, depth_of, scaled, shallow_depths
from lib.models.registry import gpt2_shape, llama_shape
from lib.steptime.count import FIELDS, StepCounter

pytestmark = pytest.mark.usefixtures("one_thread")


def llama(make_config, extra: str = ""):
    # 16 blocks of Llama 60M at a short context and a real vocabulary: every moment of a step has a share
    # that grows with the depth and one that does not (the 32,000-token head and loss)
    return make_config("CONFIG_LLAMA_PRESET_60M=y\nCONFIG_LLAMA_BLOCK_SIZE=128\nCONFIG_VOCAB_SIZE=32000\n" + extra,
                       "llama-tiny")


def test_only_deep_llamas_are_scaled_and_the_shallow_ones_keep_the_shape(make_config):
    config = llama(make_config)
    assert depth_of(config) == 16
    assert depth_of(make_config("", "llama-tiny")) is None  # 4 blocks: traced whole
    assert depth_of(make_config("", "gpt2-tiny")) is None
    shallow = at_depth(config, 2)
    assert llama_shape(shallow).n_layer == 2
    assert (llama_shape(shallow).dim, shallow.vocab_size, shallow.llama_block_size) == (512, 32000, 128)
    assert at_depth(config, 2) is shallow  # derived once per plan
    assert shallow_depths(config, False) == (2, 3) and shallow_depths(config, True) == (3, 4)


def test_every_kth_block_checkpointed_scales_by_whole_periods(make_config):
    """With every k-th block checkpointed the blocks are alike only k at a time: traced at k and 2k blocks
    (2k and 3k sharded), and traced whole where the depth is no whole number of k."""
    every = lambda k: llama(make_config, f"CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_LAYER=y\n"  # noqa: E731
                                         f"CONFIG_ACTIVATION_CHECKPOINT_EVERY={k}\n")
    assert shallow_depths(every(2), False) == (2, 4) and shallow_depths(every(2), True) == (4, 6)
    assert depth_of(every(2)) == 16 and depth_of(every(3)) is None  # 16 blocks: 8 periods of 2, not of 3
    assert depth_of(every(8)) is None  # 16 blocks are no deeper than 2 periods of 8


def gpt2(make_config, extra: str = ""):
    # GPT-2 124M's 12 blocks at a short context, with its real vocabulary and tied embeddings (at 128 tokens
    # two moments of its step, the loss's gradient and the first block's backward, hold peaks 0.02% apart:
    # the scaled peak is right, but its breakdown may be the other moment's)
    return make_config("CONFIG_GPT2_PRESET_124M=y\nCONFIG_GPT2_BLOCK_SIZE=256\nCONFIG_VOCAB_SIZE=50257\n" + extra,
                       "gpt2-tiny")


def test_deep_gpt2s_are_scaled_through_their_custom_size(make_config):
    config = gpt2(make_config)
    assert depth_of(config) == 12 and depth_of(make_config("CONFIG_GPT2_PRESET_30M=y\n", "gpt2-tiny")) is None
    shallow = at_depth(config, 3)
    assert shallow.gpt2_preset == "custom" and (shallow.options.gpt2_layers, shallow.options.gpt2_heads,
                                                shallow.options.gpt2_width) == (3, 12, 768)
    assert gpt2_shape(shallow).n_layer == 3 and (shallow.vocab_size, shallow.gpt2_block_size) == (50257, 256)


slow = pytest.mark.slow  # a full trace of 16 blocks takes 10-20 s here


@pytest.mark.parametrize("family, extra, ckpt, train, parallel", [
    pytest.param(llama, "", False, True, {}, marks=slow), pytest.param(llama, "", True, True, {}, marks=slow),
    pytest.param(llama, "CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_OP=y\n", True, True, {}, marks=slow),
    pytest.param(llama, "CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_LAYER=y\n", True, True, {}, marks=slow),
    pytest.param(llama, "CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_LAYER=y\n", True, True,
                 dict(strategy="fsdp", world_size=2), marks=slow),
    (llama, "", None, False, {}),
    pytest.param(llama, "", True, True, dict(strategy="fsdp", world_size=4), marks=slow),
    pytest.param(llama, "", False, True, dict(strategy="fsdp_grad_op", world_size=2), marks=slow),
    pytest.param(gpt2, "", False, True, {}, marks=slow), (gpt2, "", True, True, {}),
    pytest.param(gpt2, "CONFIG_ACTIVATION_CHECKPOINT_SELECTIVE_OP=y\n", True, True, {}, marks=slow),
    pytest.param(gpt2, "CONFIG_GPT2_DROPOUT=\"0.1\"\n", False, True, {}, marks=slow),
    pytest.param(gpt2, "", False, True, dict(strategy="fsdp", world_size=2), marks=slow)])
def test_the_scaled_trace_is_the_full_one(make_config, tmp_path, family, extra, ckpt, train, parallel):
    """Peak and breakdown within 0.5% of the trace of every block (CUDA's step, bf16), whichever moment of
    the step holds the peak, for one process and FSDP's ranks: Llama 60M and GPT-2 124M."""
    config = family(make_config, extra)
    step = dict(batch=2, device_type="cuda", precision="bf16", gradient_checkpointing=ckpt, train=train, **parallel)
    full = MemoryPredictor(tmp_path, full_depth=True).trace(config, **step)
    fast = MemoryPredictor(tmp_path).trace(config, **step)
    assert abs(fast.peak_bytes / full.peak_bytes - 1) < 0.005, (fast.peak_bytes, full.peak_bytes)
    for name, value in full.breakdown.items():
        assert abs(fast.breakdown[name] - value) <= 0.005 * full.peak_bytes, name
    assert fast.parameters == full.parameters


@slow
@pytest.mark.parametrize("family", [llama, gpt2])
def test_the_scaled_counts_are_the_full_ones(make_config, tmp_path, family):
    config = family(make_config)
    step = dict(device_type="cuda", precision="bf16", gradient_checkpointing=True)
    full = StepCounter(tmp_path / "full", full_depth=True).counts(config, **step)
    counter = StepCounter(tmp_path / "fast")
    fast = counter.counts(config, **step)
    assert counter.counted == 2  # the two shallow steps, not the deep one
    assert fast.parameters == full.parameters
    for batch, phases in full.phases.items():
        for name, phase in phases.items():
            for f in FIELDS:
                assert getattr(fast.phases[batch][name], f) == pytest.approx(getattr(phase, f), rel=1e-9), (name, f)


segment = st.tuples(st.integers(0, 2**34), st.integers(0, 2**30))  # (bytes at depth 0, bytes per block)


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(segment, min_size=1, max_size=7), layers=st.integers(7, 200),
       depths=st.sampled_from([(2, 3), (3, 4), (2, 4), (4, 6)]))
def test_scaling_takes_the_largest_stretch_at_the_depth(segments, layers, depths):
    """Each stretch affine in the depth, with its own slope: the scaled peak is the largest of them at the
    depth, not the line through the two shallow peaks."""
    def trace(depth: int) -> Trace:
        stretches = tuple({"peak_bytes": c + depth * s, "breakdown": {"activations": c + depth * s}}
                          for c, s in segments)
        top = max(stretches, key=lambda x: x["peak_bytes"])
        return Trace(batch=1, peak_bytes=top["peak_bytes"], breakdown=top["breakdown"], parameters=depth * 10 + 3,
                     features=(), eval_samples=1, seconds=1.0, segments=stretches)

    out = scaled((trace(depths[0]), trace(depths[1])), layers, depths)
    assert out.peak_bytes == max(c + layers * s for c, s in segments)
    assert out.breakdown["activations"] == out.peak_bytes and out.parameters == layers * 10 + 3
