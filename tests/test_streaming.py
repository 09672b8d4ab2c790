"""Streaming data: a custom model fed by an IterableDataset trains, is killed with SIGKILL mid-run, resumes, and
ends where an uninterrupted run ends: a stream with state_dict() continues from its saved state, one without is
read again and skipped (and the run says so)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lib import api, checkpoint
from lib import config as kc
from lib.errors import ConfigError
from lib.task import load_task

from tests.helpers import KFIT, kfit_env
from tests.test_resume import logged_steps, losses_by_step

pytestmark = pytest.mark.usefixtures("one_thread")

TESTS = Path(__file__).resolve().parent


def stream_config(tmp_path: Path, factory: str, **extra):
    """The run's config (tmp_path/.config, which `kfit train` reads too)."""
    settings = {"MODEL_CUSTOM": "y", "CUSTOM_MODEL_FACTORY": f'"stream_model:{factory}"', "DEVICE_CPU": "y",
                "CUSTOM_EVAL_SAMPLES": 40, "EPOCHS": 100, "MAX_STEPS": 60, "TARGET_EFFECTIVE_BATCH": 32,
                "LEARNING_RATE": '"0.05"', "LOG_INTERVAL": 1, "EVAL_INTERVAL": 20,
                "OUTPUT_DIR": f'"{tmp_path}/runs"', "CHECKPOINT_INTERVAL_STEPS": "y", "CHECKPOINT_EVERY_STEPS": 4,
                "CHECKPOINT_KEEP": 3, **extra}
    lines = [f"CONFIG_{k}={v}" for k, v in settings.items()]
    (tmp_path / "defconfig").write_text("\n".join(lines) + "\n")
    return kc.make_defconfig(str(tmp_path / "defconfig"), out=tmp_path / ".config")


