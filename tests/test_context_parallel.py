"""Context parallelism (CONFIG_CP): the degrees a context splits into, the plan's refusals in one line, what the
planner predicts for a process of a context-parallel group (its share of the context traced, the gathered keys
and values beside it, the ring's traffic, FSDP over the group), AUTO's choice, and real gloo runs: torch's own
ring, with the CPU's attention kernel inside it (tests/cpu_ring.py), trains as one process does."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from lib import config as kc
from lib import context_parallel as cp
from lib import parallel
from lib.distributed import Rank
from lib.errors import PlanError
from lib.hardware import resolve_hardware
from lib.planning import make_plan
from tests.helpers import CPU
from tests.test_fsdp import train
from tests.test_tensor_parallel import (assert_like_one_process, llama_config, losses_of, reference_run,
                                       resumes_under_fsdp_then_one_process)

RING_SITE = Path(__file__).resolve().parent / "cpu_ring_site"


@settings(max_examples=300, deadline=None)
@given(tokens=st.integers(1, 1 << 18), most=st.integers(1, 64))
def test_auto_plans_only_degrees_that_split_the_context_evenly_and_leave_enough_tokens(tokens, most):
    degrees = cp.context_candidates(tokens, most)
    assert degrees[0] == 1 and degrees == sorted(set(degrees))
    for degree in degrees[1:]:
        assert degree & (degree - 1) == 0 and degree <= most  # a power of two within the bound
        assert tokens % (2 * degree) == 0 and tokens // degree >= cp.MIN_TOKENS
        assert cp.context_problem(tokens, degree) is None
    # and none is left out: every power of two that qualifies is planned
    power = 2
    while power <= most:
        if tokens % (2 * power) == 0 and tokens // power >= cp.MIN_TOKENS:
            assert power in degrees
        power *= 2


@settings(max_examples=200, deadline=None)
@given(stages=st.sampled_from([1, 2]), groups=st.integers(1, 3), context=st.sampled_from([1, 2, 4]),
       tensor=st.sampled_from([1, 2]))
def test_every_process_has_one_place_and_a_context_parallel_group_shares_its_samples(stages, groups, context,
                                                                                       tensor):
    """Over the mesh's order (pp, data, cp, tp): each (stage, data group, cp rank, tp rank) is one process; the
    processes of a context-parallel group share their data rank, and their loss weights add to one."""
    world = stages * groups * context * tensor
    ranks = [Rank(rank=r, world_size=world, local_world_size=world, tensor=tensor, pipeline=stages, context=context)
             for r in range(world)]
    assert {r.data_world for r in ranks} == {groups}
    by_group: dict[tuple[int, int], float] = {}
    for r in ranks:
        key = (r.stage_rank, r.data_rank)
        by_group[key] = by_group.get(key, 0.0) + r.loss_weight
    last = stages - 1
    assert {k: v for k, v in by_group.items() if k[0] == last} == {(last, g): pytest.approx(1.0) for g in range(groups)}
    assert len(parallel.mesh_shape("fsdp", world, world, tensor, stages, context)) == (
        1 + (stages > 1) + (context > 1) + (tensor > 1))


def test_the_ring_s_memory_and_traffic_grow_with_the_context_and_shrink_with_the_degree():
    one = cp.gather_terms(2, 8192, 2048, 2)(1, 0)["context_gather"]
    assert cp.gather_terms(2, 8192, 2048, 2)(2, 0)["context_gather"] == 2 * one  # per sample
    assert cp.gather_terms(4, 8192, 2048, 2)(1, 0)["context_gather"] < one  # smaller gradient chunks
    assert one >= 8192 * 2048 * 2  # the whole context's keys and values, gathered
    assert cp.traffic_bytes(8192, 4, 2048, 2, True) > cp.traffic_bytes(8192, 4, 2048, 2, False)
    assert cp.traffic_bytes(16384, 4, 2048, 2, False) == 2 * cp.traffic_bytes(8192, 4, 2048, 2, False)


# --------------------------------------------------------------------------
# The plan


def long_llama(directory: Path, tokens: int, extra: str = "") -> kc.Config:
    """The Llama 3.1 8B preset at `tokens` of context, checkpointed, planned for GPUs."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "fragment").write_text(f"CONFIG_LLAMA_BLOCK_SIZE={tokens}\nCONFIG_GRADIENT_CHECKPOINTING=y\n"
                                        + extra)
    kc.make_defconfig("llama3-8b", [str(directory / "fragment")], out=directory / ".config")
    return kc.read_config(directory / ".config")


def test_a_small_llama_plans_a_context_parallel_group_on_gpus(tmp_path):
    """The quick tier's plan: llama-tiny's 128 tokens over CP 2 on 4 simulated H100s (2 data-parallel groups of
    2), traced at 64 tokens a process with the gathered keys and values beside it."""
    config = kc.read_config(llama_config(tmp_path, "CONFIG_CP=2\n", device="AUTO"))
    plan = make_plan(config, resolve_hardware(gpu="h100", gpus=4), world_size=4).plan
    assert (plan.context_parallel, plan.data_parallel) == (2, 2)
    assert plan.strategy != "ddp" and plan.split.text().endswith("x 2 context-parallel groups = 16")
    assert plan.memory_breakdown["context_gather"] >= plan.micro_batch * 128 * 2 * 4 * 32 * 2
    assert "64 each" in plan.reasons["context_parallel"]
    assert "context parallelism over 2 processes" in plan.reasons["communication"]


