"""Pipeline parallelism (CONFIG_PP): how a model is cut into stages and a window into the pipeline's
micro-batches, the plan's refusals, and real gloo runs on this CPU: PP 2 with 1F1B and with the interleaved
schedule on 2 processes, and PP 2 x FSDP 2 on 4, train as one process does, and a PP run resumes on other
layouts through DCP (and a one-process run under PP)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lib import parallel, pipeline
from lib import config as kc
from lib.distributed import Rank
from lib.errors import PlanError
from lib.hardware import resolve_hardware
from lib.models.llama import Llama, LlamaConfig
from lib.planning import make_plan
from tests.helpers import CPU
from tests.test_fsdp import train
from tests.test_tensor_parallel import (assert_like_one_process, llama_config, losses_of, reference_run,
                                        resumes_under_fsdp_then_one_process, trains_as_one_process)

UNTIED = "# CONFIG_LLAMA_TIE_EMBEDDINGS is not set\n"


# --------------------------------------------------------------------------
# The cut


@settings(max_examples=300, deadline=None)
@given(blocks=st.integers(1, 130), stages=st.integers(1, 130))
def test_the_blocks_are_cut_into_consecutive_stages_of_nearly_equal_length(blocks, stages):
    if stages > blocks:
        return
    cuts = pipeline.stage_blocks(blocks, stages)
    assert [i for cut in cuts for i in cut] == list(range(blocks))  # each block once, in order
    lengths = [len(cut) for cut in cuts]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths)  # the longer ones last: the first stage also holds the embedding


@settings(max_examples=300, deadline=None)
@given(share=st.integers(1, 300), micro=st.integers(1, 64), degree=st.integers(2, 8),
       schedule=st.sampled_from(sorted(pipeline.SCHEDULES)))
def test_a_share_is_cut_into_equal_micro_batches_torch_schedules_accept(share, micro, degree, schedule):
    n, size = pipeline.micro_batches(share, micro, degree, schedule)
    assert n >= degree and size <= micro and n * size >= share
    assert n * size - share < n  # padding: less than one sample per micro-batch
    if schedule == "Interleaved1F1B":  # torch's rule: a multiple of its rounds of `degree`
        assert n % max(1, n // degree) == 0


@settings(max_examples=40, deadline=None)
@given(blocks=st.integers(1, 6), degree=st.integers(1, 6), schedule=st.sampled_from(sorted(pipeline.SCHEDULES)),
       seed=st.integers(0, 3))
def test_the_stages_of_every_process_chained_compute_the_whole_model(blocks, degree, schedule, seed):
    """Each process's cut copy keeps the whole model's tensor names; the processes' parts cover the model once;
    and running stage after stage gives the whole model's logits."""
    per = pipeline.stages_per_process(schedule)
    if pipeline.pipeline_problem(blocks, degree, schedule, tied=False):
        return
    config = LlamaConfig(dim=32, n_layer=blocks, n_head=4, n_kv_head=2, hidden_dim=48, block_size=16,
                         vocab_size=40, tie_embeddings=False)
    torch.manual_seed(seed)
    whole = Llama(config).eval()
    names = set(whole.state_dict())
    parts = {}
    for r in range(degree):
        part = Llama(config)
        part.load_state_dict(whole.state_dict())
        pipeline.keep_stages(part, pipeline.process_stages(r, degree, per), degree * per)
        parts[r] = part.eval()
    held = [n for part in parts.values() for n in part.state_dict()]
    assert sorted(held) == sorted(names)  # every tensor on exactly one process, under its own name
    assert all(parts[r].pipeline_elsewhere == names - set(parts[r].state_dict()) for r in parts)
    idx = torch.randint(0, 40, (2, 16))
    x = idx
    for stage in range(degree * per):
        x = parts[stage % degree](x, stage=stage)
    torch.testing.assert_close(x, whole(idx))


def test_fsdp_wraps_a_stage_s_numbered_blocks_one_by_one_and_gpt2_s_as_before():
    config = LlamaConfig(dim=32, n_layer=4, n_head=4, n_kv_head=2, hidden_dim=48, block_size=16, vocab_size=40,
                         tie_embeddings=False)
    part = pipeline.keep_stages(Llama(config), [1], 2)
    assert [type(u).__name__ for u in parallel.shard_units(part)] == ["Block", "Block"]
    from lib.models.gpt2 import GPT2, GPT2Config

    gpt = GPT2(GPT2Config(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=20))
    assert len(parallel.shard_units(gpt)) == 3  # its ModuleDict of named parts is not a stage's blocks


