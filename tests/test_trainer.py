"""The training loop: accumulation equals one large batch, runs repeat exactly, artifacts are complete."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from lib.checkpoint import load_checkpoint, save_checkpoint
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.task import load_task
from lib.trainer import Trainer, epoch_micro_batches, lr_at
from tests.helpers import CPU, assert_same_weights, make_cifar, make_mnist, manual, run

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# Gentle rates: in a chaotic stretch of training (SGD at 0.05 here) float rounding differences
# between summing 4 micro-batch gradients and one batch gradient grow to 1e-2 within 30 steps.
@pytest.mark.parametrize("optimizer", ["CONFIG_OPTIMIZER_SGD=y\nCONFIG_LEARNING_RATE=\"0.02\"\n",
                                       "CONFIG_OPTIMIZER_ADAMW=y\nCONFIG_LEARNING_RATE=\"1e-3\"\n"])
def test_accumulation_equals_one_large_batch_over_a_full_epoch(make_config, optimizer):
    # 1437 training digits: the last window of the epoch is short (29 samples) in both runs.
    common = f"CONFIG_EPOCHS=1\nCONFIG_GRAD_CLIP=\"0\"\n{optimizer}"
    small, small_result = run(make_config(manual(8, 4, common)))
    large, large_result = run(make_config(manual(32, 1, common)))
    assert small_result.steps == large_result.steps == 45
    assert small_result.samples == large_result.samples == 1437
    assert_same_weights(small.model, large.model, atol=2e-5)


def test_accumulation_equivalence_for_gpt2_with_clipping(make_config):
    common = "CONFIG_MAX_STEPS=3\nCONFIG_GRAD_CLIP=\"0.5\"\nCONFIG_LEARNING_RATE=\"1e-3\"\n"
    small, _ = run(make_config(manual(2, 4, common), base="gpt2-tiny"))
    large, _ = run(make_config(manual(8, 1, common), base="gpt2-tiny"))
    assert_same_weights(small.model, large.model, atol=2e-5)


def test_a_run_is_repeatable_and_the_seed_matters(make_config):
    text = "CONFIG_MAX_STEPS=4\nCONFIG_LOG_INTERVAL=1\n"
    a, ra = run(make_config(text))
    b, rb = run(make_config(text))
    assert [h["loss"] for h in ra.history if "loss" in h] == [h["loss"] for h in rb.history if "loss" in h]
    assert_same_weights(a.model, b.model, atol=0)
    c, rc = run(make_config(text + "CONFIG_SEED=7\n"))
    assert [h["loss"] for h in rc.history if "loss" in h] != [h["loss"] for h in ra.history if "loss" in h]


def test_sample_order_depends_only_on_seed_and_epoch():
    small = [i for b in epoch_micro_batches(103, 8, seed=1, epoch=2) for i in b]
    large = [i for b in epoch_micro_batches(103, 64, seed=1, epoch=2) for i in b]
    assert small == large and sorted(small) == list(range(103))
    assert small != [i for b in epoch_micro_batches(103, 8, seed=1, epoch=3) for i in b]
    # a lone trailing sample (BatchNorm needs two) halves the last two micro-batches: none is over 8
    sizes = [len(b) for b in epoch_micro_batches(17, 8, seed=0, epoch=0)]
    assert sizes == [8, 5, 4]


def test_learning_rate_schedule(make_config):
    config = make_config("CONFIG_LEARNING_RATE=\"1.0\"\nCONFIG_WARMUP_STEPS=4\n")
    assert [lr_at(config, s, 20) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(config, 4, 20) == pytest.approx(1.0)
    assert lr_at(config, 20, 20) == pytest.approx(0.1)
    assert 0.1 < lr_at(config, 12, 20) < 1.0
    constant = make_config("CONFIG_LEARNING_RATE=\"1.0\"\nCONFIG_LR_SCHEDULE_CONSTANT=y\n")
    assert lr_at(constant, 19, 20) == 1.0


def test_stops_at_max_steps_and_time_limit(make_config):
    _, result = run(make_config("CONFIG_MAX_STEPS=2\n"))
    assert (result.steps, result.stop_reason) == (2, "max_steps")
    _, result = run(make_config("CONFIG_TIME_LIMIT=1\nCONFIG_EPOCHS=100000\n"))
    assert result.stop_reason == "time_limit" and result.seconds < 30


def test_run_directory_holds_config_plan_metrics_and_a_safe_checkpoint(make_config, tmp_path):
    config = make_config("CONFIG_MAX_STEPS=3\nCONFIG_LOG_INTERVAL=1\nCONFIG_RUN_NAME=\"named\"\n")
    trainer, result = run(config)
    assert result.run_dir == tmp_path / "runs" / "named"
    assert (result.run_dir / "config").read_text() == config.text
    plan = json.loads((result.run_dir / "plan.json").read_text())
    assert plan["micro_batch"] == trainer.plan.micro_batch and plan["grad_accum"] == trainer.plan.grad_accum
    lines = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == [1, 2, 3]
    assert all(line["samples_per_s"] > 0 for line in lines if "loss" in line)
    [final] = [line for line in lines if line.get("final")]
    assert 0 <= final["accuracy"] <= 1
    assert lines[-1]["event"] == "finished" and lines[-1]["stop_reason"] == "max_steps"  # the Saved line
    state = load_checkpoint(result.run_dir / "checkpoint.pt")  # weights_only=True
    assert state["config"] == config.text and state["step"] == 3
    assert state["plan"]["effective_batch"] == trainer.plan.effective_batch
    assert state["hardware"]["cpu"]["logical_cores"] >= 1 and state["versions"]["torch"]
    fresh = load_task(config).build(False)  # (a Trainer of RUN_NAME "named" now would be refused: it finished)
    fresh.load_state_dict(state["model"])
    assert_same_weights(fresh, trainer.model, atol=0)


def test_text_model_reports_perplexity_and_tokens_per_second(make_config):
    _, result = run(make_config("CONFIG_MAX_STEPS=2\nCONFIG_LOG_INTERVAL=1\n", base="gpt2-tiny"))
    assert "perplexity" in result.final_eval and result.final_eval["perplexity"] < 300
    assert all("tokens_per_s" in h for h in result.history if "loss" in h)


def test_atomic_checkpoint_write_keeps_the_previous_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"step": 1})

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", broken_replace)
    with pytest.raises(OSError):
        save_checkpoint(path, {"step": 2})
    monkeypatch.undo()
    assert load_checkpoint(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_default_lenet5_learns_the_digits(make_config):
    """The default config's recipe on a shortened schedule still clearly learns (behaviour, not speed)."""
    _, result = run(make_config("CONFIG_EPOCHS=12\n"))
    assert result.final_eval["accuracy"] > 0.9