@pytest.mark.slow  # the 8B preset's traces at 8k and 32k tokens, cold: about 40 s
def test_a_context_parallel_process_is_planned_at_its_share_of_the_context(tmp_path):
    """CP=4 on 8 H100s: each process traced at a quarter of the 32k context with the gathered keys and values
    beside it, FSDP over all 8 (2 data-parallel groups x 4), the ring's collectives in the step time."""
    config = long_llama(tmp_path, 32768, "CONFIG_CP=4\n")
    h100 = resolve_hardware(gpu="h100", gpus=8)
    planned = make_plan(config, h100, world_size=8)
    plan = planned.plan
    assert (plan.context_parallel, plan.data_parallel) == (4, 2)
    assert plan.effective_batch == config.target_effective_batch
    assert plan.memory_breakdown["context_gather"] >= plan.micro_batch * 32768 * 2 * 32 * 128 * 2
    assert plan.predicted_peak_bytes <= plan.budget_bytes and plan.predicted_samples_per_second
    assert "context parallelism over 4 processes" in plan.reasons["communication"]
    assert "8192 each" in plan.reasons["context_parallel"]
    from lib.planning.render import format_plan

    [row] = [line for line in format_plan(plan, config, h100, planned.model).splitlines()
             if line.lstrip().startswith("context parallel")]
    assert "4 per group" in row
    # the whole context on one process does not fit where a quarter of it does
    with pytest.raises(PlanError, match="does not fit"):
        make_plan(dataclasses.replace(config, context_parallel=1), h100, world_size=8)


def test_the_plan_refuses_in_one_line_what_context_parallelism_cannot_split(tmp_path):
    config = long_llama(tmp_path, 8192)
    h100 = resolve_hardware(gpu="h100", gpus=8)

    def refused(match: str, hardware=h100, world: int = 8, model: kc.Config = config, **changes) -> None:
        with pytest.raises(PlanError, match=match) as err:
            make_plan(dataclasses.replace(model, **changes), hardware, world_size=world)
        assert "\n" not in str(err.value) and "CONFIG_CP" in str(err.value)

    refused("CUDA kernels only", hardware=CPU, world=2, context_parallel=2)
    refused("do not split into 2 x 8 equal chunks", context_parallel=8, llama_block_size=8184)
    refused("needs groups of 16 processes", context_parallel=16)
    refused("needs groups of 4 x CONFIG_TP=4", context_parallel=4, tensor_parallel=4, world=12)
    refused("DDP", context_parallel=2, parallel_strategy="ddp")
    kc.make_defconfig("gpt2-tiny", [], out=tmp_path / "gpt2.config")
    gpt2 = kc.read_config(tmp_path / "gpt2.config")
    refused("GPT-2 cannot split its sequences", model=dataclasses.replace(gpt2, device="auto"), context_parallel=2)
    tiny = kc.read_config(llama_config(tmp_path / "tiny"))
    one = make_plan(dataclasses.replace(tiny, context_parallel=2), CPU, world_size=1).plan
    assert one.context_parallel == 1 and "nothing to split" in one.reasons["context_parallel"]


@pytest.mark.slow  # every degree's plan of the 8B preset at 8k and 32k tokens, cold: about 75 s
def test_auto_splits_a_context_that_does_not_fit_whole_and_names_each_degree_s_speed(tmp_path):
    """CONFIG_CP=0: at 32k tokens the 8B preset does not fit whole on an H100, so AUTO splits the context and
    says why the unsplit layout lost; at 8k every degree plans, and the fastest predicted is kept among them."""
    config = long_llama(tmp_path, 32768, "CONFIG_CP=0\n")
    h100 = resolve_hardware(gpu="h100", gpus=8)
    plan = make_plan(config, h100, world_size=8).plan
    why = plan.reasons["context_parallel"]
    assert plan.context_parallel > 1 and why.startswith(f"AUTO (CONFIG_CP=0): CP {plan.context_parallel}: ")
    assert "CP 1: " in why and "does not fit" in why  # the unsplit layout's refusal, said
    short = make_plan(long_llama(tmp_path / "short", 8192, "CONFIG_CP=0\n"), h100, world_size=8).plan
    speeds = {int(d): float(v.replace(",", "")) for d, v in
              re.findall(r"CP (\d+): ([\d,.]+) samples/s", short.reasons["context_parallel"])}
    assert set(speeds) == {1, 2, 4}  # 8192 tokens: 4096 and 2048 a process; 1024 is below the floor
    assert speeds[short.context_parallel] == max(speeds.values())


# --------------------------------------------------------------------------
# Real runs: torch's ring with the CPU's kernel, the rest of the path as on a GPU


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return reference_run(tmp_path_factory.mktemp("one"))


@pytest.fixture
def cpu_ring(monkeypatch):
    """Every Python process the test starts (kfit's launcher, torchrun's ranks) with the CPU ring installed."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(RING_SITE), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.slow
def test_cp2_on_two_processes_trains_as_one_process_does(tmp_path, one_process, cpu_ring):
    done = train(tmp_path, llama_config(tmp_path), 2, args=("--set", "CP=2"))
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir, _ = losses_of(tmp_path)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["context_parallel"], plan["strategy"]) == (2, "fsdp")
    assert_like_one_process(run_dir, one_process, tmp_path / "e")


@pytest.mark.slow
def test_cp2_by_tp2_on_four_processes_trains_as_one_process_does(tmp_path, one_process, cpu_ring):
    done = train(tmp_path, llama_config(tmp_path), 4, args=("--set", "CP=2", "--set", "TP=2"))
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir, _ = losses_of(tmp_path)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["context_parallel"], plan["tensor_parallel"]) == (2, 2)
    assert_like_one_process(run_dir, one_process, tmp_path / "e")


@pytest.mark.slow
def test_a_cp_run_resumes_under_fsdp_then_on_one_process(tmp_path, one_process, cpu_ring):
    resumes_under_fsdp_then_one_process(tmp_path, one_process, "CP=2")