def test_the_mesh_puts_the_pipeline_first():
    assert parallel.mesh_shape("none", 2, 2, pipeline=2) == (2, 1)
    assert parallel.mesh_shape("fsdp", 8, 8, tensor=2, pipeline=2) == (2, 2, 2)
    # 4 machines of 8: a stage on 2 of them, replicated across those, sharded over 4 TP groups within each
    assert parallel.mesh_shape("hsdp", 32, 8, tensor=2, pipeline=2) == (2, 2, 4, 2)


@settings(max_examples=200, deadline=None)
@given(stages=st.integers(1, 4), tensor=st.integers(1, 4), groups=st.integers(1, 4))
def test_every_process_has_one_place_and_one_counts_each_data_parallel_group(stages, tensor, groups):
    world = stages * tensor * groups
    ranks = [Rank(rank=r, world_size=world, tensor=tensor, pipeline=stages) for r in range(world)]
    places = {(r.stage_rank, r.data_rank, r.rank % tensor) for r in ranks}
    assert len(places) == world  # (stage, data group, TP rank) names each process once
    assert all(r.data_world == groups for r in ranks)
    counting = [r.data_rank for r in ranks if r.counts]
    assert sorted(counting) == list(range(groups))  # one per data-parallel group, on its last stage
    assert all(r.stage_rank == stages - 1 for r in ranks if r.counts)


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.integers(1, 5), min_size=1, max_size=6), pad=st.integers(0, 3), window=st.integers(30, 40))
def test_padding_rows_leave_the_weighted_loss_as_it_was(rows, pad, window):
    """A micro-batch with padded rows (targets IGNORE) weighs only its real rows, as one process weighs them."""
    torch.manual_seed(len(rows))
    out = torch.randn(sum(rows), 3, 7)
    y = torch.randint(0, 7, (sum(rows), 3))
    from lib.task import cross_entropy

    plain = pipeline._weighted(cross_entropy, window, 1.0, padded=False)(out, y)
    padded_out = torch.cat([out, torch.randn(pad, 3, 7)])
    padded_y = pipeline.pad(y, pad, pipeline.IGNORE) if pad else y
    torch.testing.assert_close(pipeline._weighted(cross_entropy, window, 1.0, padded=True)(padded_out, padded_y),
                               plain)


@settings(max_examples=200, deadline=None)
@given(degree=st.integers(2, 8), n=st.integers(1, 64), rank=st.integers(0, 7))
def test_the_micro_batches_held_at_once_follow_each_schedule(degree, n, rank):
    """GPipe holds every micro-batch; 1F1B no more than the stages after this one; the interleaved schedule
    between the two (its chunks are half a process's blocks), never more than all of them."""
    rank = rank % degree
    n = max(n, degree)
    gpipe, one_f = pipeline.in_flight("GPipe", degree, n, rank), pipeline.in_flight("1F1B", degree, n, rank)
    inter = pipeline.in_flight("Interleaved1F1B", degree, n, rank)
    assert gpipe == n and one_f == min(n, degree - rank)
    assert 0.5 <= inter <= n
    assert pipeline.in_flight("1F1B", degree, n, 0) >= pipeline.in_flight("1F1B", degree, n, degree - 1) == 1


@pytest.fixture(scope="module")
def untied_on_h100(tmp_path_factory):
    """An untied llama-tiny's step-time model on an H100 (the roofline: nothing measured here)."""
    from lib.steptime import step_time_model

    directory = tmp_path_factory.mktemp("steptime")
    config = kc.read_config(llama_config(directory, UNTIED))
    return step_time_model(config, resolve_hardware(gpu="h100"), device_type="cuda", precision="bf16",
                           cache_dir=directory / "cache")


@settings(max_examples=60, deadline=None)
@given(degree=st.sampled_from([2, 4]), micro=st.integers(1, 16), accum=st.integers(1, 16),
       schedule=st.sampled_from(sorted(pipeline.SCHEDULES)))
def test_a_pipeline_step_is_its_stages_share_of_each_micro_batch_and_the_bubble(untied_on_h100, degree, micro,
                                                                               accum, schedule):
    whole = untied_on_h100
    staged = dataclasses.replace(whole, pipeline=degree, pipeline_schedule=schedule)
    n, size = pipeline.micro_batches(micro * accum, micro, degree, schedule)
    parts = staged.parts(micro, accum)
    stage = whole.corrected_micro_seconds(size) / degree
    assert parts["micro_batches"] == pytest.approx(n * stage, rel=1e-9)
    assert parts["pipeline_bubble"] / (parts["micro_batches"] + parts["pipeline_bubble"]) == pytest.approx(
        pipeline.bubble_share(schedule, degree, n), rel=1e-9)
    # interleaving halves the bubble of the same cut
    if schedule == "1F1B":
        inter = dataclasses.replace(whole, pipeline=degree, pipeline_schedule="Interleaved1F1B")
        n2, size2 = pipeline.micro_batches(micro * accum, micro, degree, "Interleaved1F1B")
        if (n2, size2) == (n, size):
            assert inter.parts(micro, accum)["pipeline_bubble"] == pytest.approx(parts["pipeline_bubble"] / 2)


