"""Tensor parallelism (CONFIG_TP): the mesh, the plan's refusals, how a window is cut by data-parallel group,
and real gloo runs on this CPU: TP 2 with 2 processes and TP 2 x FSDP 2 with 4 train as one process does,
and a TP run resumes on another layout through DCP."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lib import checkpoint, parallel
from lib import config as kc
from lib.distributed import Rank
from lib.errors import KfitError, PlanError
from lib.export import export, load_exported
from lib.hardware import resolve_hardware
from lib.planning import make_plan
from lib.planning.decisions import tensor_parallel_candidates
from lib.trainer.windows import rank_batches
from tests.helpers import CPU
from tests.test_fsdp import losses, train

STEPS = 6

# llama-tiny (4 heads, 2 key/value heads, 384 hidden units, 128 tokens, tied embeddings): 16 samples a step
COMMON = ("CONFIG_TARGET_EFFECTIVE_BATCH=16\nCONFIG_LOG_INTERVAL=1\nCONFIG_EVAL_INTERVAL=1000\n"
          "CONFIG_OUTPUT_DIR=\"runs\"\nCONFIG_GRAD_CLIP=\"1.0\"\nCONFIG_COMPILE_MANUAL=y\n# CONFIG_COMPILE_MODEL is not set\n"
          "CONFIG_CHECKPOINT_INTERVAL_STEPS=y\nCONFIG_CHECKPOINT_EVERY_STEPS=2\nCONFIG_CHECKPOINT_KEEP=2\n")


def llama_config(directory: Path, extra: str = "", steps: int = STEPS, device: str = "CPU") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "fragment").write_text(COMMON + f"CONFIG_DEVICE_{device}=y\nCONFIG_MAX_STEPS={steps}\n" + extra)
    kc.make_defconfig("llama-tiny", [str(directory / "fragment")], out=directory / ".config")
    return directory / ".config"


# --------------------------------------------------------------------------
# The mesh and the cut of a window


def test_the_mesh_puts_tensor_parallel_groups_last_and_fsdp_over_the_rest():
    assert parallel.mesh_shape("none", 2, 2, tensor=2) == (1, 2)
    assert parallel.mesh_shape("fsdp", 4, 4, tensor=2) == (2, 2)
    assert parallel.mesh_shape("hsdp", 16, 8, tensor=2) == (2, 4, 2)  # machines x groups per machine x TP
    assert parallel.mesh_shape("fsdp", 8, 8) == (8,)  # no TP: as before


@settings(max_examples=200, deadline=None)
@given(groups=st.integers(1, 6), tensor=st.integers(1, 4), window=st.integers(1, 60), micro=st.integers(1, 9))
def test_a_window_is_cut_by_data_parallel_group_and_each_group_sees_one_slice(groups, tensor, window, micro):
    """Every process of a tensor-parallel group trains on the same samples; the groups' slices cover the window
    once; and exactly one process per group counts its loss."""
    world = groups * tensor
    samples = list(range(100, 100 + window))
    seen: dict[int, list[int]] = {}
    counted = 0
    for r in range(world):
        rank = Rank(rank=r, world_size=world, local_world_size=world, tensor=tensor)
        # a group with no samples runs weightless batches (so the collectives match): they count for nothing
        mine = [i for indices, weight in rank_batches(samples, rank.data_rank, rank.data_world, micro,
                                                      equal_counts=True) if weight for i in indices]
        assert seen.setdefault(rank.data_rank, mine) == mine  # the same as the group's other processes
        counted += rank.counts
    assert sorted(i for slice_ in seen.values() for i in slice_) == samples
    assert counted == groups


# --------------------------------------------------------------------------
# The plan


def test_the_plan_shares_the_batch_by_data_parallel_groups(tmp_path):
    config = kc.read_config(llama_config(tmp_path, "CONFIG_TP=2\n"))
    plan = make_plan(config, CPU, world_size=4).plan
    assert (plan.world_size, plan.tensor_parallel, plan.data_parallel) == (4, 2, 2)
    assert plan.micro_batch * plan.grad_accum * plan.data_parallel == plan.effective_batch == 16
    assert plan.strategy in parallel.SHARDED  # AUTO: FSDP across the groups, never DDP
    assert "2 tensor-parallel group(s) of 2" in plan.reasons["tensor_parallel"]
    assert plan.split.text() == f"{plan.micro_batch} x {plan.grad_accum} x 2 tensor-parallel groups = 16"
    alone = make_plan(config, CPU, world_size=2).plan
    assert (alone.strategy, alone.data_parallel, alone.micro_batch * alone.grad_accum) == ("none", 1, 16)
    one = make_plan(config, CPU, world_size=1).plan  # the same config on one process: nothing to split
    assert one.tensor_parallel == 1 and "nothing to split" in one.reasons["tensor_parallel"]


@pytest.mark.parametrize("extra, world, words", [
    ("CONFIG_TP=3\n", 3, "key/value heads"),  # llama-tiny has 2
    ("CONFIG_TP=2\n", 3, "within one machine"),
    ("CONFIG_TP=2\nCONFIG_PARALLEL_DDP=y\n", 4, "CONFIG_PARALLEL_FSDP"),
])
def test_a_degree_this_run_cannot_use_is_one_line_naming_the_setting(tmp_path, extra, world, words):
    config = kc.read_config(llama_config(tmp_path, extra))
    with pytest.raises(PlanError) as err:
        make_plan(config, CPU, world_size=world)
    message = str(err.value)
    assert "CONFIG_TP=" in message and words in message and "\n" not in message


def test_auto_plans_every_degree_that_splits_the_model_and_keeps_the_fastest(tmp_path):
    config = kc.read_config(llama_config(tmp_path, "CONFIG_TP=0\n", device="AUTO"))
    assert tensor_parallel_candidates(config, 8, 1) == [1, 2]  # llama-tiny's 2 key/value heads: no 4 or 8
    assert tensor_parallel_candidates(config, 16, 2) == [1, 2]
    assert tensor_parallel_candidates(config, 3, 1) == [1]
    h100 = resolve_hardware(gpu="h100", gpus=4)
    plan = make_plan(config, h100, world_size=4).plan
    why = plan.reasons["tensor_parallel"]
    assert why.startswith("AUTO (CONFIG_TP=0): ") and "TP 1: " in why and "TP 2: " in why
    each = {d: make_plan(dataclasses.replace(config, tensor_parallel=d), h100, world_size=4).plan for d in (1, 2)}
    fastest = max(each.values(), key=lambda p: p.predicted_samples_per_second)
    assert plan.tensor_parallel == fastest.tensor_parallel
    assert plan.predicted_samples_per_second == fastest.predicted_samples_per_second
    # where step time is unknown (a CPU's 2 processes share its cores: measured, but AUTO still decides)
    cpu = make_plan(kc.read_config(llama_config(tmp_path / "cpu", "CONFIG_TP=0\n")), CPU, world_size=2).plan
    assert cpu.tensor_parallel in (1, 2) and cpu.reasons["tensor_parallel"].startswith("AUTO")


def test_auto_passes_on_a_refusal_that_no_degree_changes_as_it_is(tmp_path):
    """A refusal every degree meets alike (here a CUDA device on a machine without one) is the error the
    config gets with CONFIG_TP=1, word for word: the command line and the API say the same."""
    config = kc.read_config(llama_config(tmp_path, "CONFIG_TP=0\n", device="CUDA"))
    with pytest.raises(KfitError) as auto:
        make_plan(config, CPU, world_size=2)
    with pytest.raises(KfitError) as one:
        make_plan(dataclasses.replace(config, tensor_parallel=1), CPU, world_size=2)
    assert str(auto.value) == str(one.value) and "CONFIG_TP" not in str(auto.value)


def test_gpt2_and_float8_are_refused_with_tp(tmp_path):
    (tmp_path / "frag").write_text("CONFIG_DEVICE_CPU=y\nCONFIG_TP=2\n")
    kc.make_defconfig("gpt2-tiny", [str(tmp_path / "frag")], out=tmp_path / "g")
    with pytest.raises(PlanError, match="GPT-2 states no tensor-parallel plan"):
        make_plan(kc.read_config(tmp_path / "g"), CPU, world_size=2)
    h100 = resolve_hardware(gpu="h100", gpus=2)
    float8 = llama_config(tmp_path / "f8", "CONFIG_TP=2\nCONFIG_FLOAT8_TENSORWISE=y\n", device="AUTO")
    with pytest.raises(PlanError, match="float8 linear layers are not yet split"):
        make_plan(kc.read_config(float8), h100, world_size=2)


# --------------------------------------------------------------------------
# Real runs: torchrun, gloo, on this CPU


def losses_of(directory: Path) -> tuple[Path, dict[int, float]]:
    [run_dir] = (directory / "runs").iterdir()
    return run_dir, losses(run_dir)


def reference_run(directory: Path, extra: str = "") -> tuple[dict, dict]:
    """(losses by step, final weights) of one process taking the same 16 samples per step (and `extra`)."""
    done = train(directory, llama_config(directory, extra), 1)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir, by_step = losses_of(directory)
    return by_step, load_exported(export(run_dir, directory / "e"))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return reference_run(tmp_path_factory.mktemp("one"))


def assert_like_one_process(run_dir: Path, one_process, out: Path) -> None:
    """The run's losses and exported weights are one process's (`one_process`: reference_run's)."""
    reference, weights = one_process
    got = losses(run_dir)
    assert set(got) == set(reference)
    for step, loss in reference.items():
        assert got[step] == pytest.approx(loss, abs=1e-4), step
    exported = load_exported(export(run_dir, out))
    assert set(exported) == set(weights)
    for name, value in weights.items():
        torch.testing.assert_close(exported[name], value, atol=2e-5, rtol=1e-4, msg=name)


def trains_as_one_process(directory: Path, one_process, gpus: int, settings: tuple[str, ...], extra: str = "",
                          **plan_fields) -> Path:
    """`kfit train` on `gpus` gloo processes with `settings` (KEY=value overrides) and `extra` in the config: its
    plan.json has `plan_fields`, and its losses and weights are one process's. Returns the run directory."""
    done = train(directory, llama_config(directory, extra), gpus, args=tuple(a for s in settings for a in ("--set", s)))
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir, _ = losses_of(directory)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert {k: plan[k] for k in plan_fields} == plan_fields
    assert_like_one_process(run_dir, one_process, directory / "e")
    return run_dir


@pytest.mark.slow
def test_tp2_on_two_processes_trains_as_one_process_does(tmp_path, one_process):
    run_dir = trains_as_one_process(tmp_path, one_process, 2, ("TP=2",), tensor_parallel=2, strategy="none")
    assert (run_dir / checkpoint.FINAL_SHARDED / "__1_0.distcp").is_file()  # each rank saved its part (DCP)


@pytest.mark.slow
def test_tp2_by_fsdp2_on_four_processes_trains_as_one_process_does(tmp_path, one_process):
    trains_as_one_process(tmp_path, one_process, 4, ("TP=2", "PARALLEL_FSDP=y"), world_size=4, tensor_parallel=2,
                          strategy="fsdp")


def resumes_under_fsdp_then_one_process(directory: Path, one_process, first: str, extra: str = "") -> None:
    """A 2-process run with `first` (a KEY=value override) stopped by SIGTERM, resumed as FSDP over 2 processes
    and stopped again, finished on one process (DCP reshards the checkpoint at each change of layout): the
    losses and weights of one process throughout."""
    config = llama_config(directory, extra)
    stopped = train(directory, config, 2, stop_after=2, args=("--set", first))
    assert stopped.returncode == 143, stopped.stdout
    again = train(directory, config, 2, stop_after=4, args=("--set", "PARALLEL_FSDP=y"))
    assert again.returncode in (0, 143) and "Resuming" in again.stdout, again.stdout
    finished = train(directory, config, 1)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    run_dir, _ = losses_of(directory)
    assert_like_one_process(run_dir, one_process, directory / "e")


@pytest.mark.slow
def test_a_tp_run_resumes_under_fsdp_then_on_one_process(tmp_path, one_process):
    resumes_under_fsdp_then_one_process(tmp_path, one_process, "TP=2")


# --------------------------------------------------------------------------
# What the planner predicts for a tensor-parallel process


@pytest.mark.slow  # two traces, one in a child process; AUTO's test below traces TP plans in the quick tier
def test_a_tensor_parallel_process_is_traced_holding_its_share_of_the_model(tmp_path):
    """The sharded tracer applies the same tensor_parallelize as the trainer: at TP 2 a process holds half of
    every split weight (the norms, a few hundred numbers, whole), and its activations shrink too."""
    from lib.memory import MemoryPredictor

    config = kc.read_config(llama_config(tmp_path))
    predictor = MemoryPredictor(cache_dir=tmp_path / "cache")
    whole = predictor.trace(config, batch=8, device_type="cpu", precision="fp32")
    split = predictor.trace(config, batch=8, device_type="cpu", precision="fp32", tensor=2)
    assert split.breakdown["parameters"] == pytest.approx(whole.breakdown["parameters"] / 2, rel=0.01)
    assert split.breakdown["activations"] < 0.7 * whole.breakdown["activations"]
    assert split.peak_bytes < whole.peak_bytes


@pytest.mark.slow
def test_tp_by_fsdp_is_traced_with_a_quarter_of_the_model_per_process(tmp_path):
    from lib.memory import MemoryPredictor

    config = kc.read_config(llama_config(tmp_path))
    predictor = MemoryPredictor(cache_dir=tmp_path / "cache")
    whole = predictor.trace(config, batch=8, device_type="cpu", precision="fp32")
    both = predictor.trace(config, batch=8, device_type="cpu", precision="fp32", strategy="fsdp", world_size=2,
                           tensor=2)
    fsdp = predictor.trace(config, batch=8, device_type="cpu", precision="fp32", strategy="fsdp", world_size=2)
    assert both.breakdown["parameters"] == pytest.approx(whole.breakdown["parameters"] / 4, rel=0.02)
    assert both.peak_bytes < fsdp.peak_bytes


def test_tensor_parallel_collectives_are_added_whole_to_each_micro_batch():
    from lib.steptime.comm import BUS_EFFICIENCY, Communication

    comm = Communication("none", world_size=1, shard_size=1, parameter_bytes=0, gradient_bytes=0,
                         link_bytes_per_s=100e9, tensor=4, tensor_bytes_per_sample=1e9)
    one = 0.75 * 1e9 / (100e9 * BUS_EFFICIENCY)  # (N - 1) / N of a sample's bytes through each link
    assert comm.tensor_seconds(1) == pytest.approx(one)
    # compute never hides them: the next layer waits for its activations
    assert comm.exposed_seconds([10.0, 10.0], [8, 8]) == pytest.approx(16 * one)
    assert comm.gather_seconds() == comm.reduce_seconds() == 0.0  # one group: no data-parallel collectives


@pytest.fixture(scope="module")
def tiny_on_h100(tmp_path_factory):
    """llama-tiny's step-time model on an H100 (the roofline: nothing measured here)."""
    from lib.steptime import step_time_model

    directory = tmp_path_factory.mktemp("steptime")
    config = kc.read_config(llama_config(directory))
    return step_time_model(config, resolve_hardware(gpu="h100"), device_type="cuda", precision="bf16",
                           cache_dir=directory / "cache")


@settings(max_examples=40, deadline=None)
@given(tensor=st.sampled_from([2, 4, 8]), micro=st.integers(1, 64), accum=st.integers(1, 4))
def test_a_tensor_parallel_process_computes_the_whole_model_at_a_share_of_the_micro_batch(tiny_on_h100, tensor,
                                                                                         micro, accum):
    whole = tiny_on_h100
    split = dataclasses.replace(whole, tensor=tensor)
    parts = split.parts(micro, accum)
    assert parts["micro_batches"] == pytest.approx(accum * whole.corrected_micro_seconds(micro / tensor), rel=1e-9)
    assert parts["optimizer"] == pytest.approx(whole.parts(micro, accum)["optimizer"] / tensor, rel=1e-9)


def test_a_tensor_parallel_plan_on_gpus_predicts_its_step_with_the_collectives(tmp_path):
    config = kc.read_config(llama_config(tmp_path, "CONFIG_TP=2\n", device="AUTO"))
    h100 = resolve_hardware(gpu="h100", gpus=4)
    split = make_plan(config, h100, world_size=4).plan
    assert split.predicted_step_seconds and "tensor parallelism over 2 processes" in split.reasons["communication"]
    whole = make_plan(kc.read_config(llama_config(tmp_path / "w", device="AUTO")), h100, world_size=4).plan
    # the same 16 samples a step: two groups of two each compute half the work of four whole processes'
    assert split.data_parallel == 2 and whole.data_parallel == 4
    assert split.predicted_peak_bytes < whole.predicted_peak_bytes * 1.1
