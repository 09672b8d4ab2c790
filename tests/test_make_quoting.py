"""make passes no value through a shell (issue 32 item 7), and a Kconfig symbol on make's command line is a
one-command override (issue 32 item 8, issue 29): through real make, on cheap targets, many values per make run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lib import config as kconfig
from lib.cli import flags

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = ROOT / "Makefile"
SENTINEL = "kfit-quoting-sentinel"

pytestmark = pytest.mark.slow

# Values a user (or a script passing a user's text) may give; every one that could run a command would create
# the sentinel in the working directory.
HOSTILE = (
    f'a"; touch {SENTINEL}; "b',
    f"a'; touch {SENTINEL}; 'b",
    f"a`touch {SENTINEL}`b",
    f"$(touch {SENTINEL})",
    f"a\ntouch {SENTINEL}\nb",
    f"a b $$(touch {SENTINEL}) \\ c",
)
# Every documented variable that reaches kfit, with the cheap targets that read them: each make run refuses
# every target in one error line each (make -k runs them all).
VARIABLES = ("FRAGMENTS", "HW", "GPU", "FREE_GB", "GPUS", "WORLD_SIZE", "NNODES", "FORMAT", "RUN", "OUT", "PROMPT",
             "MAX_TOKENS", "TEMPERATURE", "TOP_K", "SEED", "KCONFIG_SEED", "DEFCONFIG", "TRIALS", "HPO_STUDY")
TARGETS = ("lenet5-defconfig", "plan", "export", "sample")


def make(cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in {*flags.FLAGS, "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS",
                        flags.MAKE_LIST, flags.SET_VARIABLE, "V"}}
    return subprocess.run(["make", "--no-print-directory", "-f", str(MAKEFILE), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def errors(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture()
def lenet_dir(tmp_path: Path) -> Path:
    kconfig.make_defconfig("lenet5", out=tmp_path / ".config")
    return tmp_path


def listing(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_no_variable_runs_a_command_and_refusals_change_nothing(lenet_dir, value):
    before = listing(lenet_dir)
    result = make(lenet_dir, "-k", *TARGETS, *(f"{name}={value}" for name in VARIABLES))
    assert not (lenet_dir / SENTINEL).exists(), result.stderr
    assert not list(lenet_dir.glob("*touch*")), "a value became a file name"
    assert listing(lenet_dir) == before, "a refused target changed the directory"
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode != 0
    # one error line per target, each naming what kfit got: the value as typed (its first word for a list)
    assert len(errors(result)) == len(TARGETS), result.stderr
    shown = "\n".join(errors(result))
    assert value.split()[0] in shown or repr(value)[1:-1] in shown, shown


def test_config_file_and_target_names_are_never_shell_text(lenet_dir):
    before = listing(lenet_dir)
    for value in HOSTILE[:4]:
        result = make(lenet_dir, "-k", "savedefconfig", "olddefconfig", f"KCONFIG_CONFIG={value}",
                      f"{value.replace(' ', '_')}-defconfig")
        assert not (lenet_dir / SENTINEL).exists(), result.stderr
        assert len(errors(result)) == 3 and "Traceback" not in result.stderr, result.stderr
    assert listing(lenet_dir) == before
    # the literal value is used: a name with a space and a quote is a file kfit writes
    name = "my \"odd' config"
    assert make(lenet_dir, "lenet5-defconfig", f"KCONFIG_CONFIG={name}").returncode == 0
    assert (lenet_dir / name).read_text() == (lenet_dir / ".config").read_text()


def test_a_path_make_runs_is_quoted_and_a_line_break_refused(lenet_dir):
    result = make(lenet_dir, "-n", "plan", f"VENV=/tmp/a'b`touch {SENTINEL}`")
    assert result.returncode == 0 and f"'/tmp/a'\\''b`touch {SENTINEL}`/bin/python'" in result.stdout, result.stdout
    for variable in ("PYTHON", "KCONFIG_CONFIG"):  # one error: line, kfit's, naming it, then make's stop
        result = make(lenet_dir, "plan", f"{variable}=python3\ntouch " + SENTINEL)
        assert result.returncode != 0 and result.stderr.startswith(f"error: {variable}= holds a line break: give it "
                                                                   "on one line\n"), result.stderr
    assert not (lenet_dir / SENTINEL).exists()


def test_a_kconfig_symbol_on_the_command_line_overrides_one_command(lenet_dir):
    before = (lenet_dir / ".config").read_bytes()
    result = make(lenet_dir, "plan", "FORMAT=json", "EPOCHS=2", "CONFIG_LEARNING_RATE=0.01", "PRECISION=FP32",
                  "V=0", "CUDA_VISIBLE_DEVICES=")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)  # stdout holds only the JSON
    note = next(n for n in plan["notes"] if n.startswith("overrides:"))
    assert note == ("overrides: CONFIG_EPOCHS=2 CONFIG_LEARNING_RATE=0.01 CONFIG_PRECISION_FP32=y (command line; "
                    ".config unchanged)"), note
    assert plan["precision"] == "fp32" and "warning:" not in result.stderr
    assert (lenet_dir / ".config").read_bytes() == before
    # a bad value, or a name that is not kfit's, is one error naming the symbol (a mistyped name: the one it
    # probably meant; SEED= is make sample's, so the symbol needs its prefix here); a config-writing target
    # refuses an override
    for args, needle in ((("plan", "MAX_STEP=10"), "did you mean CONFIG_MAX_STEPS"),
                         (("plan", "SEED=4"), "write CONFIG_SEED=4"),
                         (("plan", "LEARNING_RATE=abc"), "CONFIG_LEARNING_RATE"),
                         (("plan", "EPOCHS=0"), "CONFIG_EPOCHS=0"),
                         (("savedefconfig", "EPOCHS=2"), "CONFIG_EPOCHS=2"),
                         (("lenet5-defconfig", "EPOCHS=2"), "does not train or plan")):
        result = make(lenet_dir, *args)
        assert result.returncode != 0 and len(errors(result)) == 1, result.stderr
        assert needle in errors(result)[0] and "Traceback" not in result.stderr, result.stderr
    assert (lenet_dir / ".config").read_bytes() == before
    assert not (lenet_dir / "defconfig").exists()


def test_a_stamp_whose_packages_are_gone_reinstalls(tmp_path):
    """A .venv whose stamp is there but whose packages are not: make runs the install again (shown with -n)."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    for name in ("kconfiglib.py", "safetensors", "optuna", "sqlalchemy", "numpy", "psutil", "jinja2", "tqdm",
                 "pynvml.py", "torchmetrics", "torchao", "pytest", "xdist", "hypothesis",
                 "__editable__.kfit-0.1.0.pth"):
        (site / name).touch()
    (tmp_path / "venv" / ".installed").touch()
    result = make(tmp_path, "-n", "plan", f"VENV={tmp_path / 'venv'}")
    assert "lacks torch" in result.stdout and "install-deps.sh" in result.stdout, result.stdout
    (site / "torch").mkdir()
    result = make(tmp_path, "-n", "plan", f"VENV={tmp_path / 'venv'}")
    assert "install-deps.sh" not in result.stdout, result.stdout


def test_a_fragment_path_with_a_space_is_given_quoted(tmp_path):
    """FRAGMENTS= splits at spaces as a shell does: a path holding one is quoted inside the value."""
    spaced = tmp_path / "my fragments"
    spaced.mkdir()
    (spaced / "two epochs").write_text("CONFIG_EPOCHS=2\n")
    result = make(tmp_path, "lenet5-defconfig", f"FRAGMENTS='{spaced / 'two epochs'}' fp32")
    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / ".config").read_text()
    assert "CONFIG_EPOCHS=2" in text and "CONFIG_PRECISION_FP32=y" in text
    result = make(tmp_path, "lenet5-defconfig", "FRAGMENTS='unclosed")
    assert result.returncode == 2 and "close the quote" in result.stderr
