"""make recommend (lib/recommend.py): token budgets, the score, the choice of model in either family (GPT-2,
Llama) and the corpus-size warning against hand-computed cases, then the command end to end: three
configurations with the Llama family's beside them, written as defconfigs, one of them trained."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lib import config as kconfig
from lib.errors import PlanError
from lib.cli.recommend import corpus_tokens
from lib.recommend import (MODES, SCORE_HIGH, SCORE_LOW, DataSource, Recommendation, Shape, compute_hours,
                           corpus_warning, data_warning, epochs_for, largest_covered, recommend_family, score,
                           state_fits, steps_for, token_budget, warnings_for)

from tests.helpers import fake_plan

ROOT = Path(__file__).resolve().parent.parent
CONSERVATIVE, BALANCED, EXTREME = MODES


def test_token_budgets_are_the_modes_chinchilla_ratios():
    assert [m.tokens_per_parameter for m in MODES] == [12, 20, 25]
    assert [m.share for m in MODES] == list(kconfig.MEMORY_PROFILES.values()) == [0.50, 0.90, 0.97]
    assert token_budget(86_000_000, BALANCED) == 1_720_000_000
    assert token_budget(30_000_000, CONSERVATIVE) == 360_000_000
    # 1.72e9 tokens in steps of 512 sequences x 1024 tokens: 3280.6 -> 3281
    assert steps_for(1_720_000_000, 512, 1024) == 3281
    assert steps_for(10, 512, 1024) == 1


def test_compute_and_memory_bounds():
    assert compute_hours(1_000_000, 20_000_000, 1e10) == pytest.approx(6 * 1e6 * 2e7 / 1e10 / 3600)  # 3.33 h
    assert state_fits(1_000_000, 16_000_000, processes=1, sharded=False)
    assert not state_fits(1_000_001, 16_000_000, processes=1, sharded=False)
    assert state_fits(2_000_000, 16_000_000, processes=2, sharded=True)  # FSDP shares the state


def test_the_score_is_a_log_scale_between_a_laptop_cpu_and_eight_h100s():
    assert score(SCORE_LOW) == 0.0 and score(SCORE_LOW / 10) == 0.0
    assert score(SCORE_HIGH) == 10.0 and score(SCORE_HIGH * 10) == 10.0
    # one H100, bf16: 989 TFLOP/s x 60% = 5.934e14: 10 x ln(29670) / ln(237360) = 8.32
    assert score(989e12 * 0.6) == 8.3
    assert score((SCORE_LOW * SCORE_HIGH) ** 0.5) == 5.0  # the geometric middle


@pytest.fixture(scope="module")
def gpt2():
    return kconfig.defconfig_config("gpt2")


def derive(config, assignments):
    return kconfig.derive(config, assignments)


SHAPES = [Shape("tiny", 1_000_000), Shape("124m", 30_000_000), Shape("355m", 60_000_000),
          Shape("774m", 150_000_000)]


def test_the_largest_shape_in_range_that_trains_in_time_is_chosen(gpt2):
    # 1e14 FLOP/s: 60M x 720M tokens x 6 = 0.72 h; 150M (out of range anyway) would take 4.5 h
    rec = recommend_family(gpt2, SHAPES, plan=fake_plan(), derive=derive, flops=1e14, budget=10**12, processes=1,
                         mode=CONSERVATIVE)
    assert rec.parameters == 60_000_000 and rec.out_of_reach is None
    assert rec.tokens == 720_000_000 and rec.steps == 2747  # 720e6 / (512 x 512) = 2746.6
    assert rec.assignments["GPT2_PRESET_355M"] and rec.assignments["MAX_STEPS"] == 2747
    assert rec.assignments["MEMORY_PROFILE_CONSERVATIVE"] and rec.assignments["GPT2_BLOCK_SIZE"] == 512
    assert rec.seconds == pytest.approx(274.7) and rec.watts == pytest.approx(50.0)
    assert rec.energy_kwh == pytest.approx(50.0 * 274.7 / 3.6e6)


def test_a_shape_the_planner_refuses_gives_way_to_the_next(gpt2):
    rec = recommend_family(gpt2, SHAPES, plan=fake_plan(fail=("355m",)), derive=derive, flops=1e14, budget=10**12,
                         processes=1, mode=CONSERVATIVE)
    assert rec.parameters == 30_000_000


def test_out_of_reach_names_the_largest_model_that_is_not(gpt2):
    # 1e12 FLOP/s: 30M x 360M tokens x 6 = 18 h > 2 h; the 1M shape takes 0.02 h
    rec = recommend_family(gpt2, SHAPES, plan=fake_plan(), derive=derive, flops=1e12, budget=10**12, processes=1,
                         mode=CONSERVATIVE)
    assert rec.parameters == 1_000_000
    assert "23M-70M" in rec.out_of_reach and "1.0M (tiny)" in rec.out_of_reach
    assert any(r.startswith("124m: at least 18.0 h") for r in rec.reasons)


def test_predicted_steps_over_the_modes_time_rule_a_shape_out(gpt2):
    # the bound passes (0.72 h) but the planner's step time says 2747 x 3 s = 2.3 h > 2 h
    rec = recommend_family(gpt2, SHAPES, plan=fake_plan(step_seconds=3.0), derive=derive, flops=1e14,
                         budget=10**12, processes=1, mode=CONSERVATIVE)
    assert rec.parameters == 30_000_000


LLAMA = [Shape("tiny", 1_000_000, "llama"), Shape("20m", 19_000_000, "llama"), Shape("60m", 64_000_000, "llama"),
         Shape("125m", 125_000_000, "llama")]


def test_the_llama_family_is_chosen_by_the_same_rule_and_selects_its_model(gpt2):
    # from the GPT-2 config: 64M x 12 = 768M tokens, 6 x 64e6 x 768e6 / 1e14 = 0.82 h; 125M is above 23M-70M
    rec = recommend_family(gpt2, LLAMA, plan=fake_plan(), derive=derive, flops=1e14, budget=10**12, processes=1,
                           mode=CONSERVATIVE)
    assert rec.shape == LLAMA[2] and rec.parameters == 64_000_000 and rec.out_of_reach is None
    assert rec.tokens == 768_000_000 and rec.steps == 2930  # 768e6 / (512 x 512) = 2929.7
    assert {k: rec.assignments[k] for k in ("MODEL_LLAMA", "LLAMA_PRESET_60M", "LLAMA_BLOCK_SIZE")} == {
        "MODEL_LLAMA": True, "LLAMA_PRESET_60M": True, "LLAMA_BLOCK_SIZE": 512}
    assert rec.config.model == "llama" and rec.config.llama_preset == "60m" and rec.config.llama_block_size == 512
    assert rec.to_dict()["model"] == "llama" and rec.to_dict()["preset"] == "60m"


def test_a_range_whose_sizes_all_run_too_long_falls_back_to_a_smaller_one(gpt2):
    # balanced (70M-200M): 125M passes the bound (6 x 125e6 x 2.5e9 / 1e15 = 0.52 h) but 2.5e9 / (512 x 1024)
    # = 4769 steps x 5 s = 6.6 h > 6 h: the largest smaller model, 64M, out of reach (4769 -> 2442 steps, 3.4 h)
    rec = recommend_family(gpt2, LLAMA, plan=fake_plan(step_seconds=5.0), derive=derive, flops=1e15,
                           budget=10**12, processes=1, mode=BALANCED)
    assert rec.parameters == 64_000_000 and rec.steps == 2442
    assert "70M-200M" in rec.out_of_reach and "64.0M (60m)" in rec.out_of_reach
    assert any(r.startswith("125m: 4,769 steps x 5.00 s is over 6 h") for r in rec.reasons)


def test_a_corpus_smaller_than_the_budget_says_the_epochs_and_the_largest_model_it_covers():
    rec = Recommendation(CONSERVATIVE, None, None, {}, parameters=64_000_000, tokens=768_000_000, shape=LLAMA[2])
    assert epochs_for(768_000_000, 100_000_000) == 7.68
    # 100M tokens at 12 per parameter: 20m needs 228M, tiny 12M -> tiny; 300M tokens cover 20m
    assert largest_covered(LLAMA, CONSERVATIVE, 100_000_000) == LLAMA[0]
    assert largest_covered(LLAMA, CONSERVATIVE, 300_000_000) == LLAMA[1]
    assert largest_covered(LLAMA, CONSERVATIVE, 11_999_999) is None
    text = corpus_warning(rec, 100_000_000, [*SHAPES, *LLAMA], corpus=True)
    assert text.startswith("the tokenized corpus holds 100,000,000 training tokens: 768,000,000 tokens "
                           "(12 per parameter) read it 7.7 times")
    assert "llama tiny (1.0M parameters, 12,000,000 tokens)" in text  # its own family: not GPT-2's 30M
    assert "make data CORPUS=" in text and "lose little" not in text
    # 300M tokens: 2.6 epochs, within the ~4 that repeated data tolerates
    assert "2.6 times (up to about 4 epochs" in corpus_warning(rec, 300_000_000, LLAMA, corpus=True)
    assert "covers no Llama size" in corpus_warning(rec, 1_000_000, LLAMA)
    assert corpus_warning(rec, 768_000_000, LLAMA) is None  # exactly one epoch
    assert any("read it 7.7 times" in w for w in warnings_for(rec, on_battery=False, dataset_tokens=100_000_000,
                                                               shapes=LLAMA, corpus=True))


def test_the_corpus_token_count_is_meta_jsons_else_the_train_files(tmp_path):
    base = kconfig.defconfig_config("llama-tiny")
    assert corpus_tokens(base) is None  # the embedded text
    config = kconfig.derive(base, {"DATASET_DIR": True, "DATA_DIR": str(tmp_path)})
    assert corpus_tokens(config) is None  # no meta.json: not a tokenized corpus
    (tmp_path / "train.bin").write_bytes(bytes(2 * 1000))
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 4096, "dtype": "uint16", "train_tokens": 900}))
    assert corpus_tokens(config) == 900
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 4096}))  # nanoGPT's meta.json: uint16
    assert corpus_tokens(config) == 1000
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 70000, "dtype": "uint32"}))
    assert corpus_tokens(config) == 500


def test_nothing_that_fits_is_one_error(gpt2):
    with pytest.raises(PlanError, match="no GPT-2 shape"):
        recommend_family(gpt2, SHAPES, plan=fake_plan(), derive=derive, flops=1e14, budget=1000, processes=1,
                       mode=CONSERVATIVE)


def test_a_disk_slower_than_training_reads_is_named_only_when_it_holds_training_back():
    plan = fake_plan(step_seconds=0.5)(kconfig.defconfig_config("gpt2"))  # 512 samples per 0.5 s step
    GiB, MiB = 2**30, 2**20
    # 100 GiB of data with 16 GiB free: read every epoch; 512 x 1 MiB / 0.5 s = 1024 MiB/s needed
    big = DataSource(bytes=100 * GiB, bytes_per_sample=MiB, read_bytes_per_s=200 * MiB, ram_available=16 * GiB)
    assert "1,024 MiB/s training consumes" in data_warning(big, plan, seconds=3600)
    fast = DataSource(bytes=100 * GiB, bytes_per_sample=MiB, read_bytes_per_s=2048 * MiB, ram_available=16 * GiB)
    assert data_warning(fast, plan, seconds=36000) is None  # keeps up; one read of 50 s is 0.1% of the run
    # data that fits in memory is read once: 10 GiB at 100 MiB/s = 102 s, 28% of a 360 s run, 0.3% of 10 h
    once = DataSource(bytes=10 * GiB, bytes_per_sample=MiB, read_bytes_per_s=100 * MiB, ram_available=16 * GiB)
    assert "102 s" in data_warning(once, plan, seconds=360)
    assert data_warning(once, plan, seconds=36000) is None
    unmeasured = DataSource(bytes=100 * GiB, bytes_per_sample=MiB, read_bytes_per_s=None, ram_available=16 * GiB)
    assert data_warning(unmeasured, plan, seconds=3600) is None


def test_checkpointing_the_planner_switched_on_is_explained(gpt2):
    import dataclasses

    plan = dataclasses.replace(fake_plan()(gpt2), gradient_checkpointing=True,
                               reasons={"gradient_checkpointing": "AUTO: on, micro-batch 8 fits"})
    rec = Recommendation(BALANCED, gpt2, plan, {})
    assert any("gradient checkpointing is on" in w and "micro-batch 8" in w
               for w in warnings_for(rec, on_battery=False, dataset_tokens=None))
    rec.plan = fake_plan()(gpt2)
    assert not any("checkpointing" in w for w in warnings_for(rec, on_battery=False, dataset_tokens=None))


KFIT = [sys.executable, str(ROOT / "scripts" / "kfit.py")]
CLEARED = ("KCONFIG_CONFIG", "HW", "GPU", "GPUS", "WORLD_SIZE", "FREE_GB", "FORMAT", "OUT", "WRITE")


def kfit(cwd, *args, **env):
    # the environment as the test runs (conftest's cache directory and planning settings), not at import
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return subprocess.run([*KFIT, *args], cwd=cwd, capture_output=True, text=True, env={**base, **env}, timeout=600)


@pytest.mark.slow
def test_recommend_without_a_config_chooses_gpt2_and_llama_sizes_and_writes_valid_defconfigs(tmp_path, kfit_here):
    out = tmp_path / "recommended"
    run = kfit_here(tmp_path, "recommend", "--format", "json", WRITE="1", OUT=str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(run.stdout)
    assert [r["mode"] for r in doc["recommendations"]] == ["conservative", "balanced", "extreme"]
    alternatives = []
    for top in doc["recommendations"]:
        assert top["model"] == "gpt2" and (len(top["alternatives"]) == 1 or "no Llama size" in top["notes"][0])
        alternatives += [f"recommended-{top['mode']}-llama" for _ in top["alternatives"]]
        for rec in (top, *top["alternatives"]):
            plan = rec["plan"]
            assert plan["predicted_peak_bytes"] <= plan["budget_bytes"]
            assert rec["tokens"] == rec["tokens_per_parameter"] * rec["parameters"]
            assert rec["seconds"] <= {"conservative": 2, "balanced": 6, "extreme": 72}[rec["mode"]] * 3600
        assert all(a["model"] == "llama" and a["context"] == top["context"] for a in top["alternatives"])
    assert alternatives, "the Llama family is offered beside GPT-2 in some mode"
    assert not (tmp_path / ".config").exists()  # recommending writes no config
    assert sorted(p.name for p in out.iterdir()) == sorted(["recommended-balanced", "recommended-conservative",
                                                           "recommended-extreme", *alternatives])
    llama = (out / alternatives[0]).read_text()
    assert "CONFIG_MODEL_LLAMA=y" in llama and "CONFIG_LLAMA_PRESET_" in llama and "CONFIG_MAX_STEPS=" in llama
    text = (out / "recommended-extreme").read_text()
    assert "CONFIG_MAX_STEPS=" in text and "CONFIG_MEMORY_PROFILE_EXTREME=y" in text
    applied = kfit_here(tmp_path, "defconfig", str(out / "recommended-extreme"))  # strictly valid
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "CONFIG_GPT2_BLOCK_SIZE=2048" in (tmp_path / ".config").read_text()


@pytest.mark.slow
def test_a_recommended_defconfig_trains(tmp_path, kfit_here):
    """LeNet-5 (the default config): its model is kept, the modes set the memory share; one trains."""
    assert kfit_here(tmp_path, "defconfig", "lenet5").returncode == 0
    run = kfit_here(tmp_path, "recommend", WRITE="1", OUT=str(tmp_path / "rec"))
    assert run.returncode == 0 and "Performance score:" in run.stdout, run.stdout + run.stderr
    assert "CONFIG_MEMORY_PROFILE_CONSERVATIVE=y" in (tmp_path / "rec" / "recommended-conservative").read_text()
    applied = kfit_here(tmp_path, "defconfig", str(tmp_path / "rec" / "recommended-conservative"), "--fragments",
                   "cpu-smoke")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    trained = kfit(tmp_path, "train")
    assert trained.returncode == 0, trained.stdout + trained.stderr
