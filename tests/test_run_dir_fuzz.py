"""Nothing in a run directory can crash a resume or redirect its writes: every file kfit reads back from a run
it resumes (hardware.json, metrics.jsonl, oom.json, init_from.json, the newest checkpoint-<step>.pt, checkpoint.pt,
best-<step>.pt, plan.json, config, a sharded checkpoint's extra.pt), damaged in each way in turn (empty, cut
short, a JSON value of the wrong type, a directory or a symlink to a file outside in its place), gives a result
(the run resumed, from an earlier checkpoint where the newest is damaged, or a new run) or one error line naming
the file; never a traceback, never a write through the link, never a lost run where the damage spares the
checkpoints.

One LeNet-5 run is made per module and copied per case; the resume search and the training run in this process,
as `make train` runs them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from lib import checkpoint, resumable
from lib import config as kc
from lib.data.splits import BatchSplit
from lib.errors import KfitError
from lib.hyperparams import ModelDescription, resolve
from lib.task import load_task
from lib.trainer import Trainer
from lib.trainer.resume import checkpoint_state, sharded_tensors
from tests.helpers import CPU, write_config

pytestmark = [pytest.mark.usefixtures("one_thread", "no_fsync"),  # conftest.py: one CPU thread
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]  # a sharded save in one process

# Effective batch 16, a checkpoint every 4 steps, an evaluation every 5 (the best kept as best-5.pt); the run
# made once stops after checkpoint-8.pt, as a crash leaves it. A resume trains steps 9 and 10 and evaluates once.
BASE = ("CONFIG_DEVICE_CPU=y\nCONFIG_EPOCHS=10\nCONFIG_TARGET_EFFECTIVE_BATCH=16\nCONFIG_LOG_INTERVAL=5\n"
        "CONFIG_EVAL_INTERVAL=5\nCONFIG_CHECKPOINT_INTERVAL_STEPS=y\nCONFIG_CHECKPOINT_EVERY_STEPS=4\n"
        "CONFIG_CHECKPOINT_KEEP=3\nCONFIG_CHECKPOINT_BEST_KEEP=1\n# CONFIG_MONITOR is not set\nCONFIG_MAX_STEPS=10\n")
SHARDED = "checkpoint-9.dcp"  # newer than checkpoint-8.pt: read first
MARKER = {"micro_batch": 8, "halvings": 1, "rungs": [], "step": 9, "reason": "CUDA out of memory"}
INIT_RECORD = {"path": "/elsewhere/checkpoint.pt", "source_step": 3}


class Stop(Exception):
    pass


@pytest.fixture
def no_fsync(monkeypatch):
    """What reaches the disk is not under test here: the fsyncs of some 200 checkpoint writes were most of its time."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


class FirstSamples(BatchSplit):
    """The first `n` samples of a split: the evaluations' length is not under test here."""

    def __init__(self, split: BatchSplit, n: int) -> None:
        self.split, self.n = split, min(n, len(split))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, indices):
        return self.split[indices]


@dataclasses.dataclass
class Made:
    run: Path  # the stopped run, to copy
    sharded: Path  # a sharded checkpoint of its step 8, to copy in as checkpoint-9.dcp
    config: kc.Config
    plan: object
    task: object

    def config_for(self, output_dir: Path) -> kc.Config:
        return dataclasses.replace(self.config, output_dir=str(output_dir))  # OUTPUT_DIR is not training math


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Made:
    tmp = tmp_path_factory.mktemp("made")
    config = kc.read_config(write_config(tmp, BASE + f'CONFIG_OUTPUT_DIR="{tmp}/runs"\n'))
    plan, task = resolve(config, CPU, ModelDescription.from_config(config)), load_task(config)
    task = dataclasses.replace(task, eval=FirstSamples(task.eval, 32))

    trainer = Trainer(config, plan, CPU, log=lambda line: None, task=task)
    save = trainer.save_periodic

    def save_then_stop():
        path = save()
        if path.name == "checkpoint-8.pt":
            raise Stop
        return path
    trainer.save_periodic = save_then_stop
    with pytest.raises(Stop):
        trainer.fit()
    run = trainer.run_dir
    assert [s for s, _ in checkpoint.periodic_checkpoints(run)] == [8, 4] and list(run.glob("best-*.pt"))
    # the same step as a sharded checkpoint (torch.distributed.checkpoint in one process)
    again = Trainer(config, plan, CPU, log=lambda line: None, task=task, resume=run)
    engine = again.engine
    extra = checkpoint_state(model=None, optimizer=None, scaler=engine.scaler, device=engine.device,
                             progress={**asdict(again.progress), "elapsed_s": 1.0}, epoch=1, final_eval=None,
                             config=config, plan=again.plan, hardware=CPU)
    sharded = tmp / SHARDED
    checkpoint.save_sharded(sharded, sharded_tensors(engine.model, engine.optimizer), {**extra, "sharded": True},
                            is_main=True, barrier=lambda: None)
    again.directory.release()
    return Made(run, sharded, config, plan, task)


