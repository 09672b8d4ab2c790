"""A damaged run directory (issue 32): a checkpoint of another model, crafted checkpoint fields, a plan.json or
config that is not one, a lock or checkpoint that is a directory, a nearly full disk. Each is skipped with its
reason or falls back with one line, or is one error naming the file; never a traceback, never a lost run."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest
import torch

from lib import checkpoint, fileio, resumable
from lib import config as kc
from lib.errors import KfitError
from lib.hyperparams import ModelDescription, resolve
from lib.trainer import Trainer
from lib.trainer.resume import checkpoint_problem
from tests.helpers import CPU, write_config

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one CPU thread

# LeNet at effective batch 16, a checkpoint every 4 steps; stopped at step 10 by `interrupted_run`.
BASE = ("CONFIG_DEVICE_CPU=y\nCONFIG_EPOCHS=10\nCONFIG_TARGET_EFFECTIVE_BATCH=16\nCONFIG_LOG_INTERVAL=1\n"
        "CONFIG_EVAL_INTERVAL=10\nCONFIG_CHECKPOINT_INTERVAL_STEPS=y\nCONFIG_CHECKPOINT_EVERY_STEPS=4\n"
        "CONFIG_CHECKPOINT_KEEP=3\n# CONFIG_MONITOR is not set\nCONFIG_MAX_STEPS=12\n")


class Stop(Exception):
    pass


def configured(tmp_path: Path, extra: str = "") -> kc.Config:
    return kc.read_config(write_config(tmp_path, BASE + f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\n' + extra))


def trainer(config, **kwargs) -> Trainer:
    plan = resolve(config, CPU, ModelDescription.from_config(config))
    return Trainer(config, plan, CPU, **{"log": lambda line: None, **kwargs})


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> tuple[Path, kc.Config]:
    """A run that died at step 10, as a crash leaves it: checkpoints 4 and 8 (copied per test by `run_dir`)."""
    tmp = tmp_path_factory.mktemp("interrupted")
    config = configured(tmp)

    def stop(step, epoch, result):
        raise Stop

    t = trainer(config, on_eval=stop)
    with pytest.raises(Stop):
        t.fit()
    return t.run_dir, config


@pytest.fixture
def run_dir(interrupted, tmp_path) -> tuple[Path, kc.Config]:
    import shutil

    source, _ = interrupted
    config = configured(tmp_path)
    copy = tmp_path / "runs" / source.name
    shutil.copytree(source, copy)
    return copy, config


def resave(path: Path, change) -> None:
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


# -- checkpoints of another model, crafted fields ------------------------------------------------------------


@pytest.mark.parametrize("change, reason", [
    (lambda s: s["model"].update({"features.0.weight": torch.zeros(3, 1, 5, 5)}), "it is a checkpoint of another model"
     " (features.0.weight: [3, 1, 5, 5] there, [6, 1, 5, 5] here"),
    (lambda s: s.update(model={"w": torch.zeros(2)}), "it is a checkpoint of another model"),
    (lambda s: s["model"].update({"features.0.weight": 3}), "its model tensor features.0.weight is a int, not a tensor"),
    (lambda s: s["progress"].update(step="12"), "its progress field step is str '12', not int"),
    (lambda s: s["progress"].update(micro_batch=0), "its progress holds a window or micro-batch below 1"),
    (lambda s: s.update(plan=[1]), "its plan is a list, not a dict"),
], ids=["another shape", "another model", "tensor replaced by an int", "progress field of the wrong type",
        "micro-batch zero", "plan not a dict"])
def test_a_wrong_newest_checkpoint_is_skipped_with_the_reason(run_dir, change, reason):
    path, config = run_dir
    wrong = checkpoint.periodic_path(path, 8)
    resave(wrong, change)
    notes = []
    t = trainer(config, resume=path, log=notes.append)
    assert t.resumed_from == checkpoint.periodic_path(path, 4)
    assert f"warning: {wrong} is not a usable checkpoint ({reason}" in notes[0], notes
    assert t.fit().steps == 12


def test_resume_from_a_checkpoint_of_another_model_is_one_error(run_dir):
    path, config = run_dir
    wrong = checkpoint.periodic_path(path, 8)
    resave(wrong, lambda s: s["model"].update({"classifier.5.bias": torch.zeros(3)}))
    with pytest.raises(KfitError, match=rf"RESUME_FROM={wrong} does not fit this config's model \(it is a "
                       r"checkpoint of another model \(classifier.5.bias: \[3\] there"):
        trainer(config, resume=wrong)


def test_checkpoint_problem_checks_progress_types():
    state = {"model": {}, "optimizer": {}, "scaler": {}, "rng": {"torch": 0, "python": 0},
             "progress": {"window_size": 16, "micro_batch": 16, "best": "x"}}
    assert checkpoint_problem(state) == "its progress field best is str 'x', not list[list]"
    state["progress"].update(best=[], step=True)
    assert checkpoint_problem(state) == "its progress field step is bool 'True', not int"


# -- run-directory files that are not what they should be ---------------------------------------------------


def search(config, notes: list) -> Path | None:
    return resumable.find_resumable(Path(config.output_dir), config.text, 16, log=notes.append)


@pytest.mark.parametrize("content, reason", [
    ("[]", "a plan is a JSON object, not list"),
    ('{"effective_batch": 16, "device_ty', "not JSON"),
    ("", "not JSON"),
    ('{"effective_batch": "16"}', "not a plan"),
    (b"\xff\xfe", "not JSON"),
], ids=["a list", "cut short", "empty", "wrong types", "not UTF-8"])
def test_a_plan_json_that_is_not_a_plan_falls_back_to_the_checkpoint(run_dir, content, reason):
    path, config = run_dir
    plan = path / "plan.json"
    plan.write_bytes(content if isinstance(content, bytes) else content.encode())
    notes = []
    assert search(config, notes) == path
    [note] = notes
    assert note.startswith(f"note: {plan} is not a plan ({reason}"), note
    assert note.endswith("): the effective batch 16 of checkpoint-8.pt decides; a resumed run writes plan.json again")
    t = trainer(config, resume=path)
    assert t.fit().steps == 12
    assert json.loads(plan.read_text())["effective_batch"] == 16  # written again


def test_a_plan_json_that_is_not_a_plan_and_no_readable_checkpoint_passes_the_run_by(run_dir):
    path, config = run_dir
    (path / "plan.json").write_text("[]")
    for _, saved in checkpoint.periodic_checkpoints(path):
        saved.write_bytes(b"junk")
    notes = []
    assert search(config, notes) is None
    assert notes == [f"note: not resuming {path}: its plan.json is not a plan (a plan is a JSON object, not list) and "
                     f"no checkpoint there records the effective batch; delete {path} or keep it aside: this run "
                     "is a separate one"]


def test_an_unfinished_run_of_another_config_is_passed_by_with_a_note_naming_what_differs(run_dir):
    """A run interrupted before an upgrade that added a symbol (CONFIG_PAD_VOCAB) or with any other change of
    training math is a separate run: said once, with the symbols and how to continue it."""
    path, config = run_dir
    saved = path / "config"
    saved.write_text(saved.read_text().replace("CONFIG_LEARNING_RATE=", "# was\nCONFIG_LEARNING_RATE=1") +
                     "# CONFIG_PAD_VOCAB is not set\n")
    notes = []
    assert search(config, notes) is None
    [note] = notes
    assert note.startswith(f"note: not resuming {path}, an unfinished run of another config (CONFIG_LEARNING_RATE: ")
    assert "CONFIG_PAD_VOCAB: not set there, absent here" in note
    assert note.endswith(f"'make train KCONFIG_CONFIG={path / 'config'}' continues it; this run is a separate one")
    (path / "checkpoint.pt").write_bytes(b"")  # finished: nothing to continue, nothing said
    notes.clear()
    assert search(config, notes) is None and notes == []


def test_a_lock_that_is_a_directory_passes_the_run_by_with_a_note(run_dir):
    path, config = run_dir
    (path / fileio.LOCK_NAME).unlink()
    (path / fileio.LOCK_NAME).mkdir()
    notes = []
    assert search(config, notes) is None
    assert notes == [f"note: not resuming {path}: its .lock is not a regular file (a directory or link planted "
                     "there); remove it and 'make train' resumes the run; this run is a separate one"]


@pytest.mark.parametrize("spoil, reason", [
    (lambda c: (c.unlink(), c.mkdir()), "not a regular file"),
    (lambda c: c.write_bytes(b"CONFIG_SEED=\xff\n"), "not UTF-8 text"),
    (lambda c: c.chmod(0), "Permission denied"),
], ids=["a directory", "not UTF-8", "unreadable"])
def test_a_config_kfit_cannot_read_passes_the_run_by_with_a_note(run_dir, spoil, reason):
    path, config = run_dir
    spoil(path / "config")
    if reason == "Permission denied" and os.access(path / "config", os.R_OK):
        pytest.skip("running as root: no file is unreadable")
    notes = []
    assert search(config, notes) is None
    assert notes == [f"note: not resuming {path}: its config cannot be read ({reason})"]


def test_a_checkpoint_that_is_a_directory_is_skipped_as_unreadable(run_dir):
    path, config = run_dir
    newest = checkpoint.periodic_path(path, 8)
    newest.unlink()
    newest.mkdir()
    notes = []
    assert search(config, notes) == path
    t = trainer(config, resume=path, log=notes.append)
    assert t.resumed_from == checkpoint.periodic_path(path, 4)
    assert f"warning: {newest} is unreadable (FileNotFoundError" in notes[0], notes
    assert t.fit().steps == 12


def test_init_from_casts_floating_weights_and_says_so(tmp_path):
    from lib.models import build_model
    from lib.task import load_task
    from lib.trainer.initial import load_initial

    config = configured(tmp_path)
    torch.save({"model": {k: v.half() for k, v in build_model("lenet5").state_dict().items()}, "step": 3},
               tmp_path / "h.pt")
    initial = load_initial(tmp_path / "h.pt", load_task(config))
    assert "10 tensors by name; cast float16 -> float32 (10 tensors); a new run" in initial.message()