def test_a_pipeline_across_machines_sends_over_the_network(tmp_path):
    config = kc.read_config(llama_config(tmp_path, UNTIED + "CONFIG_PP=2\n", device="AUTO"))
    h100 = resolve_hardware(gpu="h100", gpus=8)
    plan = make_plan(config, h100, world_size=16, nodes=2).plan
    assert plan.pipeline_parallel == 2 and plan.predicted_step_seconds
    assert "pipeline stages" in plan.reasons["communication"] and "the network" in plan.reasons["communication"]


# --------------------------------------------------------------------------
# The plan


def test_the_plan_cuts_a_llama_into_stages_and_refuses_in_one_line_what_it_cannot(tmp_path):
    config = kc.read_config(llama_config(tmp_path, UNTIED))
    cpu = CPU
    plan = make_plan(dataclasses.replace(config, pipeline_parallel=2), cpu, world_size=2).plan
    assert (plan.pipeline_parallel, plan.pipeline_schedule, plan.data_parallel) == (2, "1F1B", 1)
    # one micro-batch per stage at least (the planner's cap): 16 samples in 2 or more
    assert plan.micro_batch <= 8 and plan.micro_batch * plan.grad_accum == 16
    staged = dataclasses.replace(config, pipeline_parallel=2, parallel_strategy="fsdp")
    planned = make_plan(staged, cpu, world_size=4)
    four = planned.plan
    assert four.data_parallel == 2 and four.split.text().endswith("x 2 pipelines = 16")
    from lib.planning.render import format_plan

    [row] = [line for line in format_plan(four, staged, cpu, planned.model).splitlines()
             if line.lstrip().startswith("pipeline parallel")]
    n, size = pipeline.micro_batches(8, four.micro_batch, 2, "1F1B")
    assert "2 stages, 1F1B" in row and f"{n} micro-batches of {size} a step, the bubble " in row
    one = make_plan(dataclasses.replace(config, pipeline_parallel=2), cpu, world_size=1).plan
    assert one.pipeline_parallel == 1 and "nothing to cut" in one.reasons["pipeline_parallel"]

    def refused(match: str, world: int = 2, **changes) -> None:
        with pytest.raises(PlanError, match=match) as err:
            make_plan(dataclasses.replace(config, **changes), cpu, world_size=world)
        assert "\n" not in str(err.value) and "CONFIG_PP" in str(err.value)

    refused("tied", pipeline_parallel=2, llama_tie_embeddings=True)
    refused("cannot make 8 stages", world=8, pipeline_parallel=8)  # llama-tiny has 4 blocks
    refused(r"cannot make 8 stages of one block at least \(4 processes x 2", world=4, pipeline_parallel=4,
            pipeline_schedule="Interleaved1F1B")
    refused("multiple of 2 processes", world=3, pipeline_parallel=2)
    refused("fp16", pipeline_parallel=2, precision="fp16")
    refused("DDP cannot replicate a pipeline stage", world=4, pipeline_parallel=2, parallel_strategy="ddp")
    kc.make_defconfig("gpt2-tiny", [], out=tmp_path / "gpt2.config")
    gpt2 = kc.read_config(tmp_path / "gpt2.config")
    with pytest.raises(PlanError, match="GPT-2 cannot be cut into pipeline stages"):
        make_plan(dataclasses.replace(gpt2, pipeline_parallel=2), cpu, world_size=2)


