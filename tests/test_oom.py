"""Out-of-memory recovery: the redone step sees the same samples, so the run ends with the same weights."""

from __future__ import annotations

import json

import pytest
import torch

from lib.oom import Injector, OutOfMemory, halve, is_oom
from tests.helpers import assert_same_weights, manual, run

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def test_recognises_cuda_rocm_and_cpu_allocator_errors():
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("HIP out of memory. Tried to allocate 1.00 GiB"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 123456789 bytes"))
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_oom(ValueError("out of memory"))  # not an allocator error type


def test_halving_stops_with_advice():
    assert halve(64, 0, 6, "at step 1") == 32
    with pytest.raises(OutOfMemory, match="micro-batch 1.*CONFIG_GRADIENT_CHECKPOINTING"):
        halve(1, 0, 6, "at step 3")
    with pytest.raises(OutOfMemory, match="after 2 halvings.*CONFIG_OOM_MAX_HALVINGS=2.*bf16"):
        halve(16, 2, 2, "at step 3")


def test_injector_fires_once_per_step_and_above_a_size():
    inject = Injector({"KFIT_INJECT_OOM": "2, 5", "KFIT_INJECT_OOM_ABOVE": "8"})
    inject.check(8, step=1)
    with pytest.raises(torch.OutOfMemoryError):
        inject.check(8, step=2)
    inject.check(8, step=2)  # the redone step succeeds
    with pytest.raises(torch.OutOfMemoryError):
        inject.check(9)
    assert Injector({"KFIT_INJECT_OOM": "2", "KFIT_INJECT_OOM_RANK": "1", "RANK": "0"}).steps == set()


def losses(result) -> list[float]:
    return [h["loss"] for h in result.history if "loss" in h]


# A gentle learning rate: float32 differences between accumulation forms grow fast at high rates.
COMMON = "CONFIG_MAX_STEPS=6\nCONFIG_LOG_INTERVAL=1\nCONFIG_OPTIMIZER_ADAMW=y\nCONFIG_LEARNING_RATE=\"1e-3\"\n"


def test_injected_oom_redoes_the_step_and_ends_with_the_same_weights(make_config, monkeypatch):
    text = manual(16, 2, COMMON)
    clean, clean_result = run(make_config(text))
    monkeypatch.setenv("KFIT_INJECT_OOM", "3,5")
    recovered, result = run(make_config(text))
    assert result.steps == clean_result.steps == 6 and result.samples == clean_result.samples == 6 * 32
    assert recovered.progress.micro_batch == 4 and recovered.progress.halvings == 2
    assert recovered.plan.micro_batch == 4 and recovered.plan.grad_accum == 8
    assert_same_weights(recovered.model, clean.model, atol=1e-5)
    assert losses(result) == pytest.approx(losses(clean_result), rel=1e-5)
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [line for line in lines if line.get("event") == "oom_recovery"]
    assert [e["micro_batch"] for e in events] == [8, 4] and "same 32 samples" in events[0]["message"]
    assert json.loads((result.run_dir / "plan.json").read_text())["micro_batch"] == 4


def test_a_device_too_small_halves_until_it_fits_then_stops_with_advice(make_config, monkeypatch):
    monkeypatch.setenv("KFIT_INJECT_OOM_ABOVE", "8")
    trainer, result = run(make_config(manual(32, 1, "CONFIG_MAX_STEPS=2\n")))
    assert trainer.progress.micro_batch == 8 and result.samples == 64
    assert trainer.plan.eval_batch == 8  # evaluation halved its batch too (64 -> 8)
    monkeypatch.setenv("KFIT_INJECT_OOM_ABOVE", "1")
    # the out-of-memory ladder's one rung for LeNet-5 (bf16 autocast) forbidden: nothing is left to try
    with pytest.raises(OutOfMemory, match="CONFIG_OOM_MAX_HALVINGS=2.*not allowed: .*CONFIG_OOM_LADDER_AUTOCAST"):
        run(make_config(manual(64, 1, "CONFIG_MAX_STEPS=2\nCONFIG_OOM_MAX_HALVINGS=2\n"
                                      "# CONFIG_OOM_LADDER_AUTOCAST is not set\n")))


def test_without_recovery_the_error_propagates(make_config, monkeypatch):
    monkeypatch.setenv("KFIT_INJECT_OOM", "1")
    with pytest.raises(torch.OutOfMemoryError):
        run(make_config(manual(16, 1, "CONFIG_MAX_STEPS=2\n# CONFIG_OOM_RECOVERY is not set\n")))
