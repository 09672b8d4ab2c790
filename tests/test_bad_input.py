"""The bad-input table: every input a user can get wrong, the command that meets it, and what must happen.

Each row runs one kfit command (scripts/kfit.py's main, as make calls it) in a
fresh directory holding a valid LeNet-5 .config, after the row's setup has
spoiled one thing. A refusal must exit with the row's code, print one `error:`
line naming the row's needles, print no traceback, and leave every file in the
directory as it was (contents, mode, symlinks). Rows that are not refusals (a
note, then work) say what they expect instead. New commands add their rows here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from lib import config as kconfig
from tests.helpers import kfit_script

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "s3cretPW"
# What make would carry in from the developer's shell; each row sets its own.
CLEARED = ("KCONFIG_CONFIG", "FRAGMENTS", "FORMAT", "HW", "GPU", "FREE_GB", "GPUS", "WORLD_SIZE", "RESUME", "NNODES",
           "NODE_RANK", "OUT", "TRIALS", "BATCH", "APPLY", "HPO_STORAGE", "HPO_STUDY", "RUN", "DEVICE", "STEPS", "KFIT_OVERRIDES", "KFIT_SET")
KFIT = kfit_script()  # scripts/kfit.py loaded as a module


@dataclass(frozen=True)
class Row:
    name: str
    argv: tuple[str, ...]
    env: dict = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None  # spoils something in the directory
    code: int = 2
    needles: tuple[str, ...] = ()  # each must appear in the output
    absent: tuple[str, ...] = ()  # none may appear (secrets)


def config_line(symbol_line: str) -> Callable[[Path], None]:
    """Put `CONFIG_X=...` in .config in place of X's line (kept once: a second assignment is an error)."""
    symbol = symbol_line.split("=")[0]

    def setup(d: Path) -> None:
        lines = [line for line in (d / ".config").read_text().splitlines()
                 if not (line.startswith(symbol + "=") or line == f"# {symbol} is not set")]
        (d / ".config").write_text("\n".join([*lines, symbol_line]) + "\n")
    return setup


def data_dir(path: str) -> Callable[[Path], None]:
    """The config reads its data from `path` (the choice moved off the embedded set)."""
    def setup(d: Path) -> None:
        config_line("CONFIG_DATASET_EMBEDDED=n")(d)
        (d / ".config").write_text((d / ".config").read_text().replace("CONFIG_DATASET_EMBEDDED=n\n", ""))
        config_line("CONFIG_DATASET_DIR=y")(d)
        config_line(f'CONFIG_DATA_DIR="{path}"')(d)
    return setup