def test_auto_plans_a_pipeline_of_whole_machines_and_keeps_the_fastest_layout(tmp_path):
    """CONFIG_PP=0 plans 1 and every power of two up to the machines (stages across machines), each as
    CONFIG_PP=N would; with CONFIG_TP=0 too, every pairing; the reason names each layout's speed. On one machine
    it plans no pipeline."""
    from lib.planning.decisions import pipeline_candidates

    config = kc.read_config(llama_config(tmp_path, UNTIED + "CONFIG_PP=0\n", device="AUTO"))
    assert pipeline_candidates(config, 16, 4) == [1, 2, 4] and pipeline_candidates(config, 8, 1) == [1]
    tied = dataclasses.replace(config, llama_tie_embeddings=True)
    assert pipeline_candidates(tied, 16, 4) == [1]  # a tied output layer cannot be cut from its embedding
    h100 = resolve_hardware(gpu="h100", gpus=2)
    plan = make_plan(config, h100, world_size=4, nodes=2).plan
    why = plan.reasons["pipeline_parallel"]
    assert why.startswith("AUTO (CONFIG_PP=0): PP ") and "PP 1: " in why and "PP 2: " in why
    assert plan.pipeline_parallel in (1, 2) and plan.predicted_samples_per_second
    both = make_plan(dataclasses.replace(config, tensor_parallel=0), h100, world_size=4, nodes=2).plan
    assert "AUTO (CONFIG_TP=0 and CONFIG_PP=0): TP " in both.reasons["tensor_parallel"]
    assert all(f"TP {t} x PP {p}" in both.reasons["tensor_parallel"] for t in (1, 2) for p in (1, 2))
    # said once, on the first row: the pipeline's points there
    assert both.reasons["pipeline_parallel"] == "AUTO (CONFIG_TP=0 and CONFIG_PP=0): see the tensor parallel row"
    one = make_plan(config, resolve_hardware(gpu="h100", gpus=4), world_size=4).plan
    assert one.pipeline_parallel == 1 and one.reasons["pipeline_parallel"].startswith("AUTO")


def test_the_out_of_memory_ladder_takes_no_fp16_scaler_under_pipeline_stages(tmp_path):
    """fp16's scaler would check one stage's gradients for overflow: the autocast rung does not apply under PP
    on a GPU without bf16 (it still takes bf16 where there is)."""
    from lib.planning import ladder

    config = dataclasses.replace(kc.read_config(llama_config(tmp_path, UNTIED)), precision="auto")
    fp32 = dict(device_type="cuda", precision="fp32", gradient_checkpointing=True)
    assert ladder.changes(config, "autocast", supports_bf16=False, **fp32) == {"precision": "fp16",
                                                                               "grad_scaler": True}
    assert ladder.changes(config, "autocast", supports_bf16=False, pipeline=2, **fp32) is None
    assert ladder.changes(config, "autocast", supports_bf16=True, pipeline=2, **fp32)["precision"] == "bf16"


# --------------------------------------------------------------------------
# Real runs: torchrun, gloo, on this CPU


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One process's run of the untied Llama (a pipeline cannot cut a tied one)."""
    return reference_run(tmp_path_factory.mktemp("one"), UNTIED)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1F1B", "INTERLEAVED_1F1B", "GPIPE"])
def test_pp2_on_two_processes_trains_as_one_process_does(tmp_path, one_process, schedule):
    trains_as_one_process(tmp_path, one_process, 2, ("PP=2", f"PP_SCHEDULE_{schedule}=y"), UNTIED,
                          pipeline_parallel=2, strategy="none")


@pytest.mark.slow
def test_pp2_by_fsdp2_on_four_processes_trains_as_one_process_does(tmp_path, one_process):
    trains_as_one_process(tmp_path, one_process, 4, ("PP=2", "PARALLEL_FSDP=y"), UNTIED, world_size=4,
                          pipeline_parallel=2, strategy="fsdp")


@pytest.mark.slow
def test_pp2_by_tp2_on_four_processes_trains_as_one_process_does(tmp_path, one_process):
    trains_as_one_process(tmp_path, one_process, 4, ("PP=2", "TP=2"), UNTIED, world_size=4, pipeline_parallel=2,
                          tensor_parallel=2)


@pytest.mark.slow
def test_a_pp_run_resumes_under_fsdp_then_on_one_process(tmp_path, one_process):
    resumes_under_fsdp_then_one_process(tmp_path, one_process, "PP=2", UNTIED)


@pytest.mark.slow
def test_a_one_process_run_resumes_under_the_interleaved_pipeline(tmp_path, one_process):
    """A one-process checkpoint (one file, the whole model) resumed by PP 2 interleaved: each stage takes its
    tensors and their optimizer state from it."""
    config = llama_config(tmp_path, UNTIED)
    stopped = train(tmp_path, config, 1, stop_after=3)
    assert stopped.returncode == 143, stopped.stdout
    finished = train(tmp_path, config, 2, args=("--set", "PP=2", "--set", "PP_SCHEDULE_INTERLEAVED_1F1B=y"))
    assert finished.returncode == 0 and "Resuming" in finished.stdout, finished.stdout + finished.stderr
    run_dir, _ = losses_of(tmp_path)
    assert_like_one_process(run_dir, one_process, tmp_path / "e")
