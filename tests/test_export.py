"""make export (model.safetensors) and make sample (lib/sample.py) on a real, tiny GPT-2 run."""

from __future__ import annotations

import pytest
import torch

from lib import config as kc
from lib.errors import KfitError
from lib.export import MODEL_FILE, export, load_exported
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.sample import generate, sample, tokenizer_for
from lib.task import load_task
from lib.trainer import Trainer
from lib.trainer.evaluation import Evaluator

CPU = resolve_hardware(gpu="cpu")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A gpt2-tiny run of 3 steps with an evaluation at its end: (config, plan, result)."""
    tmp = tmp_path_factory.mktemp("export")
    fragment = tmp / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp}/runs"\nCONFIG_DEVICE_CPU=y\nCONFIG_MAX_STEPS=3\n')
    config = kc.make_defconfig("gpt2-tiny", [str(fragment)], out=tmp / "config")
    plan = resolve(config, CPU, ModelDescription.from_config(config))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = Trainer(config, plan, CPU, log=lambda line: None).fit()
    finally:
        torch.set_num_threads(threads)
    return config, plan, result


def test_the_exported_file_reproduces_the_runs_final_evaluation(trained, tmp_path):
    config, plan, result = trained
    path = export(result.run_dir, tmp_path / "e")
    assert path.name == MODEL_FILE and (tmp_path / "e" / "config").read_text() == config.text
    assert (tmp_path / "e" / "plan.json").is_file()
    weights = load_exported(path)  # GPT-2's tied output layer is its own copy: every key, strict
    assert torch.equal(weights["lm_head.weight"], weights["transformer.wte.weight"])
    task = load_task(config)
    model = task.build(False)
    model.load_state_dict(weights, strict=True)
    metrics = Evaluator(task, config, torch.device("cpu"), _no_injection()).measure(model, plan, plan.eval_batch)
    assert metrics["eval_loss"] == pytest.approx(result.final_eval["eval_loss"], rel=1e-6)


def _no_injection():
    from lib.oom import Injector

    return Injector({})


def test_a_damaged_export_is_one_error(tmp_path):
    bad = tmp_path / MODEL_FILE
    bad.write_bytes(b"not safetensors")
    with pytest.raises(KfitError, match="not a safetensors file kfit can read.*make export"):
        load_exported(bad)


def test_sampling_repeats_with_a_seed_and_reads_runs_and_exports_alike(trained, tmp_path):
    _, _, result = trained
    text, about = sample(result.run_dir, "def ", max_tokens=12, seed=3, device="cpu")
    assert about["tokenizer"] == "bytes (UTF-8)" and about["step"] == 3 and isinstance(text, str)
    again, _ = sample(result.run_dir, "def ", max_tokens=12, seed=3, device="cpu")
    assert again == text
    exported = export(result.run_dir, tmp_path / "e")
    from_export, _ = sample(exported, "def ", max_tokens=12, seed=3, device="cpu")
    assert from_export == text
    greedy, _ = sample(exported, "def ", max_tokens=5, temperature=0, device="cpu")
    assert greedy == sample(exported, "def ", max_tokens=5, temperature=0, seed=99, device="cpu")[0]


def test_generation_keeps_the_top_k_and_the_context_window():
    class Fixed(torch.nn.Module):  # logits favour token 2, then 1; sees at most block_size tokens
        def forward(self, idx):
            assert idx.size(1) <= 4
            logits = torch.full((*idx.shape, 5), -10.0)
            logits[..., 2], logits[..., 1] = 5.0, 4.0
            return logits

    g = torch.Generator().manual_seed(0)
    out = generate(Fixed(), [0], max_tokens=30, temperature=1.0, top_k=2, block_size=4, generator=g,
                   device=torch.device("cpu"))
    assert set(out) <= {1, 2} and {1, 2} <= set(out)  # top 2 only, both drawn
    assert generate(Fixed(), [0], max_tokens=3, temperature=0, top_k=None, block_size=4, generator=g,
                    device=torch.device("cpu")) == [2, 2, 2]


def test_runs_that_cannot_be_sampled_say_why(tmp_path):
    assert tokenizer_for(256).decode(tokenizer_for(256).encode("héllo")) == "héllo"
    with pytest.raises(KfitError, match="no tokenizer for it"):
        tokenizer_for(1000)
    with pytest.raises(KfitError, match="no config beside it"):
        sample(tmp_path / MODEL_FILE, "x")
    with pytest.raises(KfitError, match="TEMPERATURE=-1"):
        sample(tmp_path, "x", temperature=-1)


# --- output errors, stale temporaries, a live run (issue 32, Low 10) ---------------------------------------


def test_export_output_errors_are_one_line_and_stale_temporaries_are_swept(trained, tmp_path):
    import errno
    import os
    from unittest import mock

    _, _, result = trained
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(KfitError, match=r"OUT=.*afile is a file, not a directory"):
        export(result.run_dir, afile)
    assert afile.read_text() == "mine"
    with pytest.raises(KfitError, match=r"OUT=/proc/kfit-nope: cannot write the export"):
        export(result.run_dir, "/proc/kfit-nope")
    with pytest.raises(KfitError, match=r"cannot write the export \(File name too long"):
        export(result.run_dir, tmp_path / ("x" * 300))
    out = tmp_path / "e"
    out.mkdir()
    stale = out / f".{MODEL_FILE}.abc123.tmp"  # what a killed export leaves (mkstemp's mode)
    stale.write_bytes(b"partial")
    stale.chmod(0o600)
    foreign = out / ".notes.tmp"  # not the export's: kept
    foreign.write_text("x")
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / MODEL_FILE))
    with mock.patch("lib.export.write_atomic", side_effect=full):
        with pytest.raises(KfitError, match="No space left on device"):
            export(result.run_dir, out)
    assert not stale.exists() and foreign.exists()
    assert export(result.run_dir, out) == out / MODEL_FILE
    assert sorted(p.name for p in out.iterdir()) == sorted([".notes.tmp", MODEL_FILE, "config", "plan.json"])


def test_export_of_a_live_run_retries_once_then_says_it_is_live(trained, tmp_path, monkeypatch):
    from lib import export as export_module

    _, _, result = trained
    real, rotated = export_module.checkpoint_of, {"left": 1}

    def racing(run):  # the checkpoint chosen is rotated away before it is read, `left` times
        if rotated["left"] > 0:
            rotated["left"] -= 1
            return run / "checkpoint-999.pt"
        return real(run)

    monkeypatch.setattr(export_module, "checkpoint_of", racing)
    assert export(result.run_dir, tmp_path / "e1").is_file()
    rotated["left"] = 2
    with pytest.raises(KfitError, match="is training now"):
        export(result.run_dir, tmp_path / "e2")


def test_sample_and_export_take_the_last_fitting_run_when_run_is_not_named(trained, tmp_path, monkeypatch, capsys):
    """The last language-model run under the config's CONFIG_OUTPUT_DIR, named on stderr; an image model's run
    written later is not one sample takes, and RUN= still names another."""
    import os
    import shutil
    import time

    from lib.cli import main

    config, _, result = trained
    runs = tmp_path / "runs"
    runs.mkdir()
    older, newer = runs / "gpt2-tiny-old", runs / "gpt2-tiny-new"
    for target in (older, newer):
        shutil.copytree(result.run_dir, target)
    image = runs / "lenet5-latest"
    image.mkdir()
    (image / "config").write_text("CONFIG_MODEL_LENET5=y\n")
    (image / "plan.json").write_text("{}")
    (runs / "hpo-study").mkdir()  # a study's directory: no run of its own
    now = time.time()
    for age, run in ((300, older), (100, newer), (0, image)):
        for path in run.iterdir():
            os.utime(path, (now - age, now - age))
    (tmp_path / ".config").write_text(config.text.replace(f'CONFIG_OUTPUT_DIR="{config.output_dir}"',
                                                         f'CONFIG_OUTPUT_DIR="{runs}"'))
    monkeypatch.chdir(tmp_path)
    for name in ("RUN", "KCONFIG_CONFIG", "OUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MAX_TOKENS", "4")
    monkeypatch.setattr("signal.signal", lambda *args: None)
    assert main(["sample"]) == 0
    err = capsys.readouterr().err
    assert f"sample: the last gpt2 or llama run, {newer} (RUN= names another)" in err
    assert main(["export"]) == 2  # export takes any model's run: the image run, written last (and unfinished)
    assert f"export: the last run, {image}" in capsys.readouterr().err
    shutil.rmtree(image)
    assert main(["export"]) == 0 and (newer / "export" / MODEL_FILE).is_file()
    capsys.readouterr()
    monkeypatch.setenv("RUN", str(older))
    assert main(["sample"]) == 0 and "the last" not in capsys.readouterr().err


def test_with_no_run_to_take_sample_names_run_and_where_it_looked(tmp_path, monkeypatch, capsys):
    from lib.cli import main

    monkeypatch.chdir(tmp_path)
    for name in ("RUN", "KCONFIG_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("signal.signal", lambda *args: None)
    assert main(["sample"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: no gpt2 or llama run under CONFIG_OUTPUT_DIR (runs) to sample: train one first, or name "
                   "a run directory, a checkpoint or an exported model.safetensors with RUN=, "
                   "e.g. 'make sample RUN=runs/<run>'")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_weights_holding_nan_or_infinity_are_named_not_exported_or_sampled(trained, tmp_path, bad):
    """A checkpoint whose weight was set to NaN and saved again (its CRCs whole) was exported and sampled
    without a word, garbage out (an audit): refused, naming the weight."""
    import shutil

    from lib.checkpoint import FINAL

    config, plan, result = trained
    run = tmp_path / "run"
    shutil.copytree(result.run_dir, run)
    state = torch.load(run / FINAL, map_location="cpu", weights_only=False)
    name = next(iter(state["model"]))
    state["model"][name] = state["model"][name].clone().fill_(bad)
    torch.save(state, run / FINAL)
    with pytest.raises(KfitError, match=f"its weight {name} holds NaN or infinite values"):
        export(run, tmp_path / "e")
    assert not (tmp_path / "e").exists()
    with pytest.raises(KfitError, match="holds NaN or infinite values"):
        sample(run, "a", max_tokens=2)