def write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def both(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        for s in setups:
            s(d)
    return setup


def custom_model(module: str, source: str | None, factory: str = "build") -> Callable[[Path], None]:
    """A custom-model config whose factory is `module:factory`, the module written into the directory
    (None: an installed module)."""
    def setup(d: Path) -> None:
        if source is not None:
            (d / f"{module}.py").write_text(source)
        kconfig.make_defconfig("custom-transformer", out=d / ".config")
        config_line(f'CONFIG_CUSTOM_MODEL_FACTORY="{module}:{factory}"')(d)
    return setup


GOOD_PARTS = '''
import torch, torch.nn as nn, torch.nn.functional as F
def make_batch(n, g):
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)
def loss_fn(out, y):
    return F.cross_entropy(out, y)
'''

def fake_checkpoint(path: Path, config: bool = True) -> None:
    """A checkpoint export reads: model state, and the config and plan beside it unless `config` is False."""
    import torch

    state = {"model": {"w": torch.zeros(2)}, "step": 1}
    if config:
        state.update(config="CONFIG_MODEL_LENET5=y\n", plan={})
    torch.save(state, path)


def lenet_weights(path: Path, change) -> None:
    """A checkpoint holding LeNet-5's weights by name and shape, `change`d (dtype, values, a non-tensor)."""
    import torch

    from lib.models import build_model

    weights = dict(build_model("lenet5").state_dict())
    change(weights)
    torch.save({"model": weights, "step": 3}, path)


def crafted_resume(path: Path) -> None:
    """A checkpoint of this very config whose progress step is a string."""
    import torch

    config = (path.parent.parent / ".config").read_text()
    torch.save({"model": {}, "optimizer": {}, "scaler": {}, "rng": {"torch": torch.zeros(1), "python": [1]},
                "progress": {"window_size": 16, "micro_batch": 16, "step": "12"}, "config": config}, path)


HW_TOP = {"gpus": [], "cpu": {}}
HPO_URL = f"postgresql://user:{PASSWORD}@127.0.0.1:1/db"

ROWS = [
    # -- the config file -------------------------------------------------------------------------------
    Row("value that does not take", ("plan",), setup=config_line('CONFIG_LEARNING_RATE="fast"'),
        needles=("LEARNING_RATE", "fast")),
    Row("unknown symbol", ("plan",), setup=config_line("CONFIG_NO_SUCH_SYMBOL=y"), needles=("NO_SUCH_SYMBOL",)),
    Row("bool symbol given a number", ("plan",), setup=config_line("CONFIG_MONITOR=7"), needles=("MONITOR", "'7'")),
    Row("non-UTF-8 byte in .config", ("plan",), setup=lambda d: open(d / ".config", "ab").write(b"# caf\xe9\n"),
        needles=(".config", "UTF-8")),
    *[Row(f"non-UTF-8 byte in .config, {cmd}", (cmd,), setup=lambda d: open(d / ".config", "ab").write(b"# caf\xe9\n"),
          needles=(".config", "0xe9 is not UTF-8", "must be UTF-8 text"))
      for cmd in ("olddefconfig", "listnewconfig", "savedefconfig", "train", "check-hardware")],
    *[Row(f"KCONFIG_CONFIG is a directory, {' '.join(argv)}", argv, env={"KCONFIG_CONFIG": "adir"},
          setup=lambda d: (d / "adir").mkdir(), needles=("KCONFIG_CONFIG=adir is a directory",))
      for argv in (("defconfig", "lenet5"), ("olddefconfig",), ("train",), ("check-hardware",))],
    Row("non-UTF-8 byte in a fragment", ("mergeconfig", "frag"), setup=write("frag", b"CONFIG_SEED=3 # \xff\n"),
        needles=("frag", "UTF-8")),
    Row("KCONFIG_CONFIG is a directory", ("plan",), env={"KCONFIG_CONFIG": "adir"},
        setup=lambda d: (d / "adir").mkdir(), needles=("adir", "directory")),
    Row("KCONFIG_CONFIG missing", ("olddefconfig",), env={"KCONFIG_CONFIG": "nope.config"},
        needles=("nope.config", "defconfig")),
    Row("unknown defconfig", ("defconfig", "nosuch"), needles=("nosuch",)),
    Row("unknown fragment", ("mergeconfig", "nosuchfrag"), needles=("nosuchfrag",)),
    Row("missing data directory", ("train",), setup=data_dir("/nonexistent/mnist"),
        needles=("/nonexistent/mnist",)),
    Row("OUTPUT_DIR is /dev/null", ("train",), setup=config_line('CONFIG_OUTPUT_DIR="/dev/null"'),
        needles=("CONFIG_OUTPUT_DIR", "/dev/null")),
    Row("OUTPUT_DIR under /proc", ("train",), setup=config_line('CONFIG_OUTPUT_DIR="/proc/nope"'),
        needles=("CONFIG_OUTPUT_DIR", "/proc/nope")),
    Row("meta.json vocab_size true", ("train",), setup=both(
        lambda d: kconfig.make_defconfig("gpt2-tiny", out=d / ".config"),
        write("text/meta.json", '{"vocab_size": true}'), write("text/train.bin", bytes(4000)),
        write("text/val.bin", bytes(1000)),
        data_dir("text")),
        needles=("meta.json", "vocab_size")),
    Row("fragment with a value that does not take", ("mergeconfig", "frag"),
        setup=write("frag", "CONFIG_EPOCHS=0\n"), needles=("EPOCHS",)),
    # -- the machine -----------------------------------------------------------------------------------
    Row("unknown catalog GPU", ("plan",), env={"GPU": "h1000"}, needles=("h1000",)),
    Row("unknown catalog GPU, check-hardware", ("check-hardware",), env={"GPU": "h1000"}, needles=("h1000",)),
    Row("FREE_GB not a number", ("plan",), env={"GPU": "h100", "FREE_GB": "lots"}, needles=("FREE_GB",)),
    Row("FREE_GB above the total, by a rounding", ("plan",), env={"GPU": "h100", "FREE_GB": "79.65"},
        needles=("FREE_GB=79.65 is more than the 79.64 GiB",)),
    Row("GPUS not a number", ("plan",), env={"GPU": "h100", "GPUS": "two"}, needles=("GPUS",)),
    Row("WORLD_SIZE not a number", ("plan",), env={"WORLD_SIZE": "abc"}, needles=("WORLD_SIZE='abc'", "whole number from 1 to")),
    Row("WORLD_SIZE not a number, train", ("train",), env={"WORLD_SIZE": "abc"}, needles=("WORLD_SIZE='abc'",)),
    Row("WORLD_SIZE zero", ("plan",), env={"WORLD_SIZE": "0"}, needles=("WORLD_SIZE='0'", "from 1 to")),
    Row("NNODES not a number", ("plan",), env={"NNODES": "abc"}, needles=("NNODES='abc'", "number of machines")),
    Row("NNODES not a number, train", ("train",), env={"NNODES": "abc"}, needles=("NNODES='abc'", "MIN:MAX")),
    Row("NNODES zero", ("train",), env={"NNODES": "0"}, needles=("NNODES='0'", "from 1 to")),
    Row("NNODES negative", ("plan",), env={"NNODES": "-1"}, needles=("NNODES='-1'", "from 1 to")),
    Row("NNODES negative, train", ("train",), env={"NNODES": "-1"}, needles=("NNODES='-1'", "from 1 to")),
    Row("RESUME neither on nor off", ("train",), env={"RESUME": "maybe"},
        needles=("RESUME='maybe'", "1 (or y, yes, true, on) or 0")),
    Row("GPUS zero", ("plan-matrix",), env={"GPUS": "0"}, needles=("GPUS='0'", "from 1 to")),
    Row("FORMAT unknown", ("plan",), env={"FORMAT": "xml"}, needles=("FORMAT='xml'", "text, json")),
    Row("HW file missing", ("plan",), env={"HW": "missing.json"}, needles=("missing.json",)),
    Row("HW not JSON", ("plan",), env={"HW": "hw.json"}, setup=write("hw.json", "{not json"), needles=("hw.json",)),
    Row("HW of the wrong shape", ("plan",), env={"HW": "hw.json"}, setup=write("hw.json", json.dumps([1, 2])),
        needles=("hw.json",)),
    Row("HW a device file without end", ("plan",), env={"HW": "/dev/zero"},
        needles=("'/dev/zero' is not a regular file",)),
    # -- custom models ---------------------------------------------------------------------------------
    Row("custom factory raises", ("plan",), setup=custom_model(
        "factory_raises", "def build():\n    raise ValueError('no weights file')\n"),
        needles=("CONFIG_CUSTOM_MODEL_FACTORY", "factory_raises:build", "no weights file")),
    Row("custom module with a syntax error", ("plan",), setup=custom_model("factory_syntax", "def build(:\n"),
        needles=("CONFIG_CUSTOM_MODEL_FACTORY", "factory_syntax", "SyntaxError")),
    Row("custom factory is not one", ("plan",), setup=custom_model("os", None, factory="getcwd"),
        needles=("CONFIG_CUSTOM_MODEL_FACTORY", "os:getcwd")),
    Row("custom model without parameters", ("plan",), setup=custom_model(
        "factory_noparams", GOOD_PARTS + "def build():\n    return nn.Identity(), make_batch, loss_fn\n"),
        needles=("CONFIG_CUSTOM_MODEL_FACTORY", "parameters")),
    Row("custom loss not a scalar", ("plan",), setup=custom_model(
        "factory_vectorloss", GOOD_PARTS + "def build():\n"
        "    return nn.Linear(8, 4), make_batch, lambda out, y: F.cross_entropy(out, y, reduction='none')\n"),
        needles=("CONFIG_CUSTOM_MODEL_FACTORY", "scalar")),
    Row("custom forward shape mismatch", ("plan",), setup=custom_model(
        "factory_shapes", GOOD_PARTS + "def build():\n    return nn.Linear(5, 4), make_batch, loss_fn\n"),
        needles=("CONFIG_CUSTOM_MODEL_FACTORY", "factory_shapes")),
    # -- outputs and tools -----------------------------------------------------------------------------
    Row("plan-report into a missing directory", ("plan-report",), env={"OUT": "/nonexistent/d/r.html"},
        needles=("/nonexistent/d",)),
    Row("find-lr batch above the training set", ("find-lr",), env={"BATCH": "100000"}, needles=("BATCH", "100000")),
    Row("find-lr APPLY neither on nor off", ("find-lr",), env={"APPLY": "yes please"}, needles=("APPLY",)),
    Row("hpo storage not a URL", ("hpo-status",), env={"HPO_STORAGE": "notaurl"},
        needles=("HPO_STORAGE", "not a database URL")),
    Row("hpo storage in a missing directory", ("hpo-status",), env={"HPO_STORAGE": "sqlite:////nonexistent/x.db"},
        needles=("HPO_STORAGE",)),
    Row("hpo storage password never shown", ("hpo-status",), env={"HPO_STORAGE": HPO_URL},
        needles=("HPO_STORAGE", "user:***@"), absent=(PASSWORD,)),
    Row("recommend writing into a file", ("recommend",), env={"WRITE": "1", "OUT": "afile"},
        setup=write("afile", "mine"), needles=("OUT=afile", "directory")),
    Row("export of a run that is not there", ("export",), env={"RUN": "runs/nothing"}, needles=("runs/nothing",)),
    Row("report of a run that is not there", ("report",), env={"RUN": "runs/nothing"},
        needles=("runs/nothing holds no metrics.jsonl", "RUN=")),
    Row("report without a run", ("report",), needles=("no run under CONFIG_OUTPUT_DIR", "RUN=")),
    Row("sample without a run", ("sample",), needles=("no gpt2 or llama run under CONFIG_OUTPUT_DIR", "RUN=")),
    Row("sample of a run that is not there", ("sample",), env={"RUN": "runs/nothing"}, needles=("runs/nothing",)),
    Row("sample temperature not a number", ("sample",), env={"RUN": "runs/nothing", "TEMPERATURE": "hot"},
        needles=("TEMPERATURE='hot' is not a number",)),
    Row("sample of a damaged export", ("sample",), env={"RUN": "e/model.safetensors"},
        setup=lambda d: ((d / "e").mkdir(), (d / "e" / "config").write_text("CONFIG_MODEL_GPT2=y\n"),
                         (d / "e" / "model.safetensors").write_bytes(b"junk")),
        needles=("not a safetensors file",)),
    Row("export of a run name the OS refuses", ("export",), env={"RUN": "r" * 300},
        needles=("cannot be read", "File name too long")),
    Row("export of a checkpoint without config", ("export",), env={"RUN": "c.pt"},
        setup=lambda d: fake_checkpoint(d / "c.pt", config=False), needles=("c.pt", "holds no config and plan")),
    Row("export into a file", ("export",), env={"RUN": "c.pt", "OUT": "afile"},
        setup=both(lambda d: fake_checkpoint(d / "c.pt"), write("afile", "mine")),
        needles=("OUT=afile is a file, not a directory",)),
    Row("export into a path the OS refuses", ("export", "--out", "/proc/kfit-nope"), env={"RUN": "c.pt"},
        setup=lambda d: fake_checkpoint(d / "c.pt"), needles=("--out: OUT=/proc/kfit-nope", "cannot write")),
    # -- make's command line and overrides (KFIT_OVERRIDES is make's escaped list, as the Makefile passes it) --
    Row("make variable holding a quote and backquotes", ("defconfig", "lenet5"),
        env={"KFIT_OVERRIDES": r'FRAGMENTS=a\"`touch\ x`$$(touch\ y)'}, needles=("FRAGMENTS='a\"`touch x`$(touch y)' cannot be split",)),
    Row("make variable holding a line break", ("plan",), env={"KFIT_OVERRIDES": "GPU=h100\ntouch\\ x"},
        needles=("unknown GPU 'h100\\ntouch x'",)),
    Row("override that does not take, from make", ("train",), env={"KFIT_OVERRIDES": "LEARNING_RATE=abc"},
        needles=("command-line override", "CONFIG_LEARNING_RATE")),
    Row("override out of range", ("plan", "--set", "EPOCHS=0"), needles=("CONFIG_EPOCHS=0", "1..100000")),
    Row("override of no Kconfig symbol", ("plan", "--set", "MAX_STEP=3"), needles=("MAX_STEP", "CONFIG_MAX_STEPS")),
    Row("override with a line break", ("plan", "--set", "EPOCHS=2\nCONFIG_SEED=1"), needles=("line break",)),
    Row("override on a command that writes the config", ("savedefconfig",), env={"KFIT_OVERRIDES": "EPOCHS=2"},
        needles=("CONFIG_EPOCHS=2", "does not train or plan")),
    Row("override on export", ("export",), env={"KFIT_OVERRIDES": "EPOCHS=2", "RUN": "runs/x"},
        needles=("does not train or plan",)),
    # -- runtime adaptation ----------------------------------------------------------------------------
    Row("thermal resume temperature not below the pause one", ("train",),
        setup=both(config_line("CONFIG_THERMAL_WARN=n"),
                   lambda d: (d / ".config").write_text((d / ".config").read_text().replace("CONFIG_THERMAL_WARN=n\n",
                                                                                             "")),
                   config_line("CONFIG_THERMAL_PAUSE=y"), config_line("CONFIG_THERMAL_PAUSE_AT_C=80"),
                   config_line("CONFIG_THERMAL_RESUME_BELOW_C=85")),
        needles=("CONFIG_THERMAL_RESUME_BELOW_C=85 must be below CONFIG_THERMAL_PAUSE_AT_C=80",)),
    # -- checkpoint control ----------------------------------------------------------------------------
    Row("RESUME_FROM a path that is not there", ("train",), env={"RESUME_FROM": "runs/nothing"},
        needles=("RESUME_FROM=runs/nothing", "no such run directory or checkpoint")),
    Row("RESUME_FROM a file that is not a checkpoint", ("train",), env={"RESUME_FROM": "junk.pt"},
        setup=write("junk.pt", "not a checkpoint"), needles=("RESUME_FROM=junk.pt cannot be read",)),
    Row("RESUME_FROM a directory without checkpoints", ("train", "--resume-from", "empty"),
        setup=lambda d: (d / "empty").mkdir(), needles=("RESUME_FROM=empty holds no readable checkpoint",)),
    Row("INIT_FROM a path that is not there", ("train",), env={"INIT_FROM": "runs/nothing"},
        needles=("INIT_FROM=runs/nothing", "no such run directory, checkpoint or model.safetensors")),
    Row("INIT_FROM a damaged model.safetensors", ("train", "--init-from", "e/model.safetensors"),
        setup=write("e/model.safetensors", b"junk"), needles=("INIT_FROM=e/model.safetensors", "not a safetensors")),
    Row("RESUME_FROM and INIT_FROM together", ("train",), env={"RESUME_FROM": "junk.pt", "INIT_FROM": "junk.pt"},
        setup=write("junk.pt", "x"), needles=("RESUME_FROM and INIT_FROM exclude each other",)),
    Row("INIT_FROM integer weights", ("train",), env={"INIT_FROM": "i.pt"},
        setup=lambda d: lenet_weights(d / "i.pt", lambda w: w.update({k: v.long() for k, v in w.items()})),
        needles=("INIT_FROM=i.pt", "features.0.weight is int64 there, float32 in this model")),
    Row("INIT_FROM bool weights", ("train",), env={"INIT_FROM": "i.pt"},
        setup=lambda d: lenet_weights(d / "i.pt", lambda w: w.update({"classifier.5.bias": w["classifier.5.bias"] > 0})),
        needles=("classifier.5.bias is bool there, float32 in this model",)),
    Row("INIT_FROM NaN weights", ("train",), env={"INIT_FROM": "i.pt"},
        setup=lambda d: lenet_weights(d / "i.pt", lambda w: w["features.3.bias"].fill_(float("nan"))),
        needles=("features.3.bias holds NaN or infinite values",), absent=("LEARNING_RATE",)),
    Row("INIT_FROM a tensor replaced by an int", ("train",), env={"INIT_FROM": "i.pt"},
        setup=lambda d: lenet_weights(d / "i.pt", lambda w: w.update({"features.0.bias": 3})),
        needles=("features.0.bias is a int, not a tensor",)),
    Row("RESUME_FROM a progress field of the wrong type", ("train",), env={"RESUME_FROM": "r/checkpoint-12.pt"},
        setup=lambda d: ((d / "r").mkdir(), crafted_resume(d / "r" / "checkpoint-12.pt")),
        needles=("is not a kfit checkpoint (its progress field step is str '12', not int)",)),
    Row("sample of a pickle that is not a checkpoint", ("sample",), env={"RUN": "x.pkl"},
        setup=write("x.pkl", __import__("pickle").dumps({"a": [1, 2]})), needles=("x.pkl",)),
    Row("sample of a checkpoint whose weight is an int", ("sample",), env={"RUN": "c.pt"},
        setup=lambda d: __import__("torch").save({"model": {"transformer.wte.weight": 3}, "step": 1,
                                                  "config": "CONFIG_MODEL_GPT2=y\n", "plan": {}}, d / "c.pt"),
        needles=("transformer.wte.weight is a int, not a tensor",)),
    Row("best metric kfit cannot rank", ("train",),
        setup=both(config_line("CONFIG_CHECKPOINT_BEST_KEEP=2"), config_line('CONFIG_CHECKPOINT_BEST_METRIC="f1"')),
        needles=('CONFIG_CHECKPOINT_BEST_METRIC="f1"', "eval_loss")),
    Row("best metric the model's evaluation does not report", ("train",),
        setup=both(config_line("CONFIG_EARLY_STOP_PATIENCE=2"),
                   config_line('CONFIG_CHECKPOINT_BEST_METRIC="perplexity"')),
        needles=('CONFIG_CHECKPOINT_BEST_METRIC="perplexity"', "reports eval_loss, accuracy")),
    Row("early-stop min delta below zero", ("train",),
        setup=both(config_line("CONFIG_EARLY_STOP_PATIENCE=2"), config_line('CONFIG_EARLY_STOP_MIN_DELTA="-1"')),
        needles=('CONFIG_EARLY_STOP_MIN_DELTA="-1"', ">= 0")),
]


def snapshot(d: Path) -> dict:
    """Every path under d: (kind, mode, bytes or link target)."""
    out = {}
    for path in sorted(d.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[str(path)] = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[str(path)] = ("dir", stat.S_IMODE(st.st_mode))
        else:
            out[str(path)] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return out


@pytest.fixture(scope="module")
def lenet_config(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("template") / ".config"
    kconfig.make_defconfig("lenet5", out=path)
    return path.read_bytes()


def run_row(row: Row, d: Path, monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(d)
    monkeypatch.syspath_prepend(str(d))  # custom factories live next to the config, as a user's would
    for key in CLEARED:
        monkeypatch.delenv(key, raising=False)
    for key, value in row.env.items():
        monkeypatch.setenv(key, value)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = KFIT.main(list(row.argv))
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, lenet_config: bytes, tmp_path: Path, monkeypatch):
    d = tmp_path / "work"
    d.mkdir()
    (d / ".config").write_bytes(lenet_config)
    if row.setup:
        row.setup(d)
    before = snapshot(d)
    code, output = run_row(row, d, monkeypatch)
    assert "Traceback" not in output, output
    assert code == row.code, f"exit {code}, expected {row.code}:\n{output}"
    for needle in row.needles:
        assert needle in output, f"{needle!r} not in:\n{output}"
    for secret in row.absent:
        assert secret not in output, output
    if row.code != 0:
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, output
        assert snapshot(d) == before, "a refused command changed the directory"


def test_every_command_has_a_row():
    """A new subcommand adds its rows (config-only targets are covered by the config rows)."""
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    for path in sorted((ROOT / "scripts").glob("cli_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.register(sub)
    covered = {row.argv[0] for row in ROWS}
    exempt = {"hpo", "hpo-apply"}  # tests/test_hpo.py
    assert set(sub.choices) - exempt <= covered, set(sub.choices) - exempt - covered