# -- the damage --------------------------------------------------------------------------------------------


def template(name: str, run: Path) -> bytes:
    """What the file holds in a sound run (or would: oom.json, init_from.json, checkpoint.pt are not there)."""
    if name == checkpoint.OOM_MARKER:
        return json.dumps(MARKER).encode()
    if name == checkpoint.INIT_RECORD:
        return json.dumps(INIT_RECORD).encode()
    if name == checkpoint.FINAL:
        return (run / "checkpoint-8.pt").read_bytes()
    return (run / name).read_bytes()


def pickled(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


DAMAGE = ("empty", "truncated", "a list", "an object of another shape", "a directory", "a symlink")


def damage(path: Path, how: str, sound: bytes, outside: Path) -> None:
    binary = path.suffix == ".pt"
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if how == "a directory":
        path.mkdir()
    elif how == "a symlink":
        path.symlink_to(outside)
    else:
        path.write_bytes({"empty": b"", "truncated": sound[: len(sound) // 2],
                          "a list": pickled([]) if binary else b"[]",
                          "an object of another shape": pickled({"rungs": 5}) if binary else b'{"rungs": 5}'}[how])


# file (in the run directory) -> (how it is named in what kfit says, whether a resume must still take place when it
# is damaged: the checkpoints are spared), for content damage; a directory or link in a file kfit writes is refused
FILES = {
    "hardware.json": ("hardware.json", True),
    "metrics.jsonl": ("metrics.jsonl", True),
    checkpoint.OOM_MARKER: (checkpoint.OOM_MARKER, True),
    checkpoint.INIT_RECORD: (checkpoint.INIT_RECORD, False),  # a run started from other weights is passed by
    "checkpoint-8.pt": ("checkpoint-8.pt", True),  # from checkpoint-4.pt
    checkpoint.FINAL: (checkpoint.FINAL, False),  # a finished run is not resumed
    "best": ("best-", True),
    "plan.json": ("plan.json", True),
    "config": ("config", False),  # another training identity: not this config's run
    f"{SHARDED}/{checkpoint.EXTRA}": (SHARDED, True),  # from checkpoint-8.pt
}
WRITTEN = {"hardware.json", "metrics.jsonl", "plan.json", "config"}  # on resume: a directory or link there is refused


def resume(config: kc.Config, made: Made) -> tuple[str, list[str], Trainer | None]:
    """The resume search, then the training it picks, as `make train` runs them: (what happened: "resumed",
    "new run" or the error line, what kfit said, the trainer)."""
    said: list[str] = []
    pick = resumable.find_resumable(Path(config.output_dir), config.text, made.plan.effective_batch, config.run_name,
                                     log=said.append)
    if pick is None:
        return "new run", said, None
    trainer = None
    try:
        trainer = Trainer(config, made.plan, CPU, log=said.append, task=made.task, resume=pick)
        result = trainer.fit()
    except KfitError as err:
        if trainer is not None:
            trainer.directory.release()
        return f"error: {err}", said, trainer
    assert result.steps == 10 and (result.run_dir / checkpoint.FINAL).is_file()
    return "resumed", said, trainer


CASES = [(name, how) for name in FILES for how in DAMAGE]


@pytest.mark.parametrize("name, how", CASES, ids=[f"{n}-{h}" for n, h in CASES])
def test_a_damaged_run_file_resumes_or_is_one_line_naming_it(made, tmp_path, name, how):
    runs = tmp_path / "runs"
    run = runs / made.run.name
    shutil.copytree(made.run, run)
    if name.startswith(SHARDED):
        shutil.copytree(made.sharded, run / SHARDED)
    if name == "best":
        [name] = [p.name for p in run.glob("best-*.pt")]
    outside = tmp_path / "outside" / "kept.txt"
    outside.parent.mkdir()
    outside.write_text("keep me\n")
    path = run / name
    damage(path, how, template(name, run), outside)
    named, must_resume = FILES.get(name, FILES["best"])
    config = made.config_for(runs)

    outcome, said, trainer = resume(config, made)

    assert outside.read_text() == "keep me\n" and [p.name for p in outside.parent.iterdir()] == ["kept.txt"]
    if outcome.startswith("error: "):
        assert "\n" not in outcome and named in outcome, outcome
        assert how in ("a directory", "a symlink") and name in WRITTEN | {checkpoint.FINAL}, (outcome, said)
        return
    if name in WRITTEN and how in ("a directory", "a symlink") and outcome == "resumed":
        pytest.fail(f"a resume wrote over {how} at {name}")
    if must_resume and not (name in WRITTEN and how in ("a directory", "a symlink")):
        assert outcome == "resumed", (outcome, said)
        resumed_from = trainer.resumed_from.name
        assert resumed_from == ("checkpoint-4.pt" if name == "checkpoint-8.pt" else "checkpoint-8.pt"), said
    spoken = [line for line in said if line.startswith(("note:", "warning:", "error:"))]
    # a damaged checkpoint is kept (renamed to <name>.damaged): the note on what the older resume removed then
    # names only the files saved after it that were sound (best-5.pt)
    removed = f"note: resuming from {trainer.resumed_from.name}: removed " if trainer and trainer.resumed_from else None
    assert all(named in line or str(run) in line or (removed and line.startswith(removed)) for line in spoken), spoken
    if name in (checkpoint.OOM_MARKER, "checkpoint-8.pt", f"{SHARDED}/{checkpoint.EXTRA}", "plan.json"):
        assert any(named in line for line in spoken), (outcome, said)  # said, not silently passed over


def test_the_launcher_relaunches_only_for_a_marker_that_is_one(tmp_path):
    """make train relaunches a sharded run that ran out of memory from its oom.json (checkpoint.oom_marker_since):
    a damaged marker, or a link planted there, is one note and no relaunch; never a traceback."""
    run = tmp_path / "run"
    run.mkdir()
    marker = run / checkpoint.OOM_MARKER
    said: list[str] = []
    assert checkpoint.oom_marker_since(tmp_path, 0.0, said.append) is None and said == []
    marker.write_text(json.dumps(MARKER))
    assert checkpoint.oom_marker_since(tmp_path, 0.0, said.append) == MARKER and said == []
    assert checkpoint.oom_marker_since(tmp_path, marker.stat().st_mtime + 60, said.append) is None  # an older one
    for text, problem in (('{"rungs": 5}', "missing or invalid micro_batch, halvings, step, rungs, reason"),
                          (json.dumps({**MARKER, "rungs": ["faster"]}), "missing or invalid rungs"),
                          (json.dumps({**MARKER, "micro_batch": True}), "missing or invalid micro_batch"),
                          ("[]", "a JSON list, not an object")):
        marker.write_text(text)
        said.clear()
        assert checkpoint.oom_marker_since(tmp_path, 0.0, said.append) is None
        assert said == [f"note: {marker} is not an out-of-memory marker ({problem}): ignored, the run continues "
                        "from its checkpoint as planned"], said
    outside = tmp_path / "planted.json"
    outside.write_text(json.dumps(MARKER))
    marker.unlink()
    marker.symlink_to(outside)  # a marker, but not one a rank wrote there: never followed
    said.clear()
    assert checkpoint.oom_marker_since(tmp_path, 0.0, said.append) is None and "a symbolic link" in said[0], said
    outside.unlink()  # left dangling
    assert checkpoint.oom_marker_since(tmp_path, 0.0, said.append) is None
