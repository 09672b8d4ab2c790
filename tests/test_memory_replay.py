"""Replay the committed H100 memory measurements against the current predictor (issue 28).

Every memory case of docs/validation/nvidia-h100-80gb-hbm3-*.json (the newest run of each case; the
"before-fixes" run had fixed allocator segments and is left out) is predicted here with fake tensors
on this CPU for a CUDA target, as lib/validation/memory_check.py predicts it on the GPU, and compared
with the measured max_memory_reserved. Traces are cached (.pytest_cache/kfit, conftest): cold about
50 s on a 2-core machine, warm a few seconds.
"""

import json
from pathlib import Path

import pytest

from lib import config as kc
from lib.config import MEMORY_PROFILES
from lib.memory import MemoryPredictor
from lib.validation import vocab
from lib.validation.report import in_run_order

ROOT = Path(__file__).resolve().parent.parent
UNDER, OVER = 0.02, 0.05  # within 5%, none under-predicted by more than 2%
PAGE = 20 * 2**20  # the allocator maps the large pool in 20 MiB pages: over by one is within the band too


def committed_cases() -> dict[str, dict]:
    cases: dict[str, dict] = {}
    for path in in_run_order((ROOT / "docs" / "validation").glob("nvidia-h100-80gb-hbm3-*.json")):
        if "before-fixes" in path.name:
            continue
        doc = json.loads(path.read_text())
        for case in doc["checks"]["memory"]["figures"]["cases"]:
            if "measured_bytes" in case:
                cases[case["case"]] = case  # oldest first: a later run's figure replaces an earlier one's
    return cases


CASES = committed_cases()


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    predictor, configs, errors = MemoryPredictor(), {}, {}
    for label, case in CASES.items():
        if case["model"] not in configs:
            work = tmp_path_factory.mktemp("c")
            configs[case["model"]] = vocab.make_config(work, case["model"]) if case["model"] == vocab.MODEL else \
                kc.make_defconfig(case["model"], out=work / ".config")
        config = configs[case["model"]]
        if case.get("checkpointing"):
            config = kc.derive(config, {"GRADIENT_CHECKPOINTING": True})
        prediction = predictor.predict(config, batch=case["batch"], device_type="cuda", precision=case["precision"],
                                       compile_mode="default" if case["compile"] else None)
        errors[label] = (prediction.peak_bytes - case["measured_bytes"]) / case["measured_bytes"]
    return errors


def test_the_committed_runs_hold_every_memory_case():
    assert len(CASES) == 41  # 38 of 2026-11-23, and GPT-2 124M on its real vocabulary (2026-11-26)
    assert all(c["measured_allocated_bytes"] <= c["measured_bytes"] for c in CASES.values())


@pytest.mark.slow  # the cold traces of 38 cases: over a minute on 2 cores
def test_every_committed_h100_case_is_predicted_within_its_band(replay):
    out = {k: f"{e:+.2%}" for k, e in replay.items()
           if not -UNDER <= e <= max(OVER, PAGE / CASES[k]["measured_bytes"])}
    assert not out, f"outside -{UNDER:.0%}..+{OVER:.0%} of the measured reserved peak: {out}"
    mean = sum(map(abs, replay.values())) / len(replay)
    # 1.8% with the allocator's replay (max +5.9%, gpt2-tiny fp32 32: 14 MiB over); 2.1% with the shares
    # alone, which left GPT-2's 50,257-token logits hole out (-6.9%); 5.1% before the first refit
    assert mean < 0.025, mean


@pytest.mark.slow
@pytest.mark.parametrize("profile", list(MEMORY_PROFILES))
def test_at_every_memory_profile_each_committed_case_peaks_under_the_free_memory_it_was_planned_for(replay, profile):
    """The planner takes a case's micro-batch once free x share covers its predicted peak: at the least free
    memory that does, free = predicted / share, the measured reserved peak must still fit (lib/config/profiles.py's
    margin evidence). With predicted = measured x (1 + error): measured < predicted / share <=> share < 1 + error."""
    share = MEMORY_PROFILES[profile]
    over = {}
    for label, error in replay.items():
        measured = CASES[label]["measured_bytes"]
        free = measured * (1 + error) / share  # the smallest free memory that plans this case's micro-batch
        if measured >= free:
            over[label] = f"{measured / free:.1%} of free memory"
    assert not over, f"{profile} ({share:.0%}) would plan these cases past free memory: {over}"
    headroom = min(1 + e for e in replay.values()) - share  # 0.98 - 0.97 at extreme
    assert headroom > 0.005, headroom
