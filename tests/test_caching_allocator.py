"""The caching allocator's replay (lib/memory/caching_allocator.py) against the allocator itself: the event
streams torch.cuda.memory._record_memory_history recorded of the H100 memory-check steps
(scripts/diagnostics/alloc_events.py), replayed here on the CPU."""

import gzip
import json
from pathlib import Path

import pytest

from lib.memory.caching_allocator import LARGE_PAGE, MiB, SMALL_PAGE, replay

ROOT = Path(__file__).resolve().parent.parent
STREAMS = sorted((ROOT / "docs" / "validation").glob("diagnostics-*/alloc_events.jsonl.gz"))
# the cuBLAS workspaces of the two handles: allocated by each file's first step, before every later step's
# recording began, so they open the later steps' segments
WORKSPACES = [(-1, 32 * MiB), (-2, 32 * MiB)]


def recorded_steps() -> list[dict]:
    steps = []
    for path in STREAMS:
        with gzip.open(path, "rt") as f:
            for i, line in enumerate(f):
                step = json.loads(line)
                events = [(addr, size if action == "alloc" else 0) for action, addr, size, _ in step["events"]
                          if action in ("alloc", "free_completed")]
                steps.append({**step, "replay": replay((WORKSPACES if i else []) + events)})
    return steps


STEPS = recorded_steps()


def test_every_recorded_step_is_replayed():
    assert len(STEPS) == 40 and all(s["n_events"] > 400 for s in STEPS)


@pytest.mark.parametrize("step", STEPS, ids=[s["case"] for s in STEPS])
def test_the_replayed_reserved_peak_is_the_allocators(step):
    reserved = step["replay"].reserved_peak
    # within 5%, or one 20 MiB page on a small step (LeNet-5 bf16 1024 maps a page more, 4096 one less)
    assert abs(reserved - step["max_reserved"]) <= max(0.05 * step["max_reserved"], LARGE_PAGE), (
        step["case"], reserved / MiB, step["max_reserved"] / MiB)
    assert abs(step["replay"].allocated_peak - step["max_allocated"]) < 16 * MiB


def test_the_logits_hole_of_gpt2_on_its_real_vocabulary():
    # bf16 autocast frees the bf16 logits where the fp32 log-softmax cannot go: the segment grows past them
    steps = {s["case"]: s for s in STEPS}
    for case in ("gpt2-124m-50k bf16 8", "gpt2-124m-50k bf16 16"):
        s = steps[case]
        measured_holes = s["max_reserved"] - s["max_allocated"]
        assert measured_holes > 800 * MiB
        assert abs(s["replay"].holes - measured_holes) < 0.02 * s["max_reserved"]


def test_best_fit_reuses_a_hole_and_growth_extends_a_free_end():
    a = replay([(1, 30 * MiB), (2, 10 * MiB), (1, 0), (3, 25 * MiB)])  # 3 fits in 1's hole
    assert (a.reserved_peak, a.allocated_peak) == (2 * LARGE_PAGE, 40 * MiB)
    b = replay([(1, 10 * MiB), (2, 30 * MiB), (2, 0), (3, 50 * MiB)])  # the free end grows by what 3 lacks
    assert b.reserved_peak == 3 * LARGE_PAGE and b.allocated_peak == 60 * MiB
    c = replay([(1, 30 * MiB), (2, 10 * MiB), (1, 0), (3, 50 * MiB)])  # 1's hole is too small: it stays
    assert c.reserved_peak == 5 * LARGE_PAGE and c.holes == 5 * LARGE_PAGE - 60 * MiB
    small = replay([(1, 1000), (2, 4096), (1, 0), (3, 512)])
    assert small.reserved_peak == SMALL_PAGE and small.allocated_peak == 1024 + 4096
    assert replay([(7, 0)]).reserved_peak == 0  # a free of a block it never saw


def test_a_cuda_trace_carries_its_replayed_holes_into_the_prediction(tmp_path):
    from lib import config as kc
    from lib.memory import MemoryPredictor, Trace, device_overheads
    from lib.memory.predict import StepCurve

    config = kc.make_defconfig("gpt2-tiny", out=tmp_path / ".config")
    predictor = MemoryPredictor(cache_dir=tmp_path / "cache")
    cuda = predictor.trace(config, batch=8, device_type="cuda", precision="bf16")
    assert cuda.allocator_holes is not None and 0 <= cuda.allocator_holes < cuda.peak_bytes
    assert predictor.trace(config, batch=8, device_type="cpu", precision="fp32").allocator_holes is None
    cached = MemoryPredictor(cache_dir=tmp_path / "cache").trace(config, batch=8, device_type="cuda",
                                                                 precision="bf16")
    assert cached.allocator_holes == cuda.allocator_holes  # kept in the trace cache

    # a large replayed hole wins over the fitted shares; without one (a sharded or measured trace) they stay
    big = Trace(batch=8, peak_bytes=10**9, breakdown={"activations": 10**8, "temporaries": 0}, parameters=1,
                features=(), eval_samples=1, seconds=0.0, allocator_holes=800 * MiB)
    assert device_overheads(big, "cuda", expandable=True)["allocator_fragmentation"] == 800 * MiB
    fitted = device_overheads(Trace(**{**big.__dict__, "allocator_holes": None}), "cuda", expandable=True)
    assert 0 < fitted["allocator_fragmentation"] < 800 * MiB
    assert device_overheads(big, "cuda", expandable=False)["allocator_fragmentation"] != 800 * MiB

    # a batch read off a proven line: its holes interpolated between the line's traced ends
    def step(batch: int) -> Trace:
        return Trace(**{**big.__dict__, "batch": batch, "peak_bytes": 1000 * batch,
                        "allocator_holes": 100 * MiB * batch})

    curve = StepCurve(step, [2, 4, 6], device_type="cuda", compile_mode=None)
    assert curve.trace(5).allocator_holes == 500 * MiB and curve.trace(5).peak_bytes == 5000
