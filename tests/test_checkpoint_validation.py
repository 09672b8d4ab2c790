"""Checkpoints checked before they touch the model (lib/checkpoint.py's verify_integrity, lib/trainer/verify.py).

A real LeNet-5 run on the CPU dies at step 10 with checkpoints at steps 4 and 8; its checkpoint-8 is then
damaged in generated ways (a flipped byte anywhere in the zip or inside a tensor's data, a cut at any offset, an
optimizer tensor of another shape or dtype, an RNG state cut or extended, a key dropped, a sharded checkpoint's
files and metadata). Resuming names it in one warning, renames it to checkpoint-8.pt.damaged (kept, never
deleted), continues from checkpoint-4 and ends with the weights of the uninterrupted run bit for bit; a flipped
byte the check lets through (a zip field nothing reads) loads the very state that was saved. RESUME_FROM=
such a file is one error naming it, nothing renamed. Without an intact checkpoint the run starts afresh as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import shutil
import struct
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from lib import checkpoint
from lib import config as kc
from lib.hyperparams import ModelDescription, resolve
from lib.trainer import Trainer
from lib.trainer import verify
from tests.helpers import CPU, write_config

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one CPU thread

# LeNet at effective batch 16, a checkpoint every 4 steps, 12 steps (an evaluation at step 10 stops the first run).
BASE = ("CONFIG_DEVICE_CPU=y\nCONFIG_EPOCHS=10\nCONFIG_TARGET_EFFECTIVE_BATCH=16\nCONFIG_LOG_INTERVAL=1\n"
        "CONFIG_EVAL_INTERVAL=10\nCONFIG_CHECKPOINT_INTERVAL_STEPS=y\nCONFIG_CHECKPOINT_EVERY_STEPS=4\n"
        "CONFIG_CHECKPOINT_KEEP=3\n# CONFIG_MONITOR is not set\nCONFIG_MAX_STEPS=12\n")


def examples(n: int) -> settings:
    """n examples under `make check` (KFIT_TIER=check), a quarter of them (3 at least) in `make test`'s quick
    tier; each a real resume of a fresh copy (a few tenths of a second): no deadline."""
    n = n if os.environ.get("KFIT_TIER") == "check" else max(3, n // 4)
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Stop(Exception):
    pass


_PLANS: dict = {}


def trainer(config, **kwargs) -> Trainer:
    """A trainer of `config` on one plan per config: the runs compared bit for bit here share their split
    (each run's calibration may move the next plan's micro-batch, and with it the sums' order)."""
    key = repr(config)
    if key not in _PLANS:
        _PLANS[key] = resolve(config, CPU, ModelDescription.from_config(config))
    return Trainer(config, _PLANS[key], CPU, **{"log": lambda line: None, **kwargs})


@dataclasses.dataclass(repr=False)
class Runs:
    base: Path
    config: kc.Config
    interrupted: Path  # died at step 10: checkpoint-4.pt and checkpoint-8.pt
    weights: dict  # the uninterrupted run's final model
    numbered: list[str]  # the parameters' names in the optimizer's numbering (its groups' order)

    def __repr__(self) -> str:  # Hypothesis shows the arguments of a failing example
        return f"Runs({self.interrupted})"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests' resumed runs (one_thread): the same sums, bit for bit
    try:
        base = tmp_path_factory.mktemp("validation")
        config = kc.read_config(write_config(base, BASE + f'CONFIG_OUTPUT_DIR="{base}/runs"\n'))

        def stop(step, epoch, result):
            raise Stop

        t = trainer(config, on_eval=stop)
        with pytest.raises(Stop):
            t.fit()
        assert [s for s, _ in checkpoint.periodic_checkpoints(t.run_dir)] == [8, 4]
        names = {id(p): n for n, p in t.model.named_parameters()}
        numbered = [names[id(p)] for group in t.optimizer.param_groups for p in group["params"]]
        whole = trainer(config).fit()
        weights = checkpoint.load_checkpoint(whole.run_dir / checkpoint.FINAL)["model"]
        return Runs(base, config, t.run_dir, weights, numbered)
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def copy_of(runs: Runs, source: Path | None = None):
    """A fresh copy of the interrupted run (one per Hypothesis example); yields its directory."""
    source = source or runs.interrupted
    with tempfile.TemporaryDirectory(dir=runs.base) as d:
        run = Path(d) / source.name
        shutil.copytree(source, run)
        yield run


def resumed(runs: Runs, run: Path) -> tuple[Trainer, list[str]]:
    """Resume `run` and train it to the end; (the trainer, its warning lines)."""
    notes: list[str] = []
    t = trainer(runs.config, resume=run, log=notes.append)
    assert t.fit().steps == 12
    return t, [n for n in notes if n.startswith("warning:")]


def same_weights(run: Path, runs: Runs) -> bool:
    ours = checkpoint.load_checkpoint(run / checkpoint.FINAL)["model"]
    return ours.keys() == runs.weights.keys() and all(torch.equal(ours[k], runs.weights[k]) for k in ours)


def assert_set_aside(run: Path, runs: Runs, t: Trainer, warnings: list[str], damaged: bytes | None = None,
                     name: str = "checkpoint-8.pt", reason: str = "") -> str:
    """The damaged checkpoint was named in one warning, kept as <name>.damaged, the previous one resumed and
    the run ended with the uninterrupted run's weights; returns the warning."""
    assert t.resumed_from == run / "checkpoint-4.pt"
    [warning] = warnings
    assert warning.startswith(f"warning: {run / name} ") and "\n" not in warning, warning
    assert warning.endswith(f": kept as {name}.damaged, using the previous checkpoint"), warning
    assert reason in warning, warning
    kept = run / f"{name}.damaged"
    assert kept.exists()
    if damaged is not None:
        assert kept.read_bytes() == damaged  # kept as it was
    assert same_weights(run, runs)
    return warning


def resave(path: Path, change) -> bytes:
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)
    return path.read_bytes()