@pytest.mark.parametrize("precision,base", [("bf16", "lenet5"), ("fp16", "gpt2-tiny")])
def test_autocast_paths_train_on_cpu(make_config, precision, base):
    """The mixed-precision code paths GPUs take (autocast, fp16 gradient scaler) run here on the CPU (fp16 on
    a model without convolutions: the CPU has no fast float16 convolution, and the plan refuses one)."""
    trainer, result = run(make_config(f"CONFIG_PRECISION_{precision.upper()}=y\nCONFIG_MAX_STEPS=3\n"
                                      "CONFIG_LOG_INTERVAL=1\n", base))
    assert trainer.plan.precision == precision and trainer.plan.grad_scaler is (precision == "fp16")
    losses = [h["loss"] for h in result.history if "loss" in h]
    assert len(losses) == 3 and all(loss == loss for loss in losses) and losses[-1] < losses[0]
    assert next(trainer.model.parameters()).dtype == torch.float32  # master weights stay fp32


def test_worker_processes_deliver_the_same_batches(make_config):
    text = "CONFIG_MAX_STEPS=2\nCONFIG_LOG_INTERVAL=1\n"
    inline, a = run(make_config(text))
    workers, b = run(make_config(text + "CONFIG_DATALOADER_WORKERS_MANUAL=y\nCONFIG_DATALOADER_WORKERS=2\n"))
    assert workers.plan.num_workers == 2
    assert [h["loss"] for h in a.history if "loss" in h] == [h["loss"] for h in b.history if "loss" in h]


