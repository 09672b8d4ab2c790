"""The layouts the planner keeps for the large presets, re-traced in full: every block of the step of the
process that bounds the layout's memory (not the two shallow depths lib/memory/depth.py scales from), at the
plan's micro-batch, accumulation and checkpointing; its peak is the plan's and within the budget."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lib import config as kc
from lib.hardware import resolve_hardware
from lib.memory import MemoryPredictor
from lib.planning import make_plan
from lib.planning.memory_policy import PlannerPolicy

LAYOUTS = [
    # 70B on 8 machines of 8 H100s: TP 4 (what CONFIG_PP=0 keeps, docs/scale-out.md), and TP 8 x PP 4, whose
    # first and last stages are traced at their own depths and ends
    ("llama3-70b", 8, 8, "CONFIG_TP=4\n"),
    ("llama3-70b", 8, 8, "CONFIG_TP=8\nCONFIG_PP=4\n"),
    # 8B at 32k tokens on one machine: CP 2 (what CONFIG_CP=0 keeps), traced at 16k tokens a process
    ("llama3-8b", 8, 1, "CONFIG_LLAMA_BLOCK_SIZE=32768\nCONFIG_CP=2\n"),
]


@pytest.mark.slow  # one to five minutes each: a cold plan, then 32 to 80 blocks traced
@pytest.mark.parametrize("defconfig, gpus, nodes, layout", LAYOUTS, ids=["70b-tp4", "70b-tp8-pp4", "8b-32k-cp2"])
def test_the_chosen_layout_re_traced_in_full_peaks_as_planned_within_the_budget(tmp_path, defconfig, gpus, nodes,
                                                                               layout):
    (tmp_path / "fragment").write_text("CONFIG_GRADIENT_CHECKPOINTING=y\n" + layout)
    kc.make_defconfig(defconfig, [str(tmp_path / "fragment")], out=tmp_path / ".config")
    config = kc.read_config(tmp_path / ".config")
    h100 = resolve_hardware(gpu="h100", gpus=gpus)
    plan = make_plan(config, h100, world_size=gpus * nodes, nodes=nodes).plan
    chosen = dataclasses.replace(config, gradient_checkpointing=plan.gradient_checkpointing)
    full = PlannerPolicy(str(tmp_path / "cache"))
    full.__dict__["predictor"] = MemoryPredictor(Path(tmp_path / "cache"), full_depth=True)
    memory, warning = full.at_batch(
        config=chosen, hardware=h100, device_type=plan.device_type, compile_mode=plan.compile_mode,
        precision=plan.precision, micro=plan.micro_batch, eval_batch=1, strategy=plan.strategy,
        world_size=plan.data_parallel, local_world_size=plan.local_data_parallel, cpu_offload=plan.cpu_offload,
        tensor=plan.tensor_parallel, grad_accum=plan.grad_accum, context=plan.context_parallel,
        pipeline=(plan.pipeline_parallel, plan.pipeline_schedule) if plan.pipeline_parallel > 1 else None)
    assert warning is None
    assert memory["predicted_peak_bytes"] <= plan.budget_bytes
    assert memory["predicted_peak_bytes"] == pytest.approx(plan.predicted_peak_bytes, rel=0.005)