@pytest.fixture
def streams(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    yield
    sys.modules.pop("stream_model", None)


def killed_then_resumed(tmp_path: Path, factory: str) -> tuple[Path, list[str], dict]:
    """`kfit train` on a slowed stream, SIGKILLed once past its third checkpoint, then resumed in this process
    through the Python API; the run directory, the resumed run's lines and the progress it resumed from."""
    config = stream_config(tmp_path, factory)
    env = kfit_env(tmp_path / ".config", KFIT_TEST_STREAM_DELAY="0.002", PYTHONPATH=str(TESTS))
    proc = subprocess.Popen(KFIT + ["train"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        runs = list((tmp_path / "runs").glob("*/metrics.jsonl"))
        if runs and logged_steps(runs[0].parent) >= 14:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, out
    [run_dir] = (tmp_path / "runs").iterdir()
    assert not (run_dir / "checkpoint.pt").exists() and logged_steps(run_dir) < 60, out
    newest = checkpoint.periodic_checkpoints(run_dir)[0][1]
    progress = torch.load(newest, weights_only=True)["progress"]
    lines: list[str] = []
    result = api.train(config, resume_from=run_dir, log=lines.append)
    assert result.steps == 60 and result.stop_reason == "max_steps", "\n".join(lines)
    assert any(line.startswith(f"Resuming {run_dir}") for line in lines), "\n".join(lines)
    return run_dir, lines, progress


def assert_same_run(run_dir: Path, fresh_dir: Path) -> None:
    interrupted, uninterrupted = losses_by_step(run_dir), losses_by_step(fresh_dir)
    assert list(interrupted) == list(range(1, 61))
    assert interrupted == pytest.approx(uninterrupted, rel=1e-5, abs=1e-7)
    a = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    b = torch.load(fresh_dir / "checkpoint.pt", weights_only=True)
    assert all(torch.allclose(a["model"][k], b["model"][k], rtol=1e-5, atol=1e-7) for k in a["model"])
    assert final_eval(run_dir) == pytest.approx(final_eval(fresh_dir), rel=1e-5)


def final_eval(run_dir: Path) -> float:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line["eval_loss"] for line in lines if line.get("final")][-1]


def uninterrupted(tmp_path: Path, factory: str) -> tuple[Path, list[str]]:
    lines: list[str] = []
    result = api.train(stream_config(tmp_path, factory), output_dir=tmp_path / "fresh", log=lines.append)
    assert result.steps == 60 and result.stop_reason == "max_steps"
    return result.run_dir, lines


@pytest.mark.slow  # kills a training process and resumes it
def test_a_stateful_stream_resumes_from_its_saved_state(tmp_path, streams):
    run_dir, lines, progress = killed_then_resumed(tmp_path, "stateful")
    fresh_dir, fresh_lines = uninterrupted(tmp_path, "stateful")
    assert_same_run(run_dir, fresh_dir)
    assert not any("state_dict" in line for line in lines + fresh_lines)  # nothing to warn about
    # the checkpoint held the stream's position: 170 rows a pass, 32 a step (6 steps a pass, the last of 10)
    window = progress["window"]
    if window:  # the stream's own position, reset to 0 where the pass ended in that step
        assert progress["stream"] == {"epoch": progress["epoch"], "window": window, "ended": window == 6,
                                      "state": {"position": 32 * window if window < 6 else 0}}


@pytest.mark.slow  # kills a training process and resumes it
def test_a_stream_without_state_is_read_again_and_skipped(tmp_path, streams):
    run_dir, lines, _ = killed_then_resumed(tmp_path, "stateless")
    fresh_dir, fresh_lines = uninterrupted(tmp_path, "stateless")
    assert_same_run(run_dir, fresh_dir)
    warning = [line for line in lines if line.startswith("warning: the stream (Rows) has no state_dict()")]
    assert len(warning) == 1 and "skips the items already trained on (" in warning[0], "\n".join(lines)
    assert sum("has no state_dict()" in line for line in fresh_lines) == 1


def test_a_stream_needs_a_step_budget_and_planning_reads_its_first_items(tmp_path, streams):
    with pytest.raises(ConfigError, match="the training data is a stream .*set CONFIG_MAX_STEPS"):
        load_task(stream_config(tmp_path, "stateless", MAX_STEPS=0))
    task = load_task(stream_config(tmp_path, "stateless"))
    from stream_model import row

    assert len(task.eval) == 40 and torch.equal(task.eval[[0]][0][0], row(0)[0])  # the first 40 held out
    x, y = task.example_batch(200)  # more than a pass (170): wraps around the stream's first items
    assert x.shape == (200, 4) and torch.equal(x[0], row(40)[0]) and torch.equal(x[170], x[0])
    assert "Rows stream" in task.info.description


def test_a_pass_resumed_where_it_ended_has_no_more_windows(streams):
    from stream_model import StatefulRows

    from lib.data.stream import StreamSplit, StreamWindows

    split = StreamSplit(StatefulRows(0, 70))
    positions = []
    whole = StreamWindows(split, 32, 0, 0, None, keep=set, record=positions.append)
    sizes = []
    while len(sizes) < len(whole):  # as the trainer asks: len() reads one window ahead
        sizes.append(len(whole[len(sizes)]))
    assert sizes == [32, 32, 6] and positions[-1]["ended"]
    resumed = StreamWindows(split, 32, 0, 3, positions[-1], keep=set, record=positions.append)
    assert len(resumed) == 3  # no fourth window: the stream's reset state is not read again
    middle = StreamWindows(split, 32, 0, 1, positions[0], keep=lambda w: set(w), record=positions.append)
    assert middle[1] == list(range(32, 64)) and len(middle) == 3


def test_a_streams_epochs_are_the_passes_it_completed(streams):
    """A stream's length is a planning stand-in, so a run's epochs count the passes it finished."""
    from stream_model import Rows

    from lib.data.splits import TensorSplit
    from lib.data.stream import StreamSplit
    from lib.trainer.windows import epochs_trained

    assert epochs_trained(StreamSplit(Rows(0, 70), nominal=4096), samples=200, epoch=2) == 2.0
    tensors = TensorSplit(torch.zeros(50, 4), torch.zeros(50))
    assert epochs_trained(tensors, samples=125, epoch=2) == 2.5