def test_missing_data_directory_is_a_clear_error_before_anything_is_written(make_config, tmp_path):
    from lib.errors import DataError

    config = make_config(f'CONFIG_DATASET_DIR=y\nCONFIG_DATA_DIR="{tmp_path}/nowhere"\n')
    with pytest.raises(DataError, match="nowhere"):
        run(config)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("fmt,base", [("MNIST", "lenet5"), ("CIFAR10", "resnet18")])
def test_trains_from_a_local_dataset_directory(make_config, tmp_path, fmt, base):
    root = make_mnist(tmp_path / "mnist") if fmt == "MNIST" else make_cifar(tmp_path / "cifar", 10)
    config = make_config(f'CONFIG_DATASET_DIR=y\nCONFIG_DATA_DIR="{root}"\nCONFIG_DATASET_FORMAT_{fmt}=y\n'
                         "CONFIG_MAX_STEPS=2\nCONFIG_TARGET_EFFECTIVE_BATCH=8\n", base=base)
    trainer, result = run(config)
    assert trainer.info.name == fmt.lower() and trainer.info.channels == (1 if fmt == "MNIST" else 3)
    assert result.steps == 2 and 0 <= result.final_eval["accuracy"] <= 1


def test_text_corpus_directory_sets_the_vocabulary(make_config, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    trainer, result = run(make_config(f'CONFIG_DATASET_DIR=y\nCONFIG_DATA_DIR="{corpus}"\nCONFIG_MAX_STEPS=1\n'
                                      "CONFIG_GPT2_BLOCK_SIZE=32\n", base="gpt2-tiny"))
    assert trainer.info.vocab_size == 256 and trainer.model.lm_head.out_features == 256
    assert result.steps == 1


# --------------------------------------------------------------------------
# CPU fallback (train CLI): a GPU that fails at start, faked behind lib.hardware's own query


@pytest.fixture
def cli_train(monkeypatch):
    """lib.api, whose usable_hardware `kfit train` calls, with GPU 0 unusable."""
    from lib import api as cli_train

    monkeypatch.setattr("lib.hardware.gpu_unusable_reason",
                        lambda index=0: f"GPU {index} is unusable (RuntimeError: CUDA error: no kernel image): fix")
    return cli_train


def test_device_auto_falls_back_to_the_cpu_with_a_warning(make_config, cli_train):
    from lib.errors import HardwareError

    h100 = resolve_hardware(gpu="h100")
    config = dataclasses.replace(make_config(""), device="auto", cpu_fallback=True)
    warnings = []
    fallback = cli_train.usable_hardware(config, h100, warnings.append)
    assert fallback.gpus == () and "no kernel image" in warnings[0] and "on the CPU instead" in warnings[1]
    assert resolve(config, fallback, ModelDescription.from_config(config)).device_type == "cpu"
    with pytest.raises(HardwareError, match="CONFIG_CPU_FALLBACK=n forbids"):
        cli_train.usable_hardware(dataclasses.replace(config, cpu_fallback=False), h100, warnings.append)
    with pytest.raises(HardwareError, match="CONFIG_DEVICE_CUDA is set but GPU 0 is unusable"):
        cli_train.usable_hardware(dataclasses.replace(config, device="cuda"), h100, warnings.append)
    assert cli_train.usable_hardware(dataclasses.replace(config, device="cpu"), h100, warnings.append) is h100
    assert cli_train.usable_hardware(config, CPU, warnings.append) is CPU and len(warnings) == 2