def member_spans(path: Path) -> list[tuple[str, int, int]]:
    """(name, first byte, length) of each zip member's data: the bytes its CRC covers."""
    data = path.read_bytes()
    spans = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            names, extra = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
            spans.append((info.filename, info.header_offset + 30 + names + extra, info.compress_size))
    return [s for s in spans if s[2] > 0]


def equal_states(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal_states(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(equal_states, a, b))
    return a == b or (a != a and b != b)


# -- the bytes: a flipped byte, a cut -------------------------------------------------------------------------


@examples(30)
@given(data=st.data(), inside_a_tensor=st.booleans(), mask=st.integers(1, 255))
def test_a_flipped_byte_is_caught_or_changes_nothing(runs, data, inside_a_tensor, mask):
    with copy_of(runs) as run:
        path = run / "checkpoint-8.pt"
        original = path.read_bytes()
        if inside_a_tensor:
            _, start, length = data.draw(st.sampled_from(member_spans(path)))
            offset = start + data.draw(st.integers(0, length - 1))
        else:
            offset = data.draw(st.integers(0, len(original) - 1))
        damaged = bytearray(original)
        damaged[offset] ^= mask
        path.write_bytes(bytes(damaged))
        t, warnings = resumed(runs, run)
        if t.resumed_from == path:  # a byte nothing reads (a timestamp, alignment padding): the same state
            assert warnings == [] and same_weights(run, runs)
            (run / "saved.pt").write_bytes(original)
            (run / "flipped.pt").write_bytes(bytes(damaged))
            assert equal_states(torch.load(run / "flipped.pt", weights_only=True),
                                torch.load(run / "saved.pt", weights_only=True))
            assert not inside_a_tensor
        else:
            assert_set_aside(run, runs, t, warnings, bytes(damaged))
            if inside_a_tensor:
                assert "is damaged (its member " in warnings[0] and "fails its CRC check" in warnings[0]


def mark_as_directory(path: Path) -> str:
    """Set the DOS directory bit in the central directory entry of the largest member: a bit no CRC covers, that
    Python's zipfile passes by and torch's reader (miniz) takes to mean "no data" (the tensor's bytes then go
    unread). Returns the member's name."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        name, at = max(archive.infolist(), key=lambda i: i.file_size).filename, archive.start_dir
    while data[at + 46:at + 46 + struct.unpack("<H", data[at + 28:at + 30])[0]] != name.encode():
        at += 46 + sum(struct.unpack("<HHH", data[at + 28:at + 34]))
    data[at + 38] |= 0x10
    path.write_bytes(bytes(data))
    return name


def test_a_zip_field_torch_heeds_that_no_crc_covers_is_checked_too(runs):
    """Found by flipping every byte outside the members' data of a checkpoint (five masks each): this was the
    only change that loaded other numbers, and the check now refuses it."""
    with copy_of(runs) as run:
        path = run / "checkpoint-8.pt"
        saved = torch.load(path, weights_only=True)
        name = mark_as_directory(path)
        assert zipfile.ZipFile(path).testzip() is None  # every CRC still holds
        assert not equal_states(torch.load(path, weights_only=True), saved)  # and torch loads other numbers
        t, warnings = resumed(runs, run)
        assert_set_aside(run, runs, t, warnings, reason=f"is damaged (its member {name} is marked a directory)")


@examples(8)
@given(data=st.data())
def test_a_checkpoint_cut_anywhere_is_set_aside(runs, data):
    with copy_of(runs) as run:
        path = run / "checkpoint-8.pt"
        cut = path.read_bytes()[:data.draw(st.integers(0, path.stat().st_size - 1))]
        path.write_bytes(cut)
        t, warnings = resumed(runs, run)
        assert_set_aside(run, runs, t, warnings, cut, reason="is unreadable (")


# -- the contents: optimizer, RNG, model, keys ----------------------------------------------------------------

def other_shapes(shape: tuple) -> st.SearchStrategy:
    return st.lists(st.integers(1, 7), min_size=0, max_size=3).map(tuple).filter(lambda s: s != tuple(shape))


@examples(20)
@given(data=st.data(), key=st.sampled_from(["exp_avg", "exp_avg_sq", "step"]),
       change=st.sampled_from(["shape", "int64", "float64", "float16", "bool", "complex64", "nan", "negative"]))
def test_an_optimizer_tensor_of_another_shape_or_dtype_is_set_aside(runs, data, key, change):
    """Once a fused-AdamW segfault or a 23 GB climb (another shape), or a silently other trajectory (int64)."""
    with copy_of(runs) as run:
        path = run / "checkpoint-8.pt"
        state = torch.load(path, weights_only=True)
        index = data.draw(st.integers(0, len(state["optimizer"]["state"]) - 1))
        old = state["optimizer"]["state"][index][key]
        if key == "step" and change in ("int64", "float64", "float16"):  # a scalar of another number type is one
            change = "shape"
        if change == "shape":
            new = torch.zeros(data.draw(other_shapes(() if key == "step" else old.shape).filter(
                lambda s: key != "step" or torch.Size(s).numel() != 1)))
        elif change in ("nan", "negative"):
            new = old.clone().fill_(float("nan") if change == "nan" else -1.0)
            if key != "step" and change == "negative":  # a moment below zero is a number: another dtype then
                new = old.to(torch.int64)
            elif key != "step":
                new = old.to(torch.complex64)
        else:
            new = old.to(getattr(torch, change))
        damaged = resave(path, lambda s: s["optimizer"]["state"][index].update({key: new}))
        t, warnings = resumed(runs, run)
        assert_set_aside(run, runs, t, warnings, damaged,
                         reason=f"is not a usable checkpoint (its optimizer state for {runs.numbered[index]}: {key} ")


def rng_damages() -> st.SearchStrategy:
    torch_state = st.one_of(
        st.integers(0, 6000).filter(lambda n: n != 5056).map(lambda n: ("torch", torch.zeros(n, dtype=torch.uint8))),
        st.sampled_from(["float32", "int64"]).map(lambda d: ("torch", torch.zeros(5056, dtype=getattr(torch, d)))),
        st.just(("torch", [0] * 5056)))

    def python_state(words: tuple, version: int = 3, gauss=None):
        return ("python", (version, words, gauss))
    good = (0,) * 624 + (624,)
    python = st.one_of(
        st.integers(0, 700).filter(lambda n: n != 625).map(lambda n: python_state((1,) * n)),
        st.integers(2 ** 32, 2 ** 40).map(lambda w: python_state((w,) + good[1:])),
        st.integers(625, 10 ** 6).map(lambda i: python_state(good[:624] + (i,))),
        st.integers(-5, 10).filter(lambda v: v != 3).map(lambda v: python_state(good, version=v)),
        st.just(python_state(good, gauss="0.5")), st.just(("python", [3, list(good), None])))
    return st.one_of(torch_state, python)


@examples(15)
@given(damage=rng_damages())
def test_an_rng_state_cut_extended_or_of_another_shape_is_set_aside(runs, damage):
    part, value = damage
    with copy_of(runs) as run:
        damaged = resave(run / "checkpoint-8.pt", lambda s: s["rng"].update({part: value}))
        t, warnings = resumed(runs, run)
        assert_set_aside(run, runs, t, warnings, damaged,
                         reason=f"(its {'torch' if part == 'torch' else 'Python'} RNG state ")


def key_paths(state: dict) -> list[tuple]:
    """What may be dropped from a checkpoint: its parts, each model tensor, each parameter's optimizer state
    entries and each group's hyperparameters, each RNG state, the progress's window and micro-batch."""
    paths = [(k,) for k in ("model", "optimizer", "scaler", "progress", "rng")]
    paths += [("model", name) for name in state["model"]]
    paths += [("optimizer", "state", i, key) for i, entry in state["optimizer"]["state"].items() for key in entry]
    paths += [("optimizer", "param_groups", g, key) for g, group in enumerate(state["optimizer"]["param_groups"])
              for key in ("lr", "betas", "eps", "weight_decay", "params")]
    paths += [("optimizer", part) for part in ("state", "param_groups")]
    return paths + [("rng", "torch"), ("rng", "python"), ("progress", "window_size"), ("progress", "micro_batch")]


@examples(20)
@given(data=st.data())
def test_a_checkpoint_missing_a_key_is_set_aside(runs, data):
    with copy_of(runs) as run:
        path = run / "checkpoint-8.pt"
        where = data.draw(st.sampled_from(key_paths(torch.load(path, weights_only=True))))

        def drop(state):
            for key in where[:-1]:
                state = state[key]
            del state[where[-1]]
        damaged = resave(path, drop)
        t, warnings = resumed(runs, run)
        assert_set_aside(run, runs, t, warnings, damaged, reason="is not a usable checkpoint (")


@pytest.mark.parametrize("change, reason", [
    (lambda s: s["model"].update({"features.0.bias": s["model"]["features.0.bias"].double()}),
     "its model tensor features.0.bias is float64, this model's float32"),
    (lambda s: s["model"].update({"classifier.5.weight": s["model"]["classifier.5.weight"].long()}),
     "its model tensor classifier.5.weight is int64, this model's float32"),
    (lambda s: s["optimizer"]["param_groups"][0].update(lr="3e-3"), "its optimizer's parameter group 0: lr is "),
    (lambda s: s["optimizer"]["param_groups"][1].update(betas=(0.9,)), "its optimizer's parameter group 1: betas"),
    (lambda s: s["optimizer"]["param_groups"][1]["params"].reverse(),
     "its optimizer numbers its parameters otherwise"),
    (lambda s: s["optimizer"]["state"].update({10: s["optimizer"]["state"][0]}),
     "its optimizer state is for parameter '10', not one of 0-9"),
    (lambda s: s["optimizer"]["param_groups"].pop(), "its optimizer has 1 parameter group(s), this run's 2"),
    (lambda s: s.update(scaler={"scale": float("inf"), "growth_factor": 2.0, "backoff_factor": 0.5,
                                "growth_interval": 2000, "_growth_tracker": 0}), "its gradient scaler state is not"),
    (lambda s: s.update(scaler={"scale": 1.0}), "its gradient scaler state has the keys ['scale']"),
    (lambda s: s["progress"].update(rungs=["teleport"]), "its progress names the ladder rung 'teleport'"),
    (lambda s: s["progress"].update(best=[[4, 1.0, 2]]), "its progress holds a best or early_best evaluation"),
    (lambda s: s["progress"].update(samples=-16), "its progress holds samples below 0"),
], ids=["model float64", "model int64", "lr a string", "betas cut", "parameters renumbered", "a parameter too many",
        "a group dropped", "infinite scale", "scaler fields", "unknown rung", "best of three", "samples below 0"])
def test_contents_that_do_not_fit_are_set_aside_with_the_reason(runs, change, reason):
    with copy_of(runs) as run:
        damaged = resave(run / "checkpoint-8.pt", change)
        t, warnings = resumed(runs, run)
        assert_set_aside(run, runs, t, warnings, damaged, reason=f"is not a usable checkpoint ({reason}")


def test_with_no_intact_checkpoint_left_a_fresh_run_starts_in_a_new_directory(runs):
    """The picked run keeps its history: its metrics byte for byte, its damaged checkpoints set aside."""
    with copy_of(runs) as run:
        newest, older = run / "checkpoint-8.pt", run / "checkpoint-4.pt"
        span = member_spans(newest)[-2]
        damaged = bytearray(newest.read_bytes())
        damaged[span[1]] ^= 1
        newest.write_bytes(bytes(damaged))
        resave(older, lambda s: s["rng"].update(torch=s["rng"]["torch"][:-1]))
        metrics = (run / "metrics.jsonl").read_bytes()
        notes: list[str] = []
        t = trainer(runs.config, resume=run, log=notes.append)
        assert t.resumed_from is None and t.run_dir != run  # a new one under CONFIG_OUTPUT_DIR
        warnings = [n for n in notes if n.startswith("warning:")]
        assert len(warnings) == 3, notes
        assert "checkpoint-8.pt is damaged (its member" in warnings[0]
        assert "checkpoint-4.pt is not a usable checkpoint (its torch RNG state is [5055] uint8" in warnings[1]
        assert warnings[2] == f"warning: no readable checkpoint in {run}: starting a fresh run in a new directory"
        assert f"note: {run} keeps its history; the fresh run is {t.run_dir}" in notes
        result = t.fit()
        assert result.steps == 12 and same_weights(result.run_dir, runs)  # the same seed: the uninterrupted run
        assert (run / "metrics.jsonl").read_bytes() == metrics
        assert (run / "checkpoint-8.pt.damaged").is_file() and (run / "checkpoint-4.pt.damaged").is_file()


def test_a_name_taken_by_an_earlier_damaged_checkpoint_is_not_overwritten(runs):
    with copy_of(runs) as run:
        (run / "checkpoint-8.pt.damaged").write_bytes(b"an earlier one")
        damaged = resave(run / "checkpoint-8.pt", lambda s: s["rng"].update(torch=s["rng"]["torch"][:9]))
        t, [warning] = resumed(runs, run)
        assert warning.endswith("kept as checkpoint-8.pt.damaged-2, using the previous checkpoint"), warning
        assert (run / "checkpoint-8.pt.damaged").read_bytes() == b"an earlier one"
        assert (run / "checkpoint-8.pt.damaged-2").read_bytes() == damaged


# -- RESUME_FROM: the user named it ----------------------------------------------------------------------------


def flip_in_a_tensor(path: Path) -> None:
    name, start, length = max(member_spans(path), key=lambda s: s[2])
    data = bytearray(path.read_bytes())
    data[start + length // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, reason", [
    (flip_in_a_tensor, "is damaged (its member archive/data/"),
    (lambda p: resave(p, lambda s: s["optimizer"]["state"][1].update(exp_avg=torch.zeros(7))),
     "is damaged (its optimizer state for features.3.weight: exp_avg is [7] float32, the parameter "
     "[16, 6, 5, 5] float32)"),
    (lambda p: resave(p, lambda s: s["optimizer"]["state"][0].update(
        exp_avg_sq=s["optimizer"]["state"][0]["exp_avg_sq"].long())),
     "is damaged (its optimizer state for features.0.weight: exp_avg_sq is [6, 1, 5, 5] int64"),
    (lambda p: resave(p, lambda s: s["rng"].update(torch=torch.cat([s["rng"]["torch"]] * 2))),
     "is damaged (its torch RNG state is [10112] uint8, this torch's [5056] uint8)"),
], ids=["flipped byte", "optimizer shape", "optimizer int64", "rng extended"])
def test_resume_from_a_damaged_checkpoint_is_one_error_and_renames_nothing(runs, kfit_here, damage, reason):
    with copy_of(runs) as run:
        path = run / "checkpoint-8.pt"
        damage(path)
        shutil.copy(runs.config.source, run.parent / ".config")
        before = sorted(p.name for p in run.iterdir()), path.read_bytes()
        result = kfit_here(run.parent, "train", RESUME_FROM=str(path))
        output = result.stdout + result.stderr
        assert result.returncode == 2 and "Traceback" not in output, output
        [error] = [line for line in output.splitlines() if line.startswith("error:")]
        assert error.startswith(f"error: RESUME_FROM={path} {reason}"), error
        assert error.endswith(f": name another checkpoint, or the run directory ({run}) for its newest intact one")
        assert (sorted(p.name for p in run.iterdir()), path.read_bytes()) == before  # nothing renamed or written


def test_resume_from_the_run_directory_sets_aside_and_says_so_once(runs, kfit_here):
    with copy_of(runs) as run:
        damaged = resave(run / "checkpoint-8.pt", lambda s: s["optimizer"]["state"][0].update(step=torch.ones(3)))
        shutil.copy(runs.config.source, run.parent / ".config")
        result = kfit_here(run.parent, "train", RESUME_FROM=str(run))
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        [warning] = [line for line in output.splitlines() if line.startswith("warning:") and "checkpoint-" in line]
        assert warning == (f"warning: {run / 'checkpoint-8.pt'} is not a usable checkpoint (its optimizer state for "
                           "features.0.weight: step is [3] float32, not a scalar): kept as checkpoint-8.pt.damaged, "
                           "using the previous checkpoint")
        assert (run / "checkpoint-8.pt.damaged").read_bytes() == damaged
        assert f"Resuming {run} from step 4 (checkpoint-4.pt" in output and (run / checkpoint.FINAL).is_file()


# -- sharded checkpoints (torch.distributed.checkpoint directories), in one process ------------------------------


@pytest.fixture(scope="module")
def sharded_run(runs, tmp_path_factory) -> Path:
    """The interrupted run with its checkpoint-8 saved sharded (checkpoint-8.dcp), as an FSDP run saves it."""
    from lib.trainer.resume import sharded_tensors

    run = tmp_path_factory.mktemp("sharded") / runs.interrupted.name
    shutil.copytree(runs.interrupted, run)
    state = torch.load(run / "checkpoint-8.pt", weights_only=True)
    t = trainer(runs.config, resume=run)  # its model and optimizer as checkpoint-8 holds them
    t.directory.release()
    extra = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
    with warnings.catch_warnings():  # torch.distributed.checkpoint: one process, no process group
        warnings.simplefilter("ignore")
        checkpoint.save_sharded(checkpoint.periodic_path(run, 8, True), sharded_tensors(t.model, t.optimizer), extra,
                                is_main=True, barrier=lambda: None)
    (run / "checkpoint-8.pt").unlink()
    return run


def rewrite_metadata(path: Path, change) -> None:
    metadata = checkpoint.sharded_metadata(path)
    change(metadata)
    (path / ".metadata").write_bytes(pickle.dumps(metadata))


def resized(metadata, key: str, shape=None, dtype=None) -> None:
    entry = metadata.state_dict_metadata[key]
    properties = dataclasses.replace(entry.properties, dtype=dtype or entry.properties.dtype)
    metadata.state_dict_metadata[key] = dataclasses.replace(entry, properties=properties,
                                                            size=torch.Size(shape or entry.size))


def shard(path: Path) -> Path:
    [found] = path.glob("*.distcp")
    return found


def test_an_intact_sharded_checkpoint_resumes_exactly(runs, sharded_run):
    with copy_of(runs, sharded_run) as run:
        t, warnings = resumed(runs, run)
        assert t.resumed_from == run / "checkpoint-8.dcp" and warnings == []
        assert same_weights(run, runs)


def test_a_sharded_checkpoint_of_the_earlier_form_still_resumes_exactly(runs, sharded_run):
    """Sharded checkpoints saved before the optimizer's entries were keyed by parameter name alone (numbered
    groups: torch's get_state_dict default) are read as they were saved."""
    from lib.trainer.resume import flat_optimizer, sharded_tensors

    with copy_of(runs, sharded_run) as run:
        path = run / "checkpoint-8.dcp"
        assert flat_optimizer(path)
        t = trainer(runs.config, resume=run)
        t.directory.release()
        extra = torch.load(path / checkpoint.EXTRA, weights_only=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            checkpoint.save_sharded(path, sharded_tensors(t.model, t.optimizer, flat=False), extra, is_main=True,
                                    barrier=lambda: None)
        assert not flat_optimizer(path)
        again, notes = resumed(runs, run)
        assert again.resumed_from == path and notes == []
        assert same_weights(run, runs)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("damage, reason", [
    (lambda p: shard(p).unlink(), "is damaged (its shard file __0_0.distcp is missing)"),
    (lambda p: shard(p).write_bytes(shard(p).read_bytes()[:-100]), "is damaged (its shard file __0_0.distcp holds"),
    (lambda p: (p / ".metadata").write_bytes(b"\x80\x04junk"), "is damaged (its .metadata cannot be read as torch's"),
    # a .metadata that would run a command when unpickled (an audit): refused before dcp.load's own unpickling
    (lambda p: (p / ".metadata").write_bytes(pickle.dumps(RunsACommand(p.parent / "PWNED"))),
     "is damaged (its .metadata cannot be read as torch's (UnpicklingError: it names posix.system"),
    (lambda p: (p / ".metadata").unlink(), "is unreadable (FileNotFoundError"),
    (lambda p: flip_in_a_tensor(p / "extra.pt"), "is damaged (its member "),
    (lambda p: rewrite_metadata(p, lambda m: resized(m, "optimizer.state.features.0.weight.exp_avg", (3, 1, 5, 5))),
     "its optimizer state for features.0.weight: exp_avg is [3, 1, 5, 5] float32, the parameter [6, 1, 5, 5]"),
    (lambda p: rewrite_metadata(p, lambda m: resized(m, "optimizer.state.classifier.1.bias.exp_avg_sq",
                                                     dtype=torch.int64)), "exp_avg_sq is [120] int64"),
    (lambda p: rewrite_metadata(p, lambda m: resized(m, "model.features.3.weight", (16, 6, 5, 4))),
     "it is a checkpoint of another model (features.3.weight: [16, 6, 5, 4] there, [16, 6, 5, 5] here)"),
    (lambda p: rewrite_metadata(p, lambda m: m.state_dict_metadata.pop("optimizer.state.features.0.bias.step")),
     "its optimizer state for features.0.bias: lacks step"),
    (lambda p: resave(p / "extra.pt", lambda s: s["rng"].update(torch=s["rng"]["torch"][:5000])),
     "its torch RNG state is [5000] uint8"),
], ids=["shard missing", "shard cut", "metadata junk", "metadata runs code", "metadata missing", "extra.pt flipped", "optimizer shape",
        "optimizer int64", "model shape", "step dropped", "rng cut"])
def test_a_damaged_sharded_checkpoint_is_set_aside(runs, sharded_run, damage, reason):
    with copy_of(runs, sharded_run) as run:
        damage(run / "checkpoint-8.dcp")
        t, warnings = resumed(runs, run)
        assert_set_aside(run, runs, t, warnings, name="checkpoint-8.dcp", reason=reason)
        assert (run / "checkpoint-8.dcp.damaged" / "extra.pt").is_file()
        assert not (run / "PWNED").exists()


class RunsACommand:
    """Unpickled, it would create `path` (os.system): what a planted .metadata could do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import os

        return os.system, (f"touch '{self.path}'",)


# -- the rules alone: torch's optimizers, tied weights, the scaler ------------------------------------------------


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.mix, self.norm = torch.nn.Embedding(11, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(self.norm(self.mix(self.embed(x))))


def stepped(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2) -> torch.optim.Optimizer:
    for _ in range(steps):
        model(torch.arange(6)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


@pytest.mark.parametrize("name", [*verify.OPTIMIZER_STATE, "Adafactor"])
def test_every_torch_optimizer_state_passes_and_any_key_dropped_does_not(name):
    kwargs = {"momentum": 0.9} if name in ("SGD", "RMSprop") else {"amsgrad": True} if name in ("Adam", "AdamW") else {}
    model = Tied()
    groups = [{"params": [model.mix.weight, model.embed.weight]},
              {"params": [model.mix.bias, *model.norm.parameters()], "weight_decay": 0.0}]
    optimizer = stepped(model, getattr(torch.optim, name)(groups, lr=1e-3, **kwargs))
    state = optimizer.state_dict()
    assert verify.optimizer_problem(state, model, optimizer) is None
    expected = verify.expected_state(optimizer, optimizer.param_groups[0])
    assert (expected is None) == (name == "Adafactor")
    for key in list(state["state"][0]):
        entry = state["state"][0].pop(key)
        if expected is not None:
            assert verify.optimizer_problem(state, model, optimizer) == \
                f"its optimizer state for mix.weight: lacks {key}"
        state["state"][0][key] = entry


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_sharded_checkpoint_of_a_model_with_tied_weights_fits_it(tmp_path):
    from lib.trainer.resume import sharded_tensors

    model = Tied()
    optimizer = stepped(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    path = tmp_path / "checkpoint-2.dcp"
    checkpoint.save_sharded(path, sharded_tensors(model, optimizer), {"step": 2}, is_main=True, barrier=lambda: None)
    checkpoint.verify_integrity(path)
    assert verify.sharded_problem(path, model, optimizer) is None
    other = Tied()
    other.mix = torch.nn.Linear(4, 4, bias=False)
    assert verify.sharded_problem(path, other, torch.optim.AdamW(other.parameters())) == \
        "it is a checkpoint of another model (mix.bias: there, not in this model)"


def test_an_empty_scaler_state_is_not_loaded_into_an_enabled_scaler():
    """A checkpoint of a run without a scaler (the CPU's) resumed where one is on (fp16 on a GPU): GradScaler
    refuses an empty state with a traceback, so none is loaded and the scaler starts afresh."""
    from lib.trainer.resume import load_state

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": {},
             "rng": {"torch": torch.get_rng_state(), "python": __import__("random").getstate()},
             "progress": {"window_size": 16, "micro_batch": 16}}
    assert verify.state_problem(state, None, model, optimizer, scaler, torch.device("cpu")) is None
    assert load_state(state, model, optimizer, scaler, torch.device("cpu")).step == 0
    assert scaler.get_scale() == 2.0 ** 16


def test_export_and_init_from_refuse_a_damaged_checkpoint(tmp_path, make_config):
    """A flipped byte that the zip's CRC catches is never exported, nor trained from (INIT_FROM)."""
    from lib.errors import KfitError
    from lib.export import export
    from tests.helpers import run

    _, result = run(make_config("CONFIG_MAX_STEPS=2\nCONFIG_HYPER_PARAM_MANUAL=y\nCONFIG_BATCH_SIZE=32\n"
                                "CONFIG_GRADIENT_ACCUMULATION=1\n"))
    final = result.run_dir / "checkpoint.pt"
    data = bytearray(final.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the tensors' bytes
    final.write_bytes(bytes(data))
    with pytest.raises(KfitError, match="is damaged"):
        export(final, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


# -- intact bytes, wrong contents: a field edited and re-saved with torch.save ----------------------------------
# The CRC and every shape pass; the values are what no run writes (a step of 10**30, NaN weights, a negative
# exp_avg_sq, a learning rate below zero, a config naming another model). Each is set aside like a damaged one.

NOT_FINITE = st.sampled_from([float("nan"), float("inf"), float("-inf")])
BEYOND = st.integers(2 ** 53, 2 ** 100)  # no run's count reaches 2**53


def content_damages(state: dict, numbered: list[str]) -> st.SearchStrategy:
    """(change(state), the reason's phrase) for checkpoint-8's `state`: every kind of wrong contents, its field
    and value generated."""
    p = state["progress"]
    step, window_size = p["step"], p["window_size"]

    def progress(field, value):
        return lambda s: s["progress"].update({field: value})

    counts = st.sampled_from(["step", "epoch", "window", "samples", "interval_samples", "stale_evals", "halvings",
                              "micro_batch", "window_size"])
    beyond = st.builds(lambda f, v: (progress(f, v), f"its progress field {f} is {str(v)[:40]}, beyond any run"),
                       counts, BEYOND)
    # consistent types, each below 2**53, but more than `step` steps (of `window_size` samples) can have done
    limits = {"window": step, "epoch": step, "stale_evals": step, "samples": step * window_size,
              "interval_samples": p["samples"], "halvings": window_size.bit_length(), "micro_batch": window_size}
    contradiction = st.sampled_from(sorted(limits)).flatmap(lambda f: st.builds(
        lambda v: (progress(f, v), f"its progress field {f} is {v} at step {step}: "),
        st.integers(limits[f] + 1, 2 ** 53 - 1)))
    floats = st.builds(lambda f, v: (progress(f, v), f"its progress field {f} is {v}"),  # (-inf: "below 0")
                       st.sampled_from(["elapsed_s", "interval_loss"]), st.sampled_from([float("nan"), float("inf")]))

    def poke(tensor, index, value):
        tensor.view(-1)[index % tensor.numel()] = value

    model_names = sorted(state["model"])
    model = st.builds(
        lambda name, i, v: (lambda s: poke(s["model"][name], i, v),
                            f"its model tensor {name} holds NaN or infinite values"),
        st.sampled_from(model_names), st.integers(0, 2 ** 20), NOT_FINITE)
    moments = st.builds(
        lambda n, key, i, v: (lambda s: poke(s["optimizer"]["state"][n][key], i, v),
                              f"its optimizer state for {numbered[n]}: {key} holds NaN or infinite values"),
        st.integers(0, len(numbered) - 1), st.sampled_from(["exp_avg", "exp_avg_sq"]), st.integers(0, 2 ** 20),
        NOT_FINITE)
    negative = st.builds(
        lambda n, i, v: (lambda s: poke(s["optimizer"]["state"][n]["exp_avg_sq"], i, v),
                         f"its optimizer state for {numbered[n]}: exp_avg_sq holds "),
        st.integers(0, len(numbered) - 1), st.integers(0, 2 ** 20), st.floats(-1e30, -1e-30))
    optimizer_step = st.builds(
        lambda n, v: (lambda s: s["optimizer"]["state"][n].update(step=torch.tensor(v)),
                      f"its optimizer state for {numbered[n]}: step is "),
        st.integers(0, len(numbered) - 1), st.floats(2.0 ** 53, 1e38))
    below = st.floats(-1e30, -1e-30)
    hyper = st.one_of(
        st.tuples(st.just("lr"), below), st.tuples(st.just("weight_decay"), below),
        st.tuples(st.just("eps"), st.floats(-1e30, 0.0)),
        st.tuples(st.just("betas"), st.one_of(st.floats(1.0, 1e6), below).flatmap(
            lambda b: st.sampled_from([(b, 0.999), (0.9, b)]))))
    groups = st.builds(
        lambda g, kv: (lambda s: s["optimizer"]["param_groups"][g].update({kv[0]: kv[1]}),
                       f"its optimizer's parameter group {g}: {kv[0]} is "),
        st.integers(0, len(state["optimizer"]["param_groups"]) - 1), hyper)
    other_model = st.builds(
        lambda name: (lambda s: s.update(config=s["config"].replace("CONFIG_MODEL_LENET5=y", f"CONFIG_MODEL_{name}=y")),
                      "its config differs from its run's in training math ("),
        st.sampled_from(["RESNET18", "RESNET50", "GPT2", "LLAMA"]))
    return st.one_of(beyond, contradiction, floats, model, moments, negative, optimizer_step, groups, other_model)


@examples(48)
@given(data=st.data())
def test_contents_no_run_writes_are_set_aside_and_the_previous_checkpoint_resumed(runs, data):
    """A checkpoint re-saved with one field out of range, not finite or contradicting the others: named in one
    warning with the reason, kept as checkpoint-8.pt.damaged (its bytes as they were), checkpoint-4 resumed and
    the run ending with the uninterrupted run's weights."""
    with copy_of(runs) as run:
        state = torch.load(run / "checkpoint-8.pt", weights_only=True)
        change, reason = data.draw(content_damages(state, runs.numbered), label="damage")
        damaged = resave(run / "checkpoint-8.pt", change)
        t, warnings = resumed(runs, run)
        assert_set_aside(run, runs, t, warnings, damaged, reason=f"is not a usable checkpoint ({reason}")


def consistent_progress(window_size: int) -> st.SearchStrategy:
    """Progress fields a run can reach: counts below 2**53 that agree with each other, seconds and loss finite."""
    @st.composite
    def build(draw):
        step = draw(st.integers(0, 2 ** 30))  # step * window_size below 2**53
        samples = draw(st.integers(0, step * window_size))
        micro = draw(st.integers(1, window_size))
        return {"window_size": window_size, "micro_batch": micro, "step": step, "samples": samples,
                "halvings": draw(st.integers(0, window_size.bit_length())),
                "epoch": draw(st.integers(0, step)), "window": draw(st.integers(0, step)),
                "interval_samples": draw(st.integers(0, samples)), "stale_evals": draw(st.integers(0, step)),
                "elapsed_s": draw(st.floats(0, 1e12)), "interval_loss": draw(st.floats(-1e30, 1e30)),
                "best": [[draw(st.integers(0, step)), draw(st.floats(allow_nan=False))]]}
    return build()


@settings(max_examples=100, deadline=None)
@given(progress=st.integers(1, 2 ** 20).flatmap(consistent_progress), data=st.data())
def test_progress_a_run_can_reach_passes_and_one_field_beyond_it_does_not(progress, data):
    """No false alarm: any progress a run can reach passes (a custom loss_fn's loss may be below zero); one
    field moved beyond what the others allow, or to a value no run writes, is named."""
    from lib.trainer.resume import checkpoint_problem

    def state(p):
        return {"model": {}, "optimizer": {}, "scaler": {}, "rng": {"torch": 0, "python": 0}, "progress": p,
                "step": p["step"], "epoch": min(p["epoch"] + 1, data.draw(st.integers(0, p["epoch"] + 1)))}
    assert checkpoint_problem(state(progress)) is None
    step, size = progress["step"], progress["window_size"]
    field, value = data.draw(st.one_of(
        st.tuples(st.sampled_from(["step", "epoch", "samples", "window", "halvings"]), BEYOND),
        st.tuples(st.sampled_from(["epoch", "window", "stale_evals"]), st.integers(step + 1, 2 ** 53 - 1)),
        st.tuples(st.just("samples"), st.integers(step * size + 1, 2 ** 53 - 1)),
        st.tuples(st.just("halvings"), st.integers(size.bit_length() + 1, 2 ** 53 - 1)),
        st.tuples(st.just("interval_loss"), NOT_FINITE),
        st.tuples(st.just("elapsed_s"), st.sampled_from([float("nan"), float("inf")]))))  # (-inf: "below 0")
    wrong = checkpoint_problem(state({**progress, field: value}))
    assert wrong is not None and wrong.startswith(f"its progress field {field} is "), wrong


@settings(max_examples=100, deadline=None)
@given(lr=st.floats(0, 10), beta1=st.floats(0, 0.9999), beta2=st.floats(0, 0.9999),
       eps=st.floats(1e-30, 1), weight_decay=st.floats(0, 10))
def test_hyperparameters_in_torchs_ranges_pass(lr, beta1, beta2, eps, weight_decay):
    live = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3).param_groups[0]
    saved = {**live, "lr": lr, "betas": (beta1, beta2), "eps": eps, "weight_decay": weight_decay}
    assert verify.group_problem(saved, live) is None


def test_a_value_this_runs_optimizer_was_built_with_passes_outside_the_usual_range():
    """eps 0 is outside (0, inf) but torch's constructor takes it: a custom optimizer built so keeps it."""
    live = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3, eps=0.0).param_groups[0]
    assert verify.group_problem(dict(live), live) is None
    assert verify.group_problem({**live, "eps": -1.0}, live) == "eps is '-1.0', outside (0, inf)"


@pytest.mark.parametrize("change", [
    lambda text: text.replace("CONFIG_EPOCHS=10", "CONFIG_EPOCHS=9").replace("CONFIG_MAX_STEPS=12",
                                                                                 "CONFIG_MAX_STEPS=8"),
    lambda text: text.replace("CONFIG_LOG_INTERVAL=1", "CONFIG_LOG_INTERVAL=3"),
], ids=["extended run", "not training math"])
def test_a_checkpoint_config_that_differs_only_where_runs_may_resumes_from_it(runs, change):
    """An extension raises the run config's EPOCHS or MAX_STEPS over its kept checkpoint's; logging is not
    training math: neither is a reason to pass the checkpoint by."""
    with copy_of(runs) as run:
        resave(run / "checkpoint-8.pt", lambda s: s.update(config=change(s["config"])))
        t, warnings = resumed(runs, run)
        assert warnings == [] and t.resumed_from == run / "checkpoint-8.pt"
        assert same_weights(run, runs)


def test_a_run_config_cut_short_judges_only_the_lines_it_holds(runs):
    with copy_of(runs) as run:
        lines = (run / "config").read_text().splitlines(keepends=True)
        (run / "config").write_text("".join(lines[:len(lines) // 2]))
        t, warnings = resumed(runs, run)
        assert warnings == [] and t.resumed_from == run / "checkpoint-8.pt"


def test_resume_from_the_run_directory_sets_aside_a_checkpoint_of_another_models_config(runs, kfit_here):
    """RESUME_FROM=<run>: a checkpoint whose own config names another model is passed by for the previous one
    (one warning, renamed aside), not an error about the config; the run's own config differing from this one
    is still that error."""
    with copy_of(runs) as run:
        damaged = resave(run / "checkpoint-8.pt", lambda s: s.update(
            config=s["config"].replace("CONFIG_MODEL_LENET5=y", "CONFIG_MODEL_GPT2=y")))
        shutil.copy(runs.config.source, run.parent / ".config")
        result = kfit_here(run.parent, "train", RESUME_FROM=str(run))
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        [warning] = [line for line in output.splitlines() if line.startswith("warning:") and "checkpoint-" in line]
        assert warning.startswith(f"warning: {run / 'checkpoint-8.pt'} is not a usable checkpoint (its config differs "
                                  "from its run's in training math (CONFIG_MODEL_GPT2: y there, "), warning
        assert warning.endswith(": kept as checkpoint-8.pt.damaged, using the previous checkpoint"), warning
        assert (run / "checkpoint-8.pt.damaged").read_bytes() == damaged
        assert f"Resuming {run} from step 4 (checkpoint-4.pt" in output and (run / checkpoint.FINAL).is_file()


def test_resume_from_a_run_of_another_config_is_still_the_config_error(runs, kfit_here):
    with copy_of(runs) as run:
        text = Path(runs.config.source).read_text()
        assert "CONFIG_SEED=42\n" in text
        (run.parent / ".config").write_text(text.replace("CONFIG_SEED=42\n", "CONFIG_SEED=7\n"))
        result = kfit_here(run.parent, "train", RESUME_FROM=str(run))
        output = result.stdout + result.stderr
        assert result.returncode == 2 and "its config differs in training math (CONFIG_SEED: " in output, output
        assert not any(p.name.endswith(".damaged") for p in run.iterdir())
